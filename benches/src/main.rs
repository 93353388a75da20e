//! Benchmarks: prints tables. Run with `make bench` (starts the local ClickHouse unless
//! CLICKHOUSE_URL is set). Sections: `state` (state store latencies against a raw HTTP round
//! trip of the same query), `load` (cold and warm start of the full and the library
//! component), `sink` (1,000,000 rows through the component's CLI and embedded, the same bytes
//! POSTed natively, and onestep-clickhouse 0.1.1, at batch 10,000 and 100,000), `typed` (the
//! typed sink against raw JSONEachRow and Native POSTs and onestep, two tables, with server
//! CPU: `typed.rs`) and `link` (the
//! sink over a 100 Mbit/s link; run inside scripts/shaped-link) and `serve` (`GET /state/{id}` of
//! the composed example under stock `wasmtime serve`, against the same call through the host
//! embedding); select with `bench state` etc.

mod loader;
mod typed;

use std::time::{Duration, Instant};

use clickhouse_component::client::sql::quote_identifier;
use clickhouse_component::client::{Compression, HttpRequest, Query};
use clickhouse_component_host::{default_allow_list, SinkOptions, State};
use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::{clickhouse, runtime, store_in, unique_name};

/// p50 and p99 of samples, in milliseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e3
    };
    (at(0.50), at(0.99))
}

fn row(name: &str, samples: &mut [Duration], note: &str) -> (f64, f64) {
    let (p50, p99) = percentiles(samples);
    println!("| {name:<44} | {p50:>8.2} | {p99:>8.2} | {note} |");
    (p50, p99)
}

async fn bench_state(iterations: usize) {
    let server = clickhouse();
    let conn = server.connection();
    let db = unique_name("bench_state");
    let (mut i, s) = store_in(runtime(), &conn, &db).await;
    let state = |n: usize| State {
        id: "tap-bench--target-bench".into(),
        partial: String::new(),
        completed: format!(
            r#"{{"singer_state":{{"bookmarks":{{"stream":{{"replication_key_value":"2026-11-29T00:00:{:02}Z"}}}}}}}}"#,
            n % 60
        ),
    };
    i.state_set(s, &state(0)).await.unwrap();
    let sql = Sql::new(&conn);
    let raw_get = Query::read(
        "raw-get",
        "SELECT state_id, partial_state, completed_state FROM {db:Identifier}.{t:Identifier} FINAL WHERE state_id = {id:String} LIMIT 1",
    )
    .param("db", &db)
    .param("t", "state")
    .param("id", "tap-bench--target-bench")
    .format("JSONEachRow");
    // Warm up every path.
    for n in 0..20 {
        sql.client().execute(&raw_get).unwrap();
        i.state_get(s, "tap-bench--target-bench").await.unwrap();
        i.state_set(s, &state(n)).await.unwrap();
    }
    let mut raw = Vec::new();
    let mut get = Vec::new();
    let mut set = Vec::new();
    let mut lock = Vec::new();
    let mut raw_insert = Vec::new();
    let insert_body = |n: usize| {
        format!(
            "{}\n",
            serde_json::json!({"state_id": "raw", "partial_state": null, "completed_state": state(n).completed})
        )
        .into_bytes()
    };
    for n in 0..iterations {
        let t = Instant::now();
        sql.client().execute(&raw_get).unwrap();
        raw.push(t.elapsed());

        let t = Instant::now();
        sql.client()
            .execute(
                &Query::write(
                    "raw-set",
                    "INSERT INTO {db:Identifier}.{t:Identifier} (state_id, partial_state, completed_state) FORMAT JSONEachRow",
                )
                .param("db", &db)
                .param("t", "state")
                .data(insert_body(n)),
            )
            .unwrap();
        raw_insert.push(t.elapsed());

        let t = Instant::now();
        i.state_get(s, "tap-bench--target-bench")
            .await
            .unwrap()
            .unwrap();
        get.push(t.elapsed());

        let t = Instant::now();
        i.state_set(s, &state(n)).await.unwrap();
        set.push(t.elapsed());

        let t = Instant::now();
        let l = i.lock(s, "lock-bench").await.unwrap();
        i.lock_release(l).await.unwrap();
        lock.push(t.elapsed());
    }
    println!(
        "\nState store ({iterations} iterations each, one warm component instance, {})\n",
        server.url
    );
    println!("| operation                                    | p50 (ms) | p99 (ms) | notes |");
    println!("|----------------------------------------------|---------:|---------:|-------|");
    let (raw50, _) = row(
        "raw HTTP round trip: the get query (native)",
        &mut raw,
        "ureq, keep-alive",
    );
    let (rawi50, _) = row(
        "raw HTTP round trip: the set INSERT (native)",
        &mut raw_insert,
        "ureq, keep-alive",
    );
    let (get50, _) = row("get", &mut get, "1 request");
    let (set50, _) = row("set", &mut set, "1 request");
    row(
        "lock + release (uncontended)",
        &mut lock,
        "3 requests, no sleep",
    );
    println!();
    println!(
        "get - raw get:  {:+.2} ms (target: within 2 ms)",
        get50 - raw50
    );
    println!(
        "set - raw set:  {:+.2} ms (target: within 2 ms)",
        set50 - rawi50
    );
    bench_update(iterations).await;
}

/// `update` on both lock engines, by its three paths, in one run: written ahead of the lock's
/// confirmation (this store wrote the state last: 3 requests), read under the lock first (two
/// stores taking turns on one id: the path every update took before, 4 requests), and written
/// ahead in vain (another store wrote since this one's last write: 5). The requests are counted
/// through a proxy in a separate pass; the timed calls go straight to the server.
async fn bench_update(iterations: usize) {
    use clickhouse_component_host::{LockEngine, StoreOptions};
    use clickhouse_component_tests::proxy::Proxy;
    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let proxied = proxy.server(server).connection();
    let direct = server.connection();
    println!(
        "\n`update` by path ({iterations} calls each, one run; requests counted through a proxy)\n"
    );
    println!("| lock engine | path | p50 (ms) | p99 (ms) | requests |");
    println!("|---|---|---:|---:|---:|");
    let mut p50s = Vec::new();
    for engine in [LockEngine::KeeperMap, LockEngine::MergeTree] {
        let options = StoreOptions {
            database: Some(unique_name("bench_update")),
            lock_engine: Some(engine),
            ..Default::default()
        };
        let name = match engine {
            LockEngine::MergeTree => "merge-tree",
            _ => "keeper-map",
        };
        // Two stores straight to the server (timed) and the same two through the proxy
        // (counted).
        let mut stores = Vec::new();
        for conn in [&direct, &direct, &proxied, &proxied] {
            let mut i = clickhouse_component_tests::instance_for(runtime(), conn).await;
            let s = i.open_store(conn, &options).await.unwrap();
            stores.push((i, s));
        }
        let [(mut a, sa), (mut b, sb), (mut pa, psa), (mut pb, psb)] =
            <[_; 4]>::try_from(stores).ok().unwrap();
        let id = "tap-bench--target-update";
        let partial = |n: usize| State {
            id: id.into(),
            partial: format!(
                r#"{{"singer_state":{{"bookmarks":{{"s{}":{{"v":{n}}}}}}}}}"#,
                n % 5
            ),
            completed: String::new(),
        };
        // B's updates change the state (a key of its own, a new value each time).
        let by_b = |n: usize| State {
            id: id.into(),
            partial: format!(r#"{{"singer_state":{{"bookmarks":{{"b":{{"v":{n}}}}}}}}}"#),
            completed: String::new(),
        };
        // The id's lock row and state exist; both stores have seen them.
        for n in 0..10 {
            a.state_update(sa, &partial(n)).await.unwrap();
            b.state_update(sb, &by_b(n)).await.unwrap();
            pa.state_update(psa, &partial(n)).await.unwrap();
            pb.state_update(psb, &by_b(n)).await.unwrap();
        }
        // A's second update in a row reads what A wrote: A trusts what it knows again.
        for n in 0..2 {
            a.state_update(sa, &partial(n)).await.unwrap();
        }
        let requests = |before: usize| proxy.log().len() - before;
        let (mut ahead, mut plain, mut wasted) = (Vec::new(), Vec::new(), Vec::new());
        let (mut ahead_n, mut plain_n, mut wasted_n) = (Vec::new(), Vec::new(), Vec::new());
        for n in 0..iterations {
            // Written ahead: A wrote last.
            a.state_update(sa, &partial(n)).await.unwrap();
            let t = Instant::now();
            a.state_update(sa, &partial(n + 1)).await.unwrap();
            ahead.push(t.elapsed());
            // In vain: B wrote since; then read under the lock first (A no longer trusts what
            // it knows, and B wrote again).
            b.state_update(sb, &by_b(n)).await.unwrap();
            let t = Instant::now();
            a.state_update(sa, &partial(n + 2)).await.unwrap();
            wasted.push(t.elapsed());
            b.state_update(sb, &by_b(n + 1_000_000)).await.unwrap();
            let t = Instant::now();
            a.state_update(sa, &partial(n + 3)).await.unwrap();
            plain.push(t.elapsed());
        }
        for n in 0..2 {
            pa.state_update(psa, &partial(n)).await.unwrap();
        }
        for n in 0..10 {
            pa.state_update(psa, &partial(n)).await.unwrap();
            let before = proxy.log().len();
            pa.state_update(psa, &partial(n + 1)).await.unwrap();
            ahead_n.push(requests(before));
            pb.state_update(psb, &by_b(n)).await.unwrap();
            let before = proxy.log().len();
            pa.state_update(psa, &partial(n + 2)).await.unwrap();
            wasted_n.push(requests(before));
            pb.state_update(psb, &by_b(n + 1_000_000)).await.unwrap();
            let before = proxy.log().len();
            pa.state_update(psa, &partial(n + 3)).await.unwrap();
            plain_n.push(requests(before));
        }
        let count = |n: &[usize]| {
            let (min, max) = (n.iter().min().unwrap(), n.iter().max().unwrap());
            if min == max {
                min.to_string()
            } else {
                format!("{min}-{max}")
            }
        };
        for (path, samples, n) in [
            (
                "written ahead (this store wrote last)",
                &mut ahead,
                &ahead_n,
            ),
            (
                "read under the lock first (as before)",
                &mut plain,
                &plain_n,
            ),
            (
                "written ahead in vain (another store wrote)",
                &mut wasted,
                &wasted_n,
            ),
        ] {
            let (p50, p99) = percentiles(samples);
            println!("| {name} | {path} | {p50:.2} | {p99:.2} | {} |", count(n));
            p50s.push((name, path, p50));
        }
    }
    println!();
    for (name, path, p50) in &p50s {
        if path.starts_with("written ahead (") {
            println!("update p50, {name}, written ahead: {p50:.2} ms (target: under 30 ms; meltano-state-backend-clickhouse sleeps >= 1000 ms per update)");
        }
    }
}

const EVENT_COLUMNS: [&str; 5] = ["event_id", "seq", "occurred_at", "kind", "payload"];

/// The events table of the sink benchmark, in a database of its own; returns `db.t`.
fn events_table(sql: &Sql, name: &str) -> String {
    let db = unique_name("bench_sink");
    sql.exec(
        "CREATE DATABASE IF NOT EXISTS {db:Identifier}",
        &[("db", &db)],
    );
    sql.exec(
        "CREATE TABLE {db:Identifier}.{t:Identifier} (event_id String, seq UInt64,
         occurred_at DateTime64(3), kind LowCardinality(String), payload String)
         ENGINE = MergeTree ORDER BY event_id",
        &[("db", &db), ("t", name)],
    );
    format!("{db}.{name}")
}

/// `rows` events as NDJSON ([`typed::event_line`]), cut into batches of `batch` rows.
fn event_batches(rows: usize, batch: usize) -> Vec<Vec<u8>> {
    let mut batches = Vec::new();
    let mut current = Vec::new();
    for n in 0..rows {
        current.extend_from_slice(typed::event_line(n).as_bytes());
        current.push(b'\n');
        if (n + 1) % batch == 0 {
            batches.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// The reference CLI, built beside this binary.
fn cli() -> std::path::PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("clickhouse-component")
}

/// Runs the CLI once before anything is timed: the first run after a build compiles the
/// component into the cache (seconds of CPU and tens of MiB), which the first measured run
/// would otherwise count as its own.
fn warm_up(server: &clickhouse_component_tests::Server) {
    let out = server
        .export_to(&mut std::process::Command::new(cli()))
        .arg("check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn count_rows(sql: &Sql, table: &str) -> u64 {
    let (db, t) = table.split_once('.').unwrap();
    sql.count(
        "SELECT count() FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", t)],
    )
}

/// One measured path of the sink benchmark.
struct Measured {
    path: String,
    seconds: f64,
    wire_bytes: Option<usize>,
}

/// The native client's INSERT of `body` into `columns` in `format` (the statement the sink
/// sends, the sink's settings), built before timing: compression (when asked) is not part of
/// the measured time.
fn native_insert(
    sql: &Sql,
    table: &str,
    columns: &[&str],
    format: &str,
    body: Vec<u8>,
    compression: Compression,
) -> HttpRequest {
    let (db, t) = table.split_once('.').unwrap();
    // The same statement the sink sends: the column list backquoted (no parameters there).
    let column_list: Vec<String> = columns.iter().map(|c| quote_identifier(c)).collect();
    let insert = format!(
        "INSERT INTO {{db:Identifier}}.{{t:Identifier}} ({}) FORMAT {format}",
        column_list.join(", ")
    );
    let q = Query::write("bench", insert)
        .param("db", db)
        .param("t", t)
        .setting("input_format_null_as_default", "0")
        .setting("input_format_skip_unknown_fields", "0")
        .setting("wait_for_async_insert", "1")
        .data(body)
        .compress(compression);
    sql.client().prepare(q).unwrap()
}

/// POSTs prebuilt requests one after the other (keep-alive); returns the seconds taken.
fn native_posts(sql: &Sql, requests: &[HttpRequest]) -> f64 {
    let started = Instant::now();
    for request in requests {
        sql.client().send(request).unwrap();
    }
    started.elapsed().as_secs_f64()
}

/// The sink benchmark: the component (the CLI reading the NDJSON file, and embedded through
/// the host API), native POSTs of the same bytes (uncompressed and compressed) and
/// onestep-clickhouse, each into its own table, row counts checked after each.
async fn bench_sink(title: &str, rows: usize, batch: usize, embedded: bool) {
    let server = clickhouse();
    let conn = server.connection();
    let sql = Sql::new(&conn);
    let batches = event_batches(rows, batch);
    let all: Vec<u8> = batches.concat();
    let input = std::env::temp_dir().join(format!("bench-sink-{}.ndjson", std::process::id()));
    std::fs::write(&input, &all).unwrap();
    println!(
        "\n{title}: {rows} rows ({:.1} MB of JSONEachRow), batch size {batch}, 5-column events table (an integer and a DateTime64 among them), {}\n",
        all.len() as f64 / 1e6,
        server.url
    );
    let mut results: Vec<Measured> = Vec::new();
    let wire = |method: Compression| {
        batches
            .iter()
            .map(|b| method.encode(b.clone()).len())
            .sum::<usize>()
    };

    // The component's CLI, reading the file, as a pipeline runs it.
    let cli = cli();
    warm_up(server);
    // BENCH_BASELINE_COMPONENT=FILE: the same CLI run with another component (a build of an
    // earlier commit), side by side in this run.
    let baseline = std::env::var_os("BENCH_BASELINE_COMPONENT");
    let mut runs: Vec<(Compression, Option<&std::ffi::OsStr>)> =
        [Compression::Lz4, Compression::None, Compression::Zstd]
            .into_iter()
            .map(|m| (m, None))
            .collect();
    if let Some(path) = &baseline {
        runs.insert(1, (Compression::Lz4, Some(path.as_os_str())));
    }
    for (method, component) in runs {
        let table = events_table(
            &sql,
            &format!(
                "cli_{}{}",
                method.name(),
                if component.is_some() { "_baseline" } else { "" }
            ),
        );
        let mut command = std::process::Command::new(&cli);
        if let Some(path) = component {
            command.env("CLICKHOUSE_COMPONENT", path);
        }
        let started = Instant::now();
        let out = server
            .export_to(&mut command)
            .args([
                "sink",
                "--table",
                &table,
                "--batch-size",
                &batch.to_string(),
            ])
            .args(["--compression", method.name()])
            .arg(&input)
            .output()
            .unwrap();
        let seconds = started.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(count_rows(&sql, &table), rows as u64);
        let default = if method == Compression::default() {
            " (default)"
        } else {
            ""
        };
        results.push(Measured {
            path: format!(
                "component CLI `sink --compression {}`{default}{}",
                method.name(),
                if component.is_some() {
                    ", baseline component (BENCH_BASELINE_COMPONENT)"
                } else {
                    ""
                }
            ),
            seconds,
            wire_bytes: Some(wire(method)),
        });
    }

    // The component embedded through the host API: one send-json per batch.
    if embedded {
        let table = events_table(&sql, "component");
        let mut i = runtime()
            .instantiate(default_allow_list(&conn).unwrap())
            .await
            .unwrap();
        let s = i
            .open_sink(
                &conn,
                &SinkOptions {
                    table: table.clone(),
                    columns: Some(EVENT_COLUMNS.iter().map(|c| c.to_string()).collect()),
                    batch_size: Some(batch as u32),
                    settings: vec![],
                    dedup: None,
                    retries: None,
                    compression: None,
                },
            )
            .await
            .unwrap();
        let started = Instant::now();
        let mut written = 0;
        for body in &batches {
            written += i.sink_send_json(s, body).await.unwrap().written_rows;
        }
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(written, rows as u64);
        assert_eq!(count_rows(&sql, &table), rows as u64);
        results.push(Measured {
            path: "component embedded (send-json per batch, defaults)".into(),
            seconds,
            wire_bytes: Some(wire(Compression::default())),
        });
    }

    // The same bytes POSTed by a native client (keep-alive), per batch and as one request.
    for method in [Compression::None, Compression::Lz4, Compression::Zstd] {
        let table = events_table(&sql, &format!("native_{}", method.name()));
        let requests: Vec<HttpRequest> = batches
            .iter()
            .map(|b| {
                native_insert(
                    &sql,
                    &table,
                    &EVENT_COLUMNS,
                    "JSONEachRow",
                    b.clone(),
                    method,
                )
            })
            .collect();
        let bytes = requests.iter().map(|r| r.body.len()).sum();
        let seconds = native_posts(&sql, &requests);
        assert_eq!(count_rows(&sql, &table), rows as u64);
        results.push(Measured {
            path: format!(
                "native POST per batch, {} (compressed before timing)",
                method.name()
            ),
            seconds,
            wire_bytes: Some(bytes),
        });
    }
    let table = events_table(&sql, "native_whole");
    let whole = [native_insert(
        &sql,
        &table,
        &EVENT_COLUMNS,
        "JSONEachRow",
        all.clone(),
        Compression::None,
    )];
    let seconds = native_posts(&sql, &whole);
    assert_eq!(count_rows(&sql, &table), rows as u64);
    results.push(Measured {
        path: "native POST of the whole file, one request, none".into(),
        seconds,
        wire_bytes: Some(all.len()),
    });

    // From Python (benches/onestep_bench.py): onestep-clickhouse 0.1.1 from PyPI driving the
    // same server (clickhouse-connect's own compression, lz4 by default), our onestep plugin
    // with the same rows, and the wheel's send_json of the file.
    let input_arg = input.to_string_lossy().into_owned();
    let python_paths = [
        (
            ".venv-bench",
            "onestep-clickhouse",
            "onestep",
            rows.to_string(),
        ),
        (".venv-plugin", "plugin", "plugin", rows.to_string()),
        (".venv-plugin", "send-json", "send_json", input_arg),
    ];
    for (venv, mode, name, what) in python_paths {
        let table = events_table(&sql, name);
        if let Some((seconds, path)) =
            python_bench(server, venv, mode, &table, &what, batch, "events")
        {
            assert_eq!(count_rows(&sql, &table), rows as u64);
            results.push(Measured {
                path,
                seconds,
                wire_bytes: None,
            });
        }
    }
    let _ = std::fs::remove_file(&input);

    println!("| path | seconds | rows/s | MB on the wire |");
    println!("|---|---:|---:|---:|");
    for m in &results {
        println!(
            "| {} | {:.2} | {:.0} | {} |",
            m.path,
            m.seconds,
            rows as f64 / m.seconds,
            m.wire_bytes
                .map_or("".to_string(), |b| format!("{:.1}", b as f64 / 1e6))
        );
    }
    let rate = |prefix: &str| {
        results
            .iter()
            .find(|m| m.path.starts_with(prefix))
            .map(|m| rows as f64 / m.seconds)
    };
    let component = rate("component CLI `sink --compression lz4`").unwrap();
    println!();
    for (name, prefix) in [
        ("native POST per batch, none", "native POST per batch, none"),
        ("native POST per batch, lz4", "native POST per batch, lz4"),
        ("native POST per batch, zstd", "native POST per batch, zstd"),
        (
            "one native POST of the whole file",
            "native POST of the whole file",
        ),
        ("onestep-clickhouse", "onestep"),
    ] {
        if let Some(other) = rate(prefix) {
            println!(
                "component CLI (defaults) / {name}: {:.2}",
                component / other
            );
        }
    }
    if let Some(send_json) = rate("Python wheel `Sink.send_json`") {
        println!(
            "Python send_json / component CLI (defaults): {:.2} (target >= 0.9)",
            send_json / component
        );
    }
    if let (Some(plugin), Some(onestep)) = (rate("our onestep plugin"), rate("onestep")) {
        println!(
            "our onestep plugin / onestep-clickhouse 0.1.1: {:.2}",
            plugin / onestep
        );
    }
}

/// Runs benches/onestep_bench.py MODE in `venv` with the rows of `shape` (`events`, or the
/// typed section's `mixed`), skipped with a note when that venv is not there (`make bench`
/// makes both); returns the seconds of its send (building the rows is not timed) and the
/// path's name.
fn python_bench(
    server: &clickhouse_component_tests::Server,
    venv: &str,
    mode: &str,
    table: &str,
    what: &str,
    batch: usize,
    shape: &str,
) -> Option<(f64, String)> {
    let root = clickhouse_component_tests::repo_root();
    let python = root.join(venv).join("bin/python");
    if !python.exists() {
        eprintln!("(no {}: `make bench` makes it)", python.display());
        return None;
    }
    let v = python_json(
        server,
        &python,
        "benches/onestep_bench.py",
        &[mode, table, what, &batch.to_string(), shape],
    );
    Some((
        v["seconds"].as_f64().unwrap(),
        v["path"].as_str().unwrap().to_string(),
    ))
}

/// Runs `script` (relative to the repository) with `python`, the server's credentials in its
/// environment; its stdout is one JSON document.
fn python_json(
    server: &clickhouse_component_tests::Server,
    python: &std::path::Path,
    script: &str,
    args: &[&str],
) -> serde_json::Value {
    let out = server
        .export_to(&mut std::process::Command::new(python))
        .arg(clickhouse_component_tests::repo_root().join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The Python wheel (docs/python.md): state store latency from Python against the Rust
/// embedding's in the same run (the same operations on the same server, one warm instance
/// each), the wheel's size, `import clickhouse_component` time, and `meltano run` of a tap
/// emitting 200 STATE messages with our backend and with Meltano's systemdb.
async fn bench_python(iterations: usize) {
    let root = clickhouse_component_tests::repo_root();
    let python = root.join(".venv-plugin/bin/python");
    if !python.exists() {
        eprintln!("(no {}: `make bench` makes it)", python.display());
        return;
    }
    let server = clickhouse();
    let conn = server.connection();
    let db = unique_name("bench_python");
    let (mut i, s) = store_in(runtime(), &conn, &db).await;
    let id = "tap-bench--target-bench";
    let completed = r#"{"singer_state":{"bookmarks":{"stream":{"replication_key_value":"x"}}}}"#;
    let state = |partial: String, completed: &str| State {
        id: id.into(),
        partial,
        completed: completed.into(),
    };
    for _ in 0..20 {
        i.state_set(s, &state(String::new(), completed))
            .await
            .unwrap();
        i.state_get(s, id).await.unwrap().unwrap();
    }
    let (mut get, mut set, mut update) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..iterations {
        let t = Instant::now();
        i.state_get(s, id).await.unwrap().unwrap();
        get.push(t.elapsed());
        let t = Instant::now();
        i.state_set(s, &state(String::new(), completed))
            .await
            .unwrap();
        set.push(t.elapsed());
        let partial = format!(
            r#"{{"singer_state":{{"bookmarks":{{"s{}":{{"v":{n}}}}}}}}}"#,
            n % 5
        );
        let t = Instant::now();
        i.state_update(s, &state(partial, "")).await.unwrap();
        update.push(t.elapsed());
    }
    let py = python_json(
        server,
        &python,
        "tests/python/bench_state.py",
        &[&iterations.to_string(), "--json"],
    );
    println!(
        "\nPython wheel: state store from Python and from the Rust embedding ({iterations} iterations each, one warm instance each, same server, same run)\n"
    );
    println!("| operation | Rust p50 (ms) | Rust p99 (ms) | Python p50 (ms) | Python p99 (ms) | Python - Rust, p50 (ms) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, samples) in [
        ("get", &mut get),
        ("set", &mut set),
        ("update", &mut update),
    ] {
        let (p50, p99) = percentiles(samples);
        let (py50, py99) = (py[name][0].as_f64().unwrap(), py[name][1].as_f64().unwrap());
        println!(
            "| `{name}` | {p50:.2} | {p99:.2} | {py50:.2} | {py99:.2} | {:+.2} |",
            py50 - p50
        );
    }

    // The wheel `make bench` installed, and the time its import takes (fresh interpreters).
    let wheel = std::fs::read_dir(root.join("target/wheels"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".whl"))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
    let mut imports: Vec<f64> = (0..5)
        .map(|_| {
            let out = std::process::Command::new(&python)
                .args(["-c", "import time; t = time.perf_counter(); import clickhouse_component; print(time.perf_counter() - t)"])
                .output()
                .unwrap();
            assert!(out.status.success());
            String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().unwrap() * 1e3
        })
        .collect();
    imports.sort_by(f64::total_cmp);
    println!();
    println!("| wheel | size | `import clickhouse_component` (median of 5) |");
    println!("|---|---:|---:|");
    if let Some(wheel) = wheel {
        let size = wheel.metadata().unwrap().len();
        println!(
            "| {} | {:.1} MiB | {:.1} ms |",
            wheel.file_name().to_string_lossy(),
            size as f64 / (1024.0 * 1024.0),
            imports[2]
        );
    }

    // `meltano run`, 200 STATE messages, our backend against Meltano's default.
    let m = python_json(
        server,
        &python,
        "tests/python/bench_meltano.py",
        &["200", "--json"],
    );
    println!();
    println!("| `meltano run`, a tap emitting 200 STATE messages | seconds | ms per STATE |");
    println!("|---|---:|---:|");
    for (name, key) in [
        ("our backend (`clickhouse`, the wheel)", "clickhouse"),
        ("Meltano's default backend (systemdb)", "systemdb"),
    ] {
        let seconds = m[key].as_f64().unwrap();
        println!("| {name} | {seconds:.1} | {:.1} |", seconds / 200.0 * 1e3);
    }
    println!("| meltano-state-backend-clickhouse at f6ec0ce (measured once, issue 22; not on PyPI) | 237 | 1,185 |");
}

/// Cold and warm start of each artifact: load (Cranelift compiles it, or the precompiled
/// one comes from the cache), instantiate, and a first `ping`; median of 5.
async fn bench_load() {
    use clickhouse_component_host::{
        CachePolicy, ComponentSource, Runtime, EMBEDDED_COMPONENT_PATH, LIBRARY_COMPONENT_PATH,
    };
    let server = clickhouse();
    let conn = server.connection();
    let cache = std::env::temp_dir().join(format!("bench-load-cache-{}", std::process::id()));
    println!(
        "\nComponent start (load + instantiate + first ping, median of 5, {})\n",
        server.url
    );
    println!("| artifact | size (KB) | cold: compiled now (ms) | warm: precompiled, from the cache (ms) |");
    println!("|---|---:|---:|---:|");
    let mut artifacts = vec![(
        "full (library + command mode)",
        EMBEDDED_COMPONENT_PATH.to_string(),
    )];
    if let Some(library) = LIBRARY_COMPONENT_PATH {
        artifacts.push(("library", library.to_string()));
    }
    for (name, path) in artifacts {
        let size = std::fs::metadata(&path).unwrap().len();
        let median = |policy: &CachePolicy| {
            let mut samples = Vec::new();
            for _ in 0..5 {
                let started = Instant::now();
                let runtime =
                    Runtime::new(&ComponentSource::File(path.clone().into()), policy).unwrap();
                let mut i =
                    futures_block(runtime.instantiate(default_allow_list(&conn).unwrap())).unwrap();
                futures_block(i.ping(&conn)).unwrap();
                samples.push(started.elapsed());
            }
            samples.sort();
            samples[2].as_secs_f64() * 1e3
        };
        let cold = median(&CachePolicy::Disabled);
        // The first load fills the cache; the five measured ones read it.
        Runtime::new(
            &ComponentSource::File(path.clone().into()),
            &CachePolicy::Dir(cache.clone()),
        )
        .unwrap();
        let warm = median(&CachePolicy::Dir(cache.clone()));
        println!(
            "| {name} | {:.0} | {cold:.0} | {warm:.1} |",
            size as f64 / 1024.0
        );
    }
    let _ = std::fs::remove_dir_all(&cache);
}

/// `GET /state/{id}` of the composed example (examples/state-service + the library component,
/// scripts/compose) under stock `wasmtime serve`, where every request is a new instance that
/// opens the store and reads, against the same work through the host embedding: a new
/// instance, `open` and `get` per call, and `get` on one warm instance. Sequential (one
/// client: p50, requests/s) and with `clients` at once (requests/s).
async fn bench_serve(iterations: usize, clients: usize) {
    use clickhouse_component_host::StoreOptions;
    use clickhouse_component_tests::serve::{composed, Serve};
    let server = clickhouse();
    let conn = server.connection();
    let db = unique_name("bench_serve");
    let size = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    let files = composed();
    let serve = Serve::start(server, &[("CLICKHOUSE_SCHEMA", Some(&db))], &[]);
    let state = br#"{"completed": {"singer_state": {"bookmarks": {"stream": {"replication_key_value": "2026-11-29T00:00:00Z"}}}}}"#;
    serve.ok("PUT", "/state/tap-bench", state);
    serve.timed("GET", "/state/tap-bench", 20);
    let mut sequential = serve.timed("GET", "/state/tap-bench", iterations);
    let seq_rate = iterations as f64 / sequential.iter().sum::<Duration>().as_secs_f64();
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| serve.timed("GET", "/state/tap-bench", iterations / clients));
        }
    });
    let par_rate = (iterations / clients * clients) as f64 / started.elapsed().as_secs_f64();
    drop(serve);
    // The schema exists now: open only checks it.
    let serve = Serve::start(
        server,
        &[
            ("CLICKHOUSE_SCHEMA", Some(&db)),
            ("STATE_CREATE_SCHEMA", Some("false")),
        ],
        &[],
    );
    serve.timed("GET", "/state/tap-bench", 20);
    let mut checked = serve.timed("GET", "/state/tap-bench", iterations);
    let checked_rate = iterations as f64 / checked.iter().sum::<Duration>().as_secs_f64();
    drop(serve);

    // The same through the embedding.
    let options = StoreOptions {
        database: Some(db.clone()),
        ..Default::default()
    };
    let per_call = || async {
        let mut i = runtime()
            .instantiate(default_allow_list(&conn).unwrap())
            .await
            .unwrap();
        let s = i.open_store(&conn, &options).await.unwrap();
        i.state_get(s, "tap-bench").await.unwrap().unwrap();
    };
    for _ in 0..20 {
        per_call().await;
    }
    let mut fresh = Vec::new();
    for _ in 0..iterations {
        let t = Instant::now();
        per_call().await;
        fresh.push(t.elapsed());
    }
    let fresh_rate = iterations as f64 / fresh.iter().sum::<Duration>().as_secs_f64();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let conn = conn.clone();
        let options = options.clone();
        let n = iterations / clients;
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let mut i = runtime()
                    .instantiate(default_allow_list(&conn).unwrap())
                    .await
                    .unwrap();
                let s = i.open_store(&conn, &options).await.unwrap();
                i.state_get(s, "tap-bench").await.unwrap().unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let fresh_par_rate = (iterations / clients * clients) as f64 / started.elapsed().as_secs_f64();
    let (mut i, s) = store_in(runtime(), &conn, &db).await;
    let mut warm = Vec::new();
    for n in 0..iterations + 20 {
        let t = Instant::now();
        i.state_get(s, "tap-bench").await.unwrap().unwrap();
        if n >= 20 {
            warm.push(t.elapsed());
        }
    }
    let warm_rate = iterations as f64 / warm.iter().sum::<Duration>().as_secs_f64();

    println!(
        "\nGET /state/{{id}}: the composed component under wasmtime serve vs the host embedding ({iterations} calls, {})\n",
        server.url
    );
    println!(
        "composed component {} bytes (consumer {} + library {})\n",
        size(&files.composed),
        size(&files.consumer),
        size(std::path::Path::new(
            clickhouse_component_host::LIBRARY_COMPONENT_PATH.unwrap()
        ))
    );
    println!("| path | p50 (ms) | p99 (ms) | req/s, 1 client | req/s, {clients} clients |");
    println!("|---|---:|---:|---:|---:|");
    let (p50, p99) = percentiles(&mut sequential);
    println!("| wasmtime serve: new instance, open, get (HTTP, keep-alive) | {p50:.2} | {p99:.2} | {seq_rate:.0} | {par_rate:.0} |");
    let (p50, p99) = percentiles(&mut checked);
    println!("| wasmtime serve, STATE_CREATE_SCHEMA=false: new instance, open (checks only), get | {p50:.2} | {p99:.2} | {checked_rate:.0} | |");
    let (p50, p99) = percentiles(&mut fresh);
    println!("| embedding: new instance, open, get | {p50:.2} | {p99:.2} | {fresh_rate:.0} | {fresh_par_rate:.0} |");
    let (p50, p99) = percentiles(&mut warm);
    println!("| embedding: warm instance, get | {p50:.2} | {p99:.2} | {warm_rate:.0} | |");
}

/// Runs a future to completion on the current thread's runtime handle.
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let which: Vec<String> = std::env::args().skip(1).collect();
    let all = which.is_empty();
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if all || which.iter().any(|w| w == "state") {
        rt.block_on(bench_state(iterations));
    }
    let rows_or = |default: usize| {
        std::env::var("BENCH_SINK_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    if all || which.iter().any(|w| w == "python") {
        rt.block_on(bench_python(iterations));
    }
    if all || which.iter().any(|w| w == "serve") {
        rt.block_on(bench_serve(iterations, 4));
    }
    if all || which.iter().any(|w| w == "load") {
        rt.block_on(bench_load());
    }
    if all || which.iter().any(|w| w == "sink") {
        let rows = rows_or(1_000_000);
        rt.block_on(bench_sink("Table sink, localhost", rows, 10_000, true));
        rt.block_on(bench_sink("Table sink, localhost", rows, 100_000, false));
    }
    if all || which.iter().any(|w| w == "typed") {
        typed::bench_typed(rows_or(1_000_000));
    }
    if all || which.iter().any(|w| w == "loader") {
        let shaped = std::env::var("BENCH_SHAPED_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50_000);
        loader::bench_loader(rows_or(1_000_000), shaped);
    }
    // Run by `make bench` inside a network namespace whose loopback is shaped to 100 Mbit/s
    // (scripts/shaped-link); not part of a plain run.
    if which.iter().any(|w| w == "link") {
        rt.block_on(bench_sink(
            "Table sink over a 100 Mbit/s link (tbf-shaped loopback in a network namespace)",
            rows_or(300_000),
            10_000,
            false,
        ));
    }
}
