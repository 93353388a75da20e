//! Exact or refused: every value the sink accepts is stored as sent, or the sink refuses it
//! with nothing written. A type matrix against the real engine: for integer widths from 8 to
//! 256 bits, floats, decimals, dates and times, inside Nullable, Array, Map and Tuple, values
//! just inside and just outside each range (hand-picked and generated from a seed), each sent
//! through the sink as NDJSON (spaced, and compact rows of the configured columns: the
//! reader's two paths), as a JSON array and as typed rows (and a sample through the CLI),
//! then read back. An in-range value must be accepted and read back equal (as a value:
//! the declared coercions of docs/sink.md); an out-of-range one must be refused, with no row
//! written. Against a sink that passes values through, the out-of-range cases are stored
//! changed (300 into UInt8 is 44) and the test fails.

use clickhouse_component::client::ErrorKind;
use clickhouse_component_host::{CallError, Instance, SinkOptions, Value};
use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::values::{plus_one, Rng, BOUNDS};
use clickhouse_component_tests::{cli, clickhouse, instance, output_with_stdin, unique_name};

/// How a stored value is compared with the one sent.
#[derive(Clone, Debug)]
enum Compare {
    /// Integers: the same number.
    Integer,
    /// Floats of 32 or 64 bits: the sent text parsed at that precision equals the stored one.
    Float(u8),
    /// Decimals and date-times: equal text once trailing fraction zeros are dropped.
    Fraction,
    /// Anything else: the stored `toString` equals this text.
    Text(&'static str),
    /// The same, for a generated value.
    Owned(String),
}

#[derive(Clone, Debug)]
struct Case {
    ty: String,
    /// The value's JSON text.
    value: String,
    inside: bool,
    compare: Compare,
}

fn case(ty: &str, value: impl Into<String>, inside: bool, compare: Compare) -> Case {
    Case {
        ty: ty.to_string(),
        value: value.into(),
        inside,
        compare,
    }
}

/// `a <= b` for decimal magnitudes without leading zeros.
fn le(a: &str, b: &str) -> bool {
    a.len() < b.len() || (a.len() == b.len() && a <= b)
}

fn matrix(seed: u64) -> Vec<Case> {
    use Compare::*;
    let mut rng = Rng(seed);
    let mut cases = Vec::new();
    for &(bits, max, min, umax) in &BOUNDS {
        let int = format!("Int{bits}");
        let uint = format!("UInt{bits}");
        for (ty, hi, lo) in [(&int, max, Some(min)), (&uint, umax, None)] {
            cases.push(case(ty, hi, true, Integer));
            cases.push(case(ty, plus_one(hi), false, Integer));
            cases.push(case(ty, format!("\"{hi}\""), true, Integer));
            cases.push(case(ty, format!("\"{}\"", plus_one(hi)), false, Integer));
            cases.push(case(ty, "0", true, Integer));
            if let Some(lo) = lo {
                cases.push(case(ty, format!("-{lo}"), true, Integer));
                cases.push(case(ty, format!("-{}", plus_one(lo)), false, Integer));
            }
            // Generated: a random number of up to the bound's length (inside or outside,
            // by comparison), and one a digit longer (outside).
            for _ in 0..3 {
                let len = 1 + (rng.next() as usize) % hi.len();
                let n = rng.digits(len);
                cases.push(case(ty, n.clone(), le(&n, hi), Integer));
            }
            let n = rng.digits(hi.len() + 1);
            cases.push(case(ty, n, false, Integer));
            // Inside composites.
            cases.push(case(
                &format!("Array({ty})"),
                format!("[1, {hi}]"),
                true,
                Owned(format!("[1,{hi}]")),
            ));
            cases.push(case(
                &format!("Array({ty})"),
                format!("[1, {}]", plus_one(hi)),
                false,
                Text(""),
            ));
            cases.push(case(
                &format!("Nullable({ty})"),
                plus_one(hi),
                false,
                Integer,
            ));
        }
    }
    cases.extend([
        case("Float32", "3.4e38", true, Float(32)),
        case("Float32", "16777217", true, Float(32)),
        case("Float32", "1e39", false, Float(32)),
        case("Float32", "-1e40", false, Float(32)),
        case("Float32", "\"1e40\"", false, Float(32)),
        case("Float64", "1.7e308", true, Float(64)),
        case("Float64", "1e309", false, Float(64)),
        case("Decimal(9, 2)", "1.23", true, Fraction),
        case("Decimal(9, 2)", "1.230", true, Fraction),
        case("Decimal(9, 2)", "9999999.99", true, Fraction),
        case("Decimal(9, 2)", "1.234", false, Fraction),
        case("Decimal(9, 2)", "-0.005", false, Fraction),
        case("Decimal(9, 2)", "\"0.001\"", false, Fraction),
        case("Decimal(38, 0)", "1.5", false, Fraction),
        case("Decimal(38, 10)", "1.0123456789", true, Fraction),
        case("Decimal(38, 10)", "1.01234567891", false, Fraction),
        case("Date", "\"1970-01-01\"", true, Fraction),
        case("Date", "\"2149-06-06\"", true, Fraction),
        case("Date", "\"1969-12-31\"", false, Fraction),
        case("Date", "\"2149-06-07\"", false, Fraction),
        case("Date32", "\"1900-01-01\"", true, Fraction),
        case("Date32", "\"2299-12-31\"", true, Fraction),
        case("DateTime('UTC')", "\"1970-01-01 00:00:00\"", true, Fraction),
        case("DateTime('UTC')", "\"2106-02-07 06:28:15\"", true, Fraction),
        case(
            "DateTime('UTC')",
            "\"1969-12-31 23:59:59\"",
            false,
            Fraction,
        ),
        case(
            "DateTime('UTC')",
            "\"2106-02-07 06:28:16\"",
            false,
            Fraction,
        ),
        case(
            "DateTime('UTC')",
            "\"2026-01-01 00:00:00.5\"",
            false,
            Fraction,
        ),
        // A zone the sink has no rules for: its wall-clock times travel as text, and one within
        // a day of the range's edges is refused (the server's conversion would clamp it).
        case(
            "DateTime('Asia/Tokyo')",
            "\"1970-01-02 09:00:00\"",
            true,
            Fraction,
        ),
        case(
            "DateTime('Asia/Tokyo')",
            "\"1970-01-01 09:00:00\"",
            false,
            Fraction,
        ),
        case(
            "DateTime('Asia/Tokyo')",
            "\"1970-01-01 08:59:59\"",
            false,
            Fraction,
        ),
        case(
            "DateTime64(3, 'UTC')",
            "\"2026-01-01 00:00:00.123\"",
            true,
            Fraction,
        ),
        case(
            "DateTime64(3, 'UTC')",
            "\"2026-01-01 00:00:00.120000\"",
            true,
            Fraction,
        ),
        case(
            "DateTime64(3, 'UTC')",
            "\"2026-01-01 00:00:00.1234\"",
            false,
            Fraction,
        ),
        case(
            "DateTime64(3, 'UTC')",
            "1767225600.123",
            true,
            Text("2026-01-01 00:00:00.123"),
        ),
        case(
            "DateTime64(3, 'UTC')",
            "1767225600.1234",
            false,
            Text("2026-01-01 00:00:00.123"),
        ),
        case(
            "DateTime64(6, 'UTC')",
            "\"2026-01-01 00:00:00.123456\"",
            true,
            Fraction,
        ),
        case(
            "DateTime64(6, 'UTC')",
            "\"2026-01-01 00:00:00.1234567\"",
            false,
            Fraction,
        ),
        case(
            "Map(UInt16, Int8)",
            r#"{"65535": -128}"#,
            true,
            Text("{65535:-128}"),
        ),
        case("Map(UInt16, Int8)", r#"{"65536": 1}"#, false, Text("")),
        case("Map(UInt16, Int8)", r#"{"1": 128}"#, false, Text("")),
        // Named tuples are JSON objects (input_format_json_named_tuples_as_objects), unnamed
        // ones arrays.
        case(
            "Tuple(a UInt32, b Float32)",
            r#"{"a": 4294967295, "b": 1.5}"#,
            true,
            Text("(4294967295,1.5)"),
        ),
        case(
            "Tuple(a UInt32, b Float32)",
            r#"{"a": 4294967296, "b": 1}"#,
            false,
            Text(""),
        ),
        case(
            "Tuple(UInt8, Int8)",
            "[255, -128]",
            true,
            Text("(255,-128)"),
        ),
        case("Tuple(UInt8, Int8)", "[255, -129]", false, Text("")),
        case(
            "Tuple(a UInt32, b Float32)",
            r#"{"a": 1, "b": 1e40}"#,
            false,
            Text(""),
        ),
        case(
            "Array(Nullable(Decimal(5, 2)))",
            "[1.23, null]",
            true,
            Text("[1.23,NULL]"),
        ),
        case("Array(Nullable(Decimal(5, 2)))", "[1.234]", false, Text("")),
        case(
            "Array(Tuple(x UInt8, y String))",
            r#"[{"x": 255, "y": "a"}]"#,
            true,
            Text("[(255,'a')]"),
        ),
        case(
            "Array(Tuple(x UInt8, y String))",
            r#"[{"x": 256, "y": "a"}]"#,
            false,
            Text(""),
        ),
    ]);
    cases
}

/// Integer text as a number: no sign for zero or positives, no leading zeros, no quotes.
fn integer(text: &str) -> String {
    let t = text.trim_matches('"');
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let digits = digits.trim_start_matches('0');
    match (neg, digits.is_empty()) {
        (_, true) => "0".into(),
        (true, false) => format!("-{digits}"),
        (false, false) => digits.into(),
    }
}

/// Text with trailing zeros of a fraction (and a bare point) dropped.
fn fraction(text: &str) -> String {
    let t = text.trim_matches('"');
    match t.rfind('.') {
        Some(dot) if t[dot + 1..].bytes().all(|b| b.is_ascii_digit()) => {
            let trimmed = t.trim_end_matches('0');
            trimmed.trim_end_matches('.').to_string()
        }
        _ => t.to_string(),
    }
}

fn equal(case: &Case, stored: &str) -> bool {
    match &case.compare {
        Compare::Integer => integer(&case.value) == stored,
        Compare::Float(32) => {
            case.value.trim_matches('"').parse::<f32>().ok() == stored.parse().ok()
        }
        Compare::Float(_) => {
            case.value.trim_matches('"').parse::<f64>().ok() == stored.parse().ok()
        }
        Compare::Fraction => fraction(&case.value) == fraction(stored),
        Compare::Text(t) => *t == stored,
        Compare::Owned(t) => t == stored,
    }
}

/// The typed form of a case's value (the WIT `value` variant a caller would use).
fn typed(text: &str) -> Value {
    if let Some(s) = text.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        return Value::Text(s.to_string());
    }
    if let Ok(i) = text.parse::<i64>() {
        return Value::Int(i);
    }
    if let Ok(u) = text.parse::<u64>() {
        return Value::Uint(u);
    }
    if !text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        if let Ok(f) = text.parse::<f64>() {
            if f.is_finite() && format!("{f:?}") == text {
                return Value::Float(f);
            }
        }
    }
    Value::Json(text.to_string())
}

#[derive(Clone, Copy, Debug)]
enum Path {
    Ndjson,
    /// Compact rows of the configured columns in order (the reader's fastest path).
    NdjsonCompact,
    JsonArray,
    Typed,
}

async fn send(
    i: &mut Instance,
    table: &str,
    path: Path,
    k: usize,
    case: &Case,
) -> Result<(), CallError> {
    let compact = matches!(path, Path::NdjsonCompact);
    let options = SinkOptions {
        table: table.into(),
        columns: compact.then(|| vec!["k".to_string(), "v".to_string()]),
        batch_size: None,
        settings: vec![],
        dedup: None,
        retries: None,
        compression: None,
    };
    let sink = i.open_sink(&clickhouse().connection(), &options).await?;
    let row = format!("{{\"k\": {k}, \"v\": {}}}", case.value);
    let result = match path {
        Path::Ndjson => i.sink_send_json(sink, format!("{row}\n").as_bytes()).await,
        Path::NdjsonCompact => {
            let row = format!("{{\"k\":{k},\"v\":{}}}\n", case.value);
            i.sink_send_json(sink, row.as_bytes()).await
        }
        Path::JsonArray => i.sink_send_json(sink, format!("[{row}]").as_bytes()).await,
        Path::Typed => {
            let rows = vec![vec![
                ("k".to_string(), Value::Uint(k as u64)),
                ("v".to_string(), typed(&case.value)),
            ]];
            i.sink_send(sink, &rows).await
        }
    };
    let _ = i.sink_close(sink).await;
    let _ = i.drop_sink(sink).await;
    result.map(|_| ())
}

/// One table per type: `k UInt32, v TYPE`, each case its own `k`.
fn create(db: &str, n: usize, ty: &str) -> String {
    let t = format!("t{n}");
    sql().exec(
        &format!("CREATE TABLE {{db:Identifier}}.{{t:Identifier}} (k UInt32, v {ty}) ENGINE = MergeTree ORDER BY k"),
        &[("db", db), ("t", &t)],
    );
    format!("{db}.{t}")
}

fn stored(table: &str, k: usize) -> Vec<String> {
    let (db, t) = table.split_once('.').unwrap();
    sql()
        .rows(
            "SELECT toString(v) AS v FROM {db:Identifier}.{t:Identifier} WHERE k = {k:UInt32}",
            &[("db", db), ("t", t), ("k", &k.to_string())],
        )
        .into_iter()
        .map(|r| r["v"].as_str().unwrap().to_string())
        .collect()
}

/// Why a case's outcome is wrong, if it is.
fn judge(case: &Case, result: &Result<(), CallError>, rows: &[String]) -> Option<String> {
    match (case.inside, result) {
        (true, Ok(())) if rows.len() == 1 && equal(case, &rows[0]) => None,
        (true, Ok(())) => Some(format!("accepted but stored as {rows:?}")),
        (true, Err(e)) => Some(format!("in range but refused: {e}")),
        (false, Ok(())) => Some(format!("out of range but accepted; stored as {rows:?}")),
        (false, Err(e)) => {
            let kind = match e {
                CallError::Component(e) => Some(e.kind),
                CallError::Runner(_) => None,
            };
            if !rows.is_empty() {
                Some(format!("refused ({e}) but {rows:?} written"))
            } else if !matches!(kind, Some(ErrorKind::InvalidInput | ErrorKind::Permanent)) {
                Some(format!("refused with the wrong kind: {e}"))
            } else {
                None
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_value_is_stored_exactly_or_refused_with_nothing_written() {
    let seed = std::env::var("EXACT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001u64);
    let cases = matrix(seed);
    let db = unique_name("exact");
    sql().exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    let mut types: Vec<String> = cases.iter().map(|c| c.ty.clone()).collect();
    types.sort();
    types.dedup();
    let tables: std::collections::HashMap<String, String> = types
        .iter()
        .enumerate()
        .map(|(n, ty)| (ty.clone(), create(&db, n, ty)))
        .collect();
    let mut i = instance().await;
    let mut wrong = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    let mut k = 0;
    for case in &cases {
        for path in [
            Path::Ndjson,
            Path::NdjsonCompact,
            Path::JsonArray,
            Path::Typed,
        ] {
            k += 1;
            let table = &tables[&case.ty];
            let result = send(&mut i, table, path, k, case).await;
            match &result {
                Ok(()) => accepted += 1,
                Err(_) => refused += 1,
            }
            if let Some(why) = judge(case, &result, &stored(table, k)) {
                wrong.push(format!("{} {} via {path:?}: {why}", case.ty, case.value));
            }
        }
    }
    eprintln!(
        "measured: {} cases x 4 paths: {accepted} accepted, {refused} refused (seed {seed:#x})",
        cases.len()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} sends wrong (seed {seed:#x}):\n{}",
        wrong.len(),
        cases.len() * 4,
        wrong.join("\n")
    );
    // Both outcomes occur: a sink that refuses everything, or nothing, fails above.
    assert!(accepted > 100 && refused > 100, "{accepted} / {refused}");
}

/// A database of its own with a `k UInt32, v UInt8` table; returns `db.table`.
fn uint8_table(prefix: &str) -> String {
    let db = unique_name(prefix);
    sql().exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    create(&db, 0, "UInt8")
}

fn rows_in(table: &str) -> u64 {
    let (db, t) = table.split_once('.').unwrap();
    sql().count(
        "SELECT count() FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", t)],
    )
}

fn truncate(table: &str) {
    let (db, t) = table.split_once('.').unwrap();
    sql().exec(
        "TRUNCATE TABLE {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", t)],
    );
}

#[test]
fn the_cli_refuses_what_the_library_refuses() {
    let table = uint8_table("exact_cli");
    let count = || rows_in(&table);
    // 300 into UInt8: refused, nothing written, the row and column named.
    let out = output_with_stdin(
        cli(clickhouse()).args(["sink", "--table", &table, "-"]),
        b"{\"k\": 1, \"v\": 255}\n{\"k\": 2, \"v\": 300}\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(ErrorKind::InvalidInput.exit_code()),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 2, column 'v'") && stderr.contains("300"),
        "{stderr}"
    );
    assert_eq!(count(), 0);
    let out = output_with_stdin(
        cli(clickhouse()).args(["sink", "--table", &table, "-"]),
        b"{\"k\": 1, \"v\": 255}\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count(), 1);
    // A setting that would let dates be clamped is refused before anything is sent.
    let out = output_with_stdin(
        cli(clickhouse()).args([
            "--setting",
            "date_time_overflow_behavior=saturate",
            "sink",
            "--table",
            &table,
            "-",
        ]),
        b"{\"k\": 3, \"v\": 1}\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(ErrorKind::InvalidInput.exit_code()),
        "{stderr}"
    );
    assert!(stderr.contains("date_time_overflow_behavior"), "{stderr}");
    assert_eq!(count(), 1);
}

#[test]
fn a_file_is_checked_whole_before_anything_is_sent() {
    let table = uint8_table("exact_file");
    let count = || rows_in(&table);
    // 25 rows in batches of 10; row 23 (in the third batch) does not fit.
    let rows: String = (0..25)
        .map(|k| format!("{{\"k\": {k}, \"v\": {}}}\n", if k == 23 { 300 } else { k }))
        .collect();
    let dir = std::env::temp_dir().join(unique_name("exact_file"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rows.ndjson");
    std::fs::write(&file, &rows).unwrap();
    let file = file.to_str().unwrap();
    let sink = |extra: &[&str], stdin: &[u8]| {
        let mut cmd = cli(clickhouse());
        cmd.args(["sink", "--table", &table, "--batch-size", "10"])
            .args(extra);
        output_with_stdin(&mut cmd, stdin)
    };
    // A file: refused whole, nothing sent, the row counted from the file's start.
    let out = sink(&[file], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(ErrorKind::InvalidInput.exit_code()),
        "{stderr}"
    );
    assert!(stderr.contains("line 24, column 'v'"), "{stderr}");
    assert_eq!(
        count(),
        0,
        "a file is checked whole before anything is sent"
    );
    // --stream, and stdin: batch by batch; the first two are committed.
    for (what, extra, stdin) in [
        ("--stream", vec!["--stream", file], &b""[..]),
        ("stdin", vec!["-"], rows.as_bytes()),
    ] {
        truncate(&table);
        let out = sink(&extra, stdin);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(ErrorKind::Uncertain.exit_code()),
            "{what}: {stderr}"
        );
        assert!(stderr.contains("line 24, column 'v'"), "{what}: {stderr}");
        assert_eq!(count(), 20, "{what}");
    }
    // A good file goes through whole.
    truncate(&table);
    std::fs::write(
        dir.join("rows.ndjson"),
        rows.replace("\"v\": 300", "\"v\": 3"),
    )
    .unwrap();
    let out = sink(&[file], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count(), 25);
    let _ = std::fs::remove_dir_all(&dir);
}
