//! `clickhouse_component._native`: the reference host library as a CPython extension module
//! (PyO3, abi3 for CPython >= 3.10). The typed API is the pure-Python package around it
//! (`python/clickhouse_component/`); this module is its engine:
//!
//! * one tokio runtime and one compiled [`Runtime`] per process, made at the first call that
//!   needs them (so importing costs no compilation);
//! * every call into the component runs with the GIL released (`Python::detach`), on that
//!   runtime (`block_on` on the calling thread; connections are driven by its workers);
//! * one [`Instance`] per `NativeStore` / `NativeSink` / ping, behind a mutex: objects may be
//!   shared by threads, their calls run one at a time;
//! * every failure becomes the Python exception of its WIT error kind (built by
//!   `clickhouse_component.errors._from_native`), its message redacted of the connection's
//!   secrets; a panic is caught before it reaches Python and reported as a runner failure.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use clickhouse_component::host_api::rows::{self as encode, Value as JsonValue};
use clickhouse_component::host_api::{Compression as CoreCompression, LockEngineChoice};
use clickhouse_component::host_api::{ConnectionOptions, Endpoint, Error, ErrorKind, Redactor};
use clickhouse_component_host::config::HostArgs;
use clickhouse_component_host::runtime::runner_message;
use clickhouse_component_host::{
    default_allow_list, AllowList, CachePolicy, CallError, CommandInput, ComponentSource,
    Compression, InsertFormat, Instance, Limits, LoadKind, LockEngine, LockHandle, Network,
    Receipt, Runtime, SinkHandle, SinkOptions, State, StoreHandle, StoreOptions, TlsOptions, Value,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};

/// The process's tokio runtime and compiled component, made once.
struct Shared {
    tokio: tokio::runtime::Runtime,
    runtime: Runtime,
}

static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

/// Set in a child forked after the runtime started: its threads (tokio's workers, the epoch
/// ticker) are not in the child, so a call would wait for them for ever.
static FORKED_AFTER_START: AtomicBool = AtomicBool::new(false);

/// The shared runtime, made at the first call (compiling the component, or loading the
/// precompiled copy from the cache).
fn shared() -> Result<&'static Shared, Failure> {
    if FORKED_AFTER_START.load(Ordering::SeqCst) {
        return Err(Failure::runner(
            "this process was forked after the clickhouse_component runtime started: its threads are not in the child; fork before the first call, or use the spawn start method",
        ));
    }
    let shared = SHARED.get_or_init(|| {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("clickhouse-component")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
        let runtime = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Default)
            .map_err(|e| format!("cannot load the component: {}", runner_message(&e)))?;
        Ok(Shared { tokio, runtime })
    });
    shared.as_ref().map_err(|e| Failure::runner(e.clone()))
}

/// A failure on its way to Python (built without the GIL, raised with it).
struct Failure {
    /// The WIT error kind, or `runner`.
    kind: &'static str,
    message: String,
    server: Option<(i32, String, u16)>,
    committed_rows: u64,
}

impl Failure {
    fn runner(message: impl Into<String>) -> Failure {
        Failure {
            kind: "runner",
            message: message.into(),
            server: None,
            committed_rows: 0,
        }
    }

    fn invalid(message: impl Into<String>) -> Failure {
        Failure::from_error(Error::invalid(message.into()), None)
    }

    fn from_error(e: Error, redactor: Option<&Redactor>) -> Failure {
        Failure {
            kind: e.kind.as_str(),
            message: match redactor {
                Some(r) => r.redact(&e.message),
                None => e.message,
            },
            server: e.server.map(|s| (s.code, s.name, s.http_status)),
            committed_rows: e.committed_rows,
        }
    }

    fn from_call(e: CallError, redactor: &Redactor) -> Failure {
        match e {
            CallError::Component(e) => Failure::from_error(e, Some(redactor)),
            CallError::Runner(e) => Failure::runner(redactor.redact(&runner_message(&e))),
        }
    }

    /// The Python exception: `clickhouse_component.errors._from_native(kind, message, server,
    /// committed_rows)`.
    fn into_py(self, py: Python<'_>) -> PyErr {
        let made = (|| -> PyResult<PyErr> {
            let errors = py.import("clickhouse_component.errors")?;
            let exc = errors.getattr("_from_native")?.call1((
                self.kind,
                &self.message,
                self.server,
                self.committed_rows,
            ))?;
            Ok(PyErr::from_value(exc))
        })();
        made.unwrap_or_else(|e| e)
    }
}

type CallFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CallError>> + Send + 'a>>;

/// One call into a Python object's instance: `$body` runs as the async body of [`call`], with
/// the instance as `$i` (and everything it names moved in), the GIL released; an error becomes
/// the Python exception of its kind, redacted. `on_instance!(py, self, |i| ...)` uses the
/// object's own session and redactor. Each method of the binding is its conversions and this.
macro_rules! on_instance {
    ($py:expr, $this:ident, |$i:ident| $body:expr) => {
        on_instance!($py, &$this.session, &$this.redactor, |$i| $body)
    };
    ($py:expr, $session:expr, $redactor:expr, |$i:ident| $body:expr) => {
        call($py, $session, $redactor, move |$i| {
            Box::pin(async move { $body })
        })
    };
}

/// An instance of the component shared by the threads using one Python object; `None` once a
/// runner failure (trap, deadline) has stopped it.
type Session = Arc<Mutex<Option<Instance>>>;

/// Runs `f` on the session's instance with the GIL released; a runner failure retires the
/// instance (wasmtime forbids using a store after a trap), a panic becomes a runner failure.
fn call<T, F>(py: Python<'_>, session: &Session, redactor: &Redactor, f: F) -> PyResult<T>
where
    T: Send,
    F: for<'a> FnOnce(&'a mut Instance) -> CallFuture<'a, T> + Send,
{
    call_with(py, session, redactor, &[], move |i, _| f(i))
}

/// [`call`], lending the future `data` (bytes the caller keeps alive) as long as the instance.
fn call_with<T, F>(
    py: Python<'_>,
    session: &Session,
    redactor: &Redactor,
    data: &[u8],
    f: F,
) -> PyResult<T>
where
    T: Send,
    F: for<'a> FnOnce(&'a mut Instance, &'a [u8]) -> CallFuture<'a, T> + Send,
{
    let result = py.detach(|| -> Result<T, Failure> {
        let shared = shared()?;
        let mut guard = session.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(instance) = guard.as_mut() else {
            return Err(Failure::runner(
                "this object's component instance is gone (the store was closed, or an earlier runner failure stopped it): open a new one",
            ));
        };
        let outcome =
            std::panic::catch_unwind(AssertUnwindSafe(|| shared.tokio.block_on(f(instance, data))));
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if matches!(e, CallError::Runner(_)) {
                    *guard = None;
                }
                Err(Failure::from_call(e, redactor))
            }
            Err(_) => {
                *guard = None;
                Err(Failure::runner(
                    "the host panicked during the call; the instance was stopped",
                ))
            }
        }
    });
    result.map_err(|f| f.into_py(py))
}

/// Makes a fresh instance for `connection` (GIL released).
fn new_session(py: Python<'_>, connection: &Connection) -> PyResult<Session> {
    let runtime_network = connection.network.clone();
    let limits = connection.limits;
    let allow = connection.allow.clone();
    let redactor = connection.redactor.clone();
    let result = py.detach(move || -> Result<Instance, Failure> {
        let shared = shared()?;
        let runtime = shared
            .runtime
            .clone()
            .with_network(runtime_network)
            .with_limits(limits);
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            shared.tokio.block_on(runtime.instantiate(allow))
        }))
        .map_err(|_| Failure::runner("the host panicked while instantiating the component"))?
        .map_err(|e| Failure::runner(redactor.redact(&runner_message(&e))))
    });
    result
        .map(|instance| Arc::new(Mutex::new(Some(instance))))
        .map_err(|f| f.into_py(py))
}

fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    Failure::invalid(message).into_py(py)
}

/// How to reach one ClickHouse: the connection record, the allow-list, TLS trust.
#[pyclass(frozen, module = "clickhouse_component._native")]
struct Connection {
    options: ConnectionOptions,
    allow: AllowList,
    network: Network,
    limits: Limits,
    redactor: Arc<Redactor>,
}

#[pymethods]
impl Connection {
    #[new]
    #[pyo3(signature = (url, user=None, password=None, database=None, settings=Vec::new(), ca_file=None, allow=Vec::new(), connect_timeout_ms=None, request_timeout_ms=None, max_memory_mib=None, call_timeout_seconds=None, max_response_mib=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: String,
        user: Option<String>,
        password: Option<String>,
        database: Option<String>,
        settings: Vec<(String, String)>,
        ca_file: Option<std::path::PathBuf>,
        allow: Vec<String>,
        connect_timeout_ms: Option<u32>,
        request_timeout_ms: Option<u32>,
        max_memory_mib: Option<u64>,
        call_timeout_seconds: Option<f64>,
        max_response_mib: Option<u64>,
    ) -> PyResult<Connection> {
        // The CLI's own checks and defaults (--max-memory-mib, ...).
        let limits = HostArgs {
            max_memory_mib,
            call_timeout_seconds,
            max_response_mib,
            ..HostArgs::default()
        }
        .limits()
        .map_err(|e| Failure::from_error(e, None).into_py(py))?;
        let options = ConnectionOptions {
            url,
            user,
            password,
            database,
            settings,
            connect_timeout_ms,
            request_timeout_ms,
        };
        // Parsing checks the whole connection (nothing is sent) and names its secrets.
        let endpoint =
            Endpoint::parse(&options).map_err(|e| Failure::from_error(e, None).into_py(py))?;
        let redactor = Arc::new(Redactor::new(endpoint.secrets()));
        let mut list = default_allow_list(&options)
            .map_err(|e| Failure::from_error(e, Some(&redactor)).into_py(py))?;
        let extra = AllowList::parse(&allow).map_err(|e| invalid(py, e.to_string()))?;
        list.extend(extra);
        let network = Network::new(&TlsOptions { ca_file })
            .map_err(|e| invalid(py, redactor.redact(&e.to_string())))?;
        Ok(Connection {
            options,
            allow: list,
            network,
            limits,
            redactor,
        })
    }

    /// `server.ping`.
    fn ping(&self, py: Python<'_>) -> PyResult<NativeServerInfo> {
        let session = new_session(py, self)?;
        let options = self.options.clone();
        on_instance!(py, &session, &self.redactor, |i| {
            let info = i.ping(&options).await?;
            Ok(NativeServerInfo {
                version: info.version,
                timezone: info.timezone,
                user: info.user,
                database: info.database,
                round_trip_us: info.round_trip_us,
            })
        })
    }

    /// The allow-list, as text (no secrets: origins only).
    #[getter]
    fn allowed(&self) -> String {
        self.allow.to_string()
    }

    fn __repr__(&self) -> String {
        // Never the URL (it may carry the password or a secret setting).
        format!("<clickhouse_component.Connection allow={}>", self.allow)
    }
}

/// A state as it crosses into Python, its parts JSON text (`State._from_native` reads the
/// fields by name: a field renamed on one side fails loudly, none is mislabelled).
#[pyclass(frozen, get_all, module = "clickhouse_component._native")]
struct NativeState {
    id: String,
    partial: String,
    completed: String,
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

fn state(id: String, partial: String, completed: String) -> State {
    State {
        id,
        partial,
        completed,
    }
}

/// What `Connection.ping` learned, by name (`ServerInfo` in Python).
#[pyclass(frozen, get_all, module = "clickhouse_component._native")]
struct NativeServerInfo {
    version: String,
    timezone: String,
    user: String,
    database: String,
    round_trip_us: u64,
}

/// An open state store (`store` resource) in an instance of its own.
#[pyclass(frozen, module = "clickhouse_component._native")]
struct NativeStore {
    session: Session,
    store: StoreHandle,
    redactor: Arc<Redactor>,
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
struct NativeLock {
    session: Session,
    handle: Mutex<Option<LockHandle>>,
    id: String,
    token: String,
    redactor: Arc<Redactor>,
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

/// A receipt as it crosses into Python, by name (`_by_name` in Python reads every field of
/// the Python dataclass by its name: a field missing here fails loudly, none is mislabelled).
#[pyclass(frozen, get_all, module = "clickhouse_component._native")]
struct NativeReceipt {
    rows: u64,
    chunks: u32,
    written_rows: u64,
    deduplicated_chunks: u32,
    unverified_chunks: u32,
    retries: u32,
    format: &'static str,
}

fn receipt(r: Receipt) -> NativeReceipt {
    NativeReceipt {
        rows: r.rows,
        chunks: r.chunks,
        written_rows: r.written_rows,
        deduplicated_chunks: r.deduplicated_chunks,
        unverified_chunks: r.unverified_chunks,
        retries: r.retries,
        format: match r.format {
            InsertFormat::Native => "Native",
            InsertFormat::JsonEachRow => "JSONEachRow",
        },
    }
}

/// One Python value as a sink value: exact types only, nothing coerced.
fn to_value(
    py: Python<'_>,
    v: &Bound<'_, PyAny>,
    dumps: &Bound<'_, PyAny>,
) -> Result<JsonValue, String> {
    if v.is_none() {
        return Ok(JsonValue::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(JsonValue::Bool(b.is_true()));
    }
    if v.is_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            return Ok(JsonValue::Int(i));
        }
        if let Ok(u) = v.extract::<u64>() {
            return Ok(JsonValue::Uint(u));
        }
        return Err("an integer outside the range of Int64 and UInt64".into());
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(JsonValue::Float(f.value()));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(JsonValue::Text(
            s.to_str()
                .map_err(|_| "a str that is not valid UTF-8 (a lone surrogate)")?
                .to_string(),
        ));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(JsonValue::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        return Ok(JsonValue::Bytes(b.to_vec()));
    }
    if v.is_instance_of::<PyDict>() || v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>()
    {
        let text = dumps
            .call1((v,))
            .and_then(|t| t.extract::<String>())
            .map_err(|e| format!("a value that is not JSON ({})", e.value(py)))?;
        return Ok(JsonValue::Json(text));
    }
    if let Some(value) = std_value(v)? {
        return Ok(value);
    }
    let type_name = v
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(format!(
        "a value of type {type_name} (give None, bool, int, float, str, bytes, datetime, date, time, Decimal, UUID, IPv4Address, IPv6Address, or a dict/list for JSON)"
    ))
}

/// The standard library's value types that clickhouse-connect takes, imported once.
struct StdTypes {
    datetime: Py<PyAny>,
    date: Py<PyAny>,
    time: Py<PyAny>,
    decimal: Py<PyAny>,
    uuid: Py<PyAny>,
    ipv4: Py<PyAny>,
    ipv6: Py<PyAny>,
    utc: Py<PyAny>,
}

static STD_TYPES: PyOnceLock<StdTypes> = PyOnceLock::new();

fn std_types(py: Python<'_>) -> PyResult<&StdTypes> {
    STD_TYPES.get_or_try_init(py, || {
        let attr = |module: &str, name: &str| -> PyResult<Py<PyAny>> {
            Ok(py.import(module)?.getattr(name)?.unbind())
        };
        Ok(StdTypes {
            datetime: attr("datetime", "datetime")?,
            date: attr("datetime", "date")?,
            time: attr("datetime", "time")?,
            decimal: attr("decimal", "Decimal")?,
            uuid: attr("uuid", "UUID")?,
            ipv4: attr("ipaddress", "IPv4Address")?,
            ipv6: attr("ipaddress", "IPv6Address")?,
            utc: py
                .import("datetime")?
                .getattr("timezone")?
                .getattr("utc")?
                .unbind(),
        })
    })
}

/// A value of a standard library type as the JSON value that means exactly it under the
/// component's rules for its column's type (docs/python.md, "Values"), which then reads it
/// as it reads any JSON (no second set of rules here):
/// - `datetime`: its text, `YYYY-MM-DD hh:mm:ss[.ffffff]`, read as a wall-clock time in the
///   column's zone; an aware one with its offset (`+hh:mm`), read as that instant (an offset
///   with seconds, which that text cannot hold, is given in UTC);
/// - `date` (`YYYY-MM-DD`), `time` (`hh:mm:ss[.ffffff]`), `UUID`, `IPv4Address` and
///   `IPv6Address`: their text;
/// - `Decimal`: its digits as a JSON number (never through a float); NaN and infinities are
///   refused.
///
/// `None`: not one of these types.
fn std_value(v: &Bound<'_, PyAny>) -> Result<Option<JsonValue>, String> {
    let py = v.py();
    let types = std_types(py).map_err(|e| e.to_string())?;
    let is = |t: &Py<PyAny>| v.is_instance(t.bind(py)).unwrap_or(false);
    let text = |v: &Bound<'_, PyAny>| -> Result<String, String> {
        v.str()
            .and_then(|s| s.to_str().map(str::to_string))
            .map_err(|e| e.to_string())
    };
    // (A datetime is a date too: asked first.)
    if is(&types.datetime) {
        let offset = v.call_method0("utcoffset").map_err(|e| e.to_string())?;
        if !offset.is_none() {
            let seconds: f64 = offset
                .call_method0("total_seconds")
                .and_then(|s| s.extract())
                .map_err(|e| e.to_string())?;
            if seconds % 60.0 != 0.0 {
                let utc = v
                    .call_method1("astimezone", (types.utc.bind(py),))
                    .map_err(|e| format!("a datetime that has no UTC time ({e})"))?;
                return Ok(Some(JsonValue::Text(text(&utc)?)));
            }
        }
        return Ok(Some(JsonValue::Text(text(v)?)));
    }
    if is(&types.decimal) {
        let finite = v
            .call_method0("is_finite")
            .and_then(|f| f.is_truthy())
            .map_err(|e| e.to_string())?;
        if !finite {
            return Err("a Decimal that is not a finite number (NaN or an infinity)".into());
        }
        return Ok(Some(JsonValue::Json(text(v)?)));
    }
    if [
        &types.date,
        &types.time,
        &types.uuid,
        &types.ipv4,
        &types.ipv6,
    ]
    .into_iter()
    .any(is)
    {
        return Ok(Some(JsonValue::Text(text(v)?)));
    }
    Ok(None)
}

/// The WIT value of a sink value.
fn typed(value: JsonValue) -> Value {
    match value {
        JsonValue::Null => Value::Null,
        JsonValue::Bool(b) => Value::Boolean(b),
        JsonValue::Int(i) => Value::Int(i),
        JsonValue::Uint(u) => Value::Uint(u),
        JsonValue::Float(f) => Value::Float(f),
        JsonValue::Text(t) => Value::Text(t),
        JsonValue::Json(j) => Value::Json(j),
        JsonValue::Bytes(b) => Value::Bytes(b),
    }
}

/// Rows as `send` gives them to the component.
enum Rows {
    /// JSONEachRow, one line per row, keys in each dict's order (`send-json`).
    Json(Vec<u8>),
    /// Typed rows (`send`): only for rows with a bytes value that is not UTF-8, which JSON
    /// text cannot carry.
    Typed(Vec<Vec<(String, Value)>>),
}

/// The rows of a `send`, as an iterator, and the `json.dumps` its values that only Python can
/// write go through.
fn rows_and_dumps<'py>(
    py: Python<'py>,
    rows: &Bound<'py, PyAny>,
) -> Result<(Bound<'py, PyAny>, Bound<'py, pyo3::types::PyIterator>), String> {
    let dumps = py
        .import("clickhouse_component.errors")
        .and_then(|m| m.getattr("_json_dumps"))
        .map_err(|e| e.to_string())?;
    let iter = rows
        .try_iter()
        .map_err(|_| "rows must be a list of dicts".to_string())?;
    Ok((dumps, iter))
}

/// Calls `each(index, key, value)` for every value of every row, in order.
fn each_value(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
    mut each: impl FnMut(usize, Option<(String, JsonValue)>) -> Result<bool, String>,
) -> Result<bool, String> {
    let (dumps, iter) = rows_and_dumps(py, rows)?;
    for (index, row) in (1..).zip(iter) {
        let row = row.map_err(|e| e.to_string())?;
        let Ok(dict) = row.cast::<PyDict>() else {
            return Err(format!("row {index} is not a dict"));
        };
        for (k, v) in dict.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(format!("row {index} has a key that is not a str"));
            };
            let key = key
                .to_str()
                .map_err(|_| format!("row {index} has a key that is not valid UTF-8"))?
                .to_string();
            let value = to_value(py, &v, &dumps)
                .map_err(|m| format!("row {index}, column '{}': {m}", key.escape_debug()))?;
            if !each(index, Some((key, value)))? {
                return Ok(false);
            }
        }
        // The end of the row.
        if !each(index, None)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One value of a row into `json`: the exact built-in types (nearly every value) straight
/// from the Python object, anything else through [`to_value`]; the same JSON as
/// `encode::write_value` writes. `Ok(false)`: a bytes value that is not UTF-8, which JSON text
/// cannot carry.
fn write_json_value(
    py: Python<'_>,
    json: &mut Vec<u8>,
    v: &Bound<'_, PyAny>,
    dumps: &Bound<'_, PyAny>,
) -> Result<bool, String> {
    if v.is_exact_instance_of::<PyString>() {
        let s = v.cast::<PyString>().map_err(|e| e.to_string())?;
        let text = s
            .to_str()
            .map_err(|_| "a str that is not valid UTF-8 (a lone surrogate)")?;
        encode::write_json_string(json, text.as_bytes());
        return Ok(true);
    }
    if v.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            json.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            return Ok(true);
        }
    }
    if v.is_exact_instance_of::<PyList>()
        || v.is_exact_instance_of::<PyTuple>()
        || v.is_exact_instance_of::<PyDict>()
    {
        let start = json.len();
        if write_json_nested(json, v, 0) {
            return Ok(true);
        }
        // Something `json.dumps` writes its own way (a big int, NaN, a key that is not a
        // str, a deep or circular value): it writes the whole value, or names the problem.
        json.truncate(start);
    }
    let value = to_value(py, v, dumps)?;
    if matches!(&value, JsonValue::Bytes(b) if std::str::from_utf8(b).is_err()) {
        return Ok(false);
    }
    encode::write_value(json, &value)?;
    Ok(true)
}

/// A list, tuple or dict (a JSON column's value, an array's elements, a String column's JSON
/// text) as JSON, written from the exact built-in types byte for byte as `json.dumps` writes
/// them (the component's string escapes are the same but for backspace, form feed and DEL).
/// `false`: a value or key it leaves to `json.dumps` (floats, whose shortest forms differ,
/// strings with those three characters, big ints, other types); `json` then holds a partial
/// value the caller removes.
fn write_json_nested(json: &mut Vec<u8>, v: &Bound<'_, PyAny>, depth: usize) -> bool {
    if depth > 32 {
        return false;
    }
    if v.is_none() {
        json.extend_from_slice(b"null");
    } else if v.is_exact_instance_of::<PyBool>() {
        json.extend_from_slice(if v.is_truthy().unwrap_or(false) {
            b"true"
        } else {
            b"false"
        });
    } else if v.is_exact_instance_of::<PyString>() {
        let Some(text) = v.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) else {
            return false;
        };
        if text.bytes().any(|b| matches!(b, 0x08 | 0x0c | 0x7f)) {
            return false;
        }
        encode::write_json_string(json, text.as_bytes());
    } else if v.is_exact_instance_of::<PyInt>() {
        let Ok(i) = v.extract::<i64>() else {
            return false;
        };
        json.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
    } else if v.is_exact_instance_of::<PyList>() || v.is_exact_instance_of::<PyTuple>() {
        let Ok(items) = v.try_iter() else {
            return false;
        };
        json.push(b'[');
        for (n, item) in items.enumerate() {
            if n > 0 {
                json.push(b',');
            }
            let Ok(item) = item else {
                return false;
            };
            if !write_json_nested(json, &item, depth + 1) {
                return false;
            }
        }
        json.push(b']');
    } else if let Ok(dict) = v.cast_exact::<PyDict>() {
        json.push(b'{');
        for (n, (key, value)) in dict.iter().enumerate() {
            if n > 0 {
                json.push(b',');
            }
            if !key.is_exact_instance_of::<PyString>() || !write_json_nested(json, &key, depth) {
                return false;
            }
            json.push(b':');
            if !write_json_nested(json, &value, depth + 1) {
                return false;
            }
        }
        json.push(b'}');
    } else {
        // A standard library value (a datetime in a list, say): its JSON, as a row's.
        match std_value(v) {
            Ok(Some(value)) => return encode::write_value(json, &value).is_ok(),
            _ => return false,
        }
    }
    true
}

/// The JSONEachRow text of `rows` (a list of dicts), one line per row, keys in each dict's
/// order, written straight from the Python objects: no Rust string per key or value, and a
/// key that is the same object as the previous row's key in its place (dicts built by the
/// same code share their key strings) is written from the previous row's escaped bytes.
/// `Ok(None)`: a bytes value is not UTF-8.
fn write_json_rows(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
) -> Result<Option<(Vec<u8>, usize)>, String> {
    let (dumps, iter) = rows_and_dumps(py, rows)?;
    let mut json = Vec::new();
    // The previous row's keys, in order, held (so their addresses stay theirs), with their
    // JSON (`"key":`).
    let mut keys: Vec<(Bound<'_, PyAny>, Vec<u8>)> = Vec::new();
    let mut count = 0;
    for (index, row) in (1..).zip(iter) {
        let row = row.map_err(|e| e.to_string())?;
        let Ok(dict) = row.cast::<PyDict>() else {
            return Err(format!("row {index} is not a dict"));
        };
        json.push(b'{');
        for (place, (k, v)) in dict.iter().enumerate() {
            if place > 0 {
                json.push(b',');
            }
            match keys.get(place) {
                Some((key, text)) if key.as_ptr() == k.as_ptr() => json.extend_from_slice(text),
                _ => {
                    let Ok(key) = k.cast::<PyString>() else {
                        return Err(format!("row {index} has a key that is not a str"));
                    };
                    let key = key
                        .to_str()
                        .map_err(|_| format!("row {index} has a key that is not valid UTF-8"))?;
                    let mut text = Vec::with_capacity(key.len() + 3);
                    encode::write_json_string(&mut text, key.as_bytes());
                    text.push(b':');
                    json.extend_from_slice(&text);
                    keys.truncate(place);
                    keys.push((k.clone(), text));
                }
            }
            let written = write_json_value(py, &mut json, &v, &dumps).map_err(|m| {
                let key = k
                    .cast::<PyString>()
                    .map(|k| k.to_string())
                    .unwrap_or_default();
                format!("row {index}, column '{}': {m}", key.escape_debug())
            })?;
            if !written {
                return Ok(None);
            }
        }
        json.extend_from_slice(b"}\n");
        count = index;
    }
    Ok(Some((json, count)))
}

/// The rows of a `send`: JSONEachRow built here ([`write_json_rows`]; the component's typed
/// path lowers every string into guest memory at once: 1,000,000 five-column rows needed more
/// than its 1 GiB, and took 3x the time of the same rows as JSON), with the same JSON per value
/// as the typed path writes (`encode::write_value`); typed rows when a bytes value is not
/// UTF-8. With the number of rows.
fn to_rows(py: Python<'_>, rows: &Bound<'_, PyAny>) -> Result<(Rows, usize), String> {
    // Rows sent typed are walked a second time: an iterator is read once, into a list (of the
    // same dicts), so the second walk sees the rows the first consumed.
    let listed;
    let rows = if rows.is_instance_of::<PyList>() || rows.is_instance_of::<PyTuple>() {
        rows
    } else {
        let not_rows = |_| "rows must be a list of dicts".to_string();
        let items = rows
            .try_iter()
            .map_err(not_rows)?
            .collect::<PyResult<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        listed = PyList::new(py, items)
            .map_err(|e| e.to_string())?
            .into_any();
        &listed
    };
    if let Some((json, count)) = write_json_rows(py, rows)? {
        return Ok((Rows::Json(json), count));
    }
    let mut out: Vec<Vec<(String, Value)>> = Vec::new();
    let mut row = Vec::new();
    each_value(py, rows, |_, value| {
        match value {
            Some((key, value)) => row.push((key, typed(value))),
            None => out.push(std::mem::take(&mut row)),
        }
        Ok(true)
    })?;
    let count = out.len();
    Ok((Rows::Typed(out), count))
}

/// Rows converted for `send` at once and sent later (`prepare_rows`): what is sent is the
/// rows as they were when they were converted, the lists and dicts inside them too, so a
/// caller may change or reuse them meanwhile without a copy of its own. onestep's sink
/// converts each `send`'s rows before it waits for the send before it (a shallow copy of each
/// dict there cost more than the conversion, through Python's garbage collector).
#[pyclass(frozen, module = "clickhouse_component._native")]
struct PreparedRows {
    rows: Arc<Rows>,
    count: usize,
}

#[pymethods]
impl PreparedRows {
    /// The number of rows.
    fn __len__(&self) -> usize {
        self.count
    }
}

/// Converts rows (a list of dicts) as `send` does, to send later (`PreparedRows`).
#[pyfunction]
fn prepare_rows(py: Python<'_>, rows: &Bound<'_, PyAny>) -> PyResult<PreparedRows> {
    let (rows, count) = to_rows(py, rows).map_err(|m| invalid(py, m))?;
    Ok(PreparedRows {
        rows: Arc::new(rows),
        count,
    })
}

/// A refused row of a `send` as the caller gave it: the component names a `send-json` line
/// `line N` (from 1); the rows of a list are `row N`, as the typed path names them.
fn as_rows(e: CallError) -> CallError {
    match e {
        CallError::Component(mut e) => {
            if let Some(rest) = e.message.strip_prefix("line ") {
                e.message = format!("row {rest}");
            }
            CallError::Component(e)
        }
        other => other,
    }
}

/// An open table sink (`sink` resource) in an instance of its own.
#[pyclass(frozen, module = "clickhouse_component._native")]
struct NativeSink {
    session: Session,
    sink: SinkHandle,
    redactor: Arc<Redactor>,
}

#[pymethods]
impl NativeSink {
    #[new]
    #[pyo3(signature = (connection, table, columns=None, batch_size=None, settings=Vec::new(), dedup=None, retries=None, compression=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        connection: &Connection,
        table: String,
        columns: Option<Vec<String>>,
        batch_size: Option<u32>,
        settings: Vec<(String, String)>,
        dedup: Option<bool>,
        retries: Option<u32>,
        compression: Option<String>,
    ) -> PyResult<NativeSink> {
        let compression = compression
            .map(|c| c.parse::<CoreCompression>().map(Compression::from))
            .transpose()
            .map_err(|e| invalid(py, format!("compression: {}", e.message)))?;
        let options = SinkOptions {
            table,
            columns,
            batch_size,
            settings,
            dedup,
            retries,
            compression,
        };
        let session = new_session(py, connection)?;
        let conn = connection.options.clone();
        let sink = on_instance!(py, &session, &connection.redactor, |i| i
            .open_sink(&conn, &options)
            .await)?;
        Ok(NativeSink {
            session,
            sink,
            redactor: connection.redactor.clone(),
        })
    }

    /// Makes the sink resumable (WIT `resume`): its checkpoint under `checkpoint` in the
    /// state store at `database`.`table` (the store's defaults otherwise); returns the
    /// position of the last acknowledged send.
    #[pyo3(signature = (checkpoint, database=None, table=None, cluster=None))]
    fn resume(
        &self,
        py: Python<'_>,
        checkpoint: String,
        database: Option<String>,
        table: Option<String>,
        cluster: Option<String>,
    ) -> PyResult<Option<String>> {
        let s = self.sink;
        let store = StoreOptions {
            database,
            table,
            cluster,
            ..Default::default()
        };
        on_instance!(py, self, |i| i.sink_resume(s, &checkpoint, &store).await)
    }

    /// Sends rows (a list of dicts): validated, chunked, each chunk acknowledged; with a
    /// position, through the checkpoint (`send-at`).
    #[pyo3(signature = (rows, position=None))]
    fn send(
        &self,
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        position: Option<String>,
    ) -> PyResult<NativeReceipt> {
        let rows = match rows.cast::<PreparedRows>() {
            Ok(prepared) => Arc::clone(&prepared.get().rows),
            Err(_) => Arc::new(to_rows(py, rows).map_err(|m| invalid(py, m))?.0),
        };
        let s = self.sink;
        on_instance!(py, self, |i| {
            let at = position.as_deref();
            Ok(receipt(match (&*rows, at) {
                (Rows::Json(json), None) => i.sink_send_json(s, json).await.map_err(as_rows)?,
                (Rows::Json(json), Some(at)) => {
                    i.sink_send_json_at(s, json, at).await.map_err(as_rows)?
                }
                (Rows::Typed(rows), None) => i.sink_send(s, rows).await?,
                (Rows::Typed(rows), Some(at)) => i.sink_send_at(s, rows, at).await?,
            }))
        })
    }

    /// Sends NDJSON or a JSON array of objects, as bytes; with a position, through the
    /// checkpoint (`send-json-at`).
    #[pyo3(signature = (data, position=None))]
    fn send_json(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        position: Option<String>,
    ) -> PyResult<NativeReceipt> {
        let s = self.sink;
        if let Ok(bytes) = data.cast::<PyBytes>() {
            // Immutable and kept alive by the caller for the whole call: no copy.
            let data: &[u8] = bytes.as_bytes();
            return call_with(py, &self.session, &self.redactor, data, move |i, data| {
                Box::pin(async move {
                    Ok(receipt(match position.as_deref() {
                        None => i.sink_send_json(s, data).await?,
                        Some(at) => i.sink_send_json_at(s, data, at).await?,
                    }))
                })
            });
        }
        let data: Vec<u8> = if let Ok(b) = data.cast::<PyByteArray>() {
            b.to_vec()
        } else if let Ok(m) = data.extract::<Vec<u8>>() {
            m
        } else {
            return Err(invalid(
                py,
                "send_json takes bytes (UTF-8 NDJSON or a JSON array)",
            ));
        };
        on_instance!(py, self, |i| {
            Ok(receipt(match position.as_deref() {
                None => i.sink_send_json(s, &data).await?,
                Some(at) => i.sink_send_json_at(s, &data, at).await?,
            }))
        })
    }

    /// Closes the sink (later sends fail with invalid-input); idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let alive = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !alive {
            return Ok(());
        }
        let s = self.sink;
        on_instance!(py, self, |i| i.sink_close(s).await)
    }
}

/// Loads the component now (instead of at the first call): (`compiled` | `cache-hit` | ...,
/// milliseconds).
fn warm_up(py: Python<'_>) -> PyResult<(String, f64)> {
    let report = py.detach(|| shared().map(|s| s.runtime.load_report().clone()));
    let report = report.map_err(|f| f.into_py(py))?;
    Ok((
        match report.kind {
            LoadKind::Compiled => "compiled",
            LoadKind::CompiledAndCached => "compiled-and-cached",
            LoadKind::CacheHit => "cache-hit",
        }
        .to_string(),
        report.duration.as_secs_f64() * 1e3,
    ))
}

#[pyfunction(name = "warm_up")]
fn py_warm_up(py: Python<'_>) -> PyResult<(String, f64)> {
    warm_up(py)
}

/// `os.register_at_fork(after_in_child=...)`: a child forked after the runtime started can
/// use none of it.
#[pyfunction]
fn _after_fork_in_child() {
    if SHARED.get().is_some() {
        FORKED_AFTER_START.store(true, Ordering::SeqCst);
    }
}

/// Runs the component's Singer target (`target ARGS...`: the console script
/// `target-clickhouse-component`), stdin and stdout the process's own, with the allow-list of
/// its config's connection (and `allowed_hosts`) and read access to the directories of its
/// `--config` and `--input` files. Returns the exit code; the target prints its own errors.
#[pyfunction]
fn run_target(py: Python<'_>, args: Vec<String>) -> PyResult<i32> {
    use clap::Parser;
    use clickhouse_component::host_api::cli::{Cli, Command};
    use clickhouse_component_host::command_setup::{readable_dirs, TargetHosting};
    let argv: Vec<String> = [
        "target-clickhouse-component".to_string(),
        "target".to_string(),
    ]
    .into_iter()
    .chain(args)
    .collect();
    let fail = |message: String| -> PyResult<i32> {
        eprintln!("error (invalid-input): {message}");
        Ok(ErrorKind::InvalidInput.exit_code())
    };
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            eprint!("{e}");
            return Ok(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let Command::Target(target) = &cli.command else {
        return fail("not a target command".into());
    };
    let (allow, network) = match &target.config {
        Some(path) => match TargetHosting::read(path) {
            Ok(hosting) => (hosting.allow, hosting.network),
            Err(e) => return fail(e.message),
        },
        None => (AllowList::default(), None),
    };
    let files = [&target.config, &target.input].into_iter().flatten();
    let readable = match readable_dirs(files.map(|f| f.as_path())) {
        Ok(readable) => readable,
        Err(e) => return fail(e.message),
    };
    let result = py.detach(move || -> Result<i32, String> {
        let shared = shared().map_err(|f| f.message)?;
        let runtime = match network {
            Some(network) => shared.runtime.clone().with_network(network),
            None => shared.runtime.clone(),
        };
        shared.tokio.block_on(async move {
            let mut instance = runtime
                .instantiate_command(allow, &argv, &[], CommandInput::Inherit, None, &readable)
                .await
                .map_err(|e| runner_message(&e))?;
            instance.run_command().await.map_err(|e| e.to_string())
        })
    });
    match result {
        Ok(code) => Ok(code),
        Err(message) => {
            eprintln!("error (runner): {message}");
            Ok(1)
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_target, m)?)?;
    m.add_class::<Connection>()?;
    m.add_class::<NativeStore>()?;
    m.add_class::<NativeLock>()?;
    m.add_class::<NativeSink>()?;
    m.add_class::<NativeState>()?;
    m.add_class::<NativeReceipt>()?;
    m.add_class::<NativeServerInfo>()?;
    m.add_class::<PreparedRows>()?;
    m.add_function(wrap_pyfunction!(prepare_rows, m)?)?;
    m.add_function(wrap_pyfunction!(py_warm_up, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add(
        "WASMTIME_VERSION",
        clickhouse_component_host::component::WASMTIME_VERSION,
    )?;
    Ok(())
}
