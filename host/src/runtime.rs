//! The embedding API: a [`Runtime`] (engine + compiled component + linker, loaded once, shared
//! across threads) makes [`Instance`]s (one store each: per call or per session, as the embedder
//! chooses). Outgoing HTTP leaves through the instance's pool, which checks the allow-list.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clickhouse_component::host_api::OPERATION_HEADER;
use clickhouse_component::host_api::{ConnectionOptions, Endpoint, Error, ErrorKind, ServerError};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use crate::allow_list::AllowList;
use crate::bindings::{
    Connection, Library, LibraryIndices, Receipt, ServerInfo, SinkOptions, State, StoreOptions,
    Value, WitError, WitErrorKind,
};
use crate::component::{self, CachePolicy, ComponentSource, LoadReport};
use crate::limits::{
    self, CallDeadline, CallDeadlineExceeded, GuestMemory, Limits, MemoryLimitExceeded,
};
use crate::pool::{ConnectionPool, Network};
use wasmtime::component::{ComponentExportIndex, InstancePre, ResourceAny, TypedFunc};

/// The export command mode runs (the full component has it; the library component does not).
const RUN_INTERFACE: &str = "wasi:cli/run@0.2.12";

/// The variable a command-mode instance reads its memory limit from (MiB).
const MEMORY_LIMIT_VAR: &str = "CLICKHOUSE_MAX_MEMORY_MIB";

/// Engine, compiled component and linker: load once, share (it is cheap to clone). Each
/// instance it makes gets its [`Limits`].
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
    limits: Limits,
    network: Network,
}

struct Inner {
    pre: InstancePre<HostState>,
    /// Where the library world's exports are in the component.
    library: LibraryIndices,
    /// The component's `wasi:cli/run` export (`run`), when it has one: the full component does,
    /// the library component does not.
    run: Option<ComponentExportIndex>,
    report: LoadReport,
    /// Whether running guest code can be interrupted ([`Runtime::new_uninterruptible`]).
    interruptible: bool,
}

impl Runtime {
    /// Loads the component (from the cache when possible) and links WASI and wasi:http.
    /// Calls can be bounded in time ([`Limits::call_timeout`]), and a running call yields to
    /// other tasks every 50 ms.
    pub fn new(source: &ComponentSource, cache: &CachePolicy) -> anyhow::Result<Runtime> {
        Runtime::load(source, cache, true)
    }

    /// [`Runtime::new`] whose running guest code is never interrupted: it is compiled without
    /// epoch checks, which cost the sink's typed reads about 30% of their speed
    /// (docs/benchmarks.md). So a call cannot be bounded in time (an instance with a
    /// [`Limits::call_timeout`] is refused) and does not yield to other tasks while it computes:
    /// for a caller that runs its calls where nothing else waits on that thread, as the CLI
    /// does (`block_on` on its main thread; the host's connections run on the tokio runtime's
    /// workers). Requests keep their deadlines ([`RequestDeadline`]).
    pub fn new_uninterruptible(
        source: &ComponentSource,
        cache: &CachePolicy,
    ) -> anyhow::Result<Runtime> {
        Runtime::load(source, cache, false)
    }

    fn load(
        source: &ComponentSource,
        cache: &CachePolicy,
        interruptible: bool,
    ) -> anyhow::Result<Runtime> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        // Calls can be bounded in time, and a running call yields to other tasks (see
        // `instantiate_with`). The precompiled cache keys on the engine's settings, so either
        // kind of runtime finds its own compiled component.
        config.epoch_interruption(interruptible);
        // For profiling the guest with `perf record` (docs/measurements.md): names the
        // compiled functions in /tmp/perf-PID.map.
        if std::env::var("CLICKHOUSE_WASM_PROFILER").as_deref() == Ok("perfmap") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config)?;
        if interruptible {
            limits::start_epoch_ticker(&engine);
        }
        let (component, report) = component::load(&engine, source, cache)?;
        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        let pre = linker.instantiate_pre(&component)?;
        let library = LibraryIndices::new(&pre)
            .map_err(anyhow::Error::from)
            .context("the component does not implement the clickhouse:connector library world")?;
        let run = component
            .get_export_index(None, RUN_INTERFACE)
            .and_then(|run| component.get_export_index(Some(&run), "run"));
        tracing::debug!(kind = ?report.kind, ms = report.duration.as_secs_f64() * 1e3, "component loaded");
        Ok(Runtime {
            inner: Arc::new(Inner {
                pre,
                library,
                run,
                report,
                interruptible,
            }),
            limits: Limits::default(),
            network: Network::default(),
        })
    }

    /// The same runtime, making instances with these limits.
    pub fn with_limits(mut self, limits: Limits) -> Runtime {
        self.limits = limits;
        self
    }

    /// The same runtime, its instances connecting through `network` (TLS trust: system roots
    /// plus an optional CA file; the resolver).
    pub fn with_network(mut self, network: Network) -> Runtime {
        self.network = network;
        self
    }

    /// How its instances connect.
    pub fn network(&self) -> &Network {
        &self.network
    }

    /// The limits of the instances it makes.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// How loading went (compiled or cache hit, and how long it took).
    pub fn load_report(&self) -> &LoadReport {
        &self.inner.report
    }

    /// A fresh instance whose outgoing HTTP may reach only `allow`.
    pub async fn instantiate(&self, allow: AllowList) -> anyhow::Result<Instance> {
        self.instantiate_with(allow, WasiCtx::builder().inherit_stderr().build())
            .await
    }

    /// A fresh instance set up to run as a command ([`Instance::run_command`]): these
    /// arguments (the first is the program name) and environment, stdin from `stdin`, stdout
    /// into `stdout` (or the host's own stdout), stderr inherited, and the directories in
    /// `readable` preopened read-only (nothing else of the filesystem). The environment's
    /// `CLICKHOUSE_MAX_MEMORY_MIB` is always this runtime's memory limit, in MiB (the
    /// command line's `sink` keeps at most a quarter of it of a file's first pass).
    pub async fn instantiate_command(
        &self,
        allow: AllowList,
        args: &[String],
        env: &[(String, String)],
        stdin: CommandInput,
        stdout: Option<&CapturedOutput>,
        readable: &[ReadableDir],
    ) -> anyhow::Result<Instance> {
        let mut wasi = WasiCtx::builder();
        let env: Vec<(String, String)> = env
            .iter()
            .filter(|(k, _)| k != MEMORY_LIMIT_VAR)
            .cloned()
            .chain([(
                MEMORY_LIMIT_VAR.to_string(),
                (self.limits.max_memory_bytes >> 20).to_string(),
            )])
            .collect();
        wasi.args(args).envs(&env).inherit_stderr();
        // A file is read 64 KiB per call (wasmtime-wasi's cap); by default each call is a
        // `spawn_blocking` task, and the hand-off between threads cost 12-19% of the CLI's CPU
        // on a 175 MB file (2,674 reads, 18,380 futex calls; docs/benchmarks.md). The
        // preopened files are local and read-only: a read blocks this thread for microseconds.
        wasi.allow_blocking_current_thread(true);
        for dir in readable {
            wasi.preopened_dir(&dir.host, &dir.guest, wasmtime_wasi::FsPerms::ReadOnly)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", dir.host.display()))?;
        }
        match stdin {
            CommandInput::Inherit => {
                wasi.inherit_stdin();
            }
            CommandInput::File(file) => {
                wasi.stdin(wasmtime_wasi::cli::InputFile::new(file));
            }
            CommandInput::Bytes(bytes) => {
                wasi.stdin(wasmtime_wasi::p2::pipe::MemoryInputPipe::new(bytes));
            }
        }
        match stdout {
            Some(captured) => {
                wasi.stdout(captured.0.clone());
            }
            None => {
                wasi.inherit_stdout();
            }
        }
        self.instantiate_with(allow, wasi.build()).await
    }

    async fn instantiate_with(&self, allow: AllowList, wasi: WasiCtx) -> anyhow::Result<Instance> {
        let limits = self.limits;
        if !self.inner.interruptible && limits.call_timeout.is_some() {
            anyhow::bail!(
                "a call timeout needs a runtime that can interrupt a running call (Runtime::new, not Runtime::new_uninterruptible)"
            );
        }
        let allow = Arc::new(allow);
        let state = HostState {
            table: ResourceTable::new(),
            wasi,
            http: WasiHttpCtx::new(),
            memory: GuestMemory {
                limit: limits.max_memory_bytes,
                refused: false,
            },
            limits,
            hooks: Hooks {
                // Per instance: its connections are driven by the runtime that uses it.
                pool: self.network.pool(allow, &limits),
                deadline: RequestDeadline::default(),
                call: CallDeadline::default(),
            },
        };
        let mut store = Store::new(self.inner.pre.engine(), state);
        store.limiter(|state| &mut state.memory);
        // At every epoch tick a running call checks its deadline, then yields to other tasks
        // (a busy guest never starves the host's own tasks on the same thread).
        if self.inner.interruptible {
            store.set_epoch_deadline(1);
            store.epoch_deadline_callback(|context| {
                let call = context.data().hooks.call;
                if call.passed() {
                    return Err(CallDeadlineExceeded(call.limit).into());
                }
                Ok(wasmtime::UpdateDeadline::Yield(1))
            });
        }
        let instance = self.inner.pre.instantiate_async(&mut store).await?;
        let connector = self.inner.library.load(&mut store, &instance)?;
        let run = match self.inner.run {
            Some(index) => {
                Some(instance.get_typed_func::<(), (Result<(), ()>,)>(&mut store, index)?)
            }
            None => None,
        };
        Ok(Instance {
            store,
            connector,
            run,
        })
    }
}

/// A host directory a command instance may read (never write), under a name in the guest:
/// the reference CLI gives the component the directory of each FILE argument, under the name
/// the argument uses, so the component opens the file as given (and can read it twice).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadableDir {
    /// The directory on the host.
    pub host: std::path::PathBuf,
    /// Its name in the guest (`.`, `data`, `/srv/in`).
    pub guest: String,
}

/// Where a command instance's standard input comes from.
#[derive(Debug)]
pub enum CommandInput {
    /// The host's own stdin.
    Inherit,
    /// A file (the reference CLI's FILE arguments).
    File(std::fs::File),
    /// These bytes, then the end of the input.
    Bytes(Vec<u8>),
}

/// A command instance's standard output kept in memory, read after the run. A write past
/// `limit` bytes fails in the guest (its stdout is closed), never grows the host's memory.
#[derive(Debug, Clone)]
pub struct CapturedOutput(wasmtime_wasi::p2::pipe::MemoryOutputPipe);

impl CapturedOutput {
    /// An empty capture that holds at most `limit` bytes.
    pub fn new(limit: usize) -> CapturedOutput {
        CapturedOutput(wasmtime_wasi::p2::pipe::MemoryOutputPipe::new(limit))
    }

    /// What the command wrote so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0.contents().to_vec()
    }
}

/// One instance of the component with its own store. Calls on it run one at a time.
pub struct Instance {
    store: Store<HostState>,
    connector: Library,
    /// `wasi:cli/run`, if the component has command mode.
    run: Option<TypedFunc<(), (Result<(), ()>,)>>,
}

/// A deadline for the outgoing requests of one [`Instance`], settable from any task while a call
/// runs: a request started after it fails at once (nothing sent, a connect timeout), and one
/// still waiting for its reply when it comes fails with a read timeout. So a call in progress
/// can be bounded, or cut short, from outside without cancelling it (dropping a call's future
/// would leave the instance unusable).
#[derive(Clone, Debug)]
pub struct RequestDeadline(Arc<tokio::sync::watch::Sender<Option<Instant>>>);

impl Default for RequestDeadline {
    fn default() -> Self {
        RequestDeadline(Arc::new(tokio::sync::watch::channel(None).0))
    }
}

impl RequestDeadline {
    /// Sets (or, with `None`, clears) the deadline.
    pub fn set(&self, deadline: Option<Instant>) {
        self.0.send_replace(deadline);
    }

    /// The deadline now.
    pub fn get(&self) -> Option<Instant> {
        *self.0.borrow()
    }

    /// Completes when the deadline, as set at any moment meanwhile, has come.
    async fn reached(&self) {
        let mut rx = self.0.subscribe();
        loop {
            let deadline = *rx.borrow_and_update();
            match deadline {
                Some(d) => tokio::select! {
                    _ = tokio::time::sleep_until(d.into()) => return,
                    _ = rx.changed() => {}
                },
                // The sender lives as long as `self`: `changed` cannot fail here.
                None => {
                    let _ = rx.changed().await;
                }
            }
        }
    }

    /// `options` with every timeout cut to the time left before this deadline and `also` (the
    /// call's), whichever comes first; `None` if none is left.
    fn bound(
        &self,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        also: Option<Instant>,
    ) -> Option<Option<wasmtime_wasi_http::RequestOptions>> {
        let Some(deadline) = [self.get(), also].into_iter().flatten().min() else {
            return Some(options);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let o = options.unwrap_or_default();
        let cut = |t: Option<std::time::Duration>| Some(t.map_or(left, |t| t.min(left)));
        Some(Some(wasmtime_wasi_http::RequestOptions {
            connect_timeout: cut(o.connect_timeout),
            first_byte_timeout: cut(o.first_byte_timeout),
            between_bytes_timeout: cut(o.between_bytes_timeout),
        }))
    }
}

/// A failed call: the component's classified error, or a failure of the runner (a trap).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The component returned an error.
    #[error("{0}")]
    Component(Error),
    /// The runtime failed (trap, resource misuse).
    #[error("runner failure: {}", runner_message(.0))]
    Runner(anyhow::Error),
}

impl CallError {
    /// The component error's kind, if it is one.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            CallError::Component(e) => Some(e.kind),
            CallError::Runner(_) => None,
        }
    }

    /// The component error; panics on a runner failure (for tests and examples).
    pub fn into_component(self) -> Error {
        match self {
            CallError::Component(e) => e,
            CallError::Runner(e) => panic!("runner failure: {e:#}"),
        }
    }

    /// Process exit code: the kind's, or 1 for a runner failure.
    pub fn exit_code(&self) -> i32 {
        self.kind().map_or(1, ErrorKind::exit_code)
    }
}

/// A runner failure as a user reads it: one line, no wasm or Rust stack frames (whatever
/// `RUST_BACKTRACE` says): the memory limit or the call deadline when either ended the call,
/// the trap's own words for another trap, else the error's chain without its backtrace.
pub fn runner_message(e: &anyhow::Error) -> String {
    if let Some(m) = e.downcast_ref::<MemoryLimitExceeded>() {
        return m.to_string();
    }
    if let Some(d) = e.downcast_ref::<CallDeadlineExceeded>() {
        return d.to_string();
    }
    if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        return format!("the component trapped: {trap}");
    }
    let backtrace = e
        .downcast_ref::<wasmtime::WasmBacktrace>()
        .map(ToString::to_string);
    e.chain()
        .map(ToString::to_string)
        .filter(|part| Some(part) != backtrace.as_ref() && !part.contains("wasm backtrace:"))
        .collect::<Vec<_>>()
        .join(": ")
}

impl From<anyhow::Error> for CallError {
    fn from(e: anyhow::Error) -> Self {
        CallError::Runner(e)
    }
}

impl From<wasmtime::Error> for CallError {
    fn from(e: wasmtime::Error) -> Self {
        CallError::Runner(anyhow::Error::from(e))
    }
}

/// One call into the component: `$func` of the guest interface at `$guest` in the bindings,
/// with these arguments after the store. It starts the call's deadline and memory accounting
/// ([`Instance::begin_call`]), and turns a failure of the runtime into [`CallError::Runner`]
/// and the component's own error into [`CallError::Component`]. Each WIT function's method on
/// [`Instance`] is its signature and this one line (docs/architecture.md, "Adding a WIT
/// function").
macro_rules! call {
    ($self:ident, $($guest:ident ()).+ => $func:ident ($($arg:expr),*)) => {{
        $self.begin_call();
        let guest = $self.connector$(.$guest())+;
        flatten(
            guest
                .$func(&mut $self.store, $($arg),*)
                .await
                .map_err(|e| $self.runner(e))?,
        )
    }};
}

fn flatten<T>(result: Result<T, WitError>) -> Result<T, CallError> {
    result.map_err(|e| CallError::Component(from_wit_error(e)))
}

/// An open state store inside an [`Instance`] (a `store` resource handle).
#[derive(Clone, Copy, Debug)]
pub struct StoreHandle(ResourceAny);

/// A held lock inside an [`Instance`] (a `lock` resource handle).
#[derive(Clone, Copy, Debug)]
pub struct LockHandle(ResourceAny);

/// An open table sink inside an [`Instance`] (a `sink` resource handle).
#[derive(Clone, Copy, Debug)]
pub struct SinkHandle(ResourceAny);

impl Instance {
    /// Starts the clock of a call (its deadline, from [`Limits::call_timeout`]).
    fn begin_call(&mut self) {
        let limit = self.store.data().limits.call_timeout;
        let state = self.store.data_mut();
        state.hooks.call = CallDeadline::starting_now(limit);
        state.memory.refused = false;
    }

    /// A failure of the runtime during a call: when the guest's memory could not grow during
    /// it, the trap that followed is its running out of memory ([`MemoryLimitExceeded`]).
    fn runner(&self, e: wasmtime::Error) -> CallError {
        let e = anyhow::Error::from(e);
        let memory = &self.store.data().memory;
        if memory.refused && e.downcast_ref::<CallDeadlineExceeded>().is_none() {
            return CallError::Runner(e.context(MemoryLimitExceeded(memory.limit)));
        }
        CallError::Runner(e)
    }

    /// The deadline of this instance's outgoing requests (none by default); clone it to set
    /// it from another task while a call runs.
    pub fn request_deadline(&self) -> RequestDeadline {
        self.store.data().hooks.deadline.clone()
    }

    /// `server.ping`: connects, authenticates and returns the server's identity.
    pub async fn ping(&mut self, connection: &ConnectionOptions) -> Result<ServerInfo, CallError> {
        let conn = to_wit_connection(connection);
        call!(self, clickhouse_connector_server() => call_ping(&conn))
    }

    /// `wasi:cli/run`: runs the component's command line (see
    /// [`Runtime::instantiate_command`]) and returns its exit code.
    pub async fn run_command(&mut self) -> Result<i32, CallError> {
        self.begin_call();
        let Some(run) = self.run else {
            return Err(CallError::Runner(anyhow::anyhow!(
                "this component has no command mode (it does not export {RUN_INTERFACE}): it is the library component; run the full one"
            )));
        };
        let result = run
            .call_async(&mut self.store, ())
            .await
            .map(|(outcome,)| outcome);
        match result {
            Ok(Ok(())) => Ok(0),
            Ok(Err(())) => Ok(1),
            Err(e) => match e.downcast_ref::<wasmtime_wasi::I32Exit>() {
                Some(exit) => Ok(exit.0),
                None => Err(self.runner(e)),
            },
        }
    }

    /// `store.open`.
    pub async fn open_store(
        &mut self,
        connection: &ConnectionOptions,
        options: &StoreOptions,
    ) -> Result<StoreHandle, CallError> {
        let conn = to_wit_connection(connection);
        call!(self, clickhouse_connector_state_store().store() => call_open(&conn, options))
            .map(StoreHandle)
    }

    /// `store.get`.
    pub async fn state_get(
        &mut self,
        s: StoreHandle,
        id: &str,
    ) -> Result<Option<State>, CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_get(s.0, id))
    }

    /// `store.set`.
    pub async fn state_set(&mut self, s: StoreHandle, state: &State) -> Result<(), CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_set(s.0, state))
    }

    /// `store.update`.
    pub async fn state_update(
        &mut self,
        s: StoreHandle,
        state: &State,
    ) -> Result<State, CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_update(s.0, state))
    }

    /// `store.delete`.
    pub async fn state_delete(&mut self, s: StoreHandle, id: &str) -> Result<u64, CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_delete(s.0, id))
    }

    /// `store.ids`.
    pub async fn state_ids(
        &mut self,
        s: StoreHandle,
        pattern: Option<&str>,
    ) -> Result<Vec<String>, CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_ids(s.0, pattern))
    }

    /// `store.get-all`.
    pub async fn state_get_all(
        &mut self,
        s: StoreHandle,
        pattern: Option<&str>,
    ) -> Result<Vec<State>, CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_get_all(s.0, pattern))
    }

    /// `store.set-all`.
    pub async fn state_set_all(
        &mut self,
        s: StoreHandle,
        states: &[State],
    ) -> Result<(), CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_set_all(s.0, states))
    }

    /// `store.clear-all`.
    pub async fn state_clear_all(&mut self, s: StoreHandle) -> Result<u64, CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_clear_all(s.0))
    }

    /// `store.lock`.
    pub async fn lock(&mut self, s: StoreHandle, id: &str) -> Result<LockHandle, CallError> {
        call!(self, clickhouse_connector_state_store().store() => call_lock(s.0, id))
            .map(LockHandle)
    }

    /// `lock.token`.
    pub async fn lock_token(&mut self, lock: LockHandle) -> Result<String, CallError> {
        self.begin_call();
        let r = self.connector.clickhouse_connector_state_store().lock();
        r.call_token(&mut self.store, lock.0)
            .await
            .map_err(|e| self.runner(e))
    }

    /// `lock.renew`.
    pub async fn lock_renew(&mut self, lock: LockHandle) -> Result<(), CallError> {
        call!(self, clickhouse_connector_state_store().lock() => call_renew(lock.0))
    }

    /// `lock.set`: a write fenced by the lock.
    pub async fn lock_set(&mut self, lock: LockHandle, state: &State) -> Result<(), CallError> {
        call!(self, clickhouse_connector_state_store().lock() => call_set(lock.0, state))
    }

    /// `lock.update`: Meltano update under this lock, fenced by it.
    pub async fn lock_update(
        &mut self,
        lock: LockHandle,
        state: &State,
    ) -> Result<State, CallError> {
        call!(self, clickhouse_connector_state_store().lock() => call_update(lock.0, state))
    }

    /// `lock.delete`: deletes the locked id's state, fenced by the lock.
    pub async fn lock_delete(&mut self, lock: LockHandle) -> Result<u64, CallError> {
        call!(self, clickhouse_connector_state_store().lock() => call_delete(lock.0))
    }

    /// `lock.release`, then drops the handle.
    pub async fn lock_release(&mut self, lock: LockHandle) -> Result<(), CallError> {
        self.begin_call();
        let r = self.connector.clickhouse_connector_state_store().lock();
        let result = flatten(
            r.call_release(&mut self.store, lock.0)
                .await
                .map_err(|e| self.runner(e))?,
        );
        lock.0
            .resource_drop_async(&mut self.store)
            .await
            .map_err(|e| self.runner(e))?;
        result
    }

    /// Drops a lock handle without an explicit release (the component releases it, best effort).
    pub async fn lock_drop(&mut self, lock: LockHandle) -> Result<(), CallError> {
        self.begin_call();
        lock.0
            .resource_drop_async(&mut self.store)
            .await
            .map_err(|e| self.runner(e))?;
        Ok(())
    }

    /// `sink.open`.
    pub async fn open_sink(
        &mut self,
        connection: &ConnectionOptions,
        options: &SinkOptions,
    ) -> Result<SinkHandle, CallError> {
        let conn = to_wit_connection(connection);
        call!(self, clickhouse_connector_table_sink().sink() => call_open(&conn, options))
            .map(SinkHandle)
    }

    /// `sink.send`.
    pub async fn sink_send(
        &mut self,
        sink: SinkHandle,
        rows: &[Vec<(String, Value)>],
    ) -> Result<Receipt, CallError> {
        call!(self, clickhouse_connector_table_sink().sink() => call_send(sink.0, rows))
    }

    /// `sink.send-json`.
    pub async fn sink_send_json(
        &mut self,
        sink: SinkHandle,
        data: &[u8],
    ) -> Result<Receipt, CallError> {
        call!(self, clickhouse_connector_table_sink().sink() => call_send_json(sink.0, data))
    }

    /// `sink.resume`: the checkpoint under `checkpoint` in the store `store` opens; returns
    /// the position of the last acknowledged send.
    pub async fn sink_resume(
        &mut self,
        sink: SinkHandle,
        checkpoint: &str,
        store: &StoreOptions,
    ) -> Result<Option<String>, CallError> {
        call!(self, clickhouse_connector_table_sink().sink() => call_resume(sink.0, checkpoint, store))
    }

    /// `sink.send-at`.
    pub async fn sink_send_at(
        &mut self,
        sink: SinkHandle,
        rows: &[Vec<(String, Value)>],
        position: &str,
    ) -> Result<Receipt, CallError> {
        call!(self, clickhouse_connector_table_sink().sink() => call_send_at(sink.0, rows, position))
    }

    /// `sink.send-json-at`.
    pub async fn sink_send_json_at(
        &mut self,
        sink: SinkHandle,
        data: &[u8],
        position: &str,
    ) -> Result<Receipt, CallError> {
        call!(self, clickhouse_connector_table_sink().sink() => call_send_json_at(sink.0, data, position))
    }

    /// `sink.send-packed`: packed rows ([`clickhouse_component::host_api::rows::PackedWriter`]),
    /// with a `position` through the checkpoint of a resumable sink.
    pub async fn sink_send_packed(
        &mut self,
        sink: SinkHandle,
        data: &[u8],
        position: Option<&str>,
    ) -> Result<Receipt, CallError> {
        call!(self, clickhouse_connector_table_sink().sink() => call_send_packed(sink.0, data, position))
    }

    /// `sink.close` (idempotent); the handle stays valid until [`Instance::drop_sink`].
    pub async fn sink_close(&mut self, sink: SinkHandle) -> Result<(), CallError> {
        self.begin_call();
        let r = self.connector.clickhouse_connector_table_sink().sink();
        r.call_close(&mut self.store, sink.0)
            .await
            .map_err(|e| self.runner(e))?;
        Ok(())
    }

    /// Drops a sink handle.
    pub async fn drop_sink(&mut self, sink: SinkHandle) -> Result<(), CallError> {
        self.begin_call();
        sink.0
            .resource_drop_async(&mut self.store)
            .await
            .map_err(|e| self.runner(e))?;
        Ok(())
    }

    /// Closes a store handle.
    pub async fn close_store(&mut self, s: StoreHandle) -> Result<(), CallError> {
        self.begin_call();
        s.0.resource_drop_async(&mut self.store)
            .await
            .map_err(|e| self.runner(e))?;
        Ok(())
    }
}

/// The default allow-list for a connection: exactly the origin of its URL.
pub fn default_allow_list(connection: &ConnectionOptions) -> Result<AllowList, Error> {
    let endpoint = Endpoint::parse(connection)?;
    AllowList::origin(&endpoint.origin()).map_err(|e| Error::invalid(e.to_string()))
}

/// Converts the core connection options to the WIT record.
pub(crate) fn to_wit_connection(c: &ConnectionOptions) -> Connection {
    Connection {
        url: c.url.clone(),
        user: c.user.clone(),
        password: c.password.clone(),
        database: c.database.clone(),
        settings: c.settings.clone(),
        connect_timeout_ms: c.connect_timeout_ms,
        request_timeout_ms: c.request_timeout_ms,
    }
}

/// Converts the component's WIT error to the core error type.
pub(crate) fn from_wit_error(e: WitError) -> Error {
    Error {
        kind: match e.kind {
            WitErrorKind::InvalidInput => ErrorKind::InvalidInput,
            WitErrorKind::Misconfigured => ErrorKind::Misconfigured,
            WitErrorKind::Disconnected => ErrorKind::Disconnected,
            WitErrorKind::Transient => ErrorKind::Transient,
            WitErrorKind::Throttled => ErrorKind::Throttled,
            WitErrorKind::Permanent => ErrorKind::Permanent,
            WitErrorKind::Uncertain => ErrorKind::Uncertain,
            WitErrorKind::Locked => ErrorKind::Locked,
            WitErrorKind::NotFound => ErrorKind::NotFound,
        },
        message: e.message,
        server: e.server.map(|s| ServerError {
            code: s.code,
            name: s.name,
            http_status: s.http_status,
        }),
        committed_rows: e.committed_rows,
    }
}

/// Per-store host state.
pub(crate) struct HostState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    /// The guest's memory limit.
    memory: GuestMemory,
    limits: Limits,
    hooks: Hooks,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// The wasi:http seam: bounds each request by its deadlines, logs one line per request, and
/// sends through the instance's keep-alive pool (HTTP and HTTPS alike: [`crate::pool`]), which
/// is the one place the allow-list is checked and a denial reported.
struct Hooks {
    pool: ConnectionPool,
    deadline: RequestDeadline,
    /// The deadline of the call in progress.
    call: CallDeadline,
}

type SendFuture = Box<
    dyn std::future::Future<
            Output = wasmtime_wasi_http::Result<(
                http::Response<WasiBody>,
                Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    /// Let the guest write a whole INSERT body (up to 64 MiB) without waiting for the network
    /// after each 1 MiB chunk.
    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        64
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> SendFuture {
        let operation = request
            .headers()
            .get(OPERATION_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        let call_deadline = self.call.at;
        let Some(options) = self.deadline.bound(options, call_deadline) else {
            tracing::debug!(op = %operation, "clickhouse request not sent: its deadline has passed");
            return Box::new(async { Err(wasmtime_wasi_http::Error::ConnectionTimeout) });
        };
        let deadline = self.deadline.clone();
        let started = Instant::now();
        let bytes = request
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let pool = self.pool.clone();
        Box::new(async move {
            type Io = Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send>;
            // http and https alike: the pool is the one way out. It checks the destination
            // against the allow-list (and reports a denial), resolves once, checks every
            // address, and keeps connections alive.
            let send = async {
                pool.send(request, options)
                    .await
                    .map(|response| (response, Box::new(async { Ok(()) }) as Io))
            };
            let call_ends = async {
                match call_deadline {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let result: wasmtime_wasi_http::Result<(http::Response<WasiBody>, Io)> = tokio::select! {
                result = send => result,
                _ = deadline.reached() => Err(wasmtime_wasi_http::Error::ConnectionReadTimeout),
                _ = call_ends => Err(wasmtime_wasi_http::Error::ConnectionReadTimeout),
            };
            let ms = started.elapsed().as_secs_f64() * 1e3;
            match &result {
                Ok((response, _)) => tracing::debug!(
                    op = %operation,
                    status = response.status().as_u16(),
                    request_bytes = bytes,
                    ms = format!("{ms:.2}"),
                    "clickhouse request"
                ),
                Err(e) => {
                    tracing::debug!(op = %operation, error = %e, ms = format!("{ms:.2}"), "clickhouse request failed")
                }
            }
            result
        })
    }
}
