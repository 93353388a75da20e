//! The verification workload (docs/verification.md): many clients on a few state ids, a seeded
//! nemesis, every operation recorded ([`crate::history`]), then the checker
//! ([`crate::checker`]).
//!
//! * Clients: `threads` threads, each with its own component instance (the real `.wasm` in the
//!   real host), and `processes` drivers of CLI processes (`lock ID -- sh -c 'sleep; state
//!   merge ID KEY'`, recording their lock calls through the CLI's hook). Each thread picks,
//!   seeded: `update` (a unique key), `get`, `delete`, or a lock session: `lock`, then one to
//!   three of renew / `lock.update` / `lock.set` / a short pause, then release; one session in
//!   six is a *slow holder* that sleeps past its lease, then renews and writes (both must be
//!   refused) before it releases.
//! * Directed episodes on an id of their own, straight to the server: a takeover of a slow
//!   holder's lock, an update on a stale hint and an update waiting behind a held lock, over
//!   and over ([`directed`]); each is a schedule a planted bug of its kind cannot pass.
//! * Nemesis (seeded: every kind of fault the run has once first, in a seeded order, then drawn
//!   at random; bounded in count and time, stops by itself a few seconds before the end and
//!   heals everything): request faults through the fault proxy in front of ClickHouse (refuse, cut
//!   request, lost reply, cut reply, stall past the request timeout, delay: the request held
//!   before it reaches the server until its client gave up) on any request or on one
//!   kind (a write, a renewal, an acquire); restarts of the local ClickHouse on its data
//!   directory (SIGKILL); with an ensemble, SIGKILL and restart of the ZooKeeper leader or a
//!   follower, and SIGSTOP of a node past the session timeout, then SIGCONT.
//! * Afterwards every id is read once more, without faults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clickhouse_component::client::{ConnectionOptions, ErrorKind};
use clickhouse_component_host::{
    CachePolicy, CallError, ComponentSource, Instance, LockEngine, Runtime, State, StoreHandle,
    StoreOptions,
};
use serde_json::Value;

use crate::checker::{self, Report};
use crate::ensemble::{Ensemble, MAX_SESSION};
use crate::history::{now_ns, Outcome, Record, Recorder};
use crate::proxy::{Fault, Proxy, Rule};
use crate::{cache_dir, cli, engine_name, instance_for, LocalClickHouse};

/// Lease of the thread clients (fence margin: a quarter, 500 ms).
pub const LEASE: Duration = Duration::from_secs(2);
/// The id of the directed episodes ([`directed`]).
const DIRECTED_ID: &str = "job-directed";
/// Lease of the CLI clients.
const CLI_LEASE_SECONDS: u64 = 3;
/// Request timeout of every client: a stalled reply is held longer, so it is a timeout.
const REQUEST_TIMEOUT_MS: u32 = 1_000;
/// How long the nemesis holds a stalled reply.
const STALL: Duration = Duration::from_millis(1_500);
/// Lock timeout of every client.
const LOCK_TIMEOUT_MS: u32 = 8_000;
/// The nemesis stops this long before the end, so the last operations see a healed system.
const QUIET_TAIL: Duration = Duration::from_secs(4);

/// A run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Lock engine (merge-tree: one server; keeper-map: on a three-node ensemble).
    pub engine: LockEngine,
    /// Seed of the clients' choices and the nemesis schedule.
    pub seed: u64,
    /// How long the clients run.
    pub duration: Duration,
    /// The component (a planted-bug build); the embedded one when `None`.
    pub component: Option<PathBuf>,
    /// Thread clients.
    pub threads: usize,
    /// CLI process clients.
    pub processes: usize,
    /// State ids.
    pub ids: usize,
    /// Where the history is written (JSON lines).
    pub history: PathBuf,
    /// Whether ZooKeeper nodes and ClickHouse are killed and paused (request faults always).
    pub process_faults: bool,
}

/// What a run did and what the checker said.
pub struct RunResult {
    /// The checker's report.
    pub report: Report,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// How long it took, setup included.
    pub elapsed: Duration,
    /// Leases the CLI processes recorded through the CLI's hook.
    pub cli_leases: usize,
    /// `update` writes sent ahead of the lock's confirmation (`set-unless-changed`, through
    /// the proxy: the thread clients').
    pub writes_ahead: usize,
    /// Lock takeovers outside the directed episodes (on the random workload's ids, under the
    /// nemesis): whether the nemesis bit, which the directed takeovers cannot show.
    pub random_takeovers: usize,
}

impl RunResult {
    /// One line for the table of runs.
    pub fn summary(&self, config: &Config) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!(
            "engine {} seed {} clients {}+{} for {:?}: {} operations, {} unknown, {} leases ({} by CLI processes), {} takeovers, {} fenced writes refused, {} update writes ahead of the lock's confirmation; faults: {}; anomalies {}{}; {:.0} s",
            engine_name(config.engine),
            config.seed,
            config.threads,
            config.processes,
            config.duration,
            self.report.total(),
            self.report.unknown(),
            self.report.leases,
            self.cli_leases,
            self.report.taken_over.len(),
            self.report.fenced_out,
            self.writes_ahead,
            faults.join(", "),
            self.report.anomalies.len(),
            if self.report.inconclusive.is_empty() { "" } else { " (INCONCLUSIVE search)" },
            self.elapsed.as_secs_f64()
        )
    }
}

/// A small seeded generator (splitmix64).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// From a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Uniform in `lo..hi` ms.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo))
    }
}

/// The outcome of a call: ok, `uncertain` / runner failure (unknown), or certainly failed.
fn outcome<T>(result: &Result<T, CallError>) -> (Outcome, Option<String>) {
    match result {
        Ok(_) => (Outcome::Ok, None),
        // A component error prints as `kind: message`.
        Err(e @ CallError::Component(c)) if c.kind != ErrorKind::Uncertain => {
            (Outcome::Fail, Some(e.to_string()))
        }
        Err(e) => (Outcome::Unknown, Some(e.to_string())),
    }
}

fn partial_keys(state: &State) -> Vec<String> {
    match serde_json::from_str::<Value>(&state.partial) {
        Ok(Value::Object(map)) => map.keys().cloned().collect(),
        _ if state.partial.is_empty() => Vec::new(),
        _ => vec![format!("<unparsable partial {:?}>", state.partial)],
    }
}

fn with_key(id: &str, key: &str) -> State {
    State {
        id: id.into(),
        partial: format!("{{\"{key}\":1}}"),
        completed: String::new(),
    }
}

struct Client<'a> {
    name: String,
    instance: Instance,
    store: StoreHandle,
    rng: Rng,
    recorder: &'a Recorder,
    ids: Vec<String>,
    n: u64,
}

/// Runs `f` to its end on a tokio runtime of the calling thread's own.
fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

impl<'a> Client<'a> {
    /// A client named `name` with its own instance and store, opened at `at` (runtime,
    /// connection, database, lock engine), working on `ids`.
    async fn open(
        name: String,
        at: (&Runtime, &ConnectionOptions, &str, LockEngine),
        rng: Rng,
        recorder: &'a Recorder,
        ids: Vec<String>,
    ) -> Client<'a> {
        let (runtime, conn, db, engine) = at;
        let (instance, store) = open(runtime, conn, db, engine).await;
        Client {
            name,
            instance,
            store,
            rng,
            recorder,
            ids,
            n: 0,
        }
    }

    fn key(&mut self) -> String {
        self.n += 1;
        format!("{}-{}", self.name, self.n)
    }

    fn record(&self, mut r: Record, result_error: Option<String>) {
        r.error = result_error;
        self.recorder.record(&r);
    }

    async fn step(&mut self) {
        let id = self.ids[self.rng.below(self.ids.len() as u64) as usize].clone();
        match self.rng.below(100) {
            0..30 => self.update(&id).await,
            30..50 => {
                let start = now_ns();
                let result = self.instance.state_get(self.store, &id).await;
                let (o, e) = outcome(&result);
                let mut r = Record::new(&self.name, "get", &id, start, o);
                r.keys = result.ok().map(|s| s.map(|s| partial_keys(&s)));
                self.record(r, e);
            }
            50..55 => {
                let start = now_ns();
                let result = self.instance.state_delete(self.store, &id).await;
                let (o, e) = outcome(&result);
                self.record(Record::new(&self.name, "delete", &id, start, o), e);
            }
            _ => self.session(&id).await,
        }
    }

    /// `update` with a new key.
    async fn update(&mut self, id: &str) {
        let key = self.key();
        let start = now_ns();
        let result = self
            .instance
            .state_update(self.store, &with_key(id, &key))
            .await;
        let (o, e) = outcome(&result);
        let mut r = Record::new(&self.name, "update", id, start, o);
        r.key = Some(key);
        r.keys = result.ok().map(|s| Some(partial_keys(&s)));
        self.record(r, e);
    }

    async fn session(&mut self, id: &str) {
        let Some(held) = self.acquire(id).await else {
            return;
        };
        let slow = self.rng.below(6) == 0;
        let steps = if slow { 0 } else { 1 + self.rng.below(3) };
        let mut plan: Vec<u64> = (0..steps).map(|_| self.rng.below(4)).collect();
        if slow {
            // Past the lease: the renewal and the write must both be refused.
            tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
            plan = vec![0, 1];
        }
        for step in plan {
            match step {
                0 => self.renew(&held).await,
                1 => self.write(&held, true).await,
                2 => self.write(&held, false).await,
                _ => tokio::time::sleep(self.rng.millis(20, 300)).await,
            }
        }
        self.release(held).await;
    }

    /// A record of an operation under the lock `held`.
    fn lock_record(&self, op: &str, held: &Held, start: u64, o: Outcome) -> Record {
        let mut r = Record::new(&self.name, op, &held.id, start, o);
        r.token = held.token.clone();
        r.lease_ms = Some(LEASE.as_millis() as u64);
        r
    }

    /// `lock`, recorded with its token: the lock if it was taken.
    async fn acquire(&mut self, id: &str) -> Option<Held> {
        let start = now_ns();
        let result = self.instance.lock(self.store, id).await;
        let token = match &result {
            Ok(lock) => self.instance.lock_token(*lock).await.ok(),
            Err(_) => None,
        };
        let (o, e) = outcome(&result);
        let held = Held {
            lock: result.ok(),
            token,
            id: id.to_string(),
        };
        let r = self.lock_record("acquire", &held, start, o);
        self.record(r, e);
        held.lock.is_some().then_some(held)
    }

    async fn renew(&mut self, held: &Held) {
        let start = now_ns();
        let result = self.instance.lock_renew(held.lock.unwrap()).await;
        let (o, e) = outcome(&result);
        let r = self.lock_record("renew", held, start, o);
        self.record(r, e);
    }

    /// `lock.update` (`merge`) or `lock.set` with a new key.
    async fn write(&mut self, held: &Held, merge: bool) {
        let (lock, key) = (held.lock.unwrap(), self.key());
        let state = with_key(&held.id, &key);
        let start = now_ns();
        let (op, result) = if merge {
            let result = self.instance.lock_update(lock, &state).await;
            let keys = result.as_ref().ok().map(|s| Some(partial_keys(s)));
            ("lock.update", result.map(|_| keys))
        } else {
            let result = self.instance.lock_set(lock, &state).await;
            ("lock.set", result.map(|()| None))
        };
        let (o, e) = outcome(&result);
        let mut r = self.lock_record(op, held, start, o);
        r.key = Some(key);
        r.keys = result.ok().flatten();
        self.record(r, e);
    }

    async fn release(&mut self, held: Held) {
        let lock = held.lock.unwrap();
        let start = now_ns();
        let result = self.instance.lock_release(lock).await;
        let (o, e) = outcome(&result);
        let r = self.lock_record("release", &held, start, o);
        self.record(r, e);
        let _ = self.instance.lock_drop(lock).await;
    }
}

/// A lock a client holds (or held: its lease may have ended).
struct Held {
    lock: Option<clickhouse_component_host::LockHandle>,
    token: Option<String>,
    id: String,
}

/// The directed episodes (on their own id, without request faults), run over and over: each
/// is a schedule that a bug of its kind cannot pass, so a planted bug is caught every run,
/// not only when the random workload happens on its schedule.
///
/// * **Takeover:** `a` takes the lock and sleeps past its lease; `b` takes it over; `a`
///   renews and writes (both must be refused: a renewal that brings `a`'s lease back breaks
///   mutual exclusion, a write that lands is a fenced write after its lease); `b` writes and
///   both release.
/// * **Stale hint:** `a` updates (it now knows the state), `b` updates, `a` updates again: `a`'s
///   write ahead is computed from a state that is no longer stored, and must not land (it
///   would drop `b`'s key).
/// * **Update behind a lock:** `b` takes the lock; `a` updates (and waits for the lock); `b`
///   writes a key through its lock 300 ms later and releases. `a`'s update must merge into
///   the state as it is once `a` holds the lock, `b`'s key in it (one that read the state
///   before taking the lock drops it).
async fn directed(a: &mut Client<'_>, b: &mut Client<'_>, id: &str, until: Instant) {
    while Instant::now() < until {
        if let Some(held_a) = a.acquire(id).await {
            tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
            let held_b = b.acquire(id).await;
            a.renew(&held_a).await;
            a.write(&held_a, true).await;
            if let Some(held_b) = held_b {
                b.write(&held_b, true).await;
                b.release(held_b).await;
            }
            a.release(held_a).await;
        }
        a.update(id).await;
        b.update(id).await;
        a.update(id).await;
        if let Some(held_b) = b.acquire(id).await {
            // `a`'s update waits for `b`'s lock; `b` writes meanwhile and releases.
            let others = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                b.write(&held_b, true).await;
                b.release(held_b).await;
            };
            tokio::join!(a.update(id), others);
        }
    }
}

fn store_options(db: &str, engine: LockEngine) -> StoreOptions {
    StoreOptions {
        database: Some(db.into()),
        lock_engine: Some(engine),
        lock_timeout_ms: Some(LOCK_TIMEOUT_MS),
        lock_retry_ms: Some(50),
        stale_after_ms: Some(LEASE.as_millis() as u32),
        ..Default::default()
    }
}

async fn open(
    runtime: &Runtime,
    conn: &ConnectionOptions,
    db: &str,
    engine: LockEngine,
) -> (Instance, StoreHandle) {
    let mut instance = instance_for(runtime, conn).await;
    // Faults may already be injected: a few attempts.
    let mut attempts = 0;
    loop {
        match instance.open_store(conn, &store_options(db, engine)).await {
            Ok(store) => return (instance, store),
            Err(e) if attempts < 30 => {
                attempts += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("opening the store: {e}"),
        }
    }
}

/// A CLI client: `lock ID -- sh -c 'sleep 1.2; clickhouse-component state merge ID STATE'`,
/// the lock's calls recorded by the CLI's hook into `hook`, the merge recorded here as a
/// `lock.update` by the token the CLI printed.
#[allow(clippy::too_many_arguments)]
fn cli_client(
    name: &str,
    server: &crate::Server,
    component: Option<&Path>,
    db: &str,
    engine: LockEngine,
    ids: &[String],
    mut rng: Rng,
    recorder: &Recorder,
    hook: &Path,
    until: Instant,
) {
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let id = &ids[rng.below(ids.len() as u64) as usize];
        let key = format!("{name}-{n}");
        let mut cmd = cli(server);
        if let Some(c) = component {
            cmd.env("CLICKHOUSE_COMPONENT", c);
        }
        cmd.env("CLICKHOUSE_SCHEMA", db)
            .env("CLICKHOUSE_LOCK_ENGINE", engine_name(engine))
            .env("MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS", "8")
            .env("MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS", "0.05")
            .env(
                "CLICKHOUSE_LOCK_STALE_AFTER_SECONDS",
                CLI_LEASE_SECONDS.to_string(),
            )
            .env(
                "CLICKHOUSE_REQUEST_TIMEOUT_MS",
                REQUEST_TIMEOUT_MS.to_string(),
            )
            .env("CLICKHOUSE_COMPONENT_LOCK_RECORD", hook)
            .args(["lock", "--pass-credentials", id, "--", "sh", "-c"])
            .arg("sleep 1.2; exec \"$0\" state merge --no-validate \"$1\" \"$2\"")
            .arg(crate::cli_binary())
            .arg(id)
            .arg(format!("{{\"{key}\":1}}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let start = now_ns();
        let output = cmd.output().expect("running the CLI");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let token = stderr
            .split("(token ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .map(str::to_string);
        let code = output.status.code();
        // 0: merged; 2-7, 9, 10: an error kind that certainly wrote nothing (the acquire or
        // the fenced merge refused); 8 (uncertain), 11 (lease lost: the command was stopped,
        // maybe midway), 1 (a runner failure) or a signal: unknown.
        let o = match code {
            Some(0) => Outcome::Ok,
            Some(2..=7 | 9 | 10) => Outcome::Fail,
            _ => Outcome::Unknown,
        };
        let mut r = Record::new(name, "lock.update", id, start, o);
        r.token = token;
        r.key = Some(key);
        if o != Outcome::Ok {
            let last = stderr.lines().last().unwrap_or_default();
            let kind = if code == Some(9) { "locked: " } else { "" };
            r.error = Some(format!("{kind}exit {code:?}: {last}"));
        }
        recorder.record(&r);
        std::thread::sleep(rng.millis(0, 100));
    }
}

/// Runs the workload and checks its history.
pub fn run(config: &Config) -> RunResult {
    let started = Instant::now();
    let parent = std::env::temp_dir();
    let ensemble = (config.engine == LockEngine::KeeperMap).then(|| Ensemble::start(3, &parent));
    let zookeeper = ensemble
        .as_ref()
        .map_or("none".to_string(), Ensemble::connect_string);
    let clickhouse = Arc::new(Mutex::new(LocalClickHouse::start(&zookeeper)));
    let direct = clickhouse.lock().unwrap().server();
    let proxy = Proxy::start(&direct.url);
    let through = proxy.server(&direct);
    let conn = ConnectionOptions {
        request_timeout_ms: Some(REQUEST_TIMEOUT_MS),
        ..through.connection()
    };
    let source = match &config.component {
        Some(path) => ComponentSource::File(path.clone()),
        None => ComponentSource::Embedded,
    };
    let runtime = Runtime::new(&source, &CachePolicy::Dir(cache_dir())).expect("the component");
    let db = crate::unique_name("verify");
    let ids: Vec<String> = (0..config.ids).map(|i| format!("job-{i}")).collect();
    let _ = std::fs::remove_file(&config.history);
    let recorder = Recorder::create(&config.history);
    let hook = config.history.with_extension("cli.jsonl");
    let _ = std::fs::remove_file(&hook);
    let faults: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    let ensemble = Mutex::new(ensemble);

    // The schema, created once before the clients start.
    {
        block_on(open(&runtime, &direct.connection(), &db, config.engine));
    }
    let until = Instant::now() + config.duration;
    let nemesis_until = until - QUIET_TAIL.min(config.duration / 2);
    std::thread::scope(|scope| {
        for t in 0..config.threads {
            let (runtime, conn, db, ids, recorder) = (&runtime, &conn, &db, &ids, &recorder);
            let seed = config.seed.wrapping_mul(1000).wrapping_add(t as u64);
            let engine = config.engine;
            scope.spawn(move || {
                block_on(async {
                    let mut client = Client::open(
                        format!("t{t}"),
                        (runtime, conn, db, engine),
                        Rng::new(seed),
                        recorder,
                        ids.clone(),
                    )
                    .await;
                    while Instant::now() < until {
                        client.step().await;
                    }
                });
            });
        }
        // The directed episodes, straight to the server (no request faults).
        {
            let (runtime, db, recorder) = (&runtime, &db, &recorder);
            let conn = ConnectionOptions {
                request_timeout_ms: Some(REQUEST_TIMEOUT_MS),
                ..direct.connection()
            };
            let engine = config.engine;
            scope.spawn(move || {
                block_on(async {
                    let mut clients = Vec::new();
                    for name in ["d0", "d1"] {
                        clients.push(
                            Client::open(
                                name.into(),
                                (runtime, &conn, db, engine),
                                Rng::new(0),
                                recorder,
                                vec![DIRECTED_ID.into()],
                            )
                            .await,
                        );
                    }
                    let [a, b] = &mut clients[..] else {
                        unreachable!()
                    };
                    directed(a, b, DIRECTED_ID, until).await;
                });
            });
        }
        for p in 0..config.processes {
            let (through, db, ids, recorder, hook) = (&through, &db, &ids, &recorder, &hook);
            let component = config.component.as_deref();
            let rng = Rng::new(config.seed.wrapping_mul(1000).wrapping_add(500 + p as u64));
            let engine = config.engine;
            scope.spawn(move || {
                cli_client(
                    &format!("p{p}"),
                    through,
                    component,
                    db,
                    engine,
                    ids,
                    rng,
                    recorder,
                    hook,
                    until,
                )
            });
        }
        // The nemesis.
        let (proxy, faults, clickhouse, ensemble) = (&proxy, &faults, &clickhouse, &ensemble);
        let seed = config.seed;
        let process_faults = config.process_faults;
        scope.spawn(move || {
            nemesis(
                Rng::new(seed ^ 0x6e656d65),
                proxy,
                clickhouse,
                ensemble,
                process_faults,
                faults,
                nemesis_until,
            )
        });
    });

    // A last read of every id, without faults.
    {
        block_on(async {
            let (mut instance, store) =
                open(&runtime, &direct.connection(), &db, config.engine).await;
            for id in ids.iter().map(String::as_str).chain([DIRECTED_ID]) {
                let start = now_ns();
                let result = instance.state_get(store, id).await;
                let (o, e) = outcome(&result);
                let mut r = Record::new("final", "get", id, start, o);
                r.keys = result.ok().map(|s| s.map(|s| partial_keys(&s)));
                r.error = e;
                recorder.record(&r);
            }
        });
    }
    drop(recorder);
    // The CLI's own records join the history file.
    if let Ok(cli_records) = std::fs::read_to_string(&hook) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&config.history)
            .unwrap();
        f.write_all(cli_records.as_bytes()).unwrap();
        let _ = std::fs::remove_file(&hook);
    }
    let records = crate::history::read(&config.history).expect("reading the history");
    let report = checker::check(&records);
    let random_takeovers = report
        .taken_over
        .iter()
        .filter(|id| *id != DIRECTED_ID)
        .count();
    let cli_leases = records
        .iter()
        .filter(|r| r.op == "acquire" && r.outcome == Outcome::Ok && r.process.starts_with("pid-"))
        .count();
    let writes_ahead = proxy
        .log()
        .iter()
        .filter(|r| r.header("x-component-operation").as_deref() == Some("set-unless-changed"))
        .count();
    drop(proxy);
    drop(clickhouse);
    drop(ensemble);
    RunResult {
        report,
        faults: faults.into_inner().unwrap(),
        elapsed: started.elapsed(),
        cli_leases,
        writes_ahead,
        random_takeovers,
    }
}

/// One action of the nemesis.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// SIGKILL the local ClickHouse and start it again on its data directory.
    ClickHouseRestart,
    /// SIGKILL the ZooKeeper leader (or a follower), start it again 0.5-2.5 s later.
    ZooKeeperKill { leader: bool },
    /// SIGSTOP a ZooKeeper node past the session timeout, then SIGCONT.
    ZooKeeperPause,
    /// A request fault through the proxy (0-5: refuse, cut request, lost reply, cut reply,
    /// stall, delay).
    Request(u64),
}

#[allow(clippy::too_many_arguments)]
fn nemesis(
    mut rng: Rng,
    proxy: &Proxy,
    clickhouse: &Mutex<LocalClickHouse>,
    ensemble: &Mutex<Option<Ensemble>>,
    process_faults: bool,
    faults: &Mutex<BTreeMap<String, usize>>,
    until: Instant,
) {
    let count = |kind: &str| *faults.lock().unwrap().entry(kind.to_string()).or_default() += 1;
    let has_ensemble = ensemble.lock().unwrap().is_some();
    // Let the clients start.
    std::thread::sleep(Duration::from_millis(500));
    // Every kind of fault the run has comes once first, in a seeded order (so a short run has
    // them all), then they are drawn at random.
    let mut first_round: Vec<Action> = (0..6).map(Action::Request).collect();
    if process_faults {
        first_round.push(Action::ClickHouseRestart);
        if has_ensemble {
            first_round.push(Action::ZooKeeperKill { leader: true });
            first_round.push(Action::ZooKeeperKill { leader: false });
            first_round.push(Action::ZooKeeperPause);
        }
    }
    for i in (1..first_round.len()).rev() {
        first_round.swap(i, rng.below(i as u64 + 1) as usize);
    }
    // Bounded in time (until `until`) and in count: at most two actions a second.
    let most = 2 * until
        .saturating_duration_since(Instant::now())
        .as_secs()
        .max(5);
    let mut actions = 0;
    // When the requests a `delay` holds are let go (after their clients timed out).
    let mut release_at: Option<Instant> = None;
    while Instant::now() < until && actions < most {
        actions += 1;
        std::thread::sleep(rng.millis(200, 800));
        if release_at.is_some_and(|at| Instant::now() >= at) {
            proxy.release_all();
            release_at = None;
        }
        let action = first_round.pop().unwrap_or_else(|| match rng.below(100) {
            0..12 if process_faults => Action::ClickHouseRestart,
            12..36 if process_faults && has_ensemble => Action::ZooKeeperKill {
                leader: rng.below(3) < 2,
            },
            36..48 if process_faults && has_ensemble => Action::ZooKeeperPause,
            _ => Action::Request(rng.below(6)),
        });
        match action {
            Action::ClickHouseRestart => {
                count("clickhouse restart");
                clickhouse.lock().unwrap().restart();
            }
            Action::ZooKeeperKill {
                leader: kill_leader,
            } => {
                let mut guard = ensemble.lock().unwrap();
                let zk = guard.as_mut().unwrap();
                let (victim, kind) = match zk.leader() {
                    Some(l) if kill_leader => (l, "zookeeper leader kill"),
                    Some(l) => (
                        (l + 1 + rng.below(2) as usize) % zk.len(),
                        "zookeeper follower kill",
                    ),
                    None => (
                        rng.below(zk.len() as u64) as usize,
                        "zookeeper kill (no leader)",
                    ),
                };
                count(kind);
                zk.kill(victim);
                drop(guard);
                std::thread::sleep(rng.millis(500, 2500));
                ensemble
                    .lock()
                    .unwrap()
                    .as_mut()
                    .unwrap()
                    .start_node(victim);
            }
            Action::ZooKeeperPause => {
                let victim = rng.below(3) as usize;
                count("zookeeper pause");
                ensemble.lock().unwrap().as_mut().unwrap().pause(victim);
                std::thread::sleep(MAX_SESSION + rng.millis(200, 1500));
                ensemble.lock().unwrap().as_mut().unwrap().resume(victim);
            }
            Action::Request(which) => {
                let (fault, kind) = match which {
                    0 => (Fault::Refuse, "refuse"),
                    1 => (Fault::CutRequest, "cut request"),
                    2 => (Fault::DropReply, "lost reply"),
                    3 => (Fault::CutReply, "cut reply"),
                    4 => (Fault::Stall(STALL), "stall"),
                    _ => {
                        // Held before it reaches the server, let go after its client gave up.
                        let at = Instant::now() + rng.millis(1500, 3000);
                        release_at = Some(release_at.map_or(at, |r| r.max(at)));
                        (Fault::Pause, "delay")
                    }
                };
                let operation = match rng.below(4) {
                    0 => None,
                    1 => Some("set"),
                    2 => Some("renew"),
                    _ => Some("lock"),
                };
                let times = 1 + rng.below(3) as usize;
                count(kind);
                let rule = match operation {
                    None => Rule::any(fault),
                    Some(op) => {
                        Rule::head_contains(&format!("x-component-operation: {op}\r"), fault)
                    }
                };
                proxy.add(rule.times(times));
            }
        }
    }
    // Heal: no more request faults, held requests go on, every ZooKeeper node up and serving.
    proxy.clear_rules();
    proxy.release_all();
    if let Some(zk) = ensemble.lock().unwrap().as_mut() {
        zk.heal(Duration::from_secs(30));
    }
}
