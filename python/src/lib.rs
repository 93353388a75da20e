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

mod connection;
mod errors;
mod rows;
mod runtime;
mod sink;
mod store;

use std::sync::atomic::Ordering;

use crate::connection::*;
use crate::rows::*;
use crate::runtime::*;
use crate::sink::*;
use crate::store::*;
use clickhouse_component::host_api::ErrorKind;
use clickhouse_component_host::{runner_message, AllowList, CommandInput, LoadKind};
use pyo3::prelude::*;

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
/// `--config` and `--input` files and to its `batch_dirs`. Returns the exit code; the target prints its own errors.
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
    let (allow, network, batch_dirs) = match &target.config {
        Some(path) => match TargetHosting::read(path) {
            Ok(hosting) => (hosting.allow, hosting.network, hosting.readable),
            Err(e) => return fail(e.message),
        },
        None => (AllowList::default(), None, Vec::new()),
    };
    let files = [&target.config, &target.input].into_iter().flatten();
    let mut readable = match readable_dirs(files.map(|f| f.as_path())) {
        Ok(readable) => readable,
        Err(e) => return fail(e.message),
    };
    readable.extend(batch_dirs);
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
        clickhouse_component_host::WASMTIME_VERSION,
    )?;
    Ok(())
}
