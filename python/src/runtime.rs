//! The process's tokio runtime and compiled component, and calls into an instance with the
//! GIL released.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::connection::*;
use crate::errors::*;
use clickhouse_component::host_api::Redactor;
use clickhouse_component_host::{
    runner_message, CachePolicy, CallError, ComponentSource, Instance, Limits, Runtime,
};
use pyo3::prelude::*;

/// The process's tokio runtime and compiled component, made once.
pub(crate) struct Shared {
    pub(crate) tokio: tokio::runtime::Runtime,
    /// The runtime of connections without a call timeout: its guest code carries no epoch
    /// checks (about 30% faster typed reads). Each call runs on its Python thread
    /// (`block_on`), the connections on the tokio workers, so a busy call holds up no task.
    pub(crate) runtime: Runtime,
    /// The runtime of connections with a call timeout, made at the first such connection.
    timed: OnceLock<Result<Runtime, String>>,
}

impl Shared {
    /// The runtime for instances with `limits`: one that can interrupt a running call when
    /// they bound calls in time.
    fn runtime_for(&self, limits: &Limits) -> Result<&Runtime, Failure> {
        if limits.call_timeout.is_none() {
            return Ok(&self.runtime);
        }
        self.timed
            .get_or_init(|| {
                Runtime::new(&ComponentSource::Embedded, &CachePolicy::Default)
                    .map_err(|e| format!("cannot load the component: {}", runner_message(&e)))
            })
            .as_ref()
            .map_err(|e| Failure::runner(e.clone()))
    }
}

pub(crate) static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

/// Set in a child forked after the runtime started: its threads (tokio's workers, the epoch
/// ticker) are not in the child, so a call would wait for them for ever.
pub(crate) static FORKED_AFTER_START: AtomicBool = AtomicBool::new(false);

/// The shared runtime, made at the first call (compiling the component, or loading the
/// precompiled copy from the cache).
pub(crate) fn shared() -> Result<&'static Shared, Failure> {
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
        let runtime =
            Runtime::new_uninterruptible(&ComponentSource::Embedded, &CachePolicy::Default)
                .map_err(|e| format!("cannot load the component: {}", runner_message(&e)))?;
        Ok(Shared {
            tokio,
            runtime,
            timed: OnceLock::new(),
        })
    });
    shared.as_ref().map_err(|e| Failure::runner(e.clone()))
}

pub(crate) type CallFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CallError>> + Send + 'a>>;

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
pub(crate) use on_instance;

/// An instance of the component shared by the threads using one Python object; `None` once a
/// runner failure (trap, deadline) has stopped it.
pub(crate) type Session = Arc<Mutex<Option<Instance>>>;

/// Runs `f` on the session's instance with the GIL released; a runner failure retires the
/// instance (wasmtime forbids using a store after a trap), a panic becomes a runner failure.
pub(crate) fn call<T, F>(
    py: Python<'_>,
    session: &Session,
    redactor: &Redactor,
    f: F,
) -> PyResult<T>
where
    T: Send,
    F: for<'a> FnOnce(&'a mut Instance) -> CallFuture<'a, T> + Send,
{
    call_with(py, session, redactor, &[], move |i, _| f(i))
}

/// [`call`], lending the future `data` (bytes the caller keeps alive) as long as the instance.
pub(crate) fn call_with<T, F>(
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
pub(crate) fn new_session(py: Python<'_>, connection: &Connection) -> PyResult<Session> {
    let runtime_network = connection.network.clone();
    let limits = connection.limits;
    let allow = connection.allow.clone();
    let redactor = connection.redactor.clone();
    let result = py.detach(move || -> Result<Instance, Failure> {
        let shared = shared()?;
        let runtime = shared
            .runtime_for(&limits)?
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
