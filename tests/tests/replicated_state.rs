//! The state store on replicated state tables and on clusters (docs/state-store.md,
//! "Replicated tables and ClickHouse Cloud"), against the local ClickHouse.
//!
//! What the engine here can run: it creates ReplicatedReplacingMergeTree tables on its
//! ZooKeeper and reads them, but never activates a replica (an embedded engine has no
//! interserver port, which replication needs: every write is refused, TABLE_IS_READ_ONLY), and
//! it refuses `ON CLUSTER` (no distributed-DDL worker). So these tests check, through the
//! proxy, the statements and settings sent on the wire, and that a replica that cannot write
//! is a clear, retried error. A lost update against a stale replica cannot be shown here; the
//! guarantees table says which guarantees hold on paper only.

use clickhouse_component::client::ErrorKind;
use clickhouse_component_host::{LockEngine, State, StoreOptions};
use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::proxy::{Proxy, RequestInfo};
use clickhouse_component_tests::{clickhouse, instance_for, runtime, unique_name};

const STATE_COLUMNS: &str = "state_id String, partial_state Nullable(String), \
    completed_state Nullable(String), updated_at DateTime64(3) DEFAULT now64(3)";

/// A database whose state table has `engine`.
fn state_table(engine: &str) -> String {
    let db = unique_name("replicated_state");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        &format!(
            "CREATE TABLE {{db:Identifier}}.state ({STATE_COLUMNS}) ENGINE = {engine} ORDER BY state_id"
        ),
        &[("db", &db)],
    );
    db
}

fn store_options(db: &str, retries: u32) -> StoreOptions {
    StoreOptions {
        database: Some(db.into()),
        lock_engine: Some(LockEngine::KeeperMap),
        retries: Some(retries),
        ..Default::default()
    }
}

/// Each request's operation and whether it carried each of `settings` (`name=value` in its
/// URL).
fn sent(log: &[RequestInfo], settings: &[&str]) -> Vec<(String, Vec<bool>)> {
    log.iter()
        .map(|r| {
            let target = r.target_decoded();
            (
                r.header("x-component-operation").unwrap_or_default(),
                settings
                    .iter()
                    .map(|s| target.contains(&format!("{s}&")) || target.ends_with(s))
                    .collect(),
            )
        })
        .collect()
}

const READ: &str = "select_sequential_consistency=1";
const QUORUM: [&str; 2] = ["insert_quorum=auto", "insert_quorum_parallel=0"];

#[tokio::test]
async fn a_replicated_state_table_is_read_and_written_with_sequential_consistency() {
    let db = state_table("ReplicatedReplacingMergeTree(updated_at)");
    let proxy = Proxy::start(&clickhouse().url);
    let conn = proxy.server(clickhouse()).connection();
    let mut i = instance_for(runtime(), &conn).await;
    let s = i.open_store(&conn, &store_options(&db, 1)).await.unwrap();

    let before = proxy.log().len();
    assert!(i.state_get(s, "job").await.unwrap().is_none());
    assert_eq!(i.state_ids(s, None).await.unwrap(), Vec::<String>::new());
    let reads = sent(&proxy.log()[before..], &[READ]);
    assert_eq!(
        reads,
        [
            ("get".to_string(), vec![true]),
            ("ids".to_string(), vec![true])
        ]
    );

    // The replica cannot write (it is never activated here): a quorum insert refused by it
    // (TABLE_IS_READ_ONLY, or KEEPER_EXCEPTION for its missing `is_active` node) is
    // transient, repeated, and said plainly.
    let before = proxy.log().len();
    let state = State {
        id: "job".into(),
        partial: String::new(),
        completed: r#"{"singer_state":{"n":1}}"#.into(),
    };
    let e = i.state_set(s, &state).await.unwrap_err().into_component();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(
        e.message.contains("TABLE_IS_READ_ONLY") || e.message.contains("is_active"),
        "{}",
        e.message
    );
    let writes = sent(&proxy.log()[before..], &QUORUM);
    assert_eq!(
        writes,
        [
            ("set".to_string(), vec![true, true]),
            ("set".to_string(), vec![true, true])
        ],
        "one attempt and one repeat (retries 1), each a sequential quorum insert"
    );

    // update: its read of the stored state (in the lock's holder query) is sequentially
    // consistent too; the fenced write is a quorum insert. (A partial state this store knows
    // nothing of: the write follows the holder query.)
    let partial = State {
        id: "job".into(),
        partial: r#"{"singer_state":{"p":1}}"#.into(),
        completed: String::new(),
    };
    let before = proxy.log().len();
    i.state_update(s, &partial).await.unwrap_err();
    let log = proxy.log()[before..].to_vec();
    let holder: Vec<_> = sent(&log, &[READ])
        .into_iter()
        .filter(|(op, _)| op == "lock-holder")
        .collect();
    assert!(
        !holder.is_empty() && holder.iter().all(|(_, s)| s[0]),
        "{holder:?}"
    );
    let fenced: Vec<_> = sent(&log, &QUORUM)
        .into_iter()
        .filter(|(op, _)| op == "set")
        .collect();
    assert!(
        !fenced.is_empty() && fenced.iter().all(|(_, s)| s == &[true, true]),
        "{fenced:?}"
    );
    // The lock's own statements (KeeperMap) carry none of them.
    for (op, flags) in sent(&log, &[READ, QUORUM[0]]) {
        if ["lock", "lock-takeover", "unlock", "renew"].contains(&op.as_str()) {
            assert_eq!(flags, [false, false], "{op}");
        }
    }

    // A partial update of a state this store knows (no row: it just read it) is written
    // ahead of the lock's confirmation, checking the stored state in the same statement: a
    // sequentially consistent read in a quorum insert.
    assert!(i.state_get(s, "job").await.unwrap().is_none());
    let before = proxy.log().len();
    i.state_update(s, &partial).await.unwrap_err();
    let ahead: Vec<_> = sent(&proxy.log()[before..], &[READ, QUORUM[0], QUORUM[1]])
        .into_iter()
        .filter(|(op, _)| op == "set-unless-changed")
        .collect();
    assert!(
        !ahead.is_empty() && ahead.iter().all(|(_, s)| s == &[true, true, true]),
        "{ahead:?}"
    );
    assert_eq!(
        sql().count(
            "SELECT count() FROM {db:Identifier}.state",
            &[("db", db.as_str())]
        ),
        0
    );
}

#[tokio::test]
async fn a_plain_state_table_gets_no_replication_settings() {
    let db = state_table("ReplacingMergeTree(updated_at)");
    let proxy = Proxy::start(&clickhouse().url);
    let conn = proxy.server(clickhouse()).connection();
    let mut i = instance_for(runtime(), &conn).await;
    let s = i.open_store(&conn, &store_options(&db, 1)).await.unwrap();
    let before = proxy.log().len();
    let state = State {
        id: "job".into(),
        partial: r#"{"singer_state":{"p":1}}"#.into(),
        completed: String::new(),
    };
    i.state_set(s, &state).await.unwrap();
    i.state_update(s, &state).await.unwrap();
    assert!(i.state_get(s, "job").await.unwrap().is_some());
    i.state_delete(s, "job").await.unwrap();
    let log = proxy.log()[before..].to_vec();
    assert!(log.len() >= 6, "{}", log.len());
    assert!(
        log.iter()
            .any(|r| r.header("x-component-operation").as_deref() == Some("set-unless-changed")),
        "the update wrote ahead of the lock's confirmation"
    );
    for r in &log {
        let target = r.target_decoded();
        for setting in [
            "select_sequential_consistency",
            "insert_quorum",
            "lightweight_deletes_sync",
        ] {
            assert!(!target.contains(setting), "{target}");
        }
    }
}

#[tokio::test]
async fn a_cluster_schema_is_created_on_cluster_with_replicated_engines() {
    let db = unique_name("cluster_state");
    let proxy = Proxy::start(&clickhouse().url);
    let conn = proxy.server(clickhouse()).connection();
    let mut i = instance_for(runtime(), &conn).await;
    // A name that needs quoting reaches the server as one identifier: the server looks for
    // that cluster (CLUSTER_DOESNT_EXIST, not a syntax error). A cluster of its config: this
    // engine runs no distributed DDL (QUERY_IS_PROHIBITED). Either is misconfigured, said
    // plainly, and nothing is created.
    for (cluster, code) in [("local_one`; DROP TABLE x --", 701), ("local_one", 392)] {
        let before = proxy.log().len();
        let options = StoreOptions {
            cluster: Some(cluster.into()),
            ..store_options(&db, 0)
        };
        let e = i
            .open_store(&conn, &options)
            .await
            .unwrap_err()
            .into_component();
        assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
        assert!(e.message.contains("ON CLUSTER"), "{}", e.message);
        assert_eq!(e.server.as_ref().map(|s| s.code), Some(code), "{e}");
        let log = proxy.log()[before..].to_vec();
        let statement = format!(
            "{} {}",
            log[0].target_decoded(),
            String::from_utf8_lossy(&log[0].body)
        );
        let quoted = cluster.replace('`', "\\`");
        assert!(
            statement.contains(&format!(
                "CREATE DATABASE IF NOT EXISTS {{db:Identifier}} ON CLUSTER `{quoted}`"
            )),
            "{statement}"
        );
        assert_eq!(log.len(), 1, "nothing after the refused DDL");
    }
    assert_eq!(
        sql().count(
            "SELECT count() FROM system.databases WHERE name = {db:String}",
            &[("db", db.as_str())]
        ),
        0
    );

    // The statements a cluster gets, as the store writes them.
    use clickhouse_component::state::schema::{Create, CREATE_STATE_TABLE};
    let create = Create {
        cluster: Some("main"),
    };
    let table = create.statement(CREATE_STATE_TABLE, "{t:Identifier}");
    assert!(
        table.starts_with(
            "CREATE TABLE IF NOT EXISTS {db:Identifier}.{t:Identifier} ON CLUSTER `main` ("
        ),
        "{table}"
    );
    assert!(
        table.contains("ENGINE = ReplicatedReplacingMergeTree(updated_at)"),
        "{table}"
    );
    let keeper = create.statement(
        clickhouse_component::state::lock::keeper_map::CREATE_TABLE,
        "{t:Identifier}",
    );
    assert!(
        keeper.contains("{t:Identifier} ON CLUSTER `main` (") && keeper.contains("KeeperMap("),
        "{keeper}"
    );
}

#[tokio::test]
async fn the_merge_tree_lock_is_refused_on_a_cluster_before_any_request() {
    let proxy = Proxy::start(&clickhouse().url);
    let conn = proxy.server(clickhouse()).connection();
    let mut i = instance_for(runtime(), &conn).await;
    let options = StoreOptions {
        cluster: Some("local_one".into()),
        lock_engine: Some(LockEngine::MergeTree),
        ..store_options(&unique_name("cluster_state"), 0)
    };
    let e = i
        .open_store(&conn, &options)
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    assert!(e.message.contains("keeper-map"), "{}", e.message);
    assert_eq!(proxy.requests(), 0);
}
