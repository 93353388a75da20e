//! The sink on Distributed tables, against the local ClickHouse's clusters (its config:
//! `local_one` and `local_two` are shards of this engine, `unreachable` a shard nothing
//! serves): an acknowledged row is on its shard, never in a queue on the initiator.

use clickhouse_component::client::ErrorKind;
use clickhouse_component_host::SinkOptions;
use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::{clickhouse, instance, unique_name};

fn options(table: &str, dedup: Option<bool>, settings: &[(&str, &str)]) -> SinkOptions {
    SinkOptions {
        table: table.into(),
        columns: None,
        batch_size: Some(2),
        settings: settings
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        dedup,
        retries: None,
        compression: None,
    }
}

/// A database with a local table and Distributed tables over each cluster.
fn tables() -> String {
    let db = unique_name("dist");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.local (id UInt64, v String) ENGINE = MergeTree ORDER BY id",
        &[("db", &db)],
    );
    for (name, cluster) in [
        ("one", "local_one"),
        ("two", "local_two"),
        ("gone", "unreachable"),
    ] {
        // Engine arguments take no query parameters: the database name is the test's own
        // (letters, digits and underscores).
        assert!(db.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        sql.exec(
            &format!(
                "CREATE TABLE {{db:Identifier}}.{{t:Identifier}} (id UInt64, v String) ENGINE = Distributed({cluster}, '{db}', 'local', id)"
            ),
            &[("db", &db), ("t", name)],
        );
    }
    db
}

fn local_rows(db: &str) -> u64 {
    sql().count("SELECT count() FROM {db:Identifier}.local", &[("db", db)])
}

fn queued(db: &str) -> u64 {
    sql().count(
        "SELECT count() FROM system.distribution_queue WHERE database = {db:String}",
        &[("db", db)],
    )
}

const ROWS: &[u8] = b"{\"id\":1,\"v\":\"a\"}\n{\"id\":2,\"v\":\"b\"}\n{\"id\":3,\"v\":\"c\"}\n";

#[tokio::test]
async fn acknowledged_rows_are_on_their_shards() {
    let db = tables();
    let mut i = instance().await;
    let conn = clickhouse().connection();
    // One and two local shards: every acknowledged row is in the local table at once.
    for (name, total) in [("one", 3), ("two", 6)] {
        let sink = i
            .open_sink(&conn, &options(&format!("{db}.{name}"), None, &[]))
            .await
            .unwrap();
        let receipt = i.sink_send_json(sink, ROWS).await.unwrap();
        assert_eq!((receipt.rows, receipt.chunks), (3, 2), "{name}");
        // The summary's total covers every table the insert wrote (the Distributed table and
        // the shard's), which docs/sink.md says: not a count of the target's rows.
        assert!(receipt.written_rows >= 3, "{name}: {receipt:?}");
        assert_eq!(local_rows(&db), total, "{name}");
    }
    // A shard nothing serves: the send fails, nothing is queued to be sent later.
    let sink = i
        .open_sink(&conn, &options(&format!("{db}.gone"), None, &[]))
        .await
        .unwrap();
    let e = i
        .sink_send_json(sink, ROWS)
        .await
        .unwrap_err()
        .into_component();
    assert!(
        matches!(
            e.kind,
            ErrorKind::Uncertain
                | ErrorKind::Transient
                | ErrorKind::Disconnected
                | ErrorKind::Permanent
        ),
        "{e}"
    );
    assert_eq!(e.server.as_ref().map(|s| s.code), Some(210), "{e}");
    assert_eq!(queued(&db), 0, "rows were queued on the initiator: {e}");
    assert_eq!(local_rows(&db), 6);
}

#[tokio::test]
async fn background_distributed_inserts_and_dedup_through_them_are_refused() {
    let db = tables();
    let mut i = instance().await;
    let conn = clickhouse().connection();
    for (name, value) in [
        ("distributed_foreground_insert", "0"),
        ("insert_distributed_sync", "false"),
    ] {
        let e = i
            .open_sink(
                &conn,
                &options(&format!("{db}.gone"), None, &[(name, value)]),
            )
            .await
            .unwrap_err()
            .into_component();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
        assert!(e.message.contains("fire-and-forget"), "{e}");
    }
    let e = i
        .open_sink(&conn, &options(&format!("{db}.one"), Some(true), &[]))
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
    assert!(e.message.contains("Distributed"), "{e}");
    assert_eq!(queued(&db), 0);
    assert_eq!(local_rows(&db), 0);
}

/// A table with a materialized view: the summary counts the view's rows too, which is no
/// error (more written than sent); `rows` is what the target received, once.
#[tokio::test]
async fn a_materialized_views_rows_are_counted_in_written_rows_not_rows() {
    let db = unique_name("mv_sink");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.t (id UInt64, v String) ENGINE = MergeTree ORDER BY id",
        &[("db", &db)],
    );
    sql.exec(
        "CREATE TABLE {db:Identifier}.copy (id UInt64, v String) ENGINE = MergeTree ORDER BY id",
        &[("db", &db)],
    );
    sql.exec(
        "CREATE MATERIALIZED VIEW {db:Identifier}.mv TO {db:Identifier}.copy AS SELECT id, v FROM {db:Identifier}.t",
        &[("db", &db)],
    );
    let mut i = instance().await;
    let conn = clickhouse().connection();
    let sink = i
        .open_sink(&conn, &options(&format!("{db}.t"), None, &[]))
        .await
        .unwrap();
    let receipt = i.sink_send_json(sink, ROWS).await.unwrap();
    assert_eq!((receipt.rows, receipt.chunks), (3, 2), "{receipt:?}");
    assert_eq!(
        receipt.written_rows, 6,
        "the target's rows and the view's: {receipt:?}"
    );
    assert_eq!(receipt.unverified_chunks, 0);
    for table in ["t", "copy"] {
        assert_eq!(
            sql.count(
                "SELECT count() FROM {db:Identifier}.{t:Identifier}",
                &[("db", &db), ("t", table)]
            ),
            3,
            "{table}"
        );
    }
}
