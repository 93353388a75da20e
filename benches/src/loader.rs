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

use super::count_rows;

/// Records between STATE messages in the replayed file.
const STATE_EVERY: usize = 1000;

/// Writes the tap's output for `records` records (and the same records as NDJSON); returns
/// both paths.
fn tap_output(dir: &Path, records: usize) -> (PathBuf, PathBuf) {
    use std::io::Write;
    let singer = dir.join(format!("tap-{records}.singer"));
    let ndjson = dir.join(format!("tap-{records}.ndjson"));
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
    for i in 1..=records {
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

fn cli() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("clickhouse-component")
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
        let url = server.url.trim_start_matches("http://");
        let (host, port) = url.rsplit_once(':').unwrap();
        let cfg = dir.join("shaped.json");
        std::fs::write(
            &cfg,
            serde_json::json!({"host": host, "port": port.trim_end_matches('/').parse::<u16>().unwrap(),
                "username": server.user, "password": server.password, "database": shaped_db,
                "engine_type": "ReplacingMergeTree"})
            .to_string(),
        )
        .unwrap();
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
    println!(
        "\nour target / sink CLI, wall time: {:.2}x (goal <= 1.3x)",
        rows[0].2 / rows[1].2
    );
    if rows.len() > 2 {
        println!(
            "our target / shaped-target-clickhouse, records/s: {:.1}x (goal >= 5x)",
            rate(0) / rate(2)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
