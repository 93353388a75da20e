//! Section `typed` (docs/benchmarks.md, "The typed sink"): the sink that reads every value for
//! its column's type and sends Native blocks, against raw per-batch POSTs of the same rows as
//! JSONEachRow and as Native (encoded before timing), onestep-clickhouse 0.1.1 and our onestep
//! plugin; two tables (the 5-column events, and 6 columns with a decimal and an array), batch
//! 10,000 and 100,000. Each path reports its wall time, rows/s and the server's CPU (the local
//! ClickHouse's process, read from /proc around the path; `n/a` for a server elsewhere); the
//! CLI also its own CPU (the guest's work, nearly all of it) and peak memory, with and without
//! the whole-file pass (`--stream` skips it); the CLI reports its first pass's seconds (`--json`),
//! so the pass's share is measured, not guessed. Beside the first pass, the floor it must beat
//! by 1.5x: serde_json's typed read of the same file in the same guest environment (the
//! bench-only benches/serde-guest under the host's wasmtime: [`SerdeGuest`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use clickhouse_component::client::sql::quote_identifier;
use clickhouse_component::client::{Compression, HttpRequest};
use clickhouse_component::sink::columns::TableColumns;
use clickhouse_component::sink::encode::encode_json;
use clickhouse_component::sink::types::Type;
use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::{clickhouse, unique_name, Server};

use super::{cli, count_rows, native_insert, python_bench, warm_up};

/// A table shape: its columns (name, type) and its rows as NDJSON lines.
struct Shape {
    name: &'static str,
    columns: &'static [(&'static str, &'static str)],
    line: fn(usize) -> String,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "events",
        columns: &[
            ("event_id", "String"),
            ("seq", "UInt64"),
            ("occurred_at", "DateTime64(3)"),
            ("kind", "LowCardinality(String)"),
            ("payload", "String"),
        ],
        line: event_line,
    },
    Shape {
        name: "mixed",
        columns: &[
            ("id", "UInt64"),
            ("at", "DateTime64(3)"),
            ("kind", "LowCardinality(String)"),
            ("amount", "Decimal(18, 2)"),
            ("tags", "Array(String)"),
            ("note", "String"),
        ],
        line: mixed_line,
    },
];

/// `2026-11-29 hh:mm:ss.mmm`, `n` milliseconds after 10:00 (as benches/onestep_bench.py).
fn moment(n: usize) -> String {
    let ms = n as u64;
    format!(
        "2026-11-29 {:02}:{:02}:{:02}.{:03}",
        10 + ms / 3_600_000,
        (ms / 60_000) % 60,
        (ms / 1000) % 60,
        ms % 1000
    )
}

/// Event `n` as one NDJSON line (also the `sink` section's rows).
pub(crate) fn event_line(n: usize) -> String {
    format!(
        "{{\"event_id\":\"ev-{n:07}\",\"seq\":{},\"occurred_at\":\"{}\",\"kind\":\"k{}\",\"payload\":\"{}\"}}",
        1_000_000_000_000u64 + n as u64,
        moment(n),
        n % 7,
        "p".repeat(64)
    )
}

fn mixed_line(n: usize) -> String {
    let tags: Vec<String> = (0..n % 4)
        .map(|t| format!("\"t{}\"", (n + t) % 10))
        .collect();
    format!(
        "{{\"id\":{},\"at\":\"{}\",\"kind\":\"k{}\",\"amount\":\"{}.{:02}\",\"tags\":[{}],\"note\":\"note {n} {}\"}}",
        1_000_000_000_000u64 + n as u64,
        moment(n),
        n % 7,
        n % 100_000,
        n % 100,
        tags.join(","),
        "n".repeat(40)
    )
}

/// A fresh table of `shape`, in a database of its own; returns `db.t`.
fn table(sql: &Sql, shape: &Shape, name: &str) -> String {
    let db = unique_name("bench_typed");
    sql.exec(
        "CREATE DATABASE IF NOT EXISTS {db:Identifier}",
        &[("db", &db)],
    );
    let columns: Vec<String> = shape
        .columns
        .iter()
        .map(|(n, t)| format!("{} {t}", quote_identifier(n)))
        .collect();
    sql.exec(
        &format!(
            "CREATE TABLE {{db:Identifier}}.{{t:Identifier}} ({}) ENGINE = MergeTree ORDER BY tuple()",
            columns.join(", ")
        ),
        &[("db", &db), ("t", name)],
    );
    format!("{db}.{name}")
}

/// Drops a measured table's database ([`table`] makes one per table): its parts' background
/// merges would otherwise run on through the next measurements, on the same two cores.
fn drop_table(sql: &Sql, table: &str) {
    let db = table.split('.').next().unwrap_or(table);
    sql.exec("DROP DATABASE {db:Identifier} SYNC", &[("db", db)]);
}

/// CPU seconds (user + system) the local ClickHouse's process has used so far: the process
/// listening on the server URL's port on this machine (`ss`), read from /proc; `None` for a
/// server elsewhere.
struct ServerCpu(Option<u32>);

impl ServerCpu {
    fn find(server: &Server) -> Self {
        let port = server
            .url
            .rsplit(':')
            .next()
            .unwrap_or("")
            .trim_end_matches('/');
        let local = server.url.contains("127.0.0.1") || server.url.contains("localhost");
        let pid = local
            .then(|| {
                let out = Command::new("ss")
                    .args(["-Hltnp", &format!("sport = :{port}")])
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&out.stdout);
                let at = text.find("pid=")? + 4;
                text[at..]
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .flatten();
        ServerCpu(pid)
    }

    fn seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0?)).ok()?;
        // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 =
            fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / 100.0)
    }
}

/// One measured path.
struct Measured {
    path: String,
    seconds: f64,
    server_cpu: Option<f64>,
    /// The CLI's own CPU seconds, peak RSS (KiB) and first pass.
    client: Option<CliRun>,
}

/// Runs `f` and measures its wall time and the server's CPU around it.
fn measure<T>(cpu: &ServerCpu, f: impl FnOnce() -> T) -> (T, f64, Option<f64>) {
    let before = cpu.seconds();
    let started = Instant::now();
    let out = f();
    let seconds = started.elapsed().as_secs_f64();
    let used = before.zip(cpu.seconds()).map(|(a, b)| b - a);
    (out, seconds, used)
}

/// What a CLI run measured: its CPU seconds, its peak RSS (KiB), and its first pass over the
/// file (`--json`'s `first_pass_seconds`, `first_pass_kept`), if it made one.
type CliRun = (f64, u64, Option<(f64, bool)>);

/// The CLI's `sink` of `input` into `table`, through GNU time: its CPU and peak RSS, and its
/// first pass as it reports it.
fn cli_run(server: &Server, table: &str, batch: usize, input: &Path, extra: &[&str]) -> CliRun {
    let cli = cli();
    let times = std::env::temp_dir().join(format!("bench-typed-time-{}", std::process::id()));
    let mut command = Command::new("/usr/bin/time");
    command.args(["-f", "%U %S %M", "-o"]).arg(&times).arg(&cli);
    let out = server
        .export_to(&mut command)
        .args(["--json", "sink", "--table", table])
        .args(["--batch-size", &batch.to_string()])
        .args(extra)
        .arg(input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&times).unwrap();
    let _ = std::fs::remove_file(&times);
    let v: Vec<&str> = text.split_whitespace().collect();
    let n = v.len();
    let user: f64 = v[n - 3].parse().unwrap();
    let system: f64 = v[n - 2].parse().unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first_pass = summary["first_pass_seconds"]
        .as_f64()
        .zip(summary["first_pass_kept"].as_bool());
    (user + system, v[n - 1].parse().unwrap(), first_pass)
}

/// Each batch as one Native block, made by the sink's own reader and encoder (natively,
/// before timing): the bytes a client that encodes Native sends.
fn native_bodies(shape: &Shape, batches: &[Vec<u8>], zone: &str) -> Vec<Vec<u8>> {
    let table = TableColumns::new(
        shape
            .columns
            .iter()
            .map(|(n, t)| (n.to_string(), Type::parse(t).unwrap()))
            .collect(),
        zone.to_string(),
    );
    batches
        .iter()
        .map(|batch| {
            let rows = encode_json(batch, None).unwrap();
            let mut block = table.block(&rows.columns, "t").unwrap();
            table.read(&rows, 0, rows.len(), &mut block).unwrap();
            let mut body = Vec::new();
            block.write(&mut body);
            body
        })
        .collect()
}

/// The bench-only serde guest (benches/serde-guest: serde_json's typed read of an NDJSON file,
/// timed inside the guest), compiled once and run as a WASI command.
///
/// Run here, by the wasmtime the host links, rather than by the stock `wasmtime run --dir` of
/// the same version: the settings of the CLI's runtime that touch the guest's speed are
/// mirrored exactly (without `--call-timeout-seconds`, as the bench runs it, the CLI compiles
/// without epoch interruption, `Runtime::new_uninterruptible`, and reads files on the calling
/// thread, `allow_blocking_current_thread`, which `wasmtime run` does not), and no second
/// wasmtime has to be on the PATH. It matters: epoch checks cost this guest about 30% (the
/// 1M-row events file in 0.36 s without them, 0.47 s with; 2026-12-05), as they cost the
/// component's first pass. Not mirrored, as they do not touch the guest's code: the host's
/// memory limiter (the guest grows to a few MiB) and its on-disk cache of compiled components
/// (the guest is compiled once, before timing).
struct SerdeGuest {
    pre: CommandPre<GuestState>,
    runtime: tokio::runtime::Runtime,
}

/// A store's state: WASI only (the guest makes no requests).
struct GuestState {
    table: ResourceTable,
    wasi: WasiCtx,
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// What one run of the serde guest measured, as it prints it.
struct SerdeRun {
    rows: u64,
    bytes: u64,
    seconds: f64,
}

impl SerdeGuest {
    /// The guest as `make bench` builds it (`SERDE_GUEST_WASM` names another): `None`, with a
    /// note, when it is not built.
    fn load() -> Option<SerdeGuest> {
        let wasm = std::env::var_os("SERDE_GUEST_WASM")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                // target/debug/bench -> target/serde-guest/wasm32-wasip2/release/serde-guest.wasm
                let exe = std::env::current_exe().unwrap();
                let target = exe.parent().and_then(Path::parent).unwrap();
                target.join("serde-guest/wasm32-wasip2/release/serde-guest.wasm")
            });
        if !wasm.is_file() {
            println!(
                "\n(no serde guest at {}: `make bench` builds it; its lines are left out)",
                wasm.display()
            );
            return None;
        }
        // The CLI's engine (host/src/runtime.rs, `Runtime::new_uninterruptible`): wasmtime's
        // defaults (Cranelift, opt-level speed) and the component model, no epoch interruption.
        let mut config = Config::new();
        config.wasm_component_model(true);
        if std::env::var("CLICKHOUSE_WASM_PROFILER").as_deref() == Ok("perfmap") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).unwrap();
        let component = Component::from_file(&engine, &wasm).unwrap();
        let mut linker = Linker::<GuestState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        let pre = CommandPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Some(SerdeGuest { pre, runtime })
    }

    /// Runs the guest over `input` as `shape` in a new instance (the file's directory preopened
    /// read-only under its own path): what it printed, or why it failed.
    fn run(&self, shape: &str, input: &Path) -> Result<SerdeRun, String> {
        let dir = input.parent().unwrap();
        let stdout = MemoryOutputPipe::new(1 << 16);
        let stderr = MemoryOutputPipe::new(1 << 16);
        let mut wasi = WasiCtx::builder();
        wasi.args(&["serde-guest", shape, &input.display().to_string()])
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            // As the host's CLI (host/src/runtime.rs): a read runs on the calling thread.
            .allow_blocking_current_thread(true)
            .preopened_dir(dir, dir.display().to_string(), FsPerms::ReadOnly)
            .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
        let state = GuestState {
            table: ResourceTable::new(),
            wasi: wasi.build(),
        };
        let mut store = Store::new(self.pre.engine(), state);
        let ran = self.runtime.block_on(async {
            let command = self.pre.instantiate_async(&mut store).await?;
            command.wasi_cli_run().call_run(&mut store).await
        });
        let failed = |why: String| {
            let message = String::from_utf8_lossy(&stderr.contents())
                .trim()
                .to_string();
            format!("{why}: {message}")
        };
        match ran {
            Ok(Ok(())) => {}
            Ok(Err(())) => return Err(failed("the serde guest failed".into())),
            Err(e) => return Err(failed(format!("the serde guest failed ({e:#})"))),
        }
        let out: serde_json::Value = serde_json::from_slice(&stdout.contents())
            .map_err(|e| format!("the serde guest's output: {e}"))?;
        let field = |name: &str| out[name].as_f64().ok_or(format!("no {name} in {out}"));
        Ok(SerdeRun {
            rows: field("rows")? as u64,
            bytes: field("bytes")? as u64,
            seconds: field("seconds")?,
        })
    }
}

/// The section: both shapes at both batch sizes.
pub fn bench_typed(rows: usize) {
    let server = clickhouse();
    let conn = server.connection();
    let sql = Sql::new(&conn);
    let cpu = ServerCpu::find(server);
    let zone = sql.rows("SELECT timezone() AS z", &[])[0]["z"]
        .as_str()
        .unwrap_or("UTC")
        .to_string();
    warm_up(server);
    let serde_guest = SerdeGuest::load();
    for shape in &SHAPES {
        let names: Vec<&str> = shape.columns.iter().map(|(n, _)| *n).collect();
        let text: Vec<String> = (0..rows).map(shape.line).collect();
        for batch in [10_000, 100_000] {
            let batches: Vec<Vec<u8>> = text
                .chunks(batch)
                .map(|c| {
                    let mut b = c.join("\n").into_bytes();
                    b.push(b'\n');
                    b
                })
                .collect();
            let input =
                std::env::temp_dir().join(format!("bench-typed-{}.ndjson", std::process::id()));
            std::fs::write(&input, batches.concat()).unwrap();
            let mb = batches.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
            println!(
                "\nTyped sink, {} table ({} columns), {rows} rows ({mb:.1} MB of NDJSON), batch {batch}, {}:\n",
                shape.name,
                shape.columns.len(),
                server.url
            );
            let mut results: Vec<Measured> = Vec::new();
            for (path, extra) in [
                (
                    "component CLI, defaults (whole-file pass, Native, lz4)",
                    &[][..],
                ),
                (
                    "component CLI `--stream` (no whole-file pass)",
                    &["--stream"][..],
                ),
                // The raw POSTs' bodies are uncompressed; the local ClickHouse decodes a
                // compressed body with an extra engine query before the INSERT (a server's
                // HTTP handler decompresses as it reads), so this row compares like with like.
                (
                    "component CLI `--compression none` (uncompressed, as the raw POSTs)",
                    &["--compression", "none"][..],
                ),
            ] {
                let t = table(&sql, shape, "cli");
                let (client, seconds, server_cpu) =
                    measure(&cpu, || cli_run(server, &t, batch, &input, extra));
                assert_eq!(count_rows(&sql, &t), rows as u64);
                drop_table(&sql, &t);
                results.push(Measured {
                    path: path.into(),
                    seconds,
                    server_cpu,
                    client: Some(client),
                });
            }
            let natives = native_bodies(shape, &batches, &zone);
            for (path, format, bodies) in [
                (
                    "raw POST per batch, JSONEachRow, uncompressed",
                    "JSONEachRow",
                    &batches,
                ),
                (
                    "raw POST per batch, Native (encoded before timing), uncompressed",
                    "Native",
                    &natives,
                ),
            ] {
                let t = table(&sql, shape, "raw");
                let requests: Vec<HttpRequest> = bodies
                    .iter()
                    .map(|b| native_insert(&sql, &t, &names, format, b.clone(), Compression::None))
                    .collect();
                let ((), seconds, server_cpu) = measure(&cpu, || {
                    for r in &requests {
                        sql.client().send(r).unwrap();
                    }
                });
                assert_eq!(count_rows(&sql, &t), rows as u64);
                drop_table(&sql, &t);
                results.push(Measured {
                    path: path.into(),
                    seconds,
                    server_cpu,
                    client: None,
                });
            }
            for (venv, mode) in [
                (".venv-bench", "onestep-clickhouse"),
                (".venv-plugin", "plugin"),
            ] {
                let t = table(&sql, shape, "py");
                // The server's CPU around the whole script (it only inserts).
                let (timed, _, server_cpu) = measure(&cpu, || {
                    python_bench(server, venv, mode, &t, &rows.to_string(), batch, shape.name)
                });
                let Some((seconds, path)) = timed else {
                    continue;
                };
                assert_eq!(count_rows(&sql, &t), rows as u64);
                drop_table(&sql, &t);
                results.push(Measured {
                    path,
                    seconds,
                    server_cpu,
                    client: None,
                });
            }
            // The floor, over the same file the CLI read (the same bytes at each batch size:
            // run at each, a second sample).
            let serde = serde_guest.as_ref().map(|g| {
                let run = g.run(shape.name, &input);
                if let Ok(r) = &run {
                    assert_eq!(r.rows, rows as u64, "the serde guest's rows");
                    let bytes: usize = batches.iter().map(Vec::len).sum();
                    assert_eq!(r.bytes, bytes as u64, "the serde guest's bytes");
                }
                run
            });
            let _ = std::fs::remove_file(&input);
            print_table(&results, rows, mb, serde);
        }
    }
}

/// The table of one run, then each goal of issue 47 (the typed reader at memory speed) with
/// where this run stands: `mb`, the input's size in MB; `serde`, the serde guest's read of the
/// same file (`None`: not built).
fn print_table(
    results: &[Measured],
    rows: usize,
    mb: f64,
    serde: Option<Result<SerdeRun, String>>,
) {
    let f = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2}"));
    println!("| path | seconds | rows/s | server CPU (s) | CLI CPU (s) | CLI peak RSS (MiB) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for m in results {
        let (cpu, rss) = m.client.map_or(("".into(), "".into()), |(c, r, _)| {
            (format!("{c:.2}"), format!("{}", r / 1024))
        });
        println!(
            "| {} | {:.2} | {:.0} | {} | {cpu} | {rss} |",
            m.path,
            m.seconds,
            rows as f64 / m.seconds,
            f(m.server_cpu)
        );
    }
    let rate = |prefix: &str| {
        results
            .iter()
            .find(|m| m.path.starts_with(prefix))
            .map(|m| rows as f64 / m.seconds)
    };
    let cli = rate("component CLI, defaults").unwrap();
    let stream = rate("component CLI `--stream`");
    let uncompressed = rate("component CLI `--compression none`");
    println!();
    if let Some(json) = rate("raw POST per batch, JSONEachRow") {
        let alike = uncompressed.map_or(String::new(), |u| {
            format!("; uncompressed as it: {:.2}x", u / json)
        });
        println!(
            "- CLI (defaults) / raw JSONEachRow POST: **{:.2}x** (goal >= 1.0x{alike})",
            cli / json
        );
        if let Some(stream) = stream {
            println!(
                "- CLI `--stream` / raw JSONEachRow POST: **{:.2}x** (goal >= 1.4x)",
                stream / json
            );
        }
    }
    if let Some(native) = rate("raw POST per batch, Native") {
        println!(
            "- CLI (defaults) / raw Native POST: {:.2}x (no goal since issue 47: the INSERTs alone cost about as much)",
            cli / native
        );
    }
    if let (Some(plugin), Some(onestep)) = (rate("our onestep plugin"), rate("onestep-clickhouse"))
    {
        println!(
            "- our onestep plugin / onestep-clickhouse 0.1.1: **{:.2}x** (goal >= 3x)",
            plugin / onestep
        );
    }
    let pass = |prefix: &str| results.iter().find(|m| m.path.starts_with(prefix));
    if let (Some(whole), Some(stream)) = (
        pass("component CLI, defaults"),
        pass("component CLI `--stream`"),
    ) {
        let (cpu_whole, _, first) = whole.client.unwrap();
        let (first_seconds, kept) = first.expect("the default run makes a first pass");
        println!(
            "- first pass (every batch read, checked, encoded and compressed; {}): {first_seconds:.2} s, **{:.0} MB/s** of NDJSON (goal >= 350 MB/s), of the default CLI's {:.2} s wall ({:.0}%), then {:.2} s sending; CLI CPU: defaults {cpu_whole:.2} s, `--stream` {:.2} s",
            if kept { "all kept, the file read once" } else { "not all kept, the file read again" },
            mb / first_seconds,
            whole.seconds,
            100.0 * first_seconds / whole.seconds,
            (whole.seconds - first_seconds).max(0.0),
            stream.client.unwrap().0
        );
        match serde {
            Some(Ok(floor)) => println!(
                "- serde_json typed read of the same rows in the same guest (bench-only): {:.2} s, **{:.0} MB/s**; first pass / serde_json: **{:.2}x** (goal >= 1.5x)",
                floor.seconds,
                mb / floor.seconds,
                floor.seconds / first_seconds
            ),
            Some(Err(why)) => println!("- serde_json typed read (bench-only guest): {why}"),
            None => {}
        }
    }
}
