//! State store: every operation through the real component in the real host, against a real
//! ClickHouse engine; interop with rows written the way meltano-state-backend-clickhouse
//! writes them; the lock under contention (instances and OS processes), crash recovery and
//! timeout.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use clickhouse_component::client::{ConnectionOptions, ErrorKind};
use clickhouse_component_host::{Instance, LockEngine, State, StoreHandle, StoreOptions};
use clickhouse_component_tests::native::{sql, Sql};
use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::{
    check_sections, cli, clickhouse, create_section_log, engine_name, instance, record_section,
    unique_name, Server,
};
use serde_json::{json, Value};

/// A store in a database of its own.
async fn open(options: StoreOptions) -> (Instance, StoreHandle, String) {
    let db = options
        .database
        .clone()
        .unwrap_or_else(|| unique_name("state"));
    let mut inst = instance().await;
    let store = inst
        .open_store(
            &clickhouse().connection(),
            &StoreOptions {
                database: Some(db.clone()),
                ..options
            },
        )
        .await
        .unwrap();
    (inst, store, db)
}

fn state(id: &str, partial: Value, completed: Value) -> State {
    State {
        id: id.into(),
        partial: partial.to_string(),
        completed: completed.to_string(),
    }
}

fn parts(s: &State) -> (Value, Value) {
    (
        serde_json::from_str(&s.partial).unwrap(),
        serde_json::from_str(&s.completed).unwrap(),
    )
}

#[tokio::test]
async fn get_set_overwrite_and_missing() {
    let (mut i, s, _) = open(StoreOptions::default()).await;
    assert!(i.state_get(s, "nope").await.unwrap().is_none());
    i.state_set(s, &state("a", json!({}), json!({"v": 1})))
        .await
        .unwrap();
    i.state_set(s, &state("a", json!({"p": 1}), json!({"v": 2})))
        .await
        .unwrap();
    let got = i.state_get(s, "a").await.unwrap().unwrap();
    assert_eq!(
        parts(&got),
        (json!({"p": 1}), json!({"v": 2})),
        "newest wins"
    );
    // Missing parts read as {}.
    i.state_set(s, &state("b", json!({}), json!({})))
        .await
        .unwrap();
    let got = i.state_get(s, "b").await.unwrap().unwrap();
    assert_eq!(parts(&got), (json!({}), json!({})));
    // Many overwrites in a row: always the newest.
    for n in 0..20 {
        i.state_set(s, &state("c", json!({}), json!({"n": n})))
            .await
            .unwrap();
    }
    let got = i.state_get(s, "c").await.unwrap().unwrap();
    assert_eq!(parts(&got).1, json!({"n": 19}));
}

#[tokio::test]
async fn update_merges_partials_and_complete_clears_them() {
    let (mut i, s, _) = open(StoreOptions::default()).await;
    let id = "tap-x--target-y";
    i.state_set(s, &state(id, json!({}), json!({"bookmarks": {"s0": 0}})))
        .await
        .unwrap();
    i.state_update(
        s,
        &state(
            id,
            json!({"bookmarks": {"s1": {"v": 1, "keep": true}}}),
            json!({}),
        ),
    )
    .await
    .unwrap();
    i.state_update(
        s,
        &state(
            id,
            json!({"bookmarks": {"s1": {"v": 2}, "s2": [1]}}),
            json!({}),
        ),
    )
    .await
    .unwrap();
    let stored = i
        .state_update(
            s,
            &state(
                id,
                json!({"bookmarks": {"s2": [2, 3]}, "x": null}),
                json!({}),
            ),
        )
        .await
        .unwrap();
    let want_partial =
        json!({"bookmarks": {"s1": {"v": 2, "keep": true}, "s2": [2, 3]}, "x": null});
    assert_eq!(
        parts(&stored),
        (want_partial.clone(), json!({"bookmarks": {"s0": 0}}))
    );
    assert_eq!(
        parts(&i.state_get(s, id).await.unwrap().unwrap()),
        parts(&stored)
    );

    let done = i
        .state_update(
            s,
            &state(
                id,
                json!({"ignored": 1}),
                json!({"bookmarks": {"final": 9}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        parts(&done),
        (json!({}), json!({"bookmarks": {"final": 9}}))
    );
    assert_eq!(
        parts(&i.state_get(s, id).await.unwrap().unwrap()),
        parts(&done)
    );

    // Update of a new id starts from nothing.
    let fresh = i
        .state_update(s, &state("new", json!({"a": 1}), json!({})))
        .await
        .unwrap();
    assert_eq!(parts(&fresh), (json!({"a": 1}), json!({})));
}

#[tokio::test]
async fn delete_and_clear_all_count_what_they_remove() {
    let (mut i, s, _) = open(StoreOptions::default()).await;
    for id in ["a", "b", "c"] {
        i.state_set(s, &state(id, json!({}), json!({"id": id})))
            .await
            .unwrap();
    }
    i.state_set(s, &state("a", json!({}), json!({"again": 1})))
        .await
        .unwrap();
    assert_eq!(i.state_delete(s, "a").await.unwrap(), 1);
    assert_eq!(i.state_delete(s, "a").await.unwrap(), 0);
    assert!(i.state_get(s, "a").await.unwrap().is_none());
    assert_eq!(i.state_clear_all(s).await.unwrap(), 2);
    assert_eq!(i.state_ids(s, None).await.unwrap(), Vec::<String>::new());
    assert_eq!(i.state_clear_all(s).await.unwrap(), 0);
    // The store works after clearing.
    i.state_set(s, &state("a", json!({}), json!({"v": 1})))
        .await
        .unwrap();
    assert_eq!(i.state_ids(s, None).await.unwrap(), vec!["a"]);
}

#[tokio::test]
async fn glob_patterns_have_fnmatch_semantics() {
    let (mut i, s, _) = open(StoreOptions::default()).await;
    let ids = [
        "tap_a--target",
        "tapXa--target",
        "100%",
        "1000",
        "a[b]c",
        "ab",
        "a?",
        "dev:tap-github--target-x",
        "prod:tap-github--target-x",
        "Dev:tap-github--target-x",
    ];
    let states: Vec<State> = ids
        .iter()
        .map(|id| state(id, json!({}), json!({"id": id})))
        .collect();
    i.state_set_all(s, &states).await.unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("tap_a--*", &["tap_a--target"]), // '_' is literal, not LIKE's any-char
        ("100%", &["100%"]),              // '%' is literal
        ("1*", &["100%", "1000"]),
        ("a[[]b]c", &["a[b]c"]),
        ("a[b]c", &[]), // a set: matches "abc" only
        ("a?", &["a?", "ab"]),
        ("a[?]", &["a?"]),
        ("a[!?]", &["ab"]),
        ("dev:*", &["dev:tap-github--target-x"]), // case-sensitive
        (
            "*:tap-github--target-x",
            &[
                "Dev:tap-github--target-x",
                "dev:tap-github--target-x",
                "prod:tap-github--target-x",
            ],
        ),
        ("*", &[]), // special-cased below: everything
        ("nothing*", &[]),
    ];
    for (pattern, want) in cases {
        let mut got = i.state_ids(s, Some(pattern)).await.unwrap();
        got.sort();
        if *pattern == "*" {
            assert_eq!(got.len(), ids.len());
            continue;
        }
        let mut want: Vec<String> = want.iter().map(|w| w.to_string()).collect();
        want.sort();
        assert_eq!(got, want, "pattern {pattern:?}");
        // get-all agrees with ids.
        let mut all: Vec<String> = i
            .state_get_all(s, Some(pattern))
            .await
            .unwrap()
            .into_iter()
            .map(|st| st.id)
            .collect();
        all.sort();
        assert_eq!(all, want, "get-all {pattern:?}");
    }
    assert_eq!(i.state_ids(s, None).await.unwrap().len(), ids.len());
}

#[tokio::test]
async fn awkward_ids_round_trip() {
    let (mut i, s, _) = open(StoreOptions::default()).await;
    let ids = [
        "quote'single",
        "quote\"double",
        "back`tick`",
        "back\\slash",
        "ünïcødé 🚀",
        "semi;colon -- comment /* x */",
        "{id:String}",
        " spaced ",
    ];
    for id in ids {
        i.state_set(s, &state(id, json!({"id": id}), json!({})))
            .await
            .unwrap();
    }
    for id in ids {
        let got = i
            .state_get(s, id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{id:?}"));
        assert_eq!(got.id, id);
        assert_eq!(parts(&got).0, json!({"id": id}));
        if !id.contains(['[', '?', '*']) {
            // Without glob characters a pattern is the id itself.
            assert_eq!(
                i.state_ids(s, Some(id)).await.unwrap(),
                vec![id.to_string()]
            );
        }
    }
    let mut all = i.state_ids(s, None).await.unwrap();
    all.sort();
    let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(all, want);
}

/// Ids with control characters (ESC, NUL, BEL, newline, C1): every write that would create
/// or overwrite one is refused with `invalid-input` naming the character (never the raw id),
/// and nothing is written; one written by another backend (a row in the table) is read,
/// listed and deleted exactly.
#[tokio::test]
async fn ids_with_control_characters_are_written_by_no_one_but_stay_readable() {
    let (mut i, s, db) = open(StoreOptions::default()).await;
    let ids = [
        ("esc\u{1b}[31mRED", "U+001B at byte 3"),
        ("nul\0x", "U+0000 at byte 3"),
        ("bel\u{7}x", "U+0007 at byte 3"),
        ("id\nnl", "U+000A at byte 2"),
        ("c1\u{85}x", "U+0085 at byte 2"),
    ];
    for (id, named) in ids {
        let st = state(id, json!({}), json!({"singer_state": {}}));
        let errors = [
            i.state_set(s, &st).await.unwrap_err(),
            i.state_update(s, &st).await.unwrap_err(),
            i.state_set_all(s, &[state("fine", json!({}), json!({})), st.clone()])
                .await
                .unwrap_err(),
            i.lock(s, id).await.unwrap_err(),
        ];
        for e in errors {
            let e = e.into_component();
            assert_eq!(e.kind, ErrorKind::InvalidInput, "{id:?}: {e}");
            assert_eq!(
                e.message,
                format!("state id contains the control character {named}; ids are job names and may not hold control characters")
            );
        }
    }
    let count = |table: &str| {
        sql().count(
            "SELECT count() FROM {db:Identifier}.{t:Identifier}",
            &[("db", &db), ("t", table)],
        )
    };
    assert_eq!(count("state"), 0, "nothing may reach the state table");
    assert_eq!(count("state_component_lock"), 0, "no lock was taken");

    // As Meltano's or another backend would have written them.
    let rows: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(n, (id, _))| json!({"state_id": id, "partial_state": null, "completed_state": json!({"singer_state": {"n": n}}).to_string()}))
        .collect();
    sql().insert_json(
        "INSERT INTO {db:Identifier}.state (state_id, partial_state, completed_state) FORMAT JSONEachRow",
        &[("db", &db)],
        &rows,
    );
    for (n, (id, _)) in ids.iter().enumerate() {
        let got = i.state_get(s, id).await.unwrap().expect(id);
        assert_eq!(got.id, *id);
        assert_eq!(parts(&got).1, json!({"singer_state": {"n": n}}));
    }
    let mut listed = i.state_ids(s, None).await.unwrap();
    listed.sort();
    let mut want: Vec<String> = ids.iter().map(|(id, _)| id.to_string()).collect();
    want.sort();
    assert_eq!(listed, want);
    assert_eq!(
        i.state_ids(s, Some("id\nnl")).await.unwrap(),
        vec!["id\nnl"]
    );
    for (id, _) in ids {
        assert_eq!(i.state_delete(s, id).await.unwrap(), 1, "{id:?}");
        assert!(i.state_get(s, id).await.unwrap().is_none(), "{id:?}");
    }
}

#[tokio::test]
async fn bad_input_is_rejected_before_anything_is_written() {
    let (mut i, s, db) = open(StoreOptions::default()).await;
    let bad = [
        (state("", json!({}), json!({})), "must not be empty"),
        (
            State {
                id: "x".repeat(1025),
                partial: String::new(),
                completed: String::new(),
            },
            "limit",
        ),
        (
            State {
                id: "a".into(),
                partial: "[1,2]".into(),
                completed: String::new(),
            },
            "must be a JSON object",
        ),
        (
            State {
                id: "a".into(),
                partial: String::new(),
                completed: "42".into(),
            },
            "must be a JSON object",
        ),
        (
            State {
                id: "a".into(),
                partial: "{".into(),
                completed: String::new(),
            },
            "not valid JSON",
        ),
        (
            State {
                id: "a".into(),
                partial: r#"{"k":1,"k":2}"#.into(),
                completed: String::new(),
            },
            "duplicate key",
        ),
    ];
    for (st, want) in &bad {
        let e = i.state_set(s, st).await.unwrap_err().into_component();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
        assert!(e.message.contains(want), "{}", e.message);
        let e = i.state_update(s, st).await.unwrap_err().into_component();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    }
    // set-all is all or nothing: one bad state, nothing written.
    let batch = vec![
        state("good1", json!({}), json!({"v": 1})),
        State {
            id: "bad".into(),
            partial: "[]".into(),
            completed: String::new(),
        },
    ];
    assert_eq!(
        i.state_set_all(s, &batch).await.unwrap_err().kind(),
        Some(ErrorKind::InvalidInput)
    );
    let dup = vec![
        state("d", json!({}), json!({})),
        state("d", json!({}), json!({})),
    ];
    let e = i.state_set_all(s, &dup).await.unwrap_err().into_component();
    assert!(e.message.contains("appears twice"), "{}", e.message);
    let rows = sql().count("SELECT count() FROM {db:Identifier}.state", &[("db", &db)]);
    assert_eq!(rows, 0, "nothing may reach the table");
    assert_eq!(
        i.state_get(s, "").await.unwrap_err().kind(),
        Some(ErrorKind::InvalidInput)
    );
}

#[tokio::test]
async fn bulk_set_all_and_get_all() {
    let (mut i, s, db) = open(StoreOptions::default()).await;
    let states: Vec<State> = (0..500)
        .map(|n| {
            state(
                &format!("job-{n:03}"),
                json!({"n": n}),
                json!({"big": 123456789012345678901234567890u128.to_string()}),
            )
        })
        .collect();
    i.state_set_all(s, &states).await.unwrap();
    let parts_written = sql().count(
        "SELECT count() FROM system.parts WHERE database = {db:String} AND table = 'state' AND active",
        &[("db", &db)],
    );
    assert_eq!(parts_written, 1, "set-all is one INSERT");
    let all = i.state_get_all(s, Some("job-1*")).await.unwrap();
    assert_eq!(all.len(), 100);
    assert_eq!(all[0].id, "job-100");
    assert_eq!(parts(&all[5]).0, json!({"n": 105}));
    assert_eq!(i.state_get_all(s, None).await.unwrap().len(), 500);
    // Exact numbers survive.
    let n: Value =
        serde_json::from_str(r#"{"n":18446744073709551615,"f":1.000000000000000000001}"#).unwrap();
    i.state_set(s, &state("exact", n.clone(), json!({})))
        .await
        .unwrap();
    let got = i.state_get(s, "exact").await.unwrap().unwrap();
    assert_eq!(
        got.partial,
        r#"{"n":18446744073709551615,"f":1.000000000000000000001}"#
    );
}

#[tokio::test]
async fn create_schema_false_needs_existing_tables() {
    let db = unique_name("noschema");
    let mut i = instance().await;
    let conn = clickhouse().connection();
    let e = i
        .open_store(
            &conn,
            &StoreOptions {
                database: Some(db.clone()),
                create_schema: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
    assert!(e.message.contains("does not exist"), "{}", e.message);
    let exists = sql().count(
        "SELECT count() FROM system.databases WHERE name = {db:String}",
        &[("db", &db)],
    );
    assert_eq!(exists, 0, "no DDL may be sent with create-schema off");

    // With the tables created (by a first open), create-schema=false works.
    let (_, _, db) = open(StoreOptions::default()).await;
    let mut i = instance().await;
    i.open_store(
        &conn,
        &StoreOptions {
            database: Some(db),
            create_schema: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// The first run on a server that has none of it: a connection whose database does not exist
/// yet (meltano-state-backend-clickhouse's quick start names the store's own database in its
/// URI, `clickhouse://host:8123/meltano`), or never will (another name), opens the store,
/// creates its schema and keeps state.
#[tokio::test]
async fn a_connection_database_that_does_not_exist_yet_is_no_obstacle() {
    let store_db = unique_name("fresh");
    let elsewhere = unique_name("nowhere");
    for connection_db in [store_db.clone(), elsewhere.clone()] {
        let mut i = instance().await;
        let conn = ConnectionOptions {
            database: Some(connection_db.clone()),
            ..clickhouse().connection()
        };
        let s = i
            .open_store(
                &conn,
                &StoreOptions {
                    database: Some(store_db.clone()),
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("open with connection database {connection_db}: {e}"));
        let written = state(&connection_db, json!({"bookmark": 1}), json!({}));
        i.state_set(s, &written).await.unwrap();
        let read = i.state_get(s, &connection_db).await.unwrap().unwrap();
        assert_eq!(parts(&read), parts(&written));
        let lock = i.lock(s, &connection_db).await.unwrap();
        i.lock_release(lock).await.unwrap();
    }
    let databases = |name: &str| {
        sql().count(
            "SELECT count() FROM system.databases WHERE name = {db:String}",
            &[("db", name)],
        )
    };
    assert_eq!(databases(&store_db), 1);
    assert_eq!(
        databases(&elsewhere),
        0,
        "only the store's database is made"
    );
    let rows = sql().count(
        "SELECT count() FROM {db:Identifier}.state FINAL",
        &[("db", &store_db)],
    );
    assert_eq!(rows, 2);
}

#[tokio::test]
async fn interop_with_meltano_state_backend_clickhouse_rows() {
    let (mut i, s, db) = open(StoreOptions::default()).await;
    let sql = sql();
    // Written the way that backend writes: json.dumps text (", " and ": " separators), NULL for
    // an empty part, updated_at from the column default.
    sql.insert_json(
        "INSERT INTO {db:Identifier}.state (state_id, partial_state, completed_state) FORMAT JSONEachRow",
        &[("db", &db)],
        &[
            json!({"state_id": "py-1", "partial_state": null, "completed_state": "{\"singer_state\": {\"bookmarks\": {\"s\": {\"v\": 1}}}}"}),
            json!({"state_id": "py-2", "partial_state": "{\"singer_state\": {\"p\": 1}}", "completed_state": null}),
        ],
    );
    let one = i.state_get(s, "py-1").await.unwrap().unwrap();
    assert_eq!(
        parts(&one),
        (
            json!({}),
            json!({"singer_state": {"bookmarks": {"s": {"v": 1}}}})
        )
    );
    let two = i.state_get(s, "py-2").await.unwrap().unwrap();
    assert_eq!(parts(&two), (json!({"singer_state": {"p": 1}}), json!({})));
    // A newer row written their way supersedes ours, and the other way round.
    i.state_set(s, &state("shared", json!({}), json!({"by": "component"})))
        .await
        .unwrap();
    sql.insert_json(
        "INSERT INTO {db:Identifier}.state (state_id, partial_state, completed_state) FORMAT JSONEachRow",
        &[("db", &db)],
        &[json!({"state_id": "shared", "partial_state": null, "completed_state": "{\"by\": \"python\"}"})],
    );
    assert_eq!(
        parts(&i.state_get(s, "shared").await.unwrap().unwrap()).1,
        json!({"by": "python"})
    );

    // What we write, read their way: SELECT ... FINAL, json.loads(x) if x else {}.
    i.state_set(
        s,
        &state("ours", json!({}), json!({"singer_state": {"x": 1}})),
    )
    .await
    .unwrap();
    let rows = sql.rows(
        "SELECT partial_state, completed_state FROM {db:Identifier}.state FINAL WHERE state_id = {id:String} LIMIT 1",
        &[("db", &db), ("id", "ours")],
    );
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0]["partial_state"],
        Value::Null,
        "an empty part is NULL, as that backend writes it"
    );
    let completed: Value =
        serde_json::from_str(rows[0]["completed_state"].as_str().unwrap()).unwrap();
    assert_eq!(completed, json!({"singer_state": {"x": 1}}));
    // Their delete (a lightweight DELETE) is seen by us.
    sql.exec(
        "DELETE FROM {db:Identifier}.state WHERE state_id = {id:String}",
        &[("db", &db), ("id", "py-1")],
    );
    assert!(i.state_get(s, "py-1").await.unwrap().is_none());
}

/// The commit-order lock is only sound on a plain MergeTree on one server: a lock table on
/// ReplicatedMergeTree (block numbers from Keeper, before the commit) is refused at open.
/// (The local ClickHouse runs with a ZooKeeper, so a replicated table can be created.)
#[tokio::test]
async fn a_replicated_lock_table_is_refused() {
    let db = unique_name("replock");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.state_component_lock (
            state_id String, token String, kind Enum8('acquire' = 1, 'release' = 2),
            expires_at DateTime64(3), created_at DateTime64(3) DEFAULT now64(3)
        ) ENGINE = ReplicatedMergeTree ORDER BY (state_id, token)
        SETTINGS enable_block_number_column = 1",
        &[("db", &db)],
    );
    let mut i = instance().await;
    let e = i
        .open_store(
            &clickhouse().connection(),
            &StoreOptions {
                database: Some(db.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
    assert!(e.message.contains("ReplicatedMergeTree"), "{}", e.message);
    assert!(
        e.message.contains("only sound on a plain MergeTree"),
        "{}",
        e.message
    );
    assert!(e.message.contains("KeeperMap"), "{}", e.message);
}

#[tokio::test]
async fn a_foreign_lock_table_is_refused_clearly() {
    let db = unique_name("foreignlock");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    // The lock table meltano-state-backend-clickhouse creates (`<table>_lock`).
    sql.exec(
        "CREATE TABLE {db:Identifier}.state_lock (state_id String, lock_id String, locked_at DateTime DEFAULT now())
         ENGINE = ReplacingMergeTree(locked_at) ORDER BY state_id",
        &[("db", &db)],
    );
    let mut i = instance().await;
    // Our default lock table has a name of its own: the store opens beside the Python one.
    i.open_store(
        &clickhouse().connection(),
        &StoreOptions {
            database: Some(db.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Named explicitly, the Python backend's lock table is refused clearly.
    let e = i
        .open_store(
            &clickhouse().connection(),
            &StoreOptions {
                database: Some(db),
                lock_table: Some("state_lock".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured);
    assert!(
        e.message.contains("choose another lock table"),
        "{}",
        e.message
    );
}

/// Both lock engines: every lock test runs on each.
const ENGINES: [LockEngine; 2] = [LockEngine::MergeTree, LockEngine::KeeperMap];

fn lock_options_on(db: &str, engine: LockEngine) -> StoreOptions {
    StoreOptions {
        database: Some(db.into()),
        lock_timeout_ms: Some(120_000),
        lock_retry_ms: Some(10),
        stale_after_ms: Some(60_000),
        lock_engine: Some(engine),
        ..Default::default()
    }
}

fn lock_options(db: &str) -> StoreOptions {
    lock_options_on(db, LockEngine::Auto)
}

/// With `auto` on a server that allows KeeperMap tables (the local ClickHouse runs with a
/// ZooKeeper), a new store's lock table is a KeeperMap table; an explicit engine that
/// contradicts an existing lock table is refused.
#[tokio::test]
async fn auto_picks_keeper_map_and_an_existing_table_decides() {
    let db = unique_name("lockengine");
    let (_, _, _) = open(lock_options(&db)).await;
    let engine = sql().rows(
        "SELECT engine FROM system.tables WHERE database = {db:String} AND name = 'state_component_lock'",
        &[("db", &db)],
    );
    assert_eq!(engine, vec![json!({"engine": "KeeperMap"})]);
    let mut i = instance().await;
    let e = i
        .open_store(
            &clickhouse().connection(),
            &lock_options_on(&db, LockEngine::MergeTree),
        )
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
    assert!(
        e.message.contains("not the merge-tree lock"),
        "{}",
        e.message
    );
    // An explicit merge-tree store elsewhere gets a plain MergeTree lock table.
    let db2 = unique_name("lockengine_mt");
    open(lock_options_on(&db2, LockEngine::MergeTree)).await;
    let engine = sql().rows(
        "SELECT engine FROM system.tables WHERE database = {db:String} AND name = 'state_component_lock'",
        &[("db", &db2)],
    );
    assert_eq!(engine, vec![json!({"engine": "MergeTree"})]);
}

#[test]
fn lock_excludes_8_component_instances_x_25_sections() {
    for engine in ENGINES {
        hammer_instances(engine);
    }
}

fn hammer_instances(engine: LockEngine) {
    let db = unique_name("contention");
    let sql = Sql::new(&clickhouse().connection());
    create_section_log(&sql, &db, "sections");
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let db = db.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let (mut i, s, _) = open(lock_options_on(&db, engine)).await;
                    let sql = Sql::new(&clickhouse().connection());
                    for seq in 0..25 {
                        let lock = i.lock(s, "contended").await.unwrap();
                        record_section(&sql, &db, "sections", &format!("instance-{w}"), seq);
                        i.lock_release(lock).await.unwrap();
                    }
                })
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (complete, overlaps) = check_sections(&sql, &db, "sections");
    assert!(
        overlaps.is_empty(),
        "{engine:?}: overlapping critical sections: {overlaps:#?}"
    );
    assert_eq!(complete, 200, "{engine:?}");
}

#[test]
fn lock_excludes_8_cli_processes_x_25_sections() {
    for engine in ENGINES {
        hammer_processes(engine);
    }
}

fn hammer_processes(engine: LockEngine) {
    let server = clickhouse();
    let db = unique_name("proc_contention");
    let sql = Sql::new(&server.connection());
    create_section_log(&sql, &db, "sections");
    let recorder = clickhouse_component_tests::cli_binary().with_file_name("cs-record");
    assert!(recorder.exists(), "{} not built", recorder.display());
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (db, recorder) = (db.clone(), recorder.clone());
            std::thread::spawn(move || {
                for seq in 0..25 {
                    let out = cli(clickhouse())
                        .args([
                            "lock",
                            // cs-record connects with the credentials.
                            "--pass-credentials",
                            "--state-database",
                            &db,
                            "--lock-retry-seconds",
                            "0.01",
                            "--lock-timeout-seconds",
                            "120",
                            "--lock-engine",
                            engine_name(engine),
                            "contended",
                            "--",
                        ])
                        .arg(&recorder)
                        .args([&db, "sections", &format!("process-{w}"), &seq.to_string()])
                        .stdout(Stdio::null())
                        .output()
                        .unwrap();
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (complete, overlaps) = check_sections(&sql, &db, "sections");
    assert!(
        overlaps.is_empty(),
        "{engine:?}: overlapping critical sections: {overlaps:#?}"
    );
    assert_eq!(complete, 200, "{engine:?}");
}

#[tokio::test]
async fn a_crashed_holder_frees_the_lock_after_the_stale_window() {
    for engine in ENGINES {
        crashed_holder(engine).await;
    }
}

async fn crashed_holder(engine: LockEngine) {
    let db = unique_name("crash");
    let (mut i, s, _) = open(StoreOptions {
        database: Some(db.clone()),
        lock_timeout_ms: Some(15_000),
        lock_retry_ms: Some(50),
        stale_after_ms: Some(2_000),
        lock_engine: Some(engine),
        ..Default::default()
    })
    .await;
    // The holder reaches the server through a proxy that lets its first renewal through and
    // holds the next one: when the second arrives, the first was answered.
    let proxy = Proxy::start(&clickhouse().url);
    proxy.add(Rule::head_contains("x-component-operation: renew\r\n", Fault::Pause).after(1));
    let mut holder = cli(&proxy.server(clickhouse()))
        .args([
            "lock",
            "--state-database",
            &db,
            "--stale-after-seconds",
            "2",
            "--lock-engine",
            engine_name(engine),
            "job",
            "--hold",
            "60s",
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("acquired"), "{line}");
    // One renewal answered (at r1, about 0.67 s after the acquire), the next one held (at r2,
    // about r1 + 0.67 s): then kill it without any chance to release.
    proxy.wait_held(1, Duration::from_secs(10));
    unsafe { libc::kill(holder.id() as i32, libc::SIGKILL) };
    holder.wait().unwrap();
    let killed = Instant::now();
    let lock = i
        .lock(s, "job")
        .await
        .expect("the stale lock must become free");
    let waited = killed.elapsed();
    // It was really held until its renewed lease ran out (r1 + 2 s, about 1.33 s after the
    // kill); a renewal that did not extend the lease would have let go at the acquire's
    // lease end, about 0.67 s after the kill ...
    assert!(
        waited >= Duration::from_millis(1000),
        "acquired after only {waited:?}"
    );
    // ... and freed without manual cleanup, well before the 15 s timeout.
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    i.lock_release(lock).await.unwrap();
}

#[tokio::test]
async fn a_held_lock_times_out_a_contender_with_locked() {
    for engine in ENGINES {
        held_lock_times_out(engine).await;
    }
}

async fn held_lock_times_out(engine: LockEngine) {
    let db = unique_name("timeout");
    let (mut a, sa, _) = open(lock_options_on(&db, engine)).await;
    let held = a.lock(sa, "busy").await.unwrap();
    let (mut b, sb, _) = open(StoreOptions {
        lock_timeout_ms: Some(1_000),
        lock_retry_ms: Some(50),
        ..lock_options_on(&db, engine)
    })
    .await;
    let started = Instant::now();
    let e = b.lock(sb, "busy").await.unwrap_err().into_component();
    let elapsed = started.elapsed();
    assert_eq!(e.kind, ErrorKind::Locked, "{e}");
    assert!(e.message.contains("busy"), "{}", e.message);
    // At least the timeout; and it gave up then, not after the 30 s default (the upper bound
    // leaves room for a loaded 2-core machine: only the order of magnitude is the point).
    assert!(elapsed >= Duration::from_millis(1000), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    // update waits for the same lock and fails the same way, writing nothing.
    let e = b
        .state_update(sb, &state("busy", json!({"x": 1}), json!({})))
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Locked);
    assert!(a.state_get(sa, "busy").await.unwrap().is_none());
    // Released: the contender gets it at once; a timed-out contender left nothing behind.
    a.lock_release(held).await.unwrap();
    let again = b.lock(sb, "busy").await.unwrap();
    b.lock_release(again).await.unwrap();
}

#[tokio::test]
async fn dropping_a_lock_releases_it_and_renew_keeps_it() {
    for engine in ENGINES {
        drop_and_renew(engine).await;
    }
}

async fn drop_and_renew(engine: LockEngine) {
    let db = unique_name("droplock");
    let (mut a, sa, _) = open(lock_options_on(&db, engine)).await;
    let lock = a.lock(sa, "d").await.unwrap();
    a.lock_renew(lock).await.unwrap();
    a.lock_drop(lock).await.unwrap();
    let (mut b, sb, _) = open(StoreOptions {
        lock_timeout_ms: Some(0),
        ..lock_options_on(&db, engine)
    })
    .await;
    let again = b.lock(sb, "d").await.expect("a dropped lock is released");
    b.lock_release(again).await.unwrap();
    b.lock_release(again).await.unwrap_err(); // the handle is gone after release
                                              // A different id is independent.
    let x = b.lock(sb, "d").await.unwrap();
    let y = b.lock(sb, "other").await.unwrap();
    b.lock_release(x).await.unwrap();
    b.lock_release(y).await.unwrap();
}

/// `state ARGS` in database `db` with `stdin`: its exit code, stdout and stderr.
fn state_cli(server: &Server, db: &str, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut cmd = cli(server);
    cmd.arg("state").args(["--state-database", db]).args(args);
    let out = clickhouse_component_tests::output_with_stdin(&mut cmd, stdin);
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_state_commands_round_trip() {
    let server = clickhouse();
    let db = unique_name("cli_state");
    let run_with = |args: &[&str], stdin: &[u8]| state_cli(server, &db, args, stdin);
    let run = |args: &[&str]| run_with(args, b"");
    // Not confirmed (no answer on stdin): nothing is written, as `meltano state set`.
    let (code, out, err) = run(&["set", "job-a", r#"{"singer_state":{"b":1}}"#]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("Continue? [y/N]") && err.contains("Aborted!"),
        "{err}"
    );
    assert_eq!(
        run(&["get", "job-a"]),
        (0, "{}\n".into(), String::new()),
        "nothing set"
    );
    assert_eq!(
        run_with(&["set", "job-a", r#"{"singer_state":{"b":1}}"#], b"y\n").0,
        0
    );
    assert_eq!(run(&["merge", "job-a", r#"{"singer_state":{"c":2}}"#]).0, 0);
    let (code, out, _) = run(&["get", "job-a"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "{\"singer_state\":{\"b\":1,\"c\":2}}\n")
    );
    let (_, out, _) = run(&["get", "job-a", "--format", "pretty"]);
    assert_eq!(
        out,
        "{\n  \"singer_state\": {\n    \"b\": 1,\n    \"c\": 2\n  }\n}\n"
    );
    let (_, out, _) = run(&["--json", "get", "job-a"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["partial"], json!({"singer_state": {"c": 2}}));
    assert_eq!(run(&["copy", "--force", "job-a", "job-b"]).0, 0);
    let (_, out, _) = run(&["--json", "get", "job-b"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&v["completed"], &v["partial"]),
        (&json!({"singer_state": {"b": 1, "c": 2}}), &json!({}))
    );
    assert_eq!(run(&["move", "--force", "job-b", "job_c"]).0, 0);
    assert_eq!(run(&["list"]).1, "job-a\njob_c\n");
    assert_eq!(run(&["list", "--pattern", "job?c"]).1, "job_c\n");
    assert_eq!(run(&["list", "job?c"]).1, "job_c\n");
    let (_, exported, _) = run(&["export"]);
    assert_eq!(exported.lines().count(), 1);
    let v: Value = serde_json::from_str(&exported).unwrap();
    assert_eq!(
        v["job_c"],
        json!({"completed": {"singer_state": {"b": 1, "c": 2}}, "partial": {}})
    );
    let (_, lines, _) = run(&["export", "--format", "ndjson"]);
    assert_eq!(lines.lines().count(), 2);
    assert_eq!(run(&["get", "job-b"]).1, "{}\n");
    assert_eq!(run(&["clear", "--force", "job-b"]).0, 0);
    assert_eq!(run(&["set", "--force", "x", "[1]"]).0, 1);
    let (code, _, err) = run(&["set", "--force", "x", r#"{"b":1}"#]);
    assert_eq!(code, 1);
    assert!(err.contains("singer_state not found in top level"), "{err}");
    assert_eq!(
        run(&["set", "--force", "--no-validate", "x", r#"{"b":1}"#]).0,
        0
    );
    assert_eq!(run(&["clear", "--force", "x"]).0, 0);
    assert_eq!(
        run(&["copy", "--force", "nope", "y"]).0,
        1,
        "a missing source fails validation"
    );
    assert_eq!(run(&["clear-all"]).0, 2, "needs --yes");
    assert_eq!(run(&["clear", "--all"]).0, 1, "not confirmed");
    let (code, out, _) = run(&["--json", "clear", "--all", "--force"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["cleared"], 2);
    let file = std::env::temp_dir().join(format!("{db}.json"));
    std::fs::write(&file, &exported).unwrap();
    let (code, _, err) = run(&["import", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(run(&["list"]).1, "job-a\njob_c\n");
    assert_eq!(run(&["clear-all", "--yes"]).0, 0);
    let (code, _, err) = run_with(&["import"], lines.as_bytes());
    assert_eq!(code, 0, "{err}");
    assert_eq!(run(&["export"]).1, exported, "the same states either way");
    std::fs::write(&file, "{\"id\":\"ok\"}\nnot json\n").unwrap();
    let (code, _, err) = run(&["import", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("line 2"), "{err}");
    assert_eq!(
        run(&["list", "ok"]).1,
        "",
        "nothing of the bad import was written"
    );
    let _ = std::fs::remove_file(file);
}

/// `state` refuses to write an id with control characters (invalid-input, nothing written,
/// the character named, the id never printed raw); ids with them that another backend wrote
/// are listed escaped in plain text (exactly with --json), read with `get`, moved to a good
/// id and cleared.
#[test]
fn cli_refuses_new_ids_with_control_characters_and_lists_stored_ones_escaped() {
    let server = clickhouse();
    let db = unique_name("cli_ids");
    let run_with = |args: &[&str], stdin: &[u8]| state_cli(server, &db, args, stdin);
    let run = |args: &[&str]| run_with(args, b"");
    let state = r#"{"singer_state":{"b":1}}"#;
    assert_eq!(run(&["set", "--force", "src", state]).0, 0);
    let refused = |named: &str| {
        format!("error (invalid-input): state id contains the control character {named}; ids are job names and may not hold control characters\n")
    };
    for (id, named) in [
        ("esc\u{1b}[31mRED", "U+001B at byte 3"),
        ("bel\u{7}x", "U+0007 at byte 3"),
        ("id\nnl", "U+000A at byte 2"),
    ] {
        for args in [
            vec!["set", "--force", id, state],
            vec!["merge", id, state],
            vec!["copy", "--force", "src", id],
            vec!["move", "--force", "src", id],
        ] {
            assert_eq!(run(&args), (2, String::new(), refused(named)), "{args:?}");
        }
        let import = json!({ id: {"completed": {"singer_state": {}}} }).to_string();
        let (code, out, err) = run_with(&["import"], import.as_bytes());
        assert_eq!((code, out.as_str()), (1, ""), "{err}");
        assert!(err.contains(named) && !err.contains(id), "{err}");
    }
    assert_eq!(run(&["list"]).1, "src\n", "nothing was written");

    // As Meltano or another backend would have written them.
    let ids = [
        "back\\slash",
        "bel\u{7}x",
        "esc\u{1b}[31mRED",
        "escRED",
        "id\nnl",
        "nul\0x",
    ];
    let rows: Vec<Value> = ids
        .iter()
        .map(|id| json!({"state_id": id, "partial_state": null, "completed_state": json!({"singer_state": {"id": id}}).to_string()}))
        .collect();
    sql().insert_json(
        "INSERT INTO {db:Identifier}.state (state_id, partial_state, completed_state) FORMAT JSONEachRow",
        &[("db", &db)],
        &rows,
    );
    let (code, out, err) = run(&["list"]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "back\\\\slash\nbel\\x07x\nesc\\x1b[31mRED\nescRED\nid\\nnl\nnul\\x00x\nsrc\n",
            ""
        )
    );
    let (_, out, _) = run(&["--json", "list"]);
    let mut want: Vec<&str> = ids.to_vec();
    want.push("src");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!(want));
    for id in ["esc\u{1b}[31mRED", "bel\u{7}x", "id\nnl"] {
        let (code, out, _) = run(&["get", id]);
        assert_eq!(code, 0);
        let got: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(got, json!({"singer_state": {"id": id}}), "{id:?}");
    }
    // A bad id can be given a good one (move reads and clears its source) ...
    assert_eq!(run(&["move", "--force", "id\nnl", "id-nl"]).0, 0);
    let (_, out, _) = run(&["get", "id-nl"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({"singer_state": {"id": "id\nnl"}})
    );
    // ... or cleared.
    for id in ["esc\u{1b}[31mRED", "bel\u{7}x"] {
        assert_eq!(run(&["clear", "--force", id]).0, 0, "{id:?}");
    }
    assert_eq!(
        run(&["list"]).1,
        "back\\\\slash\nescRED\nid-nl\nnul\\x00x\nsrc\n"
    );
}

#[test]
fn cli_lock_runs_a_command_and_passes_its_status_on() {
    let db = unique_name("cli_lock");
    let out = cli(clickhouse())
        .args([
            "--json",
            "lock",
            "--state-database",
            &db,
            "job",
            "--",
            "sh",
            "-c",
            "exit 7",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 7);
    let out = cli(clickhouse())
        .args(["lock", "--state-database", &db, "job", "--hold", "100ms"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let out = cli(clickhouse())
        .args(["lock", "--state-database", &db, "job"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "needs --hold or a command");
    // The lock on an id no write may create (a control character) is refused, and the
    // command does not run: by the host (a command) and by the component (--hold).
    let ran = std::env::temp_dir().join(format!("{db}.ran"));
    let touch = format!("touch {}", ran.display());
    for args in [
        vec!["--", "sh", "-c", touch.as_str()],
        vec!["--hold", "100ms"],
    ] {
        let out = cli(clickhouse())
            .args(["lock", "--state-database", &db, "job\u{7}"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "error (invalid-input): state id contains the control character U+0007 at byte 3; ids are job names and may not hold control characters\n"
        );
        assert!(!ran.exists(), "the command ran");
    }
}

/// Writes through a held `lock` resource are fenced by it: they land while it holds, and
/// write nothing (`locked`) once its lease has ended and someone else took the lock.
#[tokio::test]
async fn writes_through_a_lock_are_fenced_by_it() {
    for engine in ENGINES {
        let db = unique_name("lockwrites");
        let options = StoreOptions {
            stale_after_ms: Some(1_000),
            lock_timeout_ms: Some(5_000),
            lock_retry_ms: Some(20),
            ..lock_options_on(&db, engine)
        };
        let (mut a, sa, _) = open(options.clone()).await;
        let lock = a.lock(sa, "w").await.unwrap();
        a.lock_set(lock, &state("w", json!({}), json!({"c": 1})))
            .await
            .unwrap();
        let stored = a
            .lock_update(lock, &state("w", json!({"p": 1}), json!({})))
            .await
            .unwrap();
        assert_eq!(
            parts(&stored),
            (json!({"p": 1}), json!({"c": 1})),
            "{engine:?}"
        );
        let e = a
            .lock_set(lock, &state("other", json!({}), json!({})))
            .await
            .unwrap_err()
            .into_component();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{engine:?}: {e}");
        assert_eq!(a.lock_delete(lock).await.unwrap(), 1, "{engine:?}");
        assert!(a.state_get(sa, "w").await.unwrap().is_none());
        // The lease ends; another holder takes the lock; the old handle writes nothing.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let (mut b, sb, _) = open(options).await;
        let other = b.lock(sb, "w").await.unwrap();
        let e = a
            .lock_set(lock, &state("w", json!({}), json!({"stale": true})))
            .await
            .unwrap_err()
            .into_component();
        assert_eq!(e.kind, ErrorKind::Locked, "{engine:?}: {e}");
        assert!(b.state_get(sb, "w").await.unwrap().is_none(), "{engine:?}");
        b.lock_release(other).await.unwrap();
    }
}

/// A command run by `lock ID -- COMMAND` writes the locked id's state through the held lock
/// (CLICKHOUSE_LOCK_ID / CLICKHOUSE_LOCK_TOKEN) instead of waiting for the lock it holds.
#[test]
fn a_command_under_lock_writes_through_the_held_lock() {
    let db = unique_name("heldlock");
    let bin = clickhouse_component_tests::cli_binary();
    let bin = bin.to_str().unwrap();
    let script = format!(
        "'{bin}' state --state-database '{db}' --lock-timeout-seconds 1 merge --no-validate job '{{\"a\":1}}' >/dev/null \
         && '{bin}' state --state-database '{db}' --lock-timeout-seconds 1 set --force --no-validate other '{{\"b\":2}}' >/dev/null"
    );
    let out = cli(clickhouse())
        .args([
            "lock",
            // The command's own CLI connects with the credentials.
            "--pass-credentials",
            "--state-database",
            &db,
            "--lock-timeout-seconds",
            "1",
            "job",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(clickhouse())
        .args(["--json", "state", "--state-database", &db, "get", "job"])
        .output()
        .unwrap();
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["partial"], json!({"a": 1}), "{got}");
}

/// A write under the lock carries the state in the URL while it fits (56,000 URL-encoded
/// bytes), else in the body as an external table: either way it lands whole, byte for byte
/// (tabs, newlines, backslashes, unicode), on both lock engines; and a large write fenced out
/// writes nothing, as a small one.
#[tokio::test]
async fn writes_under_the_lock_take_states_of_any_size() {
    let awkward = "tab\there\nnew line \\ backslash \\t not a tab \u{1F389} ünï\r\0";
    for engine in ENGINES {
        let db = unique_name("bigstate");
        // A lease long enough for a 9 MiB write on a loaded machine; a short one for the
        // fenced-out write below.
        let options = StoreOptions {
            stale_after_ms: Some(60_000),
            lock_timeout_ms: Some(5_000),
            lock_retry_ms: Some(20),
            ..lock_options_on(&db, engine)
        };
        let short = StoreOptions {
            stale_after_ms: Some(1_000),
            ..options.clone()
        };
        let (mut i, s, _) = open(options).await;
        // Sizes around the URL's limit, and 8,000 backslashes: 16,000 in the JSON text, 48,000
        // bytes percent-encoded but 96,000 in the URL (TSV escaping doubles them first).
        for (size, filler) in [
            (50_000, "x"),
            (60_000, "x"),
            (8_000, "\\"),
            (9 * 1024 * 1024, "x"),
        ] {
            let value = format!("{awkward}{}", filler.repeat(size / filler.len()));
            let stored = i
                .state_update(
                    s,
                    &state("big", json!({ "v": value, "n": size }), json!({})),
                )
                .await
                .unwrap();
            assert_eq!(
                parts(&stored).0["v"].as_str(),
                Some(value.as_str()),
                "{engine:?} {size}"
            );
            let got = i.state_get(s, "big").await.unwrap().unwrap();
            assert_eq!(
                parts(&got).0["v"].as_str(),
                Some(value.as_str()),
                "{engine:?} {size}"
            );
            assert_eq!(parts(&got).0["n"], json!(size), "{engine:?}");
        }
        // The lease ends, another holder takes the lock: a large write through the old
        // handle writes nothing.
        let (mut i, s, _) = open(short.clone()).await;
        let lock = i.lock(s, "big").await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let (mut b, sb, _) = open(short).await;
        let other = b.lock(sb, "big").await.unwrap();
        let e = i
            .lock_set(
                lock,
                &state("big", json!({}), json!({ "stale": "y".repeat(100_000) })),
            )
            .await
            .unwrap_err()
            .into_component();
        assert_eq!(e.kind, ErrorKind::Locked, "{engine:?}: {e}");
        let got = b.state_get(sb, "big").await.unwrap().unwrap();
        assert_eq!(parts(&got).0["n"], json!(9 * 1024 * 1024), "{engine:?}");
        b.lock_release(other).await.unwrap();
    }
}

/// Listing and exporting grow with the store, so `ids` and `get-all` ask for a compressed
/// answer (`enable_http_compression=1`, `Accept-Encoding: lz4`): the local ClickHouse then
/// compresses it with the engine's writer, as a server does, and the component decodes it.
/// Other reads do not ask. States with escapes and unicode come back exactly.
#[tokio::test]
async fn listing_and_exporting_read_compressed_answers_exactly() {
    use clickhouse_component_tests::proxy::Proxy;
    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let proxied = proxy.server(server);
    let conn = proxied.connection();
    let (mut i, s) = clickhouse_component_tests::store_in(
        clickhouse_component_tests::runtime(),
        &conn,
        &unique_name("state_packed"),
    )
    .await;
    let states: Vec<State> = (0..300)
        .map(|n| {
            state(
                &format!("tap-{n:03}--target"),
                json!({}),
                json!({"bookmarks": {"s": format!("2026-11-{:02}\t\"é\\{n}", n % 28 + 1)}, "pad": "x".repeat(200)}),
            )
        })
        .collect();
    i.state_set_all(s, &states).await.unwrap();
    let before = proxy.log().len();
    let ids = i.state_ids(s, Some("tap-*")).await.unwrap();
    assert_eq!(ids.len(), 300);
    let all = i.state_get_all(s, None).await.unwrap();
    assert_eq!(all.len(), 300);
    for (got, want) in all.iter().zip(&states) {
        assert_eq!(got.id, want.id);
        assert_eq!(parts(got), parts(want));
    }
    i.state_get(s, "tap-000--target").await.unwrap().unwrap();
    let log = proxy.log();
    let asked: Vec<(String, bool)> = log[before..]
        .iter()
        .map(|r| {
            (
                r.header("x-component-operation").unwrap_or_default(),
                r.header("accept-encoding").as_deref() == Some("lz4")
                    && r.target_decoded().contains("enable_http_compression=1"),
            )
        })
        .collect();
    assert_eq!(
        asked,
        [
            ("ids".to_string(), true),
            ("get-all".to_string(), true),
            ("get".to_string(), false)
        ]
    );
}

/// `update` takes three requests when its result is known before the lock is confirmed (a
/// completed part; a partial one merged into the state this store last wrote): the claim, the
/// fenced write, the release. A partial write checks on the server that the stored state is
/// still the one it was computed from: when another instance wrote in between, the write lets
/// nothing through, the update reads under the lock and keeps the other instance's key (five
/// requests); the next update takes the plain path (four), and, nobody else having written,
/// the one after is back to three. On both lock engines.
#[tokio::test]
async fn update_writes_ahead_of_the_confirmation_only_on_an_unchanged_state() {
    for engine in [LockEngine::MergeTree, LockEngine::KeeperMap] {
        update_ahead(engine).await;
    }
}

async fn update_ahead(engine: LockEngine) {
    use clickhouse_component_tests::proxy::Proxy;
    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let db = unique_name("state_ahead");
    let options = lock_options_on(&db, engine);
    let proxied = proxy.server(server).connection();
    let mut a =
        clickhouse_component_tests::instance_for(clickhouse_component_tests::runtime(), &proxied)
            .await;
    let sa = a.open_store(&proxied, &options).await.unwrap();
    let mut b = instance().await;
    let sb = b.open_store(&server.connection(), &options).await.unwrap();
    let id = "tap-ahead--target";
    let claim = match engine {
        LockEngine::MergeTree => "lock",
        _ => "lock-takeover",
    };
    let update = async |i: &mut Instance, s, partial: Value, completed: Value| {
        let before = proxy.log().len();
        let stored = i
            .state_update(s, &state(id, partial, completed))
            .await
            .unwrap();
        let ops: Vec<String> = proxy.log()[before..]
            .iter()
            .map(|r| r.header("x-component-operation").unwrap_or_default())
            .collect();
        (parts(&stored), ops)
    };
    // The first update of the id: this store knows nothing of it (keeper-map also creates
    // the id's lock row).
    let (got, _) = update(&mut a, sa, json!({"a": 1}), json!({})).await;
    assert_eq!(got, (json!({"a": 1}), json!({})));
    let (got, ops) = update(&mut a, sa, json!({"b": 1}), json!({})).await;
    assert_eq!(got, (json!({"a": 1, "b": 1}), json!({})), "{engine:?}");
    assert_eq!(ops, [claim, "set-unless-changed", "unlock"], "{engine:?}");
    let (got, ops) = update(&mut a, sa, json!({}), json!({"done": 1})).await;
    assert_eq!(got, (json!({}), json!({"done": 1})), "{engine:?}");
    assert_eq!(ops, [claim, "set", "unlock"], "{engine:?}");
    // Another instance writes: what A knows is stale.
    let stored = b
        .state_update(sb, &state(id, json!({"x": 1}), json!({})))
        .await
        .unwrap();
    assert_eq!(parts(&stored), (json!({"x": 1}), json!({"done": 1})));
    let (got, ops) = update(&mut a, sa, json!({"y": 1}), json!({})).await;
    assert_eq!(
        got,
        (json!({"x": 1, "y": 1}), json!({"done": 1})),
        "{engine:?}: the other instance's key was lost"
    );
    assert_eq!(
        ops,
        [claim, "set-unless-changed", "lock-holder", "set", "unlock"],
        "{engine:?}"
    );
    let (got, ops) = update(&mut a, sa, json!({"z": 1}), json!({})).await;
    assert_eq!(got, (json!({"x": 1, "y": 1, "z": 1}), json!({"done": 1})));
    assert_eq!(ops, [claim, "lock-holder", "set", "unlock"], "{engine:?}");
    let (got, ops) = update(&mut a, sa, json!({"w": 1}), json!({})).await;
    assert_eq!(
        got,
        (json!({"w": 1, "x": 1, "y": 1, "z": 1}), json!({"done": 1}))
    );
    assert_eq!(ops, [claim, "set-unless-changed", "unlock"], "{engine:?}");
    let read = b.state_get(sb, id).await.unwrap().unwrap();
    assert_eq!(parts(&read), got, "{engine:?}: stored as returned");
}
