//! Table sink: validation (nothing reaches the server), exact round trips of every value type,
//! chunking, mid-send failure, deduplication, the async-insert rule, and the streaming CLI, all
//! through the real component in the real host against a real ClickHouse engine.

use std::io::Write;
use std::process::Stdio;

use clickhouse_component::client::ErrorKind;
use clickhouse_component_host::{
    default_allow_list, Compression, Instance, SinkHandle, SinkOptions, Value,
};
use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::{
    cli, clickhouse, instance, output_with_stdin, runtime, sink_options, split_peak_rss,
    unique_name, with_peak_rss,
};
use serde_json::{json, Value as Json};

/// A database of its own with one table; returns `db.table`.
fn table(ddl_columns: &str, settings: &str) -> String {
    let db = unique_name("sink");
    let sql = sql();
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        &format!(
            "CREATE TABLE {{db:Identifier}}.t ({ddl_columns}) ENGINE = MergeTree ORDER BY tuple() {settings}"
        ),
        &[("db", &db)],
    );
    format!("{db}.t")
}

fn count(table: &str) -> u64 {
    let (db, t) = table.split_once('.').unwrap();
    sql().count(
        "SELECT count() FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", t)],
    )
}

async fn open(i: &mut Instance, options: &SinkOptions) -> SinkHandle {
    i.open_sink(&clickhouse().connection(), options)
        .await
        .unwrap()
}

fn ndjson(rows: impl IntoIterator<Item = Json>) -> Vec<u8> {
    let mut out = Vec::new();
    for r in rows {
        out.extend_from_slice(r.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

#[tokio::test]
async fn option_rules_are_checked_at_open() {
    let mut i = instance().await;
    let conn = clickhouse().connection();
    let cols = |c: &[&str]| Some(c.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    let settings = |s: &[(&str, &str)]| {
        s.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    };
    let cases: Vec<(SinkOptions, &str)> = vec![
        (sink_options(" "), "table must not be blank"),
        (sink_options("db."), "both parts non-blank"),
        (
            SinkOptions {
                columns: cols(&[]),
                ..sink_options("t")
            },
            "at least one column",
        ),
        (
            SinkOptions {
                columns: cols(&["a", "a"]),
                ..sink_options("t")
            },
            "listed twice",
        ),
        (
            SinkOptions {
                columns: cols(&["a", ""]),
                ..sink_options("t")
            },
            "must not be blank",
        ),
        (
            SinkOptions {
                batch_size: Some(0),
                ..sink_options("t")
            },
            "batch-size must be greater than 0",
        ),
        (
            SinkOptions {
                settings: settings(&[("async_insert", "1")]),
                ..sink_options("t")
            },
            "fire-and-forget",
        ),
        (
            SinkOptions {
                settings: settings(&[("async_insert", "True")]),
                ..sink_options("t")
            },
            "fire-and-forget",
        ),
        (
            SinkOptions {
                settings: settings(&[("async_insert", "1"), ("wait_for_async_insert", "0")]),
                ..sink_options("t")
            },
            "fire-and-forget",
        ),
        (
            SinkOptions {
                settings: settings(&[("bad-name", "1")]),
                ..sink_options("t")
            },
            "unknown option",
        ),
    ];
    for (o, want) in cases {
        let e = i.open_sink(&conn, &o).await.unwrap_err().into_component();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
        assert!(e.message.contains(want), "{:?}: {}", o.table, e.message);
    }
}

#[tokio::test]
async fn row_rules_are_checked_before_any_request() {
    let t = table("a Int64, b String", "");
    let mut i = instance().await;
    let s = open(&mut i, &sink_options(&t)).await;
    let configured = open(
        &mut i,
        &SinkOptions {
            columns: Some(vec!["a".into(), "b".into()]),
            ..sink_options(&t)
        },
    )
    .await;
    let cases: Vec<(SinkHandle, &[u8], &str)> = vec![
        (s, b"", "at least one row"),
        (s, b"[]", "at least one row"),
        (s, b"{}", "line 1 is empty"),
        (s, b"[1]", "element 1 is not a JSON object"),
        (
            s,
            b"{\"a\":1,\"b\":\"x\"}\n[2]",
            "line 2 is not a JSON object",
        ),
        (
            s,
            b"{\"a\":1,\"b\":\"x\"}\n{\"a\":2}",
            "line 2: missing 'b' (every row must have the same keys as the first row)",
        ),
        (
            s,
            b"{\"a\":1,\"b\":\"x\"}\n{\"a\":2,\"b\":\"y\",\"c\":3}",
            "line 2: extra 'c'",
        ),
        (
            configured,
            b"{\"a\":1}",
            "line 1: missing 'b' (every row must have exactly the configured columns)",
        ),
        (
            configured,
            b"{\"a\":1,\"b\":\"x\"}\n{\"a\":1,\"c\":\"x\"}",
            "line 2: missing 'b'; extra 'c'",
        ),
        (s, b"{\"a\":1,\"a\":2}", "appears twice"),
        (s, b"{\"a\":1,", "not valid JSON"),
    ];
    for (handle, data, want) in cases {
        let e = i
            .sink_send_json(handle, data)
            .await
            .unwrap_err()
            .into_component();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
        assert!(
            e.message.contains(want),
            "{}: {}",
            String::from_utf8_lossy(data),
            e.message
        );
    }
    // Typed rows follow the same rules.
    let e = i.sink_send(s, &[]).await.unwrap_err().into_component();
    assert!(e.message.contains("at least one row"));
    let rows = vec![
        vec![
            ("a".to_string(), Value::Int(1)),
            ("b".to_string(), Value::Text("x".into())),
        ],
        vec![("a".to_string(), Value::Int(2))],
    ];
    let e = i.sink_send(s, &rows).await.unwrap_err().into_component();
    assert!(e.message.contains("row 2: missing 'b'"), "{}", e.message);
    let e = i
        .sink_send(
            s,
            &[vec![
                ("a".into(), Value::Float(f64::INFINITY)),
                ("b".into(), Value::Null),
            ]],
        )
        .await
        .unwrap_err()
        .into_component();
    assert!(e.message.contains("NaN and infinity"), "{}", e.message);
    // A bad row late in a large send: nothing at all was written.
    let mut data = ndjson((0..5000).map(|n| json!({"a": n, "b": "ok"})));
    data.extend_from_slice(b"{\"a\":1}\n");
    assert_eq!(
        i.sink_send_json(s, &data).await.unwrap_err().kind(),
        Some(ErrorKind::InvalidInput)
    );
    assert_eq!(count(&t), 0, "nothing may reach the server");
}

#[tokio::test]
async fn every_value_type_round_trips_exactly() {
    let t = table(
        "id UInt32, b Bool, i Int64, u UInt64, f Float64, s String, e String, n Nullable(String), j String, raw String, d Decimal(38, 18)",
        "",
    );
    let mut i = instance().await;
    let s = open(&mut i, &sink_options(&t)).await;
    let row = |id: i64,
               b: bool,
               int: i64,
               uint: u64,
               f: f64,
               text: &str,
               n: Option<&str>,
               j: &str,
               raw: &[u8]| {
        vec![
            ("id".to_string(), Value::Int(id)),
            ("b".to_string(), Value::Boolean(b)),
            ("i".to_string(), Value::Int(int)),
            ("u".to_string(), Value::Uint(uint)),
            ("f".to_string(), Value::Float(f)),
            ("s".to_string(), Value::Text(text.into())),
            ("e".to_string(), Value::Text(String::new())),
            (
                "n".to_string(),
                n.map_or(Value::Null, |v| Value::Text(v.into())),
            ),
            ("j".to_string(), Value::Json(j.into())),
            ("raw".to_string(), Value::Bytes(raw.to_vec())),
            ("d".to_string(), Value::Json("1.000000000000000001".into())),
        ]
    };
    let rows = vec![
        row(
            1,
            true,
            i64::MIN,
            u64::MAX,
            0.1,
            "ünïcødé 🚀 \"quoted\" \\ \t tab",
            None,
            r#"{"k":[1,2.50,"x"],"n":null}"#,
            &[0xff, 0x00, b'a', 0xfe],
        ),
        row(2, false, -1, 0, -1.5e300, "", Some(""), "[]", b""),
        row(
            3,
            true,
            i64::MAX,
            1,
            f64::MIN_POSITIVE,
            "line\nbreak",
            Some("present"),
            "\"just a string\"",
            b"plain",
        ),
    ];
    let receipt = i.sink_send(s, &rows).await.unwrap();
    assert_eq!(
        (receipt.rows, receipt.chunks, receipt.written_rows),
        (3, 1, 3)
    );
    let (db, tb) = t.split_once('.').unwrap();
    let got = sql().rows(
        "SELECT id, b, i, toString(u) AS u, f, s, e, n, j, hex(raw) AS raw, toString(d) AS d
         FROM {db:Identifier}.{t:Identifier} ORDER BY id SETTINGS output_format_json_quote_64bit_integers = 0",
        &[("db", db), ("t", tb)],
    );
    assert_eq!(got.len(), 3);
    assert_eq!(got[0]["b"], json!(true));
    assert_eq!(got[0]["i"], json!(i64::MIN));
    assert_eq!(got[0]["u"], json!(u64::MAX.to_string()));
    assert_eq!(got[0]["f"].as_f64(), Some(0.1));
    assert_eq!(got[0]["s"], json!("ünïcødé 🚀 \"quoted\" \\ \t tab"));
    assert_eq!(got[0]["e"], json!(""));
    assert_eq!(got[0]["n"], Json::Null);
    assert_eq!(
        got[0]["j"],
        json!(r#"{"k":[1,2.50,"x"],"n":null}"#),
        "JSON text into String keeps its exact text"
    );
    assert_eq!(got[0]["raw"], json!("FF0061FE"));
    assert_eq!(got[0]["d"], json!("1.000000000000000001"));
    assert_eq!(got[1]["i"], json!(-1));
    assert_eq!(got[1]["f"].as_f64(), Some(-1.5e300));
    assert_eq!(got[1]["n"], json!(""), "an empty string is not a null");
    assert_eq!(got[1]["j"], json!("[]"));
    assert_eq!(got[2]["i"], json!(i64::MAX));
    assert_eq!(got[2]["s"], json!("line\nbreak"));
    assert_eq!(got[2]["f"].as_f64(), Some(f64::MIN_POSITIVE));

    // The JSON fast path keeps numbers exactly as written.
    let data = b"{\"id\":10,\"b\":true,\"i\":-9223372036854775808,\"u\":18446744073709551615,\"f\":0.30000000000000004,\"s\":\"x\",\"e\":\"\",\"n\":null,\"j\":\"{}\",\"raw\":\"r\",\"d\":99999999999999999999.999999999999999999}\n";
    i.sink_send_json(s, data).await.unwrap();
    let got = sql().rows(
        "SELECT toString(u) AS u, toString(i) AS i, toString(d) AS d, f FROM {db:Identifier}.{t:Identifier} WHERE id = 10",
        &[("db", db), ("t", tb)],
    );
    assert_eq!(got[0]["u"], json!("18446744073709551615"));
    assert_eq!(got[0]["i"], json!("-9223372036854775808"));
    assert_eq!(
        got[0]["d"],
        json!("99999999999999999999.999999999999999999")
    );
    assert_eq!(got[0]["f"].as_f64(), Some(0.30000000000000004));
}

#[tokio::test]
async fn nulls_never_become_defaults_and_unknown_keys_are_never_dropped() {
    let t = table(
        "a Int64, s String, arr Array(UInt32), m Map(String, UInt8), n Nullable(UInt32), \
         an Array(Nullable(UInt32))",
        "",
    );
    let mut i = instance().await;
    let s = open(&mut i, &sink_options(&t)).await;
    let ok = r#"{"a":1,"s":"x","arr":[1],"m":{"k":1},"n":null,"an":[1,null]}"#;
    // A null where the type holds none: refused before any INSERT (ClickHouse's JSON input
    // would store 0 for the numbers whatever input_format_null_as_default says).
    let not_nullable = "null is not allowed: the column is not Nullable";
    for (bad, column) in [
        (ok.replace(r#""a":1"#, r#""a":null"#), "'a'"),
        (ok.replace(r#""s":"x""#, r#""s":null"#), "'s'"),
        (ok.replace("[1]", "[1,null]"), "'arr'"),
        (ok.replace(r#"{"k":1}"#, r#"{"k":null}"#), "'m'"),
        (ok.replace("[1,null]", "null"), "'an'"),
    ] {
        let column = format!("{column}: {not_nullable}");
        let data = format!("{ok}\n{bad}\n");
        let e = i
            .sink_send_json(s, data.as_bytes())
            .await
            .unwrap_err()
            .into_component();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
        assert!(
            e.message.starts_with(&format!("line 2, column {column}")),
            "{column}: {}",
            e.message
        );
    }
    let typed = vec![
        ("a".to_string(), Value::Null),
        ("s".to_string(), Value::Text("x".into())),
        ("arr".to_string(), Value::Json("[]".into())),
        ("m".to_string(), Value::Json("{}".into())),
        ("n".to_string(), Value::Null),
        ("an".to_string(), Value::Json("[]".into())),
    ];
    let e = i.sink_send(s, &[typed]).await.unwrap_err().into_component();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    assert_eq!(count(&t), 0);
    // Nulls where the type holds them arrive as nulls.
    i.sink_send_json(s, ok.as_bytes()).await.unwrap();
    let (db, tb) = t.split_once('.').unwrap();
    let got = sql().rows(
        "SELECT n, an FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", tb)],
    );
    assert_eq!(got, vec![json!({"n": null, "an": [1, null]})]);
    let t = table("a Int64, s String", "");
    let s = open(&mut i, &sink_options(&t)).await;
    // A key the table does not have is an unknown column (misconfigured), not silently dropped.
    let e = i
        .sink_send_json(s, b"{\"a\":1,\"s\":\"x\",\"zz\":1}")
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
    assert_eq!(count(&t), 0);
}

#[tokio::test]
async fn chunking_acknowledges_each_insert_in_order() {
    let t = table("n UInt32, s String", "");
    let (db, tb) = t.split_once('.').unwrap();
    sql().exec(
        "SYSTEM STOP MERGES {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", tb)],
    );
    let mut i = instance().await;
    let s = open(
        &mut i,
        &SinkOptions {
            batch_size: Some(1000),
            ..sink_options(&t)
        },
    )
    .await;
    let data = ndjson((0..10_001).map(|n| json!({"n": n, "s": format!("row {n}")})));
    let r = i.sink_send_json(s, &data).await.unwrap();
    assert_eq!((r.rows, r.chunks, r.written_rows), (10_001, 11, 10_001));
    assert_eq!((r.deduplicated_chunks, r.unverified_chunks), (0, 0));
    assert_eq!(count(&t), 10_001);
    // 11 INSERTs, in order: 11 parts whose block numbers follow the chunk order.
    let parts = sql().rows(
        "SELECT min(n) AS first, max(n) AS last, count() AS rows FROM {db:Identifier}.{t:Identifier}
         GROUP BY _part ORDER BY min(_block_number)",
        &[("db", db), ("t", tb)],
    );
    assert_eq!(parts.len(), 11);
    for (k, p) in parts.iter().enumerate() {
        assert_eq!(p["first"], json!(k * 1000), "{p}");
        let rows = p["rows"]
            .as_u64()
            .or_else(|| p["rows"].as_str().and_then(|s| s.parse().ok()))
            .unwrap();
        assert_eq!(rows, if k == 10 { 1 } else { 1000 });
    }
}

#[tokio::test]
async fn every_compression_method_lands_the_same_rows_and_shrinks_the_wire() {
    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let proxied = proxy.server(server);
    let conn = proxied.connection();
    let mut i = runtime()
        .instantiate(default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    // Values that a codec or a server's decoder could get wrong: escapes, unicode, NUL.
    let value = |n: usize| format!("row {n}\t\"q\"\\ é 漢 \u{0} {}", "x".repeat(n % 97));
    let data = ndjson((0..3000).map(|n| json!({"n": n, "s": value(n)})));
    for (method, name) in [
        (None, "lz4"),
        (Some(Compression::None), "none"),
        (Some(Compression::Lz4), "lz4"),
        (Some(Compression::Zstd), "zstd"),
        (Some(Compression::Gzip), "gzip"),
    ] {
        let t = table("n UInt32, s String", "");
        let (db, tb) = t.split_once('.').unwrap();
        let before = proxy.log().len();
        let s = i
            .open_sink(
                &conn,
                &SinkOptions {
                    batch_size: Some(1000),
                    compression: method,
                    ..sink_options(&t)
                },
            )
            .await
            .unwrap();
        let r = i.sink_send_json(s, &data).await.unwrap();
        assert_eq!(
            (r.rows, r.chunks, r.written_rows),
            (3000, 3, 3000),
            "{name}"
        );
        let got = sql().rows(
            "SELECT n, s FROM {db:Identifier}.{t:Identifier} ORDER BY n",
            &[("db", db), ("t", tb)],
        );
        assert_eq!(got.len(), 3000, "{name}");
        for (n, row) in got.iter().enumerate() {
            assert_eq!(row["n"], json!(n), "{name}");
            assert_eq!(row["s"], json!(value(n)), "{name}: row {n} differs");
        }
        // On the wire: three INSERTs, each with its Content-Encoding and a smaller body.
        let inserts: Vec<_> = proxy.log()[before..]
            .iter()
            .filter(|r| r.target_decoded().contains("INSERT INTO"))
            .cloned()
            .collect();
        assert_eq!(inserts.len(), 3, "{name}");
        let wire: usize = inserts.iter().map(|r| r.body.len()).sum();
        for r in &inserts {
            assert_eq!(
                r.header("content-encoding").as_deref(),
                (name != "none").then_some(name),
                "{name}"
            );
        }
        // Uncompressed, each body is one Native block: a row's 4-byte `n`, its string's length
        // and bytes, and per block the column and row counts, names and types.
        let native: usize = (0..3000).map(|n| 4 + 1 + value(n).len()).sum::<usize>()
            + 3 * (2 + 2 + 1 + 1 + 6 + 1 + 1 + 1 + 6);
        if name == "none" {
            assert_eq!(wire, native);
        } else {
            assert!(
                wire * 3 < native,
                "{name}: {wire} bytes on the wire for {native}"
            );
        }
    }
}

#[tokio::test]
async fn a_rejected_chunk_after_committed_ones_is_uncertain() {
    // Every value is read before anything is sent, so the server's refusal of a later chunk
    // comes from what only it checks: a CHECK constraint.
    let columns = "n UInt32, at DateTime, CONSTRAINT not_2500 CHECK n != 2500";
    let t = table(columns, "");
    let mut i = instance().await;
    let s = open(
        &mut i,
        &SinkOptions {
            batch_size: Some(1000),
            ..sink_options(&t)
        },
    )
    .await;
    let data = ndjson((0..5000).map(|n| json!({"n": n, "at": "2026-11-29 10:00:00"})));
    let e = i
        .sink_send_json(s, &data)
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Uncertain, "{e}");
    assert_eq!(e.committed_rows, 2000);
    assert!(e.message.contains("chunk 3 of 5"), "{}", e.message);
    assert!(e.message.contains("2000 rows"), "{}", e.message);
    assert!(e.server.is_some(), "the server's error is kept");
    let (db, tb) = t.split_once('.').unwrap();
    let got = sql().rows(
        "SELECT count() AS c, min(n) AS lo, max(n) AS hi FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", tb)],
    );
    let num = |v: &Json| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    assert_eq!(
        (num(&got[0]["c"]), num(&got[0]["lo"]), num(&got[0]["hi"])),
        (2000, 0, 1999),
        "exactly the first two chunks"
    );

    // The same failure in the first chunk keeps its own kind.
    let t2 = table(columns, "");
    let s2 = open(
        &mut i,
        &SinkOptions {
            batch_size: Some(1000),
            ..sink_options(&t2)
        },
    )
    .await;
    let e = i
        .sink_send_json(s2, b"{\"n\":2500,\"at\":\"2026-11-29 10:00:00\"}")
        .await
        .unwrap_err()
        .into_component();
    assert_eq!((e.kind, e.committed_rows), (ErrorKind::Permanent, 0));

    // A value its column's type does not read, in the third chunk: refused before anything
    // is sent, naming the row and the column; nothing written.
    let data = ndjson((0..5000).map(|n| {
        let at = if n == 2400 {
            "not a date"
        } else {
            "2026-11-29 10:00:00"
        };
        json!({"n": n, "at": at})
    }));
    let e = i
        .sink_send_json(s2, &data)
        .await
        .unwrap_err()
        .into_component();
    assert_eq!((e.kind, e.committed_rows), (ErrorKind::InvalidInput, 0));
    assert!(
        e.message
            .starts_with("line 2401, column 'at': \"not a date\" is not a date and time"),
        "{}",
        e.message
    );
    assert_eq!(count(&t2), 0);
}

#[tokio::test]
async fn dedup_makes_resends_harmless_on_a_deduplicating_table_only() {
    let data = ndjson((0..2500).map(|n| json!({"n": n})));
    let mut i = instance().await;
    let conn = clickhouse().connection();
    // A deduplicating MergeTree: re-sending the same rows (the retry after an uncertain
    // failure) adds nothing.
    let t = table(
        "n UInt32",
        "SETTINGS non_replicated_deduplication_window = 100",
    );
    let deduped = SinkOptions {
        batch_size: Some(1000),
        dedup: Some(true),
        ..sink_options(&t)
    };
    let s = i.open_sink(&conn, &deduped).await.unwrap();
    i.sink_send_json(s, &data).await.unwrap();
    i.sink_send_json(s, &data).await.unwrap();
    assert_eq!(count(&t), 2500, "the re-send was absorbed");
    // A send whose first two chunks committed before it failed, then retried whole: the
    // committed chunks are absorbed and only the third is written.
    let t_retry = table(
        "n UInt32",
        "SETTINGS non_replicated_deduplication_window = 100",
    );
    let o = SinkOptions {
        batch_size: Some(1000),
        dedup: Some(true),
        ..sink_options(&t_retry)
    };
    let r = i.open_sink(&conn, &o).await.unwrap();
    i.sink_send_json(r, &ndjson((0..2000).map(|n| json!({"n": n}))))
        .await
        .unwrap();
    i.sink_send_json(r, &data).await.unwrap();
    assert_eq!(
        count(&t_retry),
        2500,
        "committed chunks absorbed, the rest written once"
    );
    // A table that does not deduplicate: the same re-send duplicates every row (proof the
    // assertions above can fail), so dedup is refused on it at open, naming the setting.
    let plain = table("n UInt32", "");
    let o = SinkOptions {
        batch_size: Some(1000),
        ..sink_options(&plain)
    };
    let s = i.open_sink(&conn, &o).await.unwrap();
    i.sink_send_json(s, &data).await.unwrap();
    i.sink_send_json(s, &data).await.unwrap();
    assert_eq!(count(&plain), 5000);
    let e = i
        .open_sink(
            &conn,
            &SinkOptions {
                dedup: Some(true),
                ..o.clone()
            },
        )
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured, "{}", e.message);
    assert!(
        e.message
            .contains("non_replicated_deduplication_window = 0"),
        "{}",
        e.message
    );
    // Contradictory options are refused.
    let contradiction = SinkOptions {
        settings: vec![("insert_deduplicate".into(), "0".into())],
        dedup: Some(true),
        ..sink_options(&t)
    };
    let e = i
        .open_sink(&conn, &contradiction)
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
}

#[tokio::test]
async fn async_inserts_only_with_wait_and_rows_are_visible_on_return() {
    let t = table("n UInt32", "");
    let mut i = instance().await;
    let conn = clickhouse().connection();
    let without = SinkOptions {
        settings: vec![("async_insert".into(), "1".into())],
        ..sink_options(&t)
    };
    let e = i
        .open_sink(&conn, &without)
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    let with = SinkOptions {
        settings: vec![
            ("async_insert".into(), "1".into()),
            ("wait_for_async_insert".into(), "1".into()),
        ],
        ..sink_options(&t)
    };
    let s = i.open_sink(&conn, &with).await.unwrap();
    let r = i
        .sink_send_json(s, &ndjson((0..100).map(|n| json!({"n": n}))))
        .await
        .unwrap();
    assert_eq!(r.rows, 100);
    assert_eq!(count(&t), 100, "visible when send returns");
}

#[tokio::test]
async fn closed_sinks_refuse_and_missing_tables_are_misconfigured() {
    let t = table("n UInt32", "");
    let mut i = instance().await;
    let s = open(&mut i, &sink_options(&t)).await;
    i.sink_close(s).await.unwrap();
    i.sink_close(s).await.unwrap();
    let e = i
        .sink_send_json(s, b"{\"n\":1}")
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::InvalidInput, "the sink is closed")
    );
    let missing = open(
        &mut i,
        &sink_options(&format!("{}.no_such_table", t.split_once('.').unwrap().0)),
    )
    .await;
    let e = i
        .sink_send_json(missing, b"{\"n\":1}")
        .await
        .unwrap_err()
        .into_component();
    assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
    assert_eq!(count(&t), 0);
}

/// Runs `cmd`: its exit code, its own peak resident memory in bytes (measured by a small
/// parent, [`with_peak_rss`]: a child forked from this test would count the test's memory),
/// and its stdout.
fn run_measuring_rss(cmd: &mut std::process::Command) -> (i32, u64, Vec<u8>) {
    let out = with_peak_rss(cmd).output().unwrap();
    let (_, peak) = split_peak_rss(&out.stderr);
    (out.status.code().unwrap_or(-1), peak, out.stdout)
}

#[test]
fn cli_streams_a_million_rows_with_bounded_memory() {
    let file = std::env::temp_dir().join(format!("{}.ndjson", unique_name("million")));
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
        let payload = "p".repeat(200);
        for n in 0..1_000_000u32 {
            writeln!(
                w,
                "{{\"event_id\":\"ev-{n:07}\",\"occurred_at\":\"2026-11-29 10:{:02}:{:02}.{:03}\",\"kind\":\"k{}\",\"payload\":\"{payload}\"}}",
                (n / 60) % 60,
                n % 60,
                n % 1000,
                n % 7
            )
            .unwrap();
        }
    }
    let size = std::fs::metadata(&file).unwrap().len();
    // Streamed (`--stream`: one batch read, one on the wire), and read twice: the first pass
    // keeps batches only up to a quarter of the memory limit (32 MiB of 128 here, against
    // ~230 MB of uncompressed Native bodies), then frees them, checks the rest, and the
    // second pass reads the file again.
    for (extra, first_pass_kept) in [
        (&["sink", "--stream"][..], None),
        (
            &["--max-memory-mib", "128", "sink", "--compression", "none"][..],
            Some(false),
        ),
    ] {
        let t = table(
            "event_id String, occurred_at DateTime64(3), kind LowCardinality(String), payload String",
            "",
        );
        let (code, rss, out) = run_measuring_rss(
            cli(clickhouse())
                .arg("--json")
                .args(extra)
                .args(["--table", &t, "--batch-size", "10000"])
                .arg(&file),
        );
        assert_eq!(code, 0, "{extra:?}: {}", String::from_utf8_lossy(&out));
        let receipt: Json = serde_json::from_slice(&out).unwrap();
        assert_eq!(receipt["rows"], 1_000_000);
        assert_eq!(receipt["chunks"], 100);
        assert_eq!(receipt["first_pass_kept"].as_bool(), first_pass_kept);
        assert_eq!(count(&t), 1_000_000);
        eprintln!("{extra:?}: input {size} bytes, peak RSS {rss} bytes");
        assert!(
            rss < size / 3,
            "{extra:?}: peak RSS {rss} is not well under the input size {size}"
        );
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn cli_reports_kind_committed_rows_and_exit_code_on_failure() {
    let t = table("n UInt32", "");
    let mut data = ndjson((0..2500).map(|n| json!({"n": n})));
    data.extend_from_slice(b"{\"n\":\"not a number\"}\n");
    let out = output_with_stdin(
        cli(clickhouse()).args(["sink", "--table", &t, "--batch-size", "1000"]),
        &data,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "uncertain: {stderr}");
    assert!(stderr.contains("error (uncertain)"), "{stderr}");
    assert!(stderr.contains("committed rows: 2000"), "{stderr}");
    assert_eq!(count(&t), 2000);

    let t2 = table("n UInt32, m UInt32", "");
    let out = output_with_stdin(
        cli(clickhouse()).args(["--json", "sink", "--table", &t2, "--columns", "n,m"]),
        b"{\"n\":1}\n",
    );
    assert_eq!(out.status.code(), Some(2));
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "invalid-input");
    assert_eq!(
        v["error"]["message"],
        "line 1: missing 'm' (every row must have exactly the configured columns)"
    );
    // A configured column the table lacks is the configuration's fault, whatever the rows.
    let out = output_with_stdin(
        cli(clickhouse()).args(["--json", "sink", "--table", &t, "--columns", "n,missing"]),
        b"{\"n\":1}\n",
    );
    assert_eq!(out.status.code(), Some(3));
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "misconfigured");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("has no column 'missing'"));
}

#[test]
fn cli_compression_comes_from_the_option_or_the_environment() {
    let t = table("n UInt32", "");
    let data = ndjson((0..300).map(|n| json!({"n": n})));
    for (args, env) in [
        (vec!["--compression", "zstd"], None),
        (vec!["--compression", "NONE"], None),
        (vec![], Some("gzip")),
    ] {
        let mut cmd = cli(clickhouse());
        cmd.args(["sink", "--table", &t, "--batch-size", "100"])
            .args(&args);
        if let Some(method) = env {
            cmd.env("CLICKHOUSE_COMPRESSION", method);
        }
        let out = output_with_stdin(&mut cmd, &data);
        assert!(
            out.status.success(),
            "{args:?} {env:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(count(&t), 900);
    // A method the server could decode but the component does not make is refused before
    // anything is read or sent (exit 2, naming the choices), from either source.
    for (args, env) in [(vec!["--compression", "br"], None), (vec![], Some("lz4hc"))] {
        let mut cmd = cli(clickhouse());
        cmd.args(["sink", "--table", &t]).args(&args);
        if let Some(method) = env {
            cmd.env("CLICKHOUSE_COMPRESSION", method);
        }
        let out = output_with_stdin(&mut cmd, &data);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("is not one of none, lz4, zstd, gzip"),
            "{stderr}"
        );
    }
    assert_eq!(count(&t), 900);
}

/// The CLI reads, checks and compresses its next batch while the previous one is on the wire,
/// and sends it only once that one is acknowledged: while the first INSERT's answer is held,
/// the second batch is read from stdin (the writer gets its bytes into the pipe), and no second
/// INSERT reaches the server. Batches of ~3 MB: more than the CLI's 1 MiB read buffer and a
/// pipe hold together, so without the overlap the writer stalls inside the second batch.
#[test]
fn cli_prepares_the_next_batch_while_one_is_on_the_wire_and_sends_in_order() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let proxied = proxy.server(server);
    let t = table("n UInt32, s String", "");
    let held = proxy.add(Rule::url_contains("INSERT", Fault::StallUntilReleased).times(1));
    const BATCH: usize = 5000;
    let data = ndjson((0..3 * BATCH).map(|n| json!({"n": n, "s": "x".repeat(600)})));
    let two_batches = data.len() * 2 / 3;
    let mut child = cli(&proxied)
        .args(["sink", "--table", &t, "--batch-size", &BATCH.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let written = written.clone();
        let data = data.clone();
        std::thread::spawn(move || {
            for piece in data.chunks(16 * 1024) {
                if stdin.write_all(piece).is_err() {
                    return;
                }
                written.fetch_add(piece.len(), Ordering::SeqCst);
            }
        })
    };
    proxy.wait_held(1, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(20);
    while written.load(Ordering::SeqCst) < two_batches && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let read_while_held = written.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    let inserts = |log: &[clickhouse_component_tests::proxy::RequestInfo]| {
        log.iter()
            .filter(|r| r.target_decoded().contains("INSERT INTO"))
            .count()
    };
    let sent_while_held = inserts(&proxy.log());
    proxy.release_all();
    writer.join().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(proxy.hits(held), 1);
    assert_eq!(
        sent_while_held, 1,
        "a second INSERT was sent before the first was acknowledged"
    );
    assert!(
        read_while_held >= two_batches,
        "only {read_while_held} of the first two batches' {two_batches} bytes were read while the first was on the wire"
    );
    assert_eq!(inserts(&proxy.log()), 3);
    assert_eq!(count(&t), 3 * BATCH as u64);
}

/// A FILE whose first pass the sink could keep (its batches prepared, within a quarter of the
/// component's memory limit) is sent as that pass read it: the second pass does not read it
/// again. The proxy holds the first INSERT while the file's last rows are rewritten in place
/// (the same length; the CLI reads ahead at most a batch and its 1 MiB buffer, so a second
/// pass that read the file would meet the new rows): none of them lands. With
/// `--max-memory-mib 48` the same file's 15 MB of bodies are more than the first pass may keep
/// (12 MiB): it keeps nothing, the second pass reads the file again and checks each batch as it
/// sends it, and the rewritten rows land. The host tells the component its limit.
#[test]
fn cli_sends_a_file_as_its_first_pass_read_it_when_its_batches_fit_in_memory() {
    use std::time::Duration;

    const BATCH: usize = 5000;
    let server = clickhouse();
    let file = std::env::temp_dir().join(format!("{}.ndjson", unique_name("kept")));
    for (extra, rewritten_land) in [(&[][..], false), (&["--max-memory-mib", "48"][..], true)] {
        let data = ndjson((0..3 * BATCH).map(|n| json!({"n": n, "s": "a".repeat(1000)})));
        std::fs::write(&file, &data).unwrap();
        let proxy = Proxy::start(&server.url);
        let proxied = proxy.server(server);
        let t = table("n UInt32, s String", "");
        proxy.add(Rule::url_contains("INSERT", Fault::Pause).times(1));
        let child = cli(&proxied)
            .args(extra)
            .args(["sink", "--table", &t, "--compression", "none"])
            .args(["--batch-size", &BATCH.to_string()])
            .arg(&file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        proxy.wait_held(1, Duration::from_secs(60));
        // The last 500 rows: their `a`s become `b`s.
        let line_ends: Vec<usize> = (0..data.len()).filter(|&i| data[i] == b'\n').collect();
        let tail = line_ends[line_ends.len() - 501] + 1;
        let rewritten: Vec<u8> = data[tail..]
            .iter()
            .map(|&b| if b == b'a' { b'b' } else { b })
            .collect();
        {
            use std::io::{Seek, SeekFrom};
            let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.seek(SeekFrom::Start(tail as u64)).unwrap();
            f.write_all(&rewritten).unwrap();
        }
        proxy.release_all();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(count(&t), 3 * BATCH as u64);
        let (db, name) = t.split_once('.').unwrap();
        let landed = sql().count(
            "SELECT countIf(startsWith(s, 'b')) FROM {db:Identifier}.{t:Identifier}",
            &[("db", db), ("t", name)],
        );
        assert_eq!(
            landed,
            if rewritten_land { 500 } else { 0 },
            "{extra:?}: rows rewritten after the first pass that landed"
        );
    }
    let _ = std::fs::remove_file(&file);
}

/// What the first pass keeps is counted as the memory it holds, not as its bodies' bytes: with
/// `--batch-size 1` each kept batch is an INSERT statement, headers and a few bytes of body,
/// about a kilobyte for a 30-byte body. 100,000 rows under `--max-memory-mib 64` would hold
/// ~100 MB if kept whole (counted by bodies they looked like 3 MB, within the 16 MiB budget, and
/// the component ran out of memory); counted as held, the pass stops keeping at the budget,
/// reaches the refused last row, and nothing is sent.
#[test]
fn cli_first_pass_counts_what_it_keeps_as_held_memory() {
    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let proxied = proxy.server(server);
    let t = table("n UInt8", "");
    let mut data = ndjson((0..100_000).map(|n| json!({"n": n % 200})));
    data.extend_from_slice(b"{\"n\":\"x\"}\n");
    let file = std::env::temp_dir().join(format!("{}.ndjson", unique_name("held")));
    std::fs::write(&file, &data).unwrap();
    let out = cli(&proxied)
        .args(["--max-memory-mib", "64", "--json", "sink", "--table", &t])
        .args(["--batch-size", "1"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "invalid-input");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("line 100001"),
        "{stdout}"
    );
    let inserts = proxy
        .log()
        .iter()
        .filter(|r| r.target_decoded().contains("INSERT"))
        .count();
    assert_eq!(inserts, 0);
    assert_eq!(count(&t), 0);
}

/// A checkpoint that cannot be written stops the run before the batch it would record, with
/// the rows committed counted once: the proxy lets the first checkpoint write through (batch
/// 1 in flight) and refuses the rest, so batch 1 (1,000 rows) commits, the write before batch
/// 2 fails, and nothing else is sent.
#[test]
fn cli_a_failed_checkpoint_write_counts_the_committed_rows_once() {
    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let proxied = proxy.server(server);
    let t = table(
        "n UInt32",
        "SETTINGS non_replicated_deduplication_window = 100",
    );
    let state_db = unique_name("sink_ckpt_state");
    let needle = state_db.clone();
    proxy.add(
        Rule::when(
            move |r| {
                let target = r.target_decoded();
                target.contains("INSERT") && target.contains(&needle)
            },
            Fault::Refuse,
        )
        .after(1),
    );
    let data = ndjson((0..2500).map(|n| json!({"n": n})));
    let out = output_with_stdin(
        cli(&proxied).args([
            "sink",
            "--table",
            &t,
            "--batch-size",
            "1000",
            "--dedup",
            "--retries",
            "1",
            "--checkpoint",
            "job",
            "--state-database",
            &state_db,
        ]),
        &data,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "uncertain: {stderr}");
    assert!(
        stderr.contains("the checkpoint could not be written"),
        "{stderr}"
    );
    assert!(stderr.contains("committed rows: 1000"), "{stderr}");
    assert!(!stderr.contains("2000"), "{stderr}");
    assert_eq!(count(&t), 1000);
}

/// Column names a real server's parser only takes backquoted (ClickHouse has no query
/// parameter for an INSERT column list): spaces, a backquote, a backslash, unicode, a reserved
/// word, a dot, and text that looks like a placeholder. NDJSON, typed rows and the CLI all
/// round-trip them exactly.
#[tokio::test]
async fn awkward_column_names_round_trip_through_every_path() {
    let t = table(
        "id UInt32, `weird col` String, `a\\`b` String, `back\\\\slash` String, `ünï` String, \
         `select` String, `x.y` String, `{c0:Identifier}` String",
        "",
    );
    let names = [
        "weird col",
        "a`b",
        "back\\slash",
        "ünï",
        "select",
        "x.y",
        "{c0:Identifier}",
    ];
    let row_json = |id: u32| {
        let mut row = serde_json::Map::new();
        row.insert("id".into(), json!(id));
        for (n, name) in names.iter().enumerate() {
            row.insert(name.to_string(), json!(format!("{id}-{n}")));
        }
        Json::Object(row)
    };
    let mut i = instance().await;
    let s = open(&mut i, &sink_options(&t)).await;
    // NDJSON (the exact-order fast path) and a JSON array.
    let receipt = i
        .sink_send_json(s, &ndjson([row_json(1), row_json(2)]))
        .await
        .unwrap();
    assert_eq!((receipt.rows, receipt.written_rows), (2, 2));
    let array = serde_json::to_vec(&json!([row_json(3)])).unwrap();
    i.sink_send_json(s, &array).await.unwrap();
    // Typed rows, keys in another order than the table's.
    let typed: Vec<(String, Value)> = names
        .iter()
        .enumerate()
        .rev()
        .map(|(n, name)| (name.to_string(), Value::Text(format!("4-{n}"))))
        .chain([("id".to_string(), Value::Int(4))])
        .collect();
    i.sink_send(s, &[typed]).await.unwrap();
    // With explicit columns.
    let with_columns = SinkOptions {
        columns: Some(
            std::iter::once("id")
                .chain(names)
                .map(String::from)
                .collect(),
        ),
        batch_size: Some(1),
        ..sink_options(&t)
    };
    let s2 = open(&mut i, &with_columns).await;
    let receipt = i
        .sink_send_json(s2, &ndjson([row_json(5), row_json(6)]))
        .await
        .unwrap();
    assert_eq!((receipt.chunks, receipt.written_rows), (2, 2));
    // The CLI.
    let out = output_with_stdin(
        cli(clickhouse()).args(["sink", "--table", &t]),
        &ndjson([row_json(7)]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (db, tb) = t.split_once('.').unwrap();
    let got = sql().rows(
        "SELECT * FROM {db:Identifier}.{t:Identifier} ORDER BY id",
        &[("db", db), ("t", tb)],
    );
    let want: Vec<Json> = (1..=7).map(row_json).collect();
    assert_eq!(got, want);
}
