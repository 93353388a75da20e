//! The state store under network faults: the real component in the real host, talking to a real
//! ClickHouse through the fault-injecting proxy (`tests/src/proxy.rs`), on both lock engines.
//!
//! What this file proves, for `update` (lock, read, fenced write, release):
//!
//! * With the default retries it survives a quarter of its requests failing (refused, cut, reply
//!   lost, reply cut, reply late): almost every merge succeeds.
//! * Without retries most merges fail — the control that shows the faults really bite.
//! * Either way its outcome tells the truth: a merge that succeeded is stored; a merge that
//!   failed with any kind but `uncertain` is not stored (`uncertain` may be either).
//! * No network fault leaves a lock behind: a lost acquire reply is resolved (by retrying the
//!   same token's acquire, or by withdrawing it), a failed release is repeated whatever the
//!   retries, so the next contender gets the lock at once rather than after the 300 s lease.
//! * A reply lost after the state write is `uncertain` (never `transient`) without retries, and
//!   a success with them; the write is stored either way.
//!
//! Connections through the proxy use a 1 s request timeout, so a reply stalled for 1.5 s is a
//! timeout after the server executed the request. Stores are opened before any fault rule is
//! added, and the schema is created first over a direct connection. The random faults are
//! chosen by a hash of a seed and the request's sequence number: the seed is printed, and
//! `STATE_FAULTS_SEED=N` reuses it (the same requests by number are faulted; timing may still
//! differ between runs).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use clickhouse_component::client::{ConnectionOptions, ErrorKind};
use clickhouse_component_host::{
    default_allow_list, Instance, LockEngine, State, StoreHandle, StoreOptions,
};
use clickhouse_component_tests::proxy::{fault_seed, seeded_hash, Fault, Proxy, RequestInfo, Rule};
use clickhouse_component_tests::{cli, clickhouse, engine_name, instance, runtime, unique_name};
use serde_json::{json, Map, Value};

/// Both lock engines: every test runs on each.
const ENGINES: [LockEngine; 2] = [LockEngine::MergeTree, LockEngine::KeeperMap];

/// Request timeout of the connections through the proxy.
const REQUEST_TIMEOUT_MS: u32 = 1_000;

/// How long a stalled reply is held: longer than the request timeout, so it is a timeout.
const STALL: Duration = Duration::from_millis(1_500);

/// Lock timeout of every store here. A lock left behind (300 s default lease) makes a
/// contender fail with `locked` after this long.
const LOCK_TIMEOUT_MS: u32 = 10_000;

/// How soon a contender must get a lock nobody holds (a lock left behind would keep it waiting
/// for the whole lock timeout).
const PROMPTLY: Duration = Duration::from_secs(3);

/// The state id the random-fault runs merge into.
const ID: &str = "tap-faults--target-x";

/// The header naming each request's operation.
const OPERATION: &str = "x-component-operation";

/// The options of every store here (default lease: 300 s).
fn options(db: &str, engine: LockEngine) -> StoreOptions {
    StoreOptions {
        database: Some(db.into()),
        lock_engine: Some(engine),
        lock_timeout_ms: Some(LOCK_TIMEOUT_MS),
        ..Default::default()
    }
}

/// A store on a direct connection (no proxy, default retries); the first one opened on a
/// database creates its schema.
async fn open_direct(db: &str, engine: LockEngine) -> (Instance, StoreHandle) {
    let mut inst = instance().await;
    let store = inst
        .open_store(&clickhouse().connection(), &options(db, engine))
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: opening the store directly: {e}"));
    (inst, store)
}

/// The connection through `proxy`, with the short request timeout.
fn through(proxy: &Proxy) -> ConnectionOptions {
    ConnectionOptions {
        request_timeout_ms: Some(REQUEST_TIMEOUT_MS),
        ..proxy.server(clickhouse()).connection()
    }
}

/// A store through `proxy` with `retries` (`None`: the default), in an instance allowed to
/// reach the proxy only.
async fn open_through(
    proxy: &Proxy,
    db: &str,
    engine: LockEngine,
    retries: Option<u32>,
) -> (Instance, StoreHandle) {
    let conn = through(proxy);
    let mut inst = runtime()
        .instantiate(default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    let store = inst
        .open_store(
            &conn,
            &StoreOptions {
                retries,
                ..options(db, engine)
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: opening the store through the proxy: {e}"));
    (inst, store)
}

/// A state whose partial part is `partial` and whose completed part is `{}` (so `update`
/// merges the partial part into the stored one).
fn state(id: &str, partial: Value) -> State {
    State {
        id: id.into(),
        partial: partial.to_string(),
        completed: "{}".into(),
    }
}

/// `{key: value}`.
fn one_key(key: &str, value: Value) -> Value {
    let mut map = Map::new();
    map.insert(key.to_string(), value);
    Value::Object(map)
}

fn partial_of(s: &State) -> Value {
    serde_json::from_str(&s.partial)
        .unwrap_or_else(|e| panic!("partial part {:?} is not JSON: {e}", s.partial))
}

/// The stored partial part of `id`, read over a fresh direct connection (`None`: no state).
async fn stored_partial(db: &str, engine: LockEngine, id: &str) -> Option<Value> {
    let (mut inst, store) = open_direct(db, engine).await;
    inst.state_get(store, id)
        .await
        .unwrap_or_else(|e| panic!("{engine:?}: reading {id:?} directly: {e}"))
        .map(|s| partial_of(&s))
}

/// Requests whose operation header is `name` exactly (`lock` is neither `lock-holder` nor
/// `lock-takeover`).
fn operation_is(name: &'static str) -> impl Fn(&RequestInfo) -> bool + Send + Sync + 'static {
    move |r: &RequestInfo| r.header(OPERATION).as_deref() == Some(name)
}

fn operation(r: &RequestInfo) -> String {
    r.header(OPERATION).unwrap_or_else(|| "(none)".into())
}

/// A direct contender takes the lock on `id` and releases it; it must get it within
/// [`PROMPTLY`].
async fn takes_the_lock_promptly(db: &str, engine: LockEngine, id: &str, after: &str) {
    let (mut inst, store) = open_direct(db, engine).await;
    let started = Instant::now();
    let lock = inst.lock(store, id).await.unwrap_or_else(|e| {
        panic!(
            "{engine:?}: after {after}, a direct contender could not take the lock on {id:?}: {e}"
        )
    });
    let waited = started.elapsed();
    inst.lock_release(lock).await.unwrap();
    assert!(
        waited < PROMPTLY,
        "{engine:?}: after {after}, a direct contender waited {waited:?} for the lock on {id:?}"
    );
}

/// A fresh CLI process on the direct connection takes the lock on `id` at its first attempt
/// (`--lock-timeout-seconds 0`) and releases it.
fn cli_takes_the_lock_at_once(db: &str, engine: LockEngine, id: &str) {
    let out = cli(clickhouse())
        .args(["lock", "--state-database", db])
        .args(["--lock-engine", engine_name(engine)])
        .args(["--lock-timeout-seconds", "0"])
        .args([id, "--hold", "0s"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{engine:?}: a fresh CLI contender did not get the lock on {id:?} at once (a lock left \
         behind?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `test` on each lock engine at once, each in a thread of its own with its own runtime
/// (the random-fault runs take long, mostly waiting); fails if either failed.
fn on_each_engine_at_once<F, Fut>(test: F)
where
    F: Fn(LockEngine) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = ()>,
{
    let threads: Vec<_> = ENGINES
        .into_iter()
        .map(|engine| {
            let test = test.clone();
            std::thread::Builder::new()
                .name(engine_name(engine).into())
                .spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(test(engine))
                })
                .unwrap()
        })
        .collect();
    let failed: Vec<LockEngine> = ENGINES
        .into_iter()
        .zip(threads)
        .filter_map(|(engine, thread)| thread.join().is_err().then_some(engine))
        .collect();
    assert!(failed.is_empty(), "failed on {failed:?} (see above)");
}

// ---------------------------------------------------------------------------------------------
// A seeded quarter of the requests faulty.

/// The five faults, each given to 1/20 of the requests: a quarter in all.
fn random_faults() -> [Fault; 5] {
    [
        Fault::Refuse,
        Fault::CutRequest,
        Fault::DropReply,
        Fault::CutReply,
        Fault::Stall(STALL),
    ]
}

/// The fault planned for request number `seq` (1-based, as the proxy counts), if any.
fn planned_fault(seed: u64, seq: u64) -> Option<Fault> {
    let slot = seeded_hash(seed, seq) % 20;
    random_faults().get(slot as usize).cloned()
}

/// Adds the rules that fault a seeded quarter of the requests.
fn fault_a_quarter(proxy: &Proxy, seed: u64) {
    for fault in random_faults() {
        let planned = fault.clone();
        proxy.add(Rule::when(
            move |r| planned_fault(seed, r.seq).as_ref() == Some(&planned),
            fault,
        ));
    }
}

/// What a run of merges under random faults did.
struct Run {
    engine: LockEngine,
    db: String,
    /// Per merge `n` (merging `{"k<n>": n}`): success, or the error's kind.
    outcomes: Vec<(usize, Result<(), ErrorKind>)>,
    /// The stored partial part at the end (`{}` if there is no state).
    stored: Value,
    /// Requests sent through the proxy during the merges, and how many were faulted.
    requests: usize,
    faults: usize,
}

impl Run {
    fn successes(&self) -> usize {
        self.outcomes.iter().filter(|(_, r)| r.is_ok()).count()
    }

    fn failures(&self) -> Vec<(usize, ErrorKind)> {
        self.outcomes
            .iter()
            .filter_map(|(n, r)| r.err().map(|k| (*n, k)))
            .collect()
    }

    fn failed_with(&self, kind: ErrorKind) -> usize {
        self.failures().iter().filter(|(_, k)| *k == kind).count()
    }

    /// Merges that failed with a kind that says they were not applied.
    fn certainly_failed(&self) -> usize {
        self.failures()
            .iter()
            .filter(|(_, k)| *k != ErrorKind::Uncertain)
            .count()
    }

    /// Every successful merge's key is stored (with its value), no key of a merge that
    /// certainly failed is, and nothing else is.
    fn check_stored(&self) {
        let engine = self.engine;
        let empty = Map::new();
        let stored = self.stored.as_object().unwrap_or(&empty);
        let mut missing = Vec::new();
        let mut applied_anyway = Vec::new();
        for (n, result) in &self.outcomes {
            let key = format!("k{n}");
            match result {
                Ok(()) if stored.get(&key) != Some(&json!(n)) => {
                    missing.push(format!("{key} = {:?}", stored.get(&key)))
                }
                Ok(()) | Err(ErrorKind::Uncertain) => {}
                Err(kind) if stored.contains_key(&key) => {
                    applied_anyway.push(format!("{key} ({kind:?})"))
                }
                Err(_) => {}
            }
        }
        let strangers: Vec<&String> = stored
            .keys()
            .filter(|k| {
                k.strip_prefix('k')
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_none_or(|n| n >= self.outcomes.len())
            })
            .collect();
        assert!(
            missing.is_empty(),
            "{engine:?}: merges that succeeded but are not stored: {missing:?}"
        );
        assert!(
            applied_anyway.is_empty(),
            "{engine:?}: merges that failed as certainly not applied, yet are stored: \
             {applied_anyway:?}"
        );
        assert!(
            strangers.is_empty(),
            "{engine:?}: stored keys no merge wrote: {strangers:?}"
        );
    }
}

/// Opens a store through a proxy with `retries`, faults a seeded quarter of the requests and
/// merges `{"k<n>": n}` into [`ID`] for n in 0..`merges`, one after the other. Stops early at
/// a `locked` failure (only a lock left behind can cause one: there is no other contender) or
/// when more than `give_up_after` merges have failed. Then removes the faults and reads what
/// is stored directly.
async fn merge_under_faults(
    engine: LockEngine,
    seed: u64,
    retries: Option<u32>,
    merges: usize,
    give_up_after: usize,
) -> Run {
    let db = unique_name("faults");
    open_direct(&db, engine).await;
    let proxy = Proxy::start(&clickhouse().url);
    let (mut inst, store) = open_through(&proxy, &db, engine, retries).await;
    let opened = proxy.requests();
    fault_a_quarter(&proxy, seed);
    let started = Instant::now();
    let mut outcomes = Vec::new();
    let mut failed = 0;
    for n in 0..merges {
        let key = format!("k{n}");
        let result = match inst
            .state_update(store, &state(ID, one_key(&key, json!(n))))
            .await
        {
            Ok(stored) => {
                assert_eq!(
                    partial_of(&stored).get(&key),
                    Some(&json!(n)),
                    "{engine:?}: merge {n} returned a state without its key: {}",
                    stored.partial
                );
                Ok(())
            }
            Err(e) => Err(e.into_component().kind),
        };
        outcomes.push((n, result));
        if result.is_err() {
            failed += 1;
        }
        if result == Err(ErrorKind::Locked) || failed > give_up_after {
            break;
        }
    }
    let elapsed = started.elapsed();
    proxy.clear_rules();
    drop(inst);

    // What the proxy did, by operation: (requests, faulted) and faults by kind.
    let log = proxy.log();
    let log = &log[opened.min(log.len())..];
    let mut by_operation: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut by_fault: BTreeMap<String, usize> = BTreeMap::new();
    for r in log {
        let entry = by_operation.entry(operation(r)).or_default();
        entry.0 += 1;
        if r.fault != Fault::Pass {
            entry.1 += 1;
            let name = format!("{:?}", r.fault);
            *by_fault
                .entry(name.split('(').next().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    let faults = log.iter().filter(|r| r.fault != Fault::Pass).count();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (_, r) in &outcomes {
        if let Err(k) = r {
            *kinds.entry(format!("{k:?}")).or_default() += 1;
        }
    }
    let run = Run {
        engine,
        stored: stored_partial(&db, engine, ID).await.unwrap_or(json!({})),
        db,
        requests: log.len(),
        faults,
        outcomes,
    };
    eprintln!(
        "{engine:?}, retries {retries:?}, seed {seed}: {} merges in {:.1} s: {} succeeded, \
         failures {kinds:?}; {} requests, {faults} faulted {by_fault:?}; by operation \
         (requests, faulted): {by_operation:?}",
        run.outcomes.len(),
        elapsed.as_secs_f64(),
        run.successes(),
        run.requests,
    );
    run
}

/// With the default retries, 200 merges on one state id with a quarter of the requests faulty:
/// at least 190 succeed, the outcomes match what is stored, and no lock is left behind.
#[test]
fn merges_survive_a_quarter_of_requests_failing() {
    const MERGES: usize = 200;
    const AT_LEAST: usize = 190;
    let seed = fault_seed("STATE_FAULTS_SEED");
    let started = Instant::now();
    on_each_engine_at_once(move |engine| async move {
        let run = merge_under_faults(engine, seed, None, MERGES, MERGES - AT_LEAST).await;
        run.check_stored();
        assert_eq!(
            run.failed_with(ErrorKind::Locked),
            0,
            "{engine:?} (seed {seed}): a merge found the lock held with no other contender: \
             a fault left a lock behind"
        );
        assert!(
            run.successes() >= AT_LEAST,
            "{engine:?} (seed {seed}): only {} of {MERGES} merges succeeded with retries \
             (stopped after {} merges); failures: {:?}",
            run.successes(),
            run.outcomes.len(),
            run.failures()
        );
        assert!(
            run.faults >= 100,
            "{engine:?} (seed {seed}): only {} of {} requests were faulted: the test did not \
             test much",
            run.faults,
            run.requests
        );
        cli_takes_the_lock_at_once(&run.db, engine, ID);
    });
    eprintln!("both engines: {:.1} s", started.elapsed().as_secs_f64());
}

/// The control: the same faults without retries make most merges fail (so the test above can
/// fail), and still every outcome is truthful and no lock is left behind (releases and
/// withdrawals are repeated whatever the retries).
#[test]
fn without_retries_most_merges_fail() {
    const MERGES: usize = 40;
    let seed = fault_seed("STATE_FAULTS_SEED");
    on_each_engine_at_once(move |engine| async move {
        let run = merge_under_faults(engine, seed, Some(0), MERGES, usize::MAX).await;
        run.check_stored();
        assert_eq!(
            run.failed_with(ErrorKind::Locked),
            0,
            "{engine:?} (seed {seed}): a merge found the lock held with no other contender: \
             a fault left a lock behind"
        );
        assert_eq!(run.outcomes.len(), MERGES, "{engine:?}");
        assert!(
            run.successes() < MERGES * 9 / 10,
            "{engine:?} (seed {seed}): {} of {MERGES} merges succeeded without retries: the \
             faults do not bite",
            run.successes()
        );
        assert!(
            run.certainly_failed() >= 1,
            "{engine:?} (seed {seed}): no merge failed as certainly not applied: {:?}",
            run.failures()
        );
        assert!(
            run.faults >= 10,
            "{engine:?} (seed {seed}): only {} of {} requests were faulted",
            run.faults,
            run.requests
        );
        cli_takes_the_lock_at_once(&run.db, engine, ID);
    });
}

// ---------------------------------------------------------------------------------------------
// One fault at a chosen point.

/// The reply to an acquire write is lost. Without retries, `update` fails as certainly not
/// applied (`transient`: it failed before the state write, which was never sent), and the
/// acquire is withdrawn, so a direct contender gets the lock at once. With retries, the acquire
/// is resolved and `update` succeeds; then too the contender gets the lock at once.
///
/// The acquire write is `lock` (merge-tree: the acquire row; keeper-map: the creation of an id's
/// row, sent only for an id without one) and, on keeper-map, `lock-takeover` (taking over the
/// row of an id whose lease has ended, e.g. after a release).
#[tokio::test]
async fn lost_acquire_reply_does_not_block_the_next_contender() {
    for engine in ENGINES {
        lost_acquire_reply(engine, "lock").await;
        if engine == LockEngine::KeeperMap {
            lost_acquire_reply(engine, "lock-takeover").await;
        }
    }
}

async fn lost_acquire_reply(engine: LockEngine, acquire: &'static str) {
    let what = format!("{engine:?}, reply to `{acquire}` lost");
    let db = unique_name("lost_acquire");
    let (mut b, sb) = open_direct(&db, engine).await;
    let proxy = Proxy::start(&clickhouse().url);
    let (mut bare, sbare) = open_through(&proxy, &db, engine, Some(0)).await;
    let (mut retried, sretried) = open_through(&proxy, &db, engine, None).await;
    let (id1, id2) = ("no-retries", "retried");
    let mut want1 = Map::new();
    let mut want2 = Map::new();
    if acquire == "lock-takeover" {
        // The ids get a row whose lease has ended (taken and released by B).
        for (id, want) in [(id1, &mut want1), (id2, &mut want2)] {
            b.state_update(sb, &state(id, json!({"b0": 1})))
                .await
                .unwrap();
            want.insert("b0".into(), json!(1));
        }
    }

    // Without retries.
    let before = proxy.requests();
    let rule = proxy.add(Rule::when(operation_is(acquire), Fault::DropReply).times(1));
    let e = bare
        .state_update(sbare, &state(id1, json!({"a1": 1})))
        .await
        .expect_err("an update whose acquire reply was lost, without retries")
        .into_component();
    assert_eq!(proxy.hits(rule), 1, "{what}: the fault was not applied");
    assert_ne!(
        e.kind,
        ErrorKind::Uncertain,
        "{what}: the update failed before its state write, yet says it may be applied: {e}"
    );
    assert_eq!(
        e.kind,
        ErrorKind::Transient,
        "{what}: a failure while acquiring the lock is transient: {e}"
    );
    let sent: Vec<String> = proxy.log()[before..].iter().map(operation).collect();
    assert!(
        !sent.iter().any(|op| op == "set"),
        "{what}: the failed update sent its state write: {sent:?}"
    );
    assert_eq!(
        stored_partial(&db, engine, id1).await,
        (!want1.is_empty()).then(|| Value::Object(want1.clone())),
        "{what}: the failed update wrote the state"
    );
    let started = Instant::now();
    let stored = b
        .state_update(sb, &state(id1, json!({"b1": 1})))
        .await
        .unwrap_or_else(|e| panic!("{what}: the next contender's update failed: {e}"));
    let waited = started.elapsed();
    want1.insert("b1".into(), json!(1));
    assert_eq!(partial_of(&stored), Value::Object(want1), "{what}");
    assert!(
        waited < PROMPTLY,
        "{what}: the next contender's update took {waited:?} (a lock left behind?)"
    );

    // With the default retries.
    let rule = proxy.add(Rule::when(operation_is(acquire), Fault::DropReply).times(1));
    let stored = retried
        .state_update(sretried, &state(id2, json!({"a2": 1})))
        .await
        .unwrap_or_else(|e| panic!("{what}: with retries the update failed: {e}"));
    assert_eq!(proxy.hits(rule), 1, "{what}: the fault was not applied");
    want2.insert("a2".into(), json!(1));
    assert_eq!(partial_of(&stored), Value::Object(want2.clone()), "{what}");
    let started = Instant::now();
    let stored = b
        .state_update(sb, &state(id2, json!({"b2": 1})))
        .await
        .unwrap_or_else(|e| panic!("{what}: the next contender's update failed: {e}"));
    let waited = started.elapsed();
    want2.insert("b2".into(), json!(1));
    assert_eq!(partial_of(&stored), Value::Object(want2.clone()), "{what}");
    assert!(
        waited < PROMPTLY,
        "{what}: after a retried update, the next contender's update took {waited:?}"
    );
    assert_eq!(
        stored_partial(&db, engine, id2).await,
        Some(Value::Object(want2)),
        "{what}"
    );
}

/// The reply to the state write is cut or lost after the server applied it. Without retries,
/// `update` fails with `uncertain` (never `transient`: it may be applied, and it is); with
/// retries it succeeds. The write is stored either way, and the lock is released.
#[tokio::test]
async fn reply_cut_after_the_state_write_is_uncertain_or_success() {
    for engine in ENGINES {
        let db = unique_name("cut_set");
        open_direct(&db, engine).await;
        let proxy = Proxy::start(&clickhouse().url);
        let (mut bare, sbare) = open_through(&proxy, &db, engine, Some(0)).await;
        let (mut retried, sretried) = open_through(&proxy, &db, engine, None).await;
        for fault in [Fault::CutReply, Fault::DropReply] {
            let what = format!("{engine:?}, {fault:?} on the state write");

            let id = format!("{fault:?}-no-retries");
            let rule = proxy.add(Rule::when(operation_is("set"), fault.clone()).times(1));
            let e = bare
                .state_update(sbare, &state(&id, json!({"k": 1})))
                .await
                .expect_err("an update whose state write's reply was cut, without retries")
                .into_component();
            assert_eq!(proxy.hits(rule), 1, "{what}: the fault was not applied");
            assert_eq!(
                e.kind,
                ErrorKind::Uncertain,
                "{what}, without retries: the write was applied, so the failure must be \
                 uncertain: {e}"
            );
            assert_eq!(
                stored_partial(&db, engine, &id).await,
                Some(json!({"k": 1})),
                "{what}, without retries: the write landed"
            );
            takes_the_lock_promptly(&db, engine, &id, &what).await;

            let id = format!("{fault:?}-retried");
            let rule = proxy.add(Rule::when(operation_is("set"), fault.clone()).times(1));
            let stored = retried
                .state_update(sretried, &state(&id, json!({"k": 2})))
                .await
                .unwrap_or_else(|e| panic!("{what}, with retries: the update failed: {e}"));
            assert_eq!(proxy.hits(rule), 1, "{what}: the fault was not applied");
            assert_eq!(partial_of(&stored), json!({"k": 2}), "{what}");
            assert_eq!(
                stored_partial(&db, engine, &id).await,
                Some(json!({"k": 2})),
                "{what}, with retries"
            );
            takes_the_lock_promptly(&db, engine, &id, &what).await;
        }
    }
}

/// The first two releases fail (their reply lost, or refused so that nothing reaches the
/// server): the release is repeated, with or without retries, so `update` succeeds and a
/// direct contender gets the lock at once.
#[tokio::test]
async fn failed_release_is_retried() {
    for engine in ENGINES {
        let db = unique_name("failed_release");
        open_direct(&db, engine).await;
        let proxy = Proxy::start(&clickhouse().url);
        for retries in [None, Some(0)] {
            let (mut a, sa) = open_through(&proxy, &db, engine, retries).await;
            for fault in [Fault::DropReply, Fault::Refuse] {
                let what = format!("{engine:?}, retries {retries:?}, {fault:?} on two releases");
                let id = format!(
                    "{fault:?}-retries-{}",
                    retries.map_or("default".into(), |r: u32| r.to_string())
                );
                let before = proxy.requests();
                let rule = proxy.add(Rule::when(operation_is("unlock"), fault.clone()).times(2));
                let stored = a
                    .state_update(sa, &state(&id, json!({"k": 1})))
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the update failed: {e}"));
                assert_eq!(partial_of(&stored), json!({"k": 1}), "{what}");
                assert_eq!(
                    stored_partial(&db, engine, &id).await,
                    Some(json!({"k": 1})),
                    "{what}"
                );
                takes_the_lock_promptly(&db, engine, &id, &what).await;
                let releases = proxy.log()[before..]
                    .iter()
                    .filter(|r| operation(r) == "unlock")
                    .count();
                assert_eq!(
                    proxy.hits(rule),
                    2,
                    "{what}: only {} release(s) failed: the release was not repeated",
                    proxy.hits(rule)
                );
                assert!(
                    releases >= 3,
                    "{what}: {releases} release(s) sent: two failed, so a third must land"
                );
            }
        }
    }
}

/// A store through a proxy (retries 1) that writes ahead of the lock's confirmation on `id`:
/// the id's lock row exists (keeper-map) and the store knows the state it wrote, `{"a": 1}`.
async fn store_writing_ahead(
    name: &str,
    engine: LockEngine,
    id: &str,
) -> (String, Proxy, Instance, StoreHandle) {
    let db = unique_name(name);
    open_direct(&db, engine).await;
    let proxy = Proxy::start(&clickhouse().url);
    let (mut i, s) = open_through(&proxy, &db, engine, Some(1)).await;
    let lock = i.lock(s, id).await.unwrap();
    i.lock_release(lock).await.unwrap();
    i.state_set(s, &state(id, json!({"a": 1}))).await.unwrap();
    (db, proxy, i, s)
}

/// A reply refusing the statement, as ClickHouse sends it (the request is not forwarded).
fn refusal(status: &str, code: u32, message: &str) -> Fault {
    let body = format!("Code: {code}. DB::Exception: {message}");
    let reply = format!(
        "HTTP/1.1 {status}\r\nX-ClickHouse-Exception-Code: {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    Fault::Respond(std::sync::Arc::new(reply.into_bytes()))
}

/// The operation that claims the lock on `engine`.
fn claim(engine: LockEngine) -> &'static str {
    if engine == LockEngine::MergeTree {
        "lock"
    } else {
        "lock-takeover"
    }
}

/// `update` writing ahead of its lock's confirmation (the store knows the state: it wrote it),
/// with every answer to that write lost: the confirmation decides. The write landed (its reply
/// dropped after the server ran it): the update succeeds without writing again. It did not land
/// (the request cut) and the plain write that follows is refused by the server: `uncertain`,
/// never the refusal's `permanent` (the first attempt might still land).
#[tokio::test]
async fn a_write_ahead_whose_answers_are_lost_is_settled_under_the_lock() {
    for engine in ENGINES {
        let id = "tap-ahead--target-lost";
        let (db, proxy, mut i, s) = store_writing_ahead("ahead_lost", engine, id).await;

        let ahead =
            proxy.add(Rule::when(operation_is("set-unless-changed"), Fault::DropReply).times(2));
        let before = proxy.log().len();
        let stored = i
            .state_update(s, &state(id, json!({"b": 1})))
            .await
            .unwrap_or_else(|e| panic!("{engine:?}: the write ahead landed: {e}"));
        assert_eq!(proxy.hits(ahead), 2, "{engine:?}");
        assert_eq!(partial_of(&stored), json!({"a": 1, "b": 1}), "{engine:?}");
        let ops: Vec<String> = proxy.log()[before..].iter().map(operation).collect();
        let claim = claim(engine);
        assert_eq!(
            ops,
            [
                claim,
                "set-unless-changed",
                "set-unless-changed",
                "lock-holder",
                "unlock"
            ],
            "{engine:?}: settled by the confirmation, not written again"
        );

        proxy.add(Rule::when(operation_is("set-unless-changed"), Fault::CutRequest).times(2));
        // The server refuses the plain write (nothing written, never repeated: `permanent`).
        let plain = proxy.add(
            Rule::when(
                operation_is("set"),
                refusal(
                    "400 Bad Request",
                    62,
                    "Syntax error: failed at position 1. (SYNTAX_ERROR)",
                ),
            )
            .times(1),
        );
        let e = i
            .state_update(s, &state(id, json!({"c": 1})))
            .await
            .expect_err("the plain write after the lost write ahead fails")
            .into_component();
        assert_eq!(
            proxy.hits(plain),
            1,
            "{engine:?}: the plain write was not refused"
        );
        assert_eq!(e.kind, ErrorKind::Uncertain, "{engine:?}: {e}");
        assert_eq!(
            stored_partial(&db, engine, id).await,
            Some(json!({"a": 1, "b": 1})),
            "{engine:?}: nothing landed"
        );
        takes_the_lock_promptly(&db, engine, id, "after the lost write ahead").await;
    }
}

/// A server that refuses the write ahead of the lock's confirmation (a statement it cannot
/// run): the update goes on the plain way and succeeds, and the store writes ahead no more.
#[tokio::test]
async fn a_refused_write_ahead_falls_back_to_the_plain_update_for_good() {
    for engine in ENGINES {
        let id = "tap-ahead--target-refused";
        let (db, proxy, mut i, s) = store_writing_ahead("ahead_refused", engine, id).await;
        proxy.add(Rule::when(
            operation_is("set-unless-changed"),
            refusal(
                "404 Not Found",
                46,
                "Unknown function anyLast. (UNKNOWN_FUNCTION)",
            ),
        ));
        let claim = claim(engine);
        for (n, key) in ["b", "c"].into_iter().enumerate() {
            let before = proxy.log().len();
            let stored = i
                .state_update(s, &state(id, one_key(key, json!(1))))
                .await
                .unwrap_or_else(|e| panic!("{engine:?}: {e}"));
            assert_eq!(
                partial_of(&stored)[key],
                json!(1),
                "{engine:?}: {}",
                stored.partial
            );
            let ops: Vec<String> = proxy.log()[before..].iter().map(operation).collect();
            let expected: &[&str] = if n == 0 {
                &[claim, "set-unless-changed", "lock-holder", "set", "unlock"]
            } else {
                &[claim, "lock-holder", "set", "unlock"]
            };
            assert_eq!(ops, expected, "{engine:?}, update {n}");
        }
        assert_eq!(
            stored_partial(&db, engine, id).await,
            Some(json!({"a": 1, "b": 1, "c": 1}))
        );
    }
}
