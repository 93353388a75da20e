//! Section `loader` (docs/benchmarks.md, "Meltano's loader"): a tap's output (SCHEMA, then
//! records of 5 typed columns with a STATE every 1,000, made here and written to a file)
//! replayed into our Singer target, against the same records as NDJSON through the sink CLI
//! (`--dedup`, into a table of the same definition), against shaped-target-clickhouse 0.2.5
//! (the Meltano Hub's `target-clickhouse`, in its own venv; fewer records, it is slow), and our
//! target under `meltano run` with a tap that replays the file (what Meltano adds). Each
//! reports wall time and records/s, and the rows found after it. Then the load methods (issue
//! 46): the same file into our target append-only, with `add_record_metadata`, with
//! `load_method: upsert` and with `load_method: overwrite` (a first run, then one over the
//! table it left, which swaps), each on a fresh database, median of 3, every run's table
//! checked (the bench fails on a wrong row count).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::{clickhouse, unique_name, Server};

use super::{cli, count_rows};

/// Records between STATE messages in the replayed file.
const STATE_EVERY: usize = 1000;

/// Our target's `batch_size_rows` in every run of the section.
const BATCH_SIZE_ROWS: usize = 10_000;

/// Writes the tap's output for `records` records (and the same records as NDJSON); returns
/// both paths.
fn tap_output(dir: &Path, records: usize) -> (PathBuf, PathBuf) {
    tap_output_after(dir, records, 0)
}

/// [`tap_output`] of a tap resumed from bookmark `after`: the records after it.
fn tap_output_after(dir: &Path, records: usize, after: usize) -> (PathBuf, PathBuf) {
    use std::io::Write;
    let singer = dir.join(format!("tap-{records}-{after}.singer"));
    let ndjson = dir.join(format!("tap-{records}-{after}.ndjson"));
    let mut s = std::io::BufWriter::new(std::fs::File::create(&singer).unwrap());
    let mut n = std::io::BufWriter::new(std::fs::File::create(&ndjson).unwrap());
    writeln!(
        s,
        "{}",
        serde_json::json!({"type": "SCHEMA", "stream": "rows", "key_properties": ["id"],
            "schema": {"properties": {
                "id": {"type": "integer"},
                "name": {"type": ["null", "string"]},
                "amount": {"type": ["null", "number"]},
                "at": {"type": ["null", "string"], "format": "date-time"},
                "ok": {"type": ["null", "boolean"]}}}})
    )
    .unwrap();
    for i in after + 1..=records {
        let record = format!(
            "{{\"id\":{i},\"name\":\"name {i}\",\"amount\":{}.{:02},\"at\":\"2026-11-{:02}T{:02}:{:02}:{:02}.{:06}Z\",\"ok\":{}}}",
            i % 100_000,
            i % 100,
            1 + i % 28,
            i % 24,
            i % 60,
            (i / 60) % 60,
            i % 1_000_000,
            i % 2 == 0
        );
        writeln!(
            s,
            "{{\"type\":\"RECORD\",\"stream\":\"rows\",\"record\":{record}}}"
        )
        .unwrap();
        writeln!(n, "{record}").unwrap();
        if i % STATE_EVERY == 0 || i == records {
            writeln!(
                s,
                "{{\"type\":\"STATE\",\"value\":{{\"bookmarks\":{{\"rows\":{{\"last\":{i}}}}}}}}}"
            )
            .unwrap();
        }
    }
    (singer, ndjson)
}

/// A loader killed with SIGKILL once its table holds `kill_at` rows or more, then run again
/// on the records after the last STATE it printed (as Meltano reruns the tap from its stored
/// bookmark); returns (rows committed at the kill, the last bookmark printed, duplicates after
/// the rerun: `count() - uniqExact(id)`, read without FINAL).
fn killed_and_rerun(
    dir: &Path,
    sql: &Sql,
    table: &str,
    records: usize,
    kill_at: u64,
    loader: &dyn Fn() -> Command,
) -> (u64, usize, u64) {
    let (input, _) = tap_output(dir, records);
    let mut command = loader();
    let mut child = command
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        let exists = sql.count(
            "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'rows'",
            &[("db", table.split_once('.').unwrap().0)],
        ) > 0;
        if exists && count_rows(sql, table) >= kill_at {
            break;
        }
        if child.try_wait().unwrap().is_some() || started.elapsed().as_secs() > 600 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let at_kill = count_rows(sql, table);
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["bookmarks"]["rows"]["last"].as_u64())
        .next_back()
        .unwrap_or(0) as usize;
    let (rest, _) = tap_output_after(dir, records, last);
    let mut command = loader();
    let status = command
        .stdin(std::fs::File::open(&rest).unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the rerun failed");
    let (db, t) = table.split_once('.').unwrap();
    let distinct = sql.count(
        "SELECT uniqExact(id) FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", t)],
    );
    (at_kill, last, count_rows(sql, table) - distinct)
}

/// Sets `engine_type` in a loader's config file.
fn set_engine(path: &Path, engine: &str) {
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    config["engine_type"] = engine.into();
    std::fs::write(path, config.to_string()).unwrap();
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Our target's config for `database` (on `server`).
fn config(dir: &Path, server: &Server, database: &str, name: &str) -> PathBuf {
    config_with(dir, server, database, name, &serde_json::json!({}))
}

/// [`config`] with the settings of `extra` added.
fn config_with(
    dir: &Path,
    server: &Server,
    database: &str,
    name: &str,
    extra: &serde_json::Value,
) -> PathBuf {
    let path = dir.join(name);
    let mut config = serde_json::json!({"uri": server.url, "username": server.user,
        "password": server.password, "database": database, "batch_size_rows": BATCH_SIZE_ROWS});
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// shaped-target-clickhouse's config for `database`.
fn shaped_config(dir: &Path, server: &Server, database: &str, name: &str) -> PathBuf {
    let url = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let (host, port) = url.rsplit_once(':').unwrap();
    let path = dir.join(name);
    std::fs::write(
        &path,
        serde_json::json!({"host": host, "port": port.parse::<u16>().unwrap(),
            "username": server.user, "password": server.password, "database": database,
            "engine_type": "ReplacingMergeTree"})
        .to_string(),
    )
    .unwrap();
    path
}

fn timed(mut command: Command, stdin: Option<&Path>) -> f64 {
    if let Some(path) = stdin {
        command.stdin(std::fs::File::open(path).unwrap());
    }
    command.stdout(Stdio::null());
    let started = Instant::now();
    let out = command.output().unwrap();
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{:?}: {}",
        command.get_program(),
        String::from_utf8_lossy(&out.stderr)
    );
    seconds
}

/// Runs the section; `records` for ours and the sink CLI, `shaped_records` for
/// shaped-target-clickhouse.
pub fn bench_loader(records: usize, shaped_records: usize) {
    let server = clickhouse();
    let sql = Sql::new(&server.connection());
    let dir = std::env::temp_dir().join(unique_name("bench-loader"));
    std::fs::create_dir_all(&dir).unwrap();
    let (singer, ndjson) = tap_output(&dir, records);
    // The component compiled (and cached) before anything is timed.
    let warm = Command::new(cli())
        .args(["target", "--about"])
        .output()
        .unwrap();
    assert!(warm.status.success());
    let mut rows: Vec<(String, usize, f64, u64)> = Vec::new();

    // Our target: a fresh database, the table created from the SCHEMA.
    let ours = unique_name("bench_target");
    let cfg = config(&dir, server, &ours, "ours.json");
    let mut command = Command::new(cli());
    command.args(["target", "--config"]).arg(&cfg);
    let seconds = timed(command, Some(&singer));
    let table = format!("{ours}.rows");
    rows.push((
        "our target (`target-clickhouse-component`)".into(),
        records,
        seconds,
        count_rows(&sql, &table),
    ));

    // The sink CLI on the same records as NDJSON, into a table of the same definition.
    let sink_db = unique_name("bench_target_sink");
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &sink_db)]);
    // The definition the target created (docs/meltano.md's mapping).
    sql.exec(
        "CREATE TABLE {db:Identifier}.rows (id Int64, name Nullable(String), amount Nullable(Float64), \
         at Nullable(DateTime64(6, 'UTC')), ok Nullable(Bool)) ENGINE = ReplacingMergeTree ORDER BY (id) \
         SETTINGS non_replicated_deduplication_window = 1000",
        &[("db", &sink_db)],
    );
    let sink_table = format!("{sink_db}.rows");
    let mut command = Command::new(cli());
    server.export_to(&mut command);
    command
        .args([
            "sink",
            "--table",
            &sink_table,
            "--batch-size",
            "10000",
            "--dedup",
        ])
        .arg(&ndjson);
    let seconds = timed(command, None);
    rows.push((
        "sink CLI, the same records as NDJSON (`--dedup`)".into(),
        records,
        seconds,
        count_rows(&sql, &sink_table),
    ));

    // shaped-target-clickhouse 0.2.5, if its venv is there.
    let shaped_bin =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-shaped/bin/target-clickhouse");
    if shaped_bin.exists() {
        let (shaped_singer, _) = tap_output(&dir, shaped_records);
        let shaped_db = unique_name("bench_shaped");
        sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &shaped_db)]);
        let cfg = shaped_config(&dir, server, &shaped_db, "shaped.json");
        let mut command = Command::new(&shaped_bin);
        command.arg("--config").arg(&cfg);
        let seconds = timed(command, Some(&shaped_singer));
        rows.push((
            "shaped-target-clickhouse 0.2.5".into(),
            shaped_records,
            seconds,
            count_rows(&sql, &format!("{shaped_db}.rows")),
        ));
    } else {
        println!(
            "(shaped-target-clickhouse: no {} — `make bench` installs it)",
            shaped_bin.display()
        );
    }

    // Our target under `meltano run`, with a tap that replays the same file (systemdb state).
    let meltano = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-plugin/bin/meltano");
    let console = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.venv-plugin/bin/target-clickhouse-component");
    if meltano.exists() && console.exists() {
        // The wheel's own cache: compiled before timing, as the CLI's above.
        let warm = Command::new(&console).arg("--about").output().unwrap();
        assert!(warm.status.success());
        let melt_db = unique_name("bench_meltano");
        let project = dir.join("meltano");
        std::fs::create_dir_all(&project).unwrap();
        let tap = project.join("tap_replay.sh");
        std::fs::write(&tap, format!("#!/bin/sh\nexec cat {}\n", singer.display())).unwrap();
        make_executable(&tap);
        let yml = serde_json::json!({
            "default_environment": "dev", "project_id": "bench-loader",
            "send_anonymous_usage_stats": false, "environments": [{"name": "dev"}],
            "plugins": {
                "extractors": [{"name": "tap-replay", "namespace": "tap_replay",
                    "executable": tap.to_str().unwrap()}],
                "loaders": [{"name": "target-clickhouse-component",
                    "namespace": "target_clickhouse_component",
                    "executable": console.to_str().unwrap(),
                    "settings": [{"name": "uri"}, {"name": "username"}, {"name": "password", "kind": "password"},
                        {"name": "database"}, {"name": "batch_size_rows", "kind": "integer"}],
                    "config": {"uri": server.url, "username": server.user, "password": server.password,
                        "database": melt_db, "batch_size_rows": BATCH_SIZE_ROWS}}]}});
        std::fs::write(project.join("meltano.yml"), yml.to_string()).unwrap();
        let mut command = Command::new(&meltano);
        command
            .current_dir(&project)
            .env("MELTANO_SEND_ANONYMOUS_USAGE_STATS", "false")
            .env("MELTANO_DISABLE_TRACKING", "true")
            .args(["run", "tap-replay", "target-clickhouse-component"]);
        let seconds = timed(command, None);
        rows.push((
            "our target under `meltano run` (a tap replaying the file)".into(),
            records,
            seconds,
            count_rows(&sql, &format!("{melt_db}.rows")),
        ));
        // The console script alone on the same file (the wheel's host, as Meltano runs it).
        let script_db = unique_name("bench_script");
        let cfg = config(&dir, server, &script_db, "script.json");
        let mut command = Command::new(&console);
        command.arg("--config").arg(&cfg);
        let seconds = timed(command, Some(&singer));
        rows.push((
            "the same console script, the file on its stdin".into(),
            records,
            seconds,
            count_rows(&sql, &format!("{script_db}.rows")),
        ));
    }

    // The crash comparison: each loader killed mid-load, then rerun from its last STATE.
    let mut crashes: Vec<(String, u64, usize, u64)> = Vec::new();
    let crash_records = 50_000;
    for kill_at in [15_000u64, 25_000, 35_000] {
        let db = unique_name("bench_crash_ours");
        let cfg = config(&dir, server, &db, &format!("crash-{kill_at}.json"));
        // A plain MergeTree for both loaders: no merge hides a duplicate.
        set_engine(&cfg, "MergeTree");
        let ours = || {
            let mut c = Command::new(cli());
            c.args(["target", "--config"]).arg(&cfg);
            c
        };
        let table = format!("{db}.rows");
        let (at, last, dups) = killed_and_rerun(&dir, &sql, &table, crash_records, kill_at, &ours);
        crashes.push(("our target".into(), at, last, dups));
        if shaped_bin.exists() {
            let db = unique_name("bench_crash_shaped");
            sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
            let cfg = shaped_config(&dir, server, &db, &format!("shaped-crash-{kill_at}.json"));
            set_engine(&cfg, "MergeTree");
            let shaped = || {
                let mut c = Command::new(&shaped_bin);
                c.arg("--config").arg(&cfg);
                c
            };
            let table = format!("{db}.rows");
            let (at, last, dups) =
                killed_and_rerun(&dir, &sql, &table, crash_records, kill_at, &shaped);
            crashes.push(("shaped-target-clickhouse 0.2.5".into(), at, last, dups));
        }
    }

    // The load methods (issue 46): the same file into our target, configuration by
    // configuration.
    let methods = bench_load_methods(&dir, server, &sql, &singer, records);

    println!("\n## Meltano's loader: {records} records of 5 typed columns, a STATE every {STATE_EVERY}, batch 10,000\n");
    println!("| path | records | seconds | records/s | rows in the table |");
    println!("|---|---:|---:|---:|---:|");
    for (path, n, seconds, found) in &rows {
        println!(
            "| {path} | {n} | {seconds:.2} | {:.0} | {found} |",
            *n as f64 / seconds
        );
    }
    let rate = |i: usize| rows[i].1 as f64 / rows[i].2;
    let at = |name: &str| rows.iter().position(|r| r.0.starts_with(name));
    println!(
        "\nour target / sink CLI, wall time: {:.2}x (goal <= 1.3x)",
        rows[0].2 / rows[1].2
    );
    if let Some(i) = at("shaped") {
        println!(
            "our target / shaped-target-clickhouse, records/s: {:.1}x (goal >= 5x)",
            rate(0) / rate(i)
        );
    }
    if let (Some(m), Some(c)) = (at("our target under"), at("the same console")) {
        println!(
            "`meltano run` / the console script alone, wall time: {:.2}x (goal <= 1.5x)",
            rows[m].2 / rows[c].2
        );
    }
    println!("\n### Killed mid-load ({crash_records} records, kill -9 once the table holds N rows), then rerun from the last STATE printed; plain MergeTree tables\n");
    println!("| loader | rows at the kill | last bookmark printed | duplicates after the rerun |");
    println!("|---|---:|---:|---:|");
    for (loader, at, last, dups) in &crashes {
        println!("| {loader} | {at} | {last} | {dups} |");
    }
    print_load_methods(&methods, records);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Timed runs of each configuration of the load-method comparison; its median is reported.
const METHOD_RUNS: usize = 3;

/// One configuration of the load-method comparison (issue 46), each run on the same file
/// with the same `batch_size_rows`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    /// Today's default: `load_method: append-only`, no metadata.
    Append,
    /// `add_record_metadata: true`, appended.
    AppendMetadata,
    /// `load_method: upsert` (the stream is keyed by `id`).
    Upsert,
    /// `load_method: overwrite`, the first run on a fresh database: loaded beside, then a
    /// `RENAME TABLE` into place.
    OverwriteFirst,
    /// `load_method: overwrite` over a table that already holds the rows (the run after
    /// [`Method::OverwriteFirst`]): loaded beside, then `EXCHANGE TABLES` and the old one
    /// dropped.
    Overwrite,
}

impl Method {
    /// In the order they are run in each round (an overwrite needs its first run before it).
    const ALL: [Method; 5] = [
        Method::Append,
        Method::AppendMetadata,
        Method::Upsert,
        Method::OverwriteFirst,
        Method::Overwrite,
    ];

    fn label(self) -> &'static str {
        match self {
            Method::Append => "append-only (the default)",
            Method::AppendMetadata => "append-only, `add_record_metadata: true`",
            Method::Upsert => "`load_method: upsert` (keyed by `id`)",
            Method::OverwriteFirst => {
                "`load_method: overwrite`, first run (fresh database: `RENAME` into place)"
            }
            Method::Overwrite => {
                "`load_method: overwrite` over the loaded table (`EXCHANGE TABLES`, old dropped)"
            }
        }
    }

    fn settings(self) -> serde_json::Value {
        match self {
            Method::Append => serde_json::json!({}),
            Method::AppendMetadata => serde_json::json!({"add_record_metadata": true}),
            Method::Upsert => serde_json::json!({"load_method": "upsert"}),
            Method::OverwriteFirst | Method::Overwrite => {
                serde_json::json!({"load_method": "overwrite"})
            }
        }
    }

    /// The `_sdc_` columns the table must have, and no others.
    fn sdc_columns(self) -> &'static [&'static str] {
        match self {
            Method::AppendMetadata => &[
                "_sdc_batched_at",
                "_sdc_deleted_at",
                "_sdc_extracted_at",
                "_sdc_received_at",
                "_sdc_sequence",
                "_sdc_sync_started_at",
                "_sdc_table_version",
            ],
            Method::Upsert => &["_sdc_upsert_version"],
            _ => &[],
        }
    }
}

/// A table's UUID (`system.tables`).
fn table_uuid(sql: &Sql, db: &str, table: &str) -> String {
    let rows = sql.rows(
        "SELECT toString(uuid) AS u FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        &[("db", db), ("t", table)],
    );
    assert_eq!(rows.len(), 1, "bench loader: no table {db}.{table}");
    rows[0]["u"].as_str().unwrap().to_string()
}

/// Checks that a run of `method` into `db` left exactly what it must, and panics (failing the
/// bench) otherwise: `records` rows under `count()` and under `count() FINAL`, the `_sdc_`
/// columns of the configuration and no others, every record's metadata filled, an upsert's
/// versioned engine with one version per record, no `rows__loading` left behind, and, for an
/// overwrite over a loaded table, another table than the one before it (`before`: its UUID).
/// Returns (`count()`, `count() FINAL`).
fn check_method(
    sql: &Sql,
    db: &str,
    method: Method,
    records: usize,
    before: Option<&str>,
) -> (u64, u64) {
    let label = method.label();
    let params = [("db", db)];
    let count = sql.count("SELECT count() FROM {db:Identifier}.rows", &params);
    let fin = sql.count("SELECT count() FROM {db:Identifier}.rows FINAL", &params);
    assert!(
        count == records as u64 && fin == records as u64,
        "bench loader, {label}: {count} rows (count()), {fin} under FINAL; expected {records}"
    );
    let sdc: Vec<String> = sql
        .rows(
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = 'rows' \
             AND startsWith(name, '_sdc_') ORDER BY name",
            &params,
        )
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        sdc,
        method.sdc_columns(),
        "bench loader, {label}: the table's _sdc_ columns"
    );
    if method == Method::AppendMetadata {
        let unfilled = sql.count(
            "SELECT countIf(_sdc_received_at IS NULL OR _sdc_batched_at IS NULL \
             OR _sdc_sequence IS NULL OR _sdc_sync_started_at IS NULL) FROM {db:Identifier}.rows",
            &params,
        );
        assert_eq!(unfilled, 0, "bench loader, {label}: rows without metadata");
    }
    if method == Method::Upsert {
        let engine = sql.rows(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = 'rows'",
            &params,
        );
        let engine = engine[0]["engine_full"].as_str().unwrap();
        assert!(
            engine.starts_with("ReplacingMergeTree(_sdc_upsert_version)"),
            "bench loader, {label}: engine {engine}"
        );
        let versions = sql.count(
            "SELECT uniqExact(_sdc_upsert_version) FROM {db:Identifier}.rows",
            &params,
        );
        assert_eq!(
            versions, records as u64,
            "bench loader, {label}: distinct versions"
        );
    }
    let left = sql.count(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name != 'rows'",
        &params,
    );
    assert_eq!(left, 0, "bench loader, {label}: tables left beside `rows`");
    if let Some(before) = before {
        assert_ne!(
            table_uuid(sql, db, "rows"),
            before,
            "bench loader, {label}: the table was not swapped"
        );
    }
    (count, fin)
}

/// One configuration's measurements: its runs' seconds, and the rows the last run left
/// (`count()`, `count() FINAL`).
struct MethodRuns {
    method: Method,
    seconds: Vec<f64>,
    found: (u64, u64),
}

impl MethodRuns {
    fn median(&self) -> f64 {
        let mut s = self.seconds.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    }
}

/// The load-method comparison (issue 46): the same file (`singer`, `records` records) into our
/// target, each configuration of [`Method`] on a fresh database, [`METHOD_RUNS`] rounds (one
/// run of each configuration per round, so a change in the machine's load falls on all of
/// them); every run's table checked ([`check_method`]) and its database dropped.
fn bench_load_methods(
    dir: &Path,
    server: &Server,
    sql: &Sql,
    singer: &Path,
    records: usize,
) -> Vec<MethodRuns> {
    let mut runs: Vec<MethodRuns> = Method::ALL
        .iter()
        .map(|&method| MethodRuns {
            method,
            seconds: Vec::new(),
            found: (0, 0),
        })
        .collect();
    let run = |db: &str, method: Method, round: usize| {
        let cfg = config_with(
            dir,
            server,
            db,
            &format!("method-{round}-{}.json", db),
            &method.settings(),
        );
        let mut command = Command::new(cli());
        command.args(["target", "--config"]).arg(&cfg);
        timed(command, Some(singer))
    };
    for round in 0..METHOD_RUNS {
        let mut overwritten: Option<(String, String)> = None;
        for (i, &method) in Method::ALL.iter().enumerate() {
            // A fresh database for each configuration, but the second overwrite: it runs over
            // the table its first run left.
            let (db, before) = match (method, overwritten.take()) {
                (Method::Overwrite, Some((db, uuid))) => (db, Some(uuid)),
                _ => (unique_name("bench_method"), None),
            };
            let seconds = run(&db, method, round);
            let found = check_method(sql, &db, method, records, before.as_deref());
            runs[i].seconds.push(seconds);
            runs[i].found = found;
            if method == Method::OverwriteFirst {
                let uuid = table_uuid(sql, &db, "rows");
                overwritten = Some((db, uuid));
            } else {
                sql.exec("DROP DATABASE {db:Identifier} SYNC", &[("db", &db)]);
            }
        }
    }
    runs
}

/// Prints the load-method comparison's table and its ratios.
fn print_load_methods(runs: &[MethodRuns], records: usize) {
    println!(
        "\n### Load methods: the same {records} records, batch_size_rows {BATCH_SIZE_ROWS}, \
         each on a fresh database (median of {METHOD_RUNS}, one round of each at a time)\n"
    );
    println!("| configuration | records | median seconds | records/s | runs (s) | count() | count() FINAL |");
    println!("|---|---:|---:|---:|---|---:|---:|");
    for r in runs {
        let each: Vec<String> = r.seconds.iter().map(|s| format!("{s:.2}")).collect();
        println!(
            "| {} | {records} | {:.2} | {:.0} | {} | {} | {} |",
            r.method.label(),
            r.median(),
            records as f64 / r.median(),
            each.join(", "),
            r.found.0,
            r.found.1
        );
    }
    let of = |m: Method| runs.iter().find(|r| r.method == m).unwrap();
    let append = of(Method::Append);
    // Per round, against that round's append-only run: the spread of a ratio.
    let ratio = |m: Method| {
        let r = of(m);
        let mut each: Vec<f64> = r
            .seconds
            .iter()
            .zip(&append.seconds)
            .map(|(a, b)| a / b)
            .collect();
        each.sort_by(f64::total_cmp);
        (r.median() / append.median(), each[0], each[each.len() - 1])
    };
    let (m, lo, hi) = ratio(Method::AppendMetadata);
    println!(
        "\nmetadata on / append-only, wall time: {:+.1}% (per round {:+.1}% to {:+.1}%)",
        (m - 1.0) * 100.0,
        (lo - 1.0) * 100.0,
        (hi - 1.0) * 100.0
    );
    for (method, name) in [
        (Method::Upsert, "upsert"),
        (Method::OverwriteFirst, "overwrite, first run"),
        (Method::Overwrite, "overwrite over the loaded table"),
    ] {
        let (m, lo, hi) = ratio(method);
        println!("{name} / append-only, wall time: {m:.2}x (per round {lo:.2}x to {hi:.2}x)");
    }
}
