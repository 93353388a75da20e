//! `NativeStore` and `NativeLock`: the state store and its lock.

use std::sync::{Arc, Mutex};

use crate::connection::*;
use crate::errors::*;
use crate::runtime::*;
use clickhouse_component::host_api::LockEngineChoice;
use clickhouse_component::host_api::{Error, ErrorKind, Redactor};
use clickhouse_component_host::{LockEngine, LockHandle, State, StoreHandle, StoreOptions};
use pyo3::prelude::*;

/// A state as it crosses into Python, its parts JSON text (`State._from_native` reads the
/// fields by name: a field renamed on one side fails loudly, none is mislabelled).
#[pyclass(frozen, get_all, module = "clickhouse_component._native")]
pub(crate) struct NativeState {
    pub(crate) id: String,
    pub(crate) partial: String,
    pub(crate) completed: String,
}

impl From<State> for NativeState {
    fn from(s: State) -> Self {
        NativeState {
            id: s.id,
            partial: s.partial,
            completed: s.completed,
        }
    }
}

pub(crate) fn state(id: String, partial: String, completed: String) -> State {
    State {
        id,
        partial,
        completed,
    }
}

/// An open state store (`store` resource) in an instance of its own.
#[pyclass(frozen, module = "clickhouse_component._native")]
pub(crate) struct NativeStore {
    pub(crate) session: Session,
    pub(crate) store: StoreHandle,
    pub(crate) redactor: Arc<Redactor>,
}

#[pymethods]
impl NativeStore {
    #[new]
    #[pyo3(signature = (connection, database=None, table=None, lock_table=None, create_schema=None, lock_timeout_ms=None, lock_retry_ms=None, stale_after_ms=None, lock_engine=None, retries=None, cluster=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        connection: &Connection,
        database: Option<String>,
        table: Option<String>,
        lock_table: Option<String>,
        create_schema: Option<bool>,
        lock_timeout_ms: Option<u32>,
        lock_retry_ms: Option<u32>,
        stale_after_ms: Option<u32>,
        lock_engine: Option<String>,
        retries: Option<u32>,
        cluster: Option<String>,
    ) -> PyResult<NativeStore> {
        // The component's own parser: one spelling rule for the CLI, Python and the host.
        let lock_engine = lock_engine
            .map(|e| e.parse::<LockEngineChoice>().map(LockEngine::from))
            .transpose()
            .map_err(|e| invalid(py, format!("lock_engine: {}", e.message)))?;
        let options = StoreOptions {
            database,
            table,
            lock_table,
            create_schema,
            lock_timeout_ms,
            lock_retry_ms,
            stale_after_ms,
            lock_engine,
            retries,
            cluster,
        };
        let session = new_session(py, connection)?;
        let conn = connection.options.clone();
        let store = on_instance!(py, &session, &connection.redactor, |i| i
            .open_store(&conn, &options)
            .await)?;
        Ok(NativeStore {
            session,
            store,
            redactor: connection.redactor.clone(),
        })
    }

    fn get(&self, py: Python<'_>, id: String) -> PyResult<Option<NativeState>> {
        let s = self.store;
        on_instance!(py, self, |i| Ok(i
            .state_get(s, &id)
            .await?
            .map(NativeState::from)))
    }

    fn set(&self, py: Python<'_>, id: String, partial: String, completed: String) -> PyResult<()> {
        let s = self.store;
        let st = state(id, partial, completed);
        on_instance!(py, self, |i| i.state_set(s, &st).await)
    }

    fn update(
        &self,
        py: Python<'_>,
        id: String,
        partial: String,
        completed: String,
    ) -> PyResult<NativeState> {
        let s = self.store;
        let st = state(id, partial, completed);
        on_instance!(py, self, |i| Ok(i.state_update(s, &st).await?.into()))
    }

    fn delete(&self, py: Python<'_>, id: String) -> PyResult<u64> {
        let s = self.store;
        on_instance!(py, self, |i| i.state_delete(s, &id).await)
    }

    #[pyo3(signature = (pattern=None))]
    fn ids(&self, py: Python<'_>, pattern: Option<String>) -> PyResult<Vec<String>> {
        let s = self.store;
        on_instance!(py, self, |i| i.state_ids(s, pattern.as_deref()).await)
    }

    #[pyo3(signature = (pattern=None))]
    fn get_all(&self, py: Python<'_>, pattern: Option<String>) -> PyResult<Vec<NativeState>> {
        let s = self.store;
        on_instance!(py, self, |i| {
            Ok(i.state_get_all(s, pattern.as_deref())
                .await?
                .into_iter()
                .map(NativeState::from)
                .collect())
        })
    }

    fn set_all(&self, py: Python<'_>, states: Vec<(String, String, String)>) -> PyResult<()> {
        let s = self.store;
        let states: Vec<State> = states
            .into_iter()
            .map(|(id, p, c)| state(id, p, c))
            .collect();
        on_instance!(py, self, |i| i.state_set_all(s, &states).await)
    }

    fn clear_all(&self, py: Python<'_>) -> PyResult<u64> {
        let s = self.store;
        on_instance!(py, self, |i| i.state_clear_all(s).await)
    }

    /// Acquires the lock on `id` (waiting up to the lock timeout).
    fn lock(&self, py: Python<'_>, id: String) -> PyResult<NativeLock> {
        let s = self.store;
        let lock_id = id.clone();
        let (handle, token) = on_instance!(py, self, |i| {
            let handle = i.lock(s, &lock_id).await?;
            let token = i.lock_token(handle).await?;
            Ok((handle, token))
        })?;
        Ok(NativeLock {
            session: self.session.clone(),
            handle: Mutex::new(Some(handle)),
            id,
            token,
            redactor: self.redactor.clone(),
        })
    }

    /// Closes the store handle (later calls fail); idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.store;
        let alive = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !alive {
            return Ok(());
        }
        let result = on_instance!(py, self, |i| i.close_store(s).await);
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = None;
        result
    }
}

/// A held lock (`lock` resource): its writes are fenced by it.
#[pyclass(frozen, module = "clickhouse_component._native")]
pub(crate) struct NativeLock {
    pub(crate) session: Session,
    pub(crate) handle: Mutex<Option<LockHandle>>,
    pub(crate) id: String,
    pub(crate) token: String,
    pub(crate) redactor: Arc<Redactor>,
}

impl NativeLock {
    fn held(&self, py: Python<'_>) -> PyResult<LockHandle> {
        self.handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ok_or_else(|| {
                Failure::from_error(Error::new(ErrorKind::Locked, "the lock was released"), None)
                    .into_py(py)
            })
    }
}

#[pymethods]
impl NativeLock {
    #[getter]
    fn id(&self) -> String {
        self.id.clone()
    }

    #[getter]
    fn token(&self) -> String {
        self.token.clone()
    }

    fn set(&self, py: Python<'_>, id: String, partial: String, completed: String) -> PyResult<()> {
        let l = self.held(py)?;
        let st = state(id, partial, completed);
        on_instance!(py, self, |i| i.lock_set(l, &st).await)
    }

    fn update(
        &self,
        py: Python<'_>,
        id: String,
        partial: String,
        completed: String,
    ) -> PyResult<NativeState> {
        let l = self.held(py)?;
        let st = state(id, partial, completed);
        on_instance!(py, self, |i| Ok(i.lock_update(l, &st).await?.into()))
    }

    fn delete(&self, py: Python<'_>) -> PyResult<u64> {
        let l = self.held(py)?;
        on_instance!(py, self, |i| i.lock_delete(l).await)
    }

    fn renew(&self, py: Python<'_>) -> PyResult<()> {
        let l = self.held(py)?;
        on_instance!(py, self, |i| i.lock_renew(l).await)
    }

    /// Releases the lock and drops its handle; idempotent.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let Some(l) = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(());
        };
        on_instance!(py, self, |i| i.lock_release(l).await)
    }

    #[getter]
    fn released(&self) -> bool {
        self.handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}
