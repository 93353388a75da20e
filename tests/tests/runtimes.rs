//! The same component file under the stock wasmtime CLI (the version the host embeds, `wasmtime run -S http`):
//! outputs and exit codes compared with the reference host's for the same commands, and one
//! `--invoke` of a library export. (Node is tested by `js/test`, the Rust example by
//! `foundation::the_embedding_example_runs`.)

use std::process::Command;

use clickhouse_component_host::EMBEDDED_COMPONENT_PATH;
use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::serve::wasmtime_cli as wasmtime;
use clickhouse_component_tests::{
    cli, clickhouse, lz4_reply, output_with_stdin, trickling_server, unique_name, Server,
};
use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn finish(mut cmd: Command, stdin: &[u8]) -> Run {
    let out = output_with_stdin(&mut cmd, stdin);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `wasmtime run -S http --env ... component.wasm ARGS`.
fn under_wasmtime(server: &Server, args: &[&str], stdin: &[u8]) -> Run {
    finish(wasmtime_run(server, None, args), stdin)
}

/// The same, with `dir` readable by the component (`--dir DIR::DIR`).
fn under_wasmtime_with_dir(server: &Server, dir: &str, args: &[&str], stdin: &[u8]) -> Run {
    finish(wasmtime_run(server, Some(dir), args), stdin)
}

/// `wasmtime run -S http` of the embedded component with the server's connection.
fn wasmtime_run(server: &Server, dir: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = Command::new(wasmtime());
    cmd.args(["run", "-S", "http"]);
    if let Some(dir) = dir {
        cmd.args(["--dir", &format!("{dir}::{dir}")]);
    }
    cmd.arg(format!("--env=CLICKHOUSE_URL={}", server.url))
        .arg(format!("--env=CLICKHOUSE_USER={}", server.user))
        .arg(format!("--env=CLICKHOUSE_PASSWORD={}", server.password))
        .arg(EMBEDDED_COMPONENT_PATH)
        .args(args);
    cmd
}

/// The reference host's CLI with the same arguments.
fn under_host(server: &Server, args: &[&str], stdin: &[u8]) -> Run {
    let mut cmd = cli(server);
    cmd.args(args);
    finish(cmd, stdin)
}

/// JSON output without the fields that measure time.
fn timeless(text: &str) -> Value {
    let mut v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    if let Some(o) = v.as_object_mut() {
        for key in [
            "round_trip_ms",
            "seconds",
            "rows_per_second",
            "waited_ms",
            "held_ms",
            "token",
        ] {
            o.remove(key);
        }
    }
    v
}

#[test]
fn check_is_the_same_under_wasmtime_and_the_host() {
    let server = clickhouse();
    let w = under_wasmtime(server, &["--json", "check"], b"");
    let h = under_host(server, &["--json", "check"], b"");
    assert_eq!((w.code, h.code), (0, 0), "{}{}", w.stderr, h.stderr);
    assert_eq!(timeless(&w.stdout), timeless(&h.stdout));
    // Text output: the same lines but the round trip.
    let w = under_wasmtime(server, &["check"], b"");
    let h = under_host(server, &["check"], b"");
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("round trip"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&w.stdout), strip(&h.stdout));
    assert!(w.stdout.starts_with("ClickHouse "), "{}", w.stdout);
}

#[test]
fn errors_and_exit_codes_are_the_same() {
    let server = clickhouse();
    let wrong = Server {
        password: "Not-The-Password".into(),
        ..server.clone()
    };
    let w = under_wasmtime(&wrong, &["--json", "check"], b"");
    let h = under_host(&wrong, &["--json", "check"], b"");
    assert_eq!((w.code, h.code), (3, 3), "{}{}", w.stderr, h.stderr);
    assert_eq!(timeless(&w.stdout), timeless(&h.stdout));
    assert!(!w.stdout.contains("Not-The-Password"));
    // Usage errors: exit 2 from both.
    let w = under_wasmtime(server, &["state", "bogus-command"], b"");
    let h = under_host(server, &["state", "bogus-command"], b"");
    assert_eq!((w.code, h.code), (2, 2));
    // A set without a state: Meltano's exit 1 from both, same message.
    let w = under_wasmtime(server, &["state", "set", "only-an-id"], b"");
    let h = under_host(server, &["state", "set", "only-an-id"], b"");
    assert_eq!((w.code, h.code), (1, 1), "{}{}", w.stderr, h.stderr);
    assert_eq!(w.stderr, h.stderr);
    // A missing id reads as {} (as `meltano state get`), from both.
    let db = unique_name("rt_missing");
    let args = ["state", "--state-database", &db, "get", "nope"];
    let w = under_wasmtime(server, &args, b"");
    let h = under_host(server, &args, b"");
    assert_eq!((w.code, h.code), (0, 0), "{}{}", w.stderr, h.stderr);
    assert_eq!((w.stdout.as_str(), h.stdout.as_str()), ("{}\n", "{}\n"));
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn state_commands_are_the_same_under_wasmtime_and_the_host() {
    let server = clickhouse();
    let db = unique_name("rt_state");
    let state = |args: &[&str]| -> Vec<String> {
        let mut v = vec!["state".to_string(), "--state-database".into(), db.clone()];
        v.extend(args.iter().map(|s| s.to_string()));
        v
    };
    let set = state(&[
        "set",
        "--force",
        "tap-a--target-b",
        r#"{"singer_state":{"x":1}}"#,
    ]);
    let w = under_wasmtime(server, &refs(&set), b"");
    assert_eq!(w.code, 0, "{}", w.stderr);
    let merge = state(&["merge", "tap-a--target-b", r#"{"singer_state":{"y":2}}"#]);
    assert_eq!(under_host(server, &refs(&merge), b"").code, 0);
    for args in [
        state(&["get", "tap-a--target-b"]),
        state(&["--json", "get", "tap-a--target-b"]),
        state(&["list"]),
        state(&["list", "tap-?--*"]),
        state(&["export"]),
    ] {
        let w = under_wasmtime(server, &refs(&args), b"");
        let h = under_host(server, &refs(&args), b"");
        assert_eq!(
            (w.code, h.code),
            (0, 0),
            "{args:?}: {}{}",
            w.stderr,
            h.stderr
        );
        assert_eq!(w.stdout, h.stdout, "{args:?}");
    }
    let w = under_wasmtime(server, &refs(&state(&["get", "tap-a--target-b"])), b"");
    let merged: Value = serde_json::from_str(&w.stdout).unwrap();
    assert_eq!(
        merged,
        serde_json::json!({"singer_state": {"x": 1, "y": 2}})
    );
    // Import from stdin under wasmtime.
    let w = under_wasmtime(
        server,
        &refs(&state(&["import", "-"])),
        b"{\"id\":\"imported\",\"completed\":{\"z\":3}}\n",
    );
    assert_eq!(w.code, 0, "{}", w.stderr);
    let h = under_host(server, &refs(&state(&["list"])), b"");
    assert_eq!(h.stdout, "imported\ntap-a--target-b\n");
}

#[test]
fn a_file_is_read_and_checked_whole_the_same_under_wasmtime_and_the_host() {
    let server = clickhouse();
    let db = unique_name("rt_file");
    let sql = Sql::new(&server.connection());
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.t (n UInt8) ENGINE = MergeTree ORDER BY n",
        &[("db", &db)],
    );
    let dir = std::env::temp_dir().join(unique_name("rt_file"));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_text = dir.to_str().unwrap().to_string();
    let file = format!("{dir_text}/rows.ndjson");
    let table = format!("{db}.t");
    let args = [
        "--json",
        "sink",
        "--table",
        &table,
        "--batch-size",
        "2",
        &file,
    ];
    let count = || sql.count("SELECT count() FROM {db:Identifier}.t", &[("db", &db)]);
    // A value out of range in the third batch: refused whole by both, nothing sent.
    std::fs::write(
        &file,
        "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n{\"n\":4}\n{\"n\":300}\n",
    )
    .unwrap();
    let w = under_wasmtime_with_dir(server, &dir_text, &args, b"");
    let h = under_host(server, &args, b"");
    assert_eq!(
        (w.code, h.code),
        (2, 2),
        "{}{}{}{}",
        w.stdout,
        w.stderr,
        h.stdout,
        h.stderr
    );
    assert_eq!(timeless(&w.stdout), timeless(&h.stdout));
    assert_eq!(count(), 0);
    // A good file: sent by both.
    std::fs::write(&file, "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n").unwrap();
    let w = under_wasmtime_with_dir(server, &dir_text, &args, b"");
    let h = under_host(server, &args, b"");
    assert_eq!((w.code, h.code), (0, 0), "{}{}", w.stderr, h.stderr);
    assert_eq!(count(), 6);
    // Without --dir the file is out of reach, and the message says how to give it.
    let w = under_wasmtime(server, &args, b"");
    assert_eq!(w.code, 2, "{}", w.stdout);
    assert!(w.stdout.contains("--dir"), "{}", w.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sink_from_stdin_is_the_same_under_wasmtime_and_the_host() {
    let server = clickhouse();
    let db = unique_name("rt_sink");
    let sql = Sql::new(&server.connection());
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    for t in ["a", "b"] {
        sql.exec(
            "CREATE TABLE {db:Identifier}.{t:Identifier} (n UInt32, s String) ENGINE = MergeTree ORDER BY n",
            &[("db", &db), ("t", t)],
        );
    }
    let rows: String = (0..2500)
        .map(|n| format!("{{\"n\":{n},\"s\":\"row {n}\"}}\n"))
        .collect();
    let table_a = format!("{db}.a");
    let table_b = format!("{db}.b");
    let sink = |table: &str| -> Vec<String> {
        ["--json", "sink", "--table", table, "--batch-size", "1000"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let w = under_wasmtime(server, &refs(&sink(&table_a)), rows.as_bytes());
    let h = under_host(server, &refs(&sink(&table_b)), rows.as_bytes());
    assert_eq!((w.code, h.code), (0, 0), "{}{}", w.stderr, h.stderr);
    let (mut wj, mut hj) = (timeless(&w.stdout), timeless(&h.stdout));
    assert_eq!(wj["rows"], 2500);
    assert_eq!(wj["chunks"], 3);
    wj["table"] = Value::Null;
    hj["table"] = Value::Null;
    assert_eq!(wj, hj);
    for t in ["a", "b"] {
        let n = sql.count(
            "SELECT count() FROM {db:Identifier}.{t:Identifier}",
            &[("db", &db), ("t", t)],
        );
        assert_eq!(n, 2500);
    }
    // A failure after committed chunks: same kind, committed count and exit code.
    let bad = format!("{rows}{{\"n\":\"x\",\"s\":\"bad\"}}\n");
    let args = sink(&table_a);
    let args = refs(&args);
    let w = under_wasmtime(server, &args, bad.as_bytes());
    let h = under_host(server, &args, bad.as_bytes());
    assert_eq!((w.code, h.code), (8, 8), "{}{}", w.stdout, h.stdout);
    let (wj, hj) = (timeless(&w.stdout), timeless(&h.stdout));
    assert_eq!(wj["error"]["kind"], "uncertain");
    assert_eq!(wj["error"]["committed_rows"], hj["error"]["committed_rows"]);
}

#[test]
fn wasmtime_invokes_a_library_export() {
    let server = clickhouse();
    let call = format!(
        "ping({{url: \"{}\", user: some(\"{}\"), password: some(\"{}\"), database: none, settings: [], connect-timeout-ms: none, request-timeout-ms: none}})",
        server.url, server.user, server.password
    );
    let mut cmd = Command::new(wasmtime());
    cmd.args([
        "run",
        "-S",
        "http",
        "--invoke",
        &call,
        EMBEDDED_COMPONENT_PATH,
    ]);
    let out = finish(cmd, b"");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("ok("), "{}", out.stdout);
    assert!(out.stdout.contains("version:"), "{}", out.stdout);
}

/// The component's own deadline on a small answer holds under the stock CLI too: a trickling
/// answer ends `check` at the request timeout.
#[test]
fn a_trickling_answer_ends_at_the_request_timeout_under_wasmtime() {
    let server = Server {
        url: trickling_server(),
        user: "default".into(),
        password: "pw".into(),
        local: false,
    };
    let started = std::time::Instant::now();
    let w = under_wasmtime(&server, &["--request-timeout-ms", "2000", "check"], b"");
    assert_eq!(w.code, 5, "{} {}", w.stdout, w.stderr);
    assert!(w.stderr.contains("not whole within 2.0 s"), "{}", w.stderr);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// A decoding bomb is a clean `permanent` error under the stock CLI too (no memory limit
/// there: the decode cap is what stops it).
#[test]
fn an_lz4_bomb_is_a_clean_error_under_wasmtime() {
    let proxy = Proxy::start(&clickhouse().url);
    proxy.add(Rule::head_contains(
        "x-component-operation: ids",
        Fault::Respond(std::sync::Arc::new(lz4_reply(300 << 20, false))),
    ));
    let w = under_wasmtime(&proxy.server(clickhouse()), &["state", "list"], b"");
    assert_eq!(w.code, 7, "{} {}", w.stdout, w.stderr);
    assert!(
        w.stderr.contains("decodes to more than 256 MiB"),
        "{}",
        w.stderr
    );
    assert!(!w.stderr.contains("backtrace"), "{}", w.stderr);
}

/// The Singer target under stock wasmtime (`--dir` for its config) and under the reference
/// host: the same STATE lines on stdout, the same rows (the second run's chunks carry the first
/// run's tokens, so the table holds each record once), and `--about` alike.
#[test]
fn the_singer_target_is_the_same_under_wasmtime_and_the_host() {
    let server = clickhouse();
    let db = unique_name("rt_target");
    let dir = std::env::temp_dir().join(unique_name("rt_target"));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_text = dir.to_str().unwrap().to_string();
    let config = format!("{dir_text}/config.json");
    std::fs::write(
        &config,
        serde_json::json!({"uri": server.url, "username": server.user,
            "password": server.password, "database": db, "engine_type": "MergeTree",
            "batch_size_rows": 2})
        .to_string(),
    )
    .unwrap();
    let mut input = String::from(
        "{\"type\":\"SCHEMA\",\"stream\":\"s\",\"key_properties\":[\"id\"],\"schema\":{\"properties\":{\"id\":{\"type\":\"integer\"}}}}\n",
    );
    for id in 1..=5 {
        input.push_str(&format!(
            "{{\"type\":\"RECORD\",\"stream\":\"s\",\"record\":{{\"id\":{id}}}}}\n{{\"type\":\"STATE\",\"value\":{{\"last\":{id}}}}}\n"
        ));
    }
    let args = ["target", "--config", &config];
    let w = under_wasmtime_with_dir(server, &dir_text, &args, input.as_bytes());
    let h = under_host(server, &args, input.as_bytes());
    assert_eq!((w.code, h.code), (0, 0), "{}{}", w.stderr, h.stderr);
    assert_eq!(w.stdout, "{\"last\":2}\n{\"last\":4}\n{\"last\":5}\n");
    assert_eq!(w.stdout, h.stdout);
    let sql = Sql::new(&server.connection());
    let rows = sql.count("SELECT count() FROM {db:Identifier}.s", &[("db", &db)]);
    assert_eq!(rows, 5, "each record once after two runs");
    let about = ["target", "--about", "--format", "json"];
    let (w, h) = (
        under_wasmtime(server, &about, b""),
        under_host(server, &about, b""),
    );
    assert_eq!((w.code, h.code), (0, 0), "{}{}", w.stderr, h.stderr);
    assert_eq!(w.stdout, h.stdout);
    assert!(w.stdout.contains("\"batch_size_rows\""), "{}", w.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}
