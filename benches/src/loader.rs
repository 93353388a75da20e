//! Section `loader` (docs/benchmarks.md, "Meltano's loader"): a tap's output (SCHEMA, then
//! records of 5 typed columns with a STATE every 1,000, made here and written to a file)
//! replayed into our Singer target, against the same records as NDJSON through the sink CLI
//! (`--dedup`, into a table of the same definition), against shaped-target-clickhouse 0.2.5
//! (the Meltano Hub's `target-clickhouse`, in its own venv; fewer records, it is slow), and our
//! target under `meltano run` with a tap that replays the file (what Meltano adds). Each
//! reports wall time and records/s, and the rows found after it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::{clickhouse, unique_name, Server};

use super::{cli, count_rows};

/// Records between STATE messages in the replayed file.
const STATE_EVERY: usize = 1000;

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
    let path = dir.join(name);
    std::fs::write(
        &path,
        serde_json::json!({"uri": server.url, "username": server.user,
            "password": server.password, "database": database, "batch_size_rows": 10_000})
        .to_string(),
    )
    .unwrap();
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
                        "database": melt_db, "batch_size_rows": 10_000}}]}});
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
    let _ = std::fs::remove_dir_all(&dir);
}
