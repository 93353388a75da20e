//! The commit-order lock and the state store under races, made reproducible: the component's
//! core runs natively over a [`PausingTransport`] that holds one chosen request (a renewal, a
//! write under the lock) while the test moves time past the lease or lets another holder act,
//! against the real ClickHouse engine. Each test fails on a store whose renewals are not
//! conditional, whose writes are not fenced, or whose deletes do not take the lock.

use std::thread;
use std::time::{Duration, Instant};

use clickhouse_component::client::{Client, ConnectionOptions, ErrorKind};
use clickhouse_component::platform::std_platform::StdPlatform;
use clickhouse_component::state::{LockEngineChoice, LockOptions, State, StateStore, StoreOptions};
use clickhouse_component_tests::native::{PausingTransport, Sql};
use clickhouse_component_tests::{clickhouse, unique_name};
use serde_json::{json, Map, Value};

type Store = StateStore<PausingTransport, StdPlatform>;

/// Both lock engines: each race runs on each.
const ENGINES: [LockEngineChoice; 2] = [LockEngineChoice::MergeTree, LockEngineChoice::KeeperMap];

fn store_with(
    db: &str,
    lease: Duration,
    connection: ConnectionOptions,
    engine: LockEngineChoice,
) -> (Store, PausingTransport) {
    let transport = PausingTransport::default();
    let client = Client::new(&connection, transport.clone()).unwrap();
    let store = StateStore::open(
        client,
        StdPlatform::default(),
        &StoreOptions {
            database: db.into(),
            lock: LockOptions {
                timeout: Duration::from_secs(20),
                retry: Duration::from_millis(50),
                stale_after: lease,
            },
            lock_engine: engine,
            ..Default::default()
        },
    )
    .unwrap();
    (store, transport)
}

fn store(db: &str, lease: Duration, engine: LockEngineChoice) -> (Store, PausingTransport) {
    store_with(db, lease, clickhouse().connection(), engine)
}

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn state(id: &str, partial: Value, completed: Value) -> State {
    State {
        id: id.into(),
        partial: obj(partial),
        completed: obj(completed),
    }
}

const HELD: Duration = Duration::from_secs(10);

/// A renewal held until the lease has ended and another holder took the lock must not bring
/// the old lease back: it is `locked`, and the new holder stays the holder.
#[test]
fn a_renewal_at_the_lease_edge_never_resurrects_the_lease() {
    for engine in ENGINES {
        renewal_at_the_lease_edge(engine);
    }
}

fn renewal_at_the_lease_edge(engine: LockEngineChoice) {
    let db = unique_name("races_renew");
    let lease = Duration::from_millis(1500);
    let (a, ta) = store(&db, lease, engine);
    let (b, _) = store(&db, lease, engine);
    let held_at = Instant::now();
    let ha = a.lock("job").unwrap();
    // Hold A's renewal before it reaches the server (a renewal written as a check followed by
    // an insert would be held after its check).
    ta.pause_next(&["renew", "lock"]);
    let renewal = thread::scope(|scope| {
        let renewal = scope.spawn(|| a.renew(&ha));
        assert!(ta.wait_held(HELD), "the renewal was never sent");
        thread::sleep((lease + Duration::from_millis(200)).saturating_sub(held_at.elapsed()));
        let hb = b
            .lock("job")
            .expect("the lease has ended: B takes the lock");
        ta.release();
        let renewal = renewal.join().unwrap();
        let holder = b.holder("job").unwrap();
        assert_eq!(
            holder.as_deref(),
            Some(hb.token.as_str()),
            "A's lease came back"
        );
        b.renew(&hb).expect("B still holds and renews");
        renewal
    });
    let e = renewal.expect_err("a renewal after the lease ended must fail");
    assert_eq!(e.kind, ErrorKind::Locked, "{engine:?}: {e}");
}

/// Writes the initial state: by A when A's update is to write ahead of its lock's confirmation
/// (A then knows what is stored), else by B. Returns the operation of A's update write.
fn set_initial(ahead: bool, a: &Store, b: &Store, initial: &State) -> &'static str {
    if ahead { a } else { b }.set(initial).unwrap();
    if ahead {
        "set-unless-changed"
    } else {
        "set"
    }
}

/// A write under the lock that stalls past the lease lands nothing once another holder has the
/// lock: it is `locked`, and the new holder's write stays. Written ahead of the lock's
/// confirmation (`update` knows the stored state: A wrote it), it lands nothing either, and the
/// update then waits for the lock like any contender and applies after B's.
#[test]
fn a_write_delayed_past_the_lease_is_fenced_out() {
    for engine in ENGINES {
        write_delayed_past_the_lease(engine, false);
        write_delayed_past_the_lease(engine, true);
    }
}

fn write_delayed_past_the_lease(engine: LockEngineChoice, ahead: bool) {
    let db = unique_name("races_fence");
    let lease = Duration::from_millis(1500);
    let (a, ta) = store(&db, lease, engine);
    let (b, _) = store(&db, lease, engine);
    let held = set_initial(ahead, &a, &b, &state("job", json!({}), json!({"v": 0})));
    ta.pause_next(&[held]);
    let started = Instant::now();
    let a_result = thread::scope(|scope| {
        let update = scope.spawn(|| a.update(&state("job", json!({"a": 1}), json!({}))));
        assert!(ta.wait_held(HELD), "A's write was never sent");
        thread::sleep((lease + Duration::from_millis(200)).saturating_sub(started.elapsed()));
        b.update(&state("job", json!({"b": 1}), json!({})))
            .expect("A's lease has ended: B updates");
        ta.release();
        update.join().unwrap()
    });
    let got = b.get("job").unwrap().unwrap();
    if ahead {
        let stored = a_result.expect("A's update waits for B's and applies after it");
        assert_eq!(got, stored, "{engine:?}");
        assert_eq!(Value::Object(got.partial), json!({"a": 1, "b": 1}));
    } else {
        let e = a_result.expect_err("A's stale write must be fenced out");
        assert_eq!(e.kind, ErrorKind::Locked, "{engine:?}: {e}");
        assert_eq!(Value::Object(got.partial), json!({"b": 1}));
    }
    assert_eq!(Value::Object(got.completed), json!({"v": 0}));
}

/// A delete (`state clear ID`) racing an update waits for the update's lock, so the update
/// cannot bring the deleted state back (the update's write held, confirmed first or written
/// ahead of the confirmation).
#[test]
fn an_update_racing_a_delete_cannot_bring_the_state_back() {
    for engine in ENGINES {
        update_racing_a_delete(engine, false);
        update_racing_a_delete(engine, true);
    }
}

fn update_racing_a_delete(engine: LockEngineChoice, ahead: bool) {
    let db = unique_name("races_clear");
    let (a, ta) = store(&db, Duration::from_secs(30), engine);
    let (b, tb) = store(&db, Duration::from_secs(30), engine);
    let held = set_initial(ahead, &a, &b, &state("job", json!({}), json!({"v": 1})));
    // The lock row exists (keeper-map): A's takeover makes it the holder before its write
    // (written ahead, that write is otherwise sent before anyone holds the lock, and the
    // delete may go first: then the update applies after it, to no state).
    b.release(&b.lock("job").unwrap()).unwrap();
    ta.pause_next(&[held]);
    let deleted = thread::scope(|scope| {
        let update = scope.spawn(|| a.update(&state("job", json!({"p": 1}), json!({}))));
        assert!(ta.wait_held(HELD), "the update's write was never sent");
        // The delete's first request (its lock claim, or its takeover of the keeper-map row;
        // its DELETE, were it not locked) is held and let go; when its next request is held,
        // the first was answered: it reached the server while the update is held.
        tb.pause_next(&["lock", "lock-takeover", "delete"]);
        let delete = scope.spawn(|| b.delete("job"));
        let first = tb.wait_holds(1, HELD);
        tb.pause_next(&[
            "lock",
            "lock-takeover",
            "lock-holder",
            "unlock",
            "delete",
            "count",
        ]);
        tb.release();
        let answered = first && tb.wait_holds(2, HELD);
        tb.release();
        ta.release();
        assert!(answered, "the delete's first request was not answered");
        update.join().unwrap().expect("the update holds the lock");
        delete.join().unwrap()
    });
    assert_eq!(deleted.expect("the delete runs after the update"), 1);
    assert_eq!(
        b.get("job").unwrap(),
        None,
        "the update brought the state back"
    );
}

/// `enable_named_columns_in_function_tuple=1` (a profile setting on some servers) must not
/// make `update` read the stored parts as empty and wipe the completed state.
#[test]
fn update_keeps_the_completed_state_under_named_tuple_settings() {
    let db = unique_name("races_tuple");
    let mut connection = clickhouse().connection();
    connection.settings = vec![("enable_named_columns_in_function_tuple".into(), "1".into())];
    let (s, _) = store_with(
        &db,
        Duration::from_secs(30),
        connection,
        LockEngineChoice::Auto,
    );
    s.set(&state("job", json!({"a": 1}), json!({"done": true})))
        .unwrap();
    let stored = s.update(&state("job", json!({"b": 2}), json!({}))).unwrap();
    assert_eq!(Value::Object(stored.completed), json!({"done": true}));
    let got = s.get("job").unwrap().unwrap();
    assert_eq!(Value::Object(got.partial), json!({"a": 1, "b": 2}));
    assert_eq!(Value::Object(got.completed), json!({"done": true}));
}

/// Leases are bounded, and a release row outlives the acquire rows it cancels (the TTL reaps
/// rows a day after they expire: a release reaped first would bring the token back).
#[test]
fn leases_are_bounded_and_releases_outlive_acquires() {
    let db = unique_name("races_ttl");
    let transport = PausingTransport::default();
    let client = Client::new(&clickhouse().connection(), transport).unwrap();
    let too_long = StateStore::open(
        client,
        StdPlatform::default(),
        &StoreOptions {
            database: db.clone(),
            lock: LockOptions {
                stale_after: Duration::from_secs(2 * 24 * 3600),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let e = too_long.err().expect("a two-day lease is refused");
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");

    let (s, _) = store(
        &db,
        Duration::from_secs(12 * 3600),
        LockEngineChoice::MergeTree,
    );
    let h = s.lock("job").unwrap();
    s.renew(&h).unwrap();
    s.release(&h).unwrap();
    let sql = Sql::new(&clickhouse().connection());
    let rows = sql.rows(
        "SELECT toUnixTimestamp64Milli(maxIf(expires_at, kind = 'acquire')) AS acquire,
                toUnixTimestamp64Milli(minIf(expires_at, kind = 'release')) AS release
         FROM {db:Identifier}.state_component_lock WHERE token = {token:String}",
        &[("db", &db), ("token", &h.token)],
    );
    let num = |v: &Value| -> i64 {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    let (acquire, release) = (num(&rows[0]["acquire"]), num(&rows[0]["release"]));
    assert!(
        release >= acquire,
        "the release row (expires {release}) would be reaped before the acquire row ({acquire})"
    );
}
