//! Resumable sends through the component (`sink.resume`, `send-at`, `send-json-at`): a process
//! that stops with a send in flight is followed by another that continues from the checkpoint
//! and writes every row exactly once, through the real component in the real host against a
//! real ClickHouse engine, with the proxy losing the reply of a chosen INSERT.

use clickhouse_component::client::{ConnectionOptions, ErrorKind};
use clickhouse_component_host::{
    default_allow_list, Instance, SinkHandle, SinkOptions, StoreOptions, Value,
};
use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::{clickhouse, instance, runtime, unique_name};
use serde_json::json;

/// A deduplicating table in a database of its own; returns `db.t`.
fn table() -> String {
    let db = unique_name("resumable");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.t (n UInt32, s String) ENGINE = MergeTree ORDER BY n \
         SETTINGS non_replicated_deduplication_window = 100",
        &[("db", &db)],
    );
    format!("{db}.t")
}

/// (count, distinct n) of the table.
fn counts(table: &str) -> (u64, u64) {
    let (db, t) = table.split_once('.').unwrap();
    let sql = sql();
    let args = [("db", db), ("t", t)];
    (
        sql.count("SELECT count() FROM {db:Identifier}.{t:Identifier}", &args),
        sql.count(
            "SELECT uniqExact(n) FROM {db:Identifier}.{t:Identifier}",
            &args,
        ),
    )
}

fn rows(range: std::ops::Range<u32>) -> Vec<u8> {
    let mut out = Vec::new();
    for n in range {
        out.extend_from_slice(
            json!({"n": n, "s": format!("row {n}")})
                .to_string()
                .as_bytes(),
        );
        out.push(b'\n');
    }
    out
}

fn sink_options(table: &str, dedup: bool) -> SinkOptions {
    SinkOptions {
        table: table.into(),
        columns: None,
        batch_size: Some(40),
        settings: vec![],
        dedup: Some(dedup),
        retries: None,
        compression: None,
    }
}

fn store(database: &str) -> StoreOptions {
    StoreOptions {
        database: Some(database.into()),
        ..Default::default()
    }
}

async fn open(i: &mut Instance, conn: &ConnectionOptions, table: &str) -> SinkHandle {
    i.open_sink(conn, &sink_options(table, true)).await.unwrap()
}

/// Process 1 sends two rows' worth of sends, the second losing the reply of its second
/// chunk's INSERT (committed on the server, an error for the sink): `uncertain`, and the
/// process stops. Process 2 resumes: it gets the first send's position, is refused another
/// send first, sends the one in flight again (its landed chunks dropped by their tokens) and
/// goes on. Every row is in the table once, and a third process resumes after everything.
#[tokio::test]
async fn a_send_in_flight_when_a_process_stopped_is_sent_again_and_written_once() {
    let t = table();
    let state_db = unique_name("resumable_state");
    let proxy = Proxy::start(&clickhouse().url);
    let proxied = proxy.server(clickhouse());
    let conn = proxied.connection();

    // Process 1.
    let mut first = runtime()
        .instantiate(default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    let s = open(&mut first, &conn, &t).await;
    let resumed = first
        .sink_resume(s, "job", &store(&state_db))
        .await
        .unwrap();
    assert_eq!(resumed, None, "a new checkpoint has no position");
    let r = first
        .sink_send_json_at(s, &rows(0..100), "after 100")
        .await
        .unwrap();
    assert_eq!((r.rows, r.chunks), (100, 3));
    // The second send: 100 rows in 3 chunks; the reply of its 2nd chunk is lost (the rule
    // counts from now), and the sink does not retry (retries 0).
    let needle = t.split_once('.').unwrap().0.to_string();
    proxy.add(
        Rule::when(
            move |r| r.target_decoded().contains("INSERT") && r.target_decoded().contains(&needle),
            Fault::DropReply,
        )
        .after(1)
        .times(1),
    );
    let e = first
        .sink_send_json_at(s, &rows(100..200), "after 200")
        .await
        .unwrap_err();
    let e = e.into_component();
    assert_eq!(e.kind, ErrorKind::Uncertain, "{}", e.message);
    assert_eq!(
        counts(&t),
        (180, 180),
        "chunk 1 and the lost-reply chunk 2 landed"
    );
    drop(first);

    // Process 2.
    let mut second = instance().await;
    let direct = clickhouse().connection();
    let s = open(&mut second, &direct, &t).await;
    let resumed = second
        .sink_resume(s, "job", &store(&state_db))
        .await
        .unwrap();
    assert_eq!(resumed.as_deref(), Some("after 100"));
    // Another send first: refused before anything is sent.
    let e = second
        .sink_send_json_at(s, &rows(200..300), "after 300")
        .await
        .unwrap_err();
    let e = e.into_component();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{}", e.message);
    assert!(
        e.message
            .contains("100 rows (ending at position after 200) was in flight"),
        "{}",
        e.message
    );
    assert_eq!(counts(&t), (180, 180));
    // A send without a position is refused by a resumable sink.
    let e = second.sink_send_json(s, &rows(100..200)).await.unwrap_err();
    let m = e.into_component().message;
    assert!(m.contains("keeps a checkpoint"), "{m}");
    // The send in flight again: its two landed chunks are dropped by their tokens.
    let r = second
        .sink_send_json_at(s, &rows(100..200), "after 200")
        .await
        .unwrap();
    assert_eq!((r.rows, r.chunks), (100, 3), "{r:?}");
    // (The receipt cannot show the deduplication: the server reports a deduplicated
    // INSERT's rows as written. The table shows it.)
    assert_eq!(
        counts(&t),
        (200, 200),
        "the landed chunks were written twice"
    );
    let r = second
        .sink_send_at(
            s,
            &[vec![
                ("n".to_string(), Value::Uint(200)),
                ("s".to_string(), Value::Text("row 200".into())),
            ]],
            "after 201",
        )
        .await
        .unwrap();
    assert_eq!(r.rows, 1);
    second.sink_close(s).await.unwrap();
    assert_eq!(counts(&t), (201, 201), "every row once");

    // Process 3: everything is recorded, the last send included (written at close).
    let mut third = instance().await;
    let s = open(&mut third, &direct, &t).await;
    let resumed = third
        .sink_resume(s, "job", &store(&state_db))
        .await
        .unwrap();
    assert_eq!(resumed.as_deref(), Some("after 201"));
    // Another table or batch size under the same id is refused.
    let other = table();
    let s = open(&mut third, &direct, &other).await;
    let e = third
        .sink_resume(s, "job", &store(&state_db))
        .await
        .unwrap_err();
    let m = e.into_component().message;
    assert!(m.contains("was written for table"), "{m}");
    let mut smaller = sink_options(&t, true);
    smaller.batch_size = Some(10);
    let s = third.open_sink(&direct, &smaller).await.unwrap();
    let e = third
        .sink_resume(s, "job", &store(&state_db))
        .await
        .unwrap_err();
    let m = e.into_component().message;
    assert!(m.contains("was written for batch size 40, not 10"), "{m}");
}

/// The rules: a checkpoint needs dedup; a send with a position needs a checkpoint; a state that
/// is not a checkpoint is never taken for one (nor overwritten).
#[tokio::test]
async fn resume_rules() {
    let t = table();
    let state_db = unique_name("resumable_state");
    let conn = clickhouse().connection();
    let mut i = instance().await;
    let plain = i.open_sink(&conn, &sink_options(&t, false)).await.unwrap();
    let e = i
        .sink_resume(plain, "job", &store(&state_db))
        .await
        .unwrap_err();
    let m = e.into_component().message;
    assert!(m.contains("a checkpoint needs dedup"), "{m}");
    let s = open(&mut i, &conn, &t).await;
    let e = i.sink_send_json_at(s, &rows(0..3), "p").await.unwrap_err();
    let m = e.into_component().message;
    assert!(m.contains("needs a checkpoint"), "{m}");
    // A state of someone else's under the id.
    let st = i.open_store(&conn, &store(&state_db)).await.unwrap();
    i.state_set(
        st,
        &clickhouse_component_host::State {
            id: "theirs".into(),
            partial: "{}".into(),
            completed: "{\"singer_state\":{\"bookmarks\":{}}}".into(),
        },
    )
    .await
    .unwrap();
    let e = i
        .sink_resume(s, "theirs", &store(&state_db))
        .await
        .unwrap_err();
    let m = e.into_component().message;
    assert!(m.contains("is not a sink checkpoint"), "{m}");
    let kept = i.state_get(st, "theirs").await.unwrap().unwrap();
    assert_eq!(kept.completed, "{\"singer_state\":{\"bookmarks\":{}}}");
    assert_eq!(counts(&t), (0, 0));
}

/// A send the server refuses whole (nothing committed, not `uncertain`) leaves nothing in
/// flight: the next send, in this process or one that resumes, need not repeat it. And a first
/// send that is refused does not fix the checkpoint's columns.
#[tokio::test]
async fn a_send_refused_whole_is_not_in_flight_and_does_not_fix_the_columns() {
    let db = unique_name("resumable");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.t (n UInt32, s String, CONSTRAINT small CHECK n < 1000) \
         ENGINE = MergeTree ORDER BY n SETTINGS non_replicated_deduplication_window = 100",
        &[("db", &db)],
    );
    let t = format!("{db}.t");
    let state_db = unique_name("resumable_state");
    let conn = clickhouse().connection();
    let mut i = instance().await;
    let s = open(&mut i, &conn, &t).await;
    assert_eq!(
        i.sink_resume(s, "job", &store(&state_db)).await.unwrap(),
        None
    );
    // A first row with a misspelt key: refused, and the columns stay free.
    let typo = b"{\"n\":1,\"z\":\"a\"}\n".to_vec();
    let e = i.sink_send_json_at(s, &typo, "typo").await.unwrap_err();
    assert!(e.into_component().message.contains("'z'"));
    // The server refuses the whole send (its one chunk breaks the constraint).
    let e = i
        .sink_send_json_at(s, &rows(995..1005), "refused")
        .await
        .unwrap_err()
        .into_component();
    assert_ne!(e.kind, ErrorKind::Uncertain, "{}", e.message);
    assert_eq!(e.committed_rows, 0);
    // Another send goes on, in this process and in the next.
    let r = i
        .sink_send_json_at(s, &rows(0..10), "after 10")
        .await
        .unwrap();
    assert_eq!(r.rows, 10);
    drop(i);
    let mut next = instance().await;
    let s = open(&mut next, &conn, &t).await;
    // Not closed: the last send's acknowledgement was never written, so it is the one in
    // flight, sent again (and dropped by its tokens) before the next.
    let resumed = next.sink_resume(s, "job", &store(&state_db)).await;
    assert_eq!(resumed.unwrap(), None);
    let e = next.sink_send_json_at(s, &rows(10..20), "after 20").await;
    let m = e.unwrap_err().into_component().message;
    assert!(m.contains("10 rows (ending at position after 10)"), "{m}");
    next.sink_send_json_at(s, &rows(0..10), "after 10")
        .await
        .unwrap();
    assert_eq!(counts(&t), (10, 10));
    let r = next
        .sink_send_json_at(s, &rows(10..20), "after 20")
        .await
        .unwrap();
    assert_eq!(r.rows, 10);
    assert_eq!(counts(&t), (20, 20));
}
