//! Exactly-once delivery of the CLI's table sink (`sink --dedup`, with and without
//! `--checkpoint`) when everything between it and ClickHouse goes wrong at once: the real CLI
//! binary (the component in the reference host) streams NDJSON from a file into a deduplicating
//! MergeTree table on a private local ClickHouse (`LocalClickHouse`, restartable), through the
//! fault-injecting proxy (`tests/src/proxy.rs`).
//!
//! What this file proves:
//!
//! * **Every row lands exactly once** through a quarter of the requests broken (refused; cut
//!   before the server had the whole request; executed with the reply lost; executed with the
//!   reply cut; executed with the reply held past the request timeout), a `kill -9` of the CLI
//!   mid-stream, and a crash and restart of ClickHouse (same port, same data directory) while the
//!   rerun of the same command is streaming: afterwards `count() = uniqExact(id) = 200000`, read
//!   over a direct connection. With `--checkpoint` the rerun continues after what the checkpoint
//!   recorded (`state get ID` after the kill: at most one batch behind the rows the table held,
//!   and the rerun's `resumed_after_rows` is exactly that), and the checkpoint ends up
//!   describing the whole input; without it the rerun has every row acknowledged again and the
//!   server's deduplication absorbs what was already there. The data written before the restart
//!   is still there after it, and the CLI was sending while ClickHouse was down. (The receipt's
//!   `deduplicated_chunks` is not checked: the server reports a deduplicated INSERT's rows in
//!   `written_rows`, so the CLI counts none; see `written_rows` in the printed receipts.)
//! * **The control**: the same faults without `--dedup` (so without retries), with the input
//!   resent by hand from `committed_rows` on as the README's at-least-once contract says, leave
//!   duplicates (`count() > uniqExact(id)`), so the first test could fail.
//! * `--dedup` on a table that does not deduplicate inserts is refused (exit 3, naming
//!   `non_replicated_deduplication_window`) before anything is written; `--retries` or
//!   `--checkpoint` without `--dedup` is invalid input (exit 2).
//! * A checkpoint written for another table, batch size, column list or input is refused
//!   (exit 2, saying which) and nothing is written; the same command still continues it.
//!
//! The random faults are chosen by a hash of a seed and the request's sequence number at the
//! proxy: the seed is printed, and `SINK_FAULTS_SEED=N` reuses it (the same requests by number
//! are faulted; timing, and so which request gets which number, may still differ between runs).
//! The CLI runs with a 750 ms request timeout (`--request-timeout-ms`); a stalled reply is held
//! 1 s. The fault counts, the retries and the timings are printed (`-- --nocapture`).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::proxy::{fault_seed, seeded_hash, Fault, Proxy, Rule, RuleId};
use clickhouse_component_tests::{cli, unique_name, LocalClickHouse, Server};
use serde_json::{json, Value};

/// Rows of the exactly-once runs.
const ROWS: u64 = 200_000;
/// Rows per INSERT (and per checkpoint) of the checkpointed exactly-once run: 910 batches,
/// two requests each (the INSERT and the checkpoint).
const BATCH_WITH_CHECKPOINT: u64 = 220;
/// Rows per INSERT of the exactly-once run without a checkpoint: 1429 chunks, one request each,
/// of which the first run's third is sent again. (The two runs go at once: so they take about
/// as long, and each makes ~2,500 requests, ~600 of them faulted.)
const BATCH_WITHOUT_CHECKPOINT: u64 = 140;
/// `--retries` of the exactly-once runs: enough to ride out a ClickHouse restart (backoff
/// doubles from 0.1 s to 2 s, half of it jittered: 20 retries wait at least ~16 s in all).
const RETRIES: u32 = 20;
/// Request timeout of every CLI run through the proxy.
const REQUEST_TIMEOUT_MS: u32 = 750;
/// How long a stalled reply is held: past the request timeout, so the client times out after
/// the server executed the request.
const STALL: Duration = Duration::from_millis(1_000);
/// How long ClickHouse stays down before it is started again (its start-up comes on top).
const OUTAGE: Duration = Duration::from_secs(1);
/// The deduplication window of the target tables: more than all the inserts a run makes.
const DEDUP_WINDOW: &str = "10000";
/// The checkpoint id of the checkpointed run.
const CHECKPOINT: &str = "sink-faults-checkpoint";
/// The faults the two exactly-once runs must inject between them.
const AT_LEAST_FAULTS: usize = 1_000;

// ---------------------------------------------------------------------------------------------
// Seeded faults.

/// The faults and their shares per 200 requests: 12 refused, 12 cut, 13 replies lost, 12
/// replies cut, 1 reply stalled past the request timeout (each costs a whole timeout, so they
/// are few): 50 of 200, a quarter.
fn fault_shares() -> [(Fault, u64); 5] {
    [
        (Fault::Refuse, 12),
        (Fault::CutRequest, 12),
        (Fault::DropReply, 13),
        (Fault::CutReply, 12),
        (Fault::Stall(STALL), 1),
    ]
}

/// The fault planned for request number `seq` (1-based, as the proxy counts), if any.
fn planned_fault(seed: u64, seq: u64) -> Option<Fault> {
    let mut slot = seeded_hash(seed, seq) % 200;
    for (fault, share) in fault_shares() {
        if slot < share {
            return Some(fault);
        }
        slot -= share;
    }
    None
}

fn fault_name(fault: &Fault) -> &'static str {
    match fault {
        Fault::Refuse => "refused",
        Fault::CutRequest => "request cut",
        Fault::DropReply => "reply lost",
        Fault::CutReply => "reply cut",
        Fault::Stall(_) => "reply stalled",
        _ => "other",
    }
}

/// The rules faulting a seeded quarter of a proxy's requests.
struct Faults {
    rules: Vec<(&'static str, RuleId)>,
}

impl Faults {
    fn inject(proxy: &Proxy, seed: u64) -> Faults {
        let rules = fault_shares()
            .into_iter()
            .map(|(fault, _)| {
                let planned = fault.clone();
                let id = proxy.add(Rule::when(
                    move |r| planned_fault(seed, r.seq).as_ref() == Some(&planned),
                    fault.clone(),
                ));
                (fault_name(&fault), id)
            })
            .collect();
        Faults { rules }
    }

    /// Faults applied so far, by kind.
    fn by_kind(&self, proxy: &Proxy) -> BTreeMap<&'static str, usize> {
        self.rules
            .iter()
            .map(|(name, id)| (*name, proxy.hits(*id)))
            .collect()
    }

    fn total(&self, proxy: &Proxy) -> usize {
        self.by_kind(proxy).values().sum()
    }
}

// ---------------------------------------------------------------------------------------------
// Tables, input files, numbers.

/// A database of its own on `sql`'s server with a table `name (id UInt64, v String)`,
/// deduplicating inserts (`non_replicated_deduplication_window`) or not; returns `db.name`.
fn create_table(sql: &Sql, db: &str, name: &str, deduplicating: bool) -> String {
    sql.exec(
        "CREATE DATABASE IF NOT EXISTS {db:Identifier}",
        &[("db", db)],
    );
    let settings = if deduplicating {
        format!("SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}")
    } else {
        String::new()
    };
    sql.exec(
        &format!(
            "CREATE TABLE {{db:Identifier}}.{{t:Identifier}} (id UInt64, v String)
             ENGINE = MergeTree ORDER BY id {settings}"
        ),
        &[("db", db), ("t", name)],
    );
    format!("{db}.{name}")
}

fn num(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not a number: {v}"))
}

/// `(count(), uniqExact(id), min(id), max(id))` of `db.table`.
fn numbers(sql: &Sql, table: &str) -> (u64, u64, u64, u64) {
    let (db, t) = table.split_once('.').unwrap();
    let rows = sql.rows(
        "SELECT count() AS rows, uniqExact(id) AS ids, min(id) AS lo, max(id) AS hi
         FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", t)],
    );
    let r = &rows[0];
    (
        num(&r["rows"]),
        num(&r["ids"]),
        num(&r["lo"]),
        num(&r["hi"]),
    )
}

fn count(sql: &Sql, table: &str) -> u64 {
    let (db, t) = table.split_once('.').unwrap();
    sql.count(
        "SELECT count() FROM {db:Identifier}.{t:Identifier}",
        &[("db", db), ("t", t)],
    )
}

/// The count once it stops changing (an INSERT the server had whole when its client was
/// killed still commits).
fn settled_count(sql: &Sql, table: &str) -> u64 {
    let mut last = count(sql, table);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = count(sql, table);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// The NDJSON line of row `n`.
fn row(n: u64) -> String {
    json!({"id": n, "v": format!("row {n}: {}", "x".repeat((n % 17) as usize))}).to_string()
}

/// An NDJSON file of rows `ids`, removed on drop.
struct RowsFile {
    path: PathBuf,
}

impl RowsFile {
    fn new(ids: impl Iterator<Item = u64>) -> RowsFile {
        let path = std::env::temp_dir().join(format!("{}.ndjson", unique_name("sink_faults")));
        let mut text = String::new();
        for n in ids {
            text.push_str(&row(n));
            text.push('\n');
        }
        std::fs::write(&path, text).unwrap();
        RowsFile { path }
    }

    fn len(&self) -> u64 {
        std::fs::metadata(&self.path).unwrap().len()
    }
}

impl Drop for RowsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn sha256_hex(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// CLI runs.

/// The `sink` command line (with `--json`) against `server`.
fn sink_command(server: &Server, table: &str, extra: &[&str], file: &Path) -> Command {
    let mut cmd = cli(server);
    cmd.args([
        "--json",
        "--request-timeout-ms",
        &REQUEST_TIMEOUT_MS.to_string(),
    ])
    .args(["sink", "--table", table])
    .args(extra)
    .arg(file);
    cmd
}

/// The JSON the CLI printed last on stdout.
fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty());
    line.and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("the CLI printed no JSON: {}", describe(out)))
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A CLI process running in the background (killed if dropped while running).
struct Running {
    child: Child,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Running {
    fn spawn(cmd: &mut Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning the CLI");
        let drain = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        };
        Running {
            stdout: Some(drain(Box::new(child.stdout.take().unwrap()))),
            stderr: Some(drain(Box::new(child.stderr.take().unwrap()))),
            child,
        }
    }

    /// Its exit status if it has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("waiting for the CLI")
    }

    /// What it printed, once it has exited with `status`.
    fn output(&mut self, status: ExitStatus) -> Output {
        let join =
            |h: Option<JoinHandle<Vec<u8>>>| h.map(|h| h.join().unwrap()).unwrap_or_default();
        Output {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }

    /// `kill -9`; panics if it had exited by itself.
    fn kill9(mut self) -> Output {
        if let Some(status) = self.exited() {
            let out = self.output(status);
            panic!(
                "the CLI exited by itself before it could be killed: {}",
                describe(&out)
            );
        }
        self.child.kill().expect("killing the CLI"); // SIGKILL
        let status = self.child.wait().unwrap();
        let out = self.output(status);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "the CLI was not killed by SIGKILL: {}",
            describe(&out)
        );
        out
    }

    /// Waits for it to exit; kills it and panics after `timeout`.
    fn wait(mut self, timeout: Duration) -> Output {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return self.output(status);
            }
            if started.elapsed() > timeout {
                let _ = self.child.kill();
                let status = self.child.wait().unwrap();
                let out = self.output(status);
                panic!(
                    "the CLI did not finish within {timeout:?}: {}",
                    describe(&out)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls (direct connection) until `table` holds at least `rows`; panics if the CLI exits
/// first or after `timeout`. Returns the count seen.
fn wait_for_rows(sql: &Sql, table: &str, rows: u64, cli: &mut Running, what: &str) -> u64 {
    let timeout = Duration::from_secs(240);
    let started = Instant::now();
    loop {
        let n = count(sql, table);
        if n >= rows {
            return n;
        }
        if let Some(status) = cli.exited() {
            panic!(
                "{what}: the CLI exited with {n} rows in {table}, before {rows}: {}",
                describe(&cli.output(status))
            );
        }
        assert!(
            started.elapsed() < timeout,
            "{what}: {n} rows in {table} after {timeout:?}, waiting for {rows}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The checkpoint `CHECKPOINT` in the store of `state_db`, as `state get` shows it (a state
/// with only the checkpoint in its completed part).
fn checkpoint_of(server: &Server, state_db: &str) -> Value {
    let out = cli(server)
        .args([
            "--json",
            "state",
            "--state-database",
            state_db,
            "get",
            CHECKPOINT,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "state get: {}", describe(&out));
    let state = json_of(&out);
    assert_eq!(
        (
            &state["partial"],
            state["completed"].as_object().map(|c| c.len())
        ),
        (&json!({}), Some(1)),
        "the checkpoint state: {state}"
    );
    state["completed"]["clickhouse_sink_checkpoint"].clone()
}

// ---------------------------------------------------------------------------------------------
// a. Exactly once through faults, a kill -9 and a restart.

/// What one exactly-once run did.
struct Report {
    faults: usize,
}

/// One exactly-once run: the CLI killed mid-stream, then the same command run again while
/// ClickHouse is crashed and restarted under it.
fn exactly_once(checkpoint: bool, seed: u64, input: &Path, input_len: u64) -> Report {
    let (what, batch_size) = if checkpoint {
        ("with --checkpoint", BATCH_WITH_CHECKPOINT)
    } else {
        ("without --checkpoint", BATCH_WITHOUT_CHECKPOINT)
    };
    let started = Instant::now();
    let mut local = LocalClickHouse::start("none");
    let direct = local.server();
    let mut sql = Sql::new(&direct.connection());
    let db = unique_name("sink_faults");
    let table = create_table(&sql, &db, "t", true);
    let state_db = format!("{db}_state");
    let proxy = Proxy::start(&direct.url);
    let proxied = proxy.server(&direct);
    let faults = Faults::inject(&proxy, seed);
    let retries = RETRIES.to_string();
    let batch = batch_size.to_string();
    let mut extra = vec!["--dedup", "--retries", &retries, "--batch-size", &batch];
    if checkpoint {
        extra.extend(["--checkpoint", CHECKPOINT, "--state-database", &state_db]);
    }
    let command = || sink_command(&proxied, &table, &extra, input);

    // The first run, killed once the table holds a third of the rows.
    let mut first = Running::spawn(&mut command());
    wait_for_rows(&sql, &table, ROWS / 3, &mut first, what);
    let first_out = first.kill9();
    let at_kill = settled_count(&sql, &table);
    let first_seconds = started.elapsed().as_secs_f64();
    let first_requests = proxy.requests();
    let first_faults = faults.total(&proxy);
    eprintln!(
        "{what}: first run killed after {first_seconds:.1} s with {at_kill} rows in the table; \
         {first_requests} requests, {first_faults} faulted (stderr: {:?})",
        String::from_utf8_lossy(&first_out.stderr).trim()
    );
    assert!(
        at_kill < ROWS,
        "{what}: the first run wrote everything before it was killed"
    );
    // What the checkpoint recorded when the CLI died, as `state get` shows it.
    let recorded_at_kill = checkpoint.then(|| {
        let recorded = checkpoint_of(&direct, &state_db);
        let rows = num(&recorded["rows"]);
        // Written before each batch, recording the batches before it as acknowledged: it may
        // lag the table by the batch in flight at the kill (committed or not), never more,
        // and never run ahead.
        assert!(
            rows > 0 && rows <= at_kill && at_kill <= rows + batch_size,
            "{what}: the checkpoint recorded {rows} rows, the table held {at_kill} at the kill: \
             {recorded}"
        );
        assert_eq!(
            num(&recorded["sends"]) * batch_size,
            rows,
            "{what}: {recorded}"
        );
        rows
    });

    // The rerun; ClickHouse crashes and restarts while it streams.
    let rerun_started = Instant::now();
    let mut rerun = Running::spawn(&mut command());
    let before_stop = wait_for_rows(&sql, &table, ROWS * 2 / 3, &mut rerun, what);
    let outage_started = Instant::now();
    local.stop();
    let requests_at_stop = proxy.requests();
    std::thread::sleep(OUTAGE);
    local.restart();
    // Requests that reached the proxy while ClickHouse was down (from the stop until the
    // restarted server listened).
    let requests_in_outage = proxy.requests() - requests_at_stop;
    let outage = outage_started.elapsed();
    // New connections: the old ones died with the server.
    sql = Sql::new(&local.server().connection());
    let after_restart = count(&sql, &table);
    eprintln!(
        "{what}: ClickHouse stopped with {before_stop}+ rows in the table, down for {:.1} s \
         ({requests_in_outage} requests meanwhile), restarted with {after_restart}",
        outage.as_secs_f64()
    );
    assert!(
        requests_in_outage > 0,
        "{what}: the CLI sent nothing while ClickHouse was down: the outage was not tested"
    );
    assert!(
        after_restart >= before_stop,
        "{what}: the restart lost rows: {before_stop} before it, {after_restart} after"
    );
    let out = rerun.wait(Duration::from_secs(300));
    let rerun_seconds = rerun_started.elapsed().as_secs_f64();
    let requests = proxy.requests();
    let by_kind = faults.by_kind(&proxy);
    let total_faults: usize = by_kind.values().sum();
    proxy.clear_rules();
    eprintln!(
        "{what}: rerun finished in {rerun_seconds:.1} s, {:.1} s in all; {requests} requests, \
         {total_faults} faulted {by_kind:?}; rerun output: {}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what} (seed {seed}): the rerun failed: {}",
        describe(&out)
    );
    let receipt = json_of(&out);

    // Every row exactly once (direct connection).
    assert_eq!(
        numbers(&sql, &table),
        (ROWS, ROWS, 0, ROWS - 1),
        "{what} (seed {seed}): (count, distinct ids, min id, max id) after the rerun"
    );

    let resumed = num(&receipt["resumed_after_rows"]);
    let rows = num(&receipt["rows"]);
    assert!(
        num(&receipt["retries"]) > 0,
        "{what}: the rerun resent no chunk through a quarter of faulty requests: {receipt}"
    );
    if checkpoint {
        assert!(
            resumed > 0,
            "{what}: the rerun did not resume from the checkpoint: {receipt}"
        );
        assert_eq!(
            Some(resumed),
            recorded_at_kill,
            "{what}: the rerun did not resume where the checkpoint said: {receipt}"
        );
        assert_eq!(
            rows,
            ROWS - resumed,
            "{what}: the rerun sent other rows than those after the checkpoint: {receipt}"
        );
        // The checkpoint, as `state get` shows it, now describes the whole input.
        let recorded = checkpoint_of(&direct, &state_db);
        assert_eq!(
            recorded,
            json!({
                "table": table,
                "columns": ["id", "v"],
                "batch_size": batch_size,
                "position": json!({"input_bytes": input_len, "input_sha256": sha256_hex(input)})
                    .to_string(),
                "rows": ROWS,
                "sends": ROWS.div_ceil(batch_size),
            }),
            "{what}: the checkpoint after the rerun"
        );
    } else {
        // The rerun had every row acknowledged again, on top of the `at_kill` rows already
        // there, and the table holds each once (checked above): the server's deduplication
        // absorbed those. (The receipt's `deduplicated_chunks` cannot show it: the server
        // reports a deduplicated INSERT's rows as written, see `written_rows` in it.)
        assert_eq!(resumed, 0, "{what}: {receipt}");
        assert_eq!(
            (rows, num(&receipt["chunks"])),
            (ROWS, ROWS.div_ceil(batch_size)),
            "{what}: the rerun did not resend everything: {receipt}"
        );
    }
    assert!(
        total_faults >= 300,
        "{what} (seed {seed}): only {total_faults} of {requests} requests were faulted"
    );
    Report {
        faults: total_faults,
    }
}

/// 200,000 rows through a quarter of faulty requests, a `kill -9` of the CLI at a third, and a
/// ClickHouse crash and restart during the rerun: with and without `--checkpoint` (at once,
/// each on its own private ClickHouse and proxy), every row lands exactly once.
#[test]
fn every_row_lands_exactly_once_through_faults_a_crash_and_a_restart() {
    let seed = fault_seed("SINK_FAULTS_SEED");
    let started = Instant::now();
    let input = RowsFile::new(0..ROWS);
    let input_len = input.len();
    let runs: Vec<(bool, std::thread::Result<Report>)> = std::thread::scope(|s| {
        let handles: Vec<_> = [true, false]
            .into_iter()
            .map(|checkpoint| {
                let path = input.path.clone();
                (
                    checkpoint,
                    s.spawn(move || exactly_once(checkpoint, seed, &path, input_len)),
                )
            })
            .collect();
        handles
            .into_iter()
            .map(|(checkpoint, h)| (checkpoint, h.join()))
            .collect()
    });
    let mut faults = 0;
    let mut failed = Vec::new();
    for (checkpoint, result) in runs {
        match result {
            Ok(report) => faults += report.faults,
            Err(panic) => failed.push(format!(
                "{}: {}",
                if checkpoint {
                    "with --checkpoint"
                } else {
                    "without --checkpoint"
                },
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        }
    }
    eprintln!(
        "exactly once: both runs in {:.1} s, {faults} faults injected",
        started.elapsed().as_secs_f64()
    );
    assert!(failed.is_empty(), "seed {seed}: {failed:#?}");
    assert!(
        faults >= AT_LEAST_FAULTS,
        "seed {seed}: only {faults} faults injected in the two runs: the test did not test much"
    );
}

// ---------------------------------------------------------------------------------------------
// b. The control.

/// The control: the same faults without `--dedup` (so without retries: the CLI refuses them
/// without it), into a table that does not deduplicate (the kind `--dedup` refuses), with the
/// input resent by hand after each failure from the `committed_rows` the error reports (the
/// at-least-once contract): a chunk whose reply was lost, cut or late had landed, so resending
/// it duplicates it. 20,000 rows in 80 chunks.
#[test]
fn without_dedup_the_same_faults_duplicate_rows() {
    const ROWS: u64 = 20_000;
    const BATCH: u64 = 250;
    let seed = fault_seed("SINK_FAULTS_SEED");
    let started = Instant::now();
    let local = LocalClickHouse::start("none");
    let direct = local.server();
    let sql = Sql::new(&direct.connection());
    let db = unique_name("sink_faults_control");
    let table = create_table(&sql, &db, "t", false);
    let proxy = Proxy::start(&direct.url);
    let proxied = proxy.server(&direct);
    let faults = Faults::inject(&proxy, seed);
    let batch = BATCH.to_string();
    let mut next = 0u64;
    let mut runs = 0;
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        runs += 1;
        assert!(runs <= 500, "seed {seed}: still failing after 500 runs");
        let rest = RowsFile::new(next..ROWS);
        let out = sink_command(&proxied, &table, &["--batch-size", &batch], &rest.path)
            .output()
            .unwrap();
        let receipt = json_of(&out);
        if out.status.code() == Some(0) {
            assert_eq!(num(&receipt["rows"]), ROWS - next, "{receipt}");
            break;
        }
        let kind = receipt["error"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            matches!(out.status.code(), Some(4 | 5 | 8)),
            "seed {seed}: a failure that is not a network one: {}",
            describe(&out)
        );
        let committed = num(&receipt["error"]["committed_rows"]);
        assert!(
            committed.is_multiple_of(BATCH) && committed < ROWS - next,
            "seed {seed}: committed_rows {committed} of {} sent: {receipt}",
            ROWS - next
        );
        next += committed;
        *failures.entry(kind).or_default() += 1;
    }
    let by_kind = faults.by_kind(&proxy);
    let total_faults = faults.total(&proxy);
    proxy.clear_rules();
    let (rows, ids, lo, hi) = numbers(&sql, &table);
    eprintln!(
        "control: {runs} runs in {:.1} s (failures {failures:?}); {} requests, {total_faults} \
         faulted {by_kind:?}; {rows} rows for {ids} ids: {} duplicates",
        started.elapsed().as_secs_f64(),
        proxy.requests(),
        rows - ids
    );
    assert!(
        runs > 1,
        "seed {seed}: no run failed: the faults did not bite"
    );
    assert_eq!(
        (ids, lo, hi),
        (ROWS, 0, ROWS - 1),
        "seed {seed}: not every row landed (at least once)"
    );
    assert!(
        rows > ids,
        "seed {seed}: {rows} rows for {ids} ids: the same faults without dedup left no \
         duplicate, so the exactly-once test could not fail"
    );
}

// ---------------------------------------------------------------------------------------------
// c. and d. Refusals.

/// The error a CLI run printed with `--json`: (exit code, kind, message).
fn failure(out: &Output) -> (Option<i32>, String, String) {
    let json = json_of(out);
    assert_eq!(json["ok"], json!(false), "{}", describe(out));
    (
        out.status.code(),
        json["error"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        json["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// `--dedup` on a table that does not deduplicate inserts is refused before anything is
/// written (exit 3, naming the setting), while the same on a deduplicating table works; and
/// `--retries` or `--checkpoint` without `--dedup` is invalid input (exit 2), while `--retries 0`
/// without it works.
/// Runs the sink with `args` on `table`, which must refuse them as `invalid-input` (exit 2);
/// returns the message.
fn refused_as_invalid(server: &Server, table: &str, args: &[&str], input: &Path) -> String {
    let out = sink_command(server, table, args, input).output().unwrap();
    let (code, kind, message) = failure(&out);
    assert_eq!(
        (code, kind.as_str()),
        (Some(2), "invalid-input"),
        "{args:?}: {message}"
    );
    message
}

#[test]
fn dedup_is_refused_on_a_table_that_does_not_deduplicate() {
    let local = LocalClickHouse::start("none");
    let server = local.server();
    let sql = Sql::new(&server.connection());
    let db = unique_name("sink_refusals");
    let plain = create_table(&sql, &db, "plain", false);
    let deduplicating = create_table(&sql, &db, "deduplicating", true);
    let input = RowsFile::new(0..1000);

    let out = sink_command(&server, &plain, &["--dedup"], &input.path)
        .output()
        .unwrap();
    let (code, kind, message) = failure(&out);
    assert_eq!(
        (code, kind.as_str()),
        (Some(3), "misconfigured"),
        "--dedup on {plain}: {message}"
    );
    assert!(
        message.contains("non_replicated_deduplication_window"),
        "the refusal does not name the setting: {message}"
    );
    assert_eq!(count(&sql, &plain), 0, "--dedup on {plain} wrote rows");

    for (args, says) in [
        (&["--retries", "3"][..], "retries need dedup"),
        (&["--checkpoint", "c"][..], "--checkpoint needs --dedup"),
    ] {
        let message = refused_as_invalid(&server, &plain, args, &input.path);
        assert!(
            message.contains(says),
            "{args:?} without --dedup: {message}"
        );
        assert_eq!(
            count(&sql, &plain),
            0,
            "{args:?} without --dedup wrote rows"
        );
    }

    // A checkpoint id no write may create (a control character) is refused before anything.
    let message = refused_as_invalid(
        &server,
        &deduplicating,
        &["--dedup", "--checkpoint", "c\u{1b}[2J"],
        &input.path,
    );
    assert_eq!(
        message,
        "state id contains the control character U+001B at byte 1; ids are job names and may not hold control characters"
    );
    assert_eq!(count(&sql, &deduplicating), 0);

    // What is refused above works where it should.
    for (table, args) in [
        (&deduplicating, &["--dedup"][..]),
        (&plain, &["--retries", "0"][..]),
    ] {
        let out = sink_command(&server, table, args, &input.path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", describe(&out));
        assert_eq!(count(&sql, table), 1000, "{args:?} into {table}");
    }
}

/// A checkpoint written for table A is refused (exit 2, saying why, nothing written) for table
/// B, for another batch size, for another column list and for another input (different rows,
/// or a shorter file); afterwards the checkpoint is unchanged and the same command continues it
/// (nothing left to send; with rows appended to the input, just those).
#[test]
fn a_checkpoint_from_another_target_or_batch_size_is_refused() {
    const ID: &str = "refusals-checkpoint";
    let local = LocalClickHouse::start("none");
    let server = local.server();
    let sql = Sql::new(&server.connection());
    let db = unique_name("sink_checkpoints");
    let a = create_table(&sql, &db, "a", true);
    let b = create_table(&sql, &db, "b", true);
    let state_db = format!("{db}_state");
    let input = RowsFile::new(0..1000);
    let other_rows = RowsFile::new(1000..2000);
    let shorter = RowsFile::new(0..500);
    let longer = RowsFile::new(0..1500);
    let run = |table: &str, batch: &str, columns: Option<&str>, file: &Path| {
        let mut extra = vec!["--dedup", "--batch-size", batch, "--checkpoint", ID];
        extra.extend(["--state-database", &state_db]);
        if let Some(columns) = columns {
            extra.extend(["--columns", columns]);
        }
        sink_command(&server, table, &extra, file).output().unwrap()
    };
    let checkpoint = || {
        let out = cli(&server)
            .args(["--json", "state", "--state-database", &state_db, "get", ID])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "state get: {}", describe(&out));
        json_of(&out)["completed"]["clickhouse_sink_checkpoint"].clone()
    };

    let out = run(&a, "100", None, &input.path);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(count(&sql, &a), 1000);
    let recorded = checkpoint();
    assert_eq!(
        (num(&recorded["rows"]), num(&recorded["sends"])),
        (1000, 10),
        "{recorded}"
    );

    for (table, batch, columns, file, says) in [
        (&b, "100", None, &input.path, "was written for table"),
        (&a, "50", None, &input.path, "was written for batch size"),
        (
            &a,
            "100",
            Some("v,id"),
            &input.path,
            "was written for columns",
        ),
        (
            &a,
            "100",
            None,
            &other_rows.path,
            "not the one the checkpoint",
        ),
        (&a, "100", None, &shorter.path, "not the one the checkpoint"),
    ] {
        let what = format!("--table {table} --batch-size {batch} --columns {columns:?}");
        let out = run(table, batch, columns, file);
        let (code, kind, message) = failure(&out);
        assert_eq!(
            (code, kind.as_str()),
            (Some(2), "invalid-input"),
            "{what}: {message}"
        );
        assert!(message.contains(says), "{what}: {message}");
        assert_eq!(count(&sql, &b), 0, "{what}: rows written to {b}");
        assert_eq!(count(&sql, &a), 1000, "{what}: rows written to {a}");
        assert_eq!(checkpoint(), recorded, "{what}: the checkpoint changed");
    }

    // The same command: nothing left to send.
    let out = run(&a, "100", None, &input.path);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let receipt = json_of(&out);
    assert_eq!(
        (num(&receipt["rows"]), num(&receipt["resumed_after_rows"])),
        (0, 1000),
        "{receipt}"
    );
    // The same table named through the connection's database is the same target; the same
    // name in another database is another.
    let unqualified = a.rsplit_once('.').unwrap().1.to_string();
    let other_db = format!("{db}_other");
    let _ = create_table(&sql, &other_db, &unqualified, true);
    for (database, accepted) in [(&db, true), (&other_db, false)] {
        let extra = [
            "--dedup",
            "--batch-size",
            "100",
            "--checkpoint",
            ID,
            "--state-database",
            &state_db,
        ];
        let out = sink_command(&server, &unqualified, &extra, &input.path)
            .env("CLICKHOUSE_DATABASE", database)
            .output()
            .unwrap();
        if accepted {
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
            assert_eq!(num(&json_of(&out)["resumed_after_rows"]), 1000);
        } else {
            let (code, _, message) = failure(&out);
            assert_eq!(code, Some(2), "{message}");
            assert!(message.contains("was written for table"), "{message}");
        }
    }
    assert_eq!(count(&sql, &format!("{other_db}.{unqualified}")), 0);
    assert_eq!(count(&sql, &a), 1000);

    // The input grew: only the new rows are sent.
    let out = run(&a, "100", None, &longer.path);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let receipt = json_of(&out);
    assert_eq!(
        (num(&receipt["rows"]), num(&receipt["resumed_after_rows"])),
        (500, 1000),
        "{receipt}"
    );
    assert_eq!(numbers(&sql, &a), (1500, 1500, 0, 1499));
    assert_eq!(count(&sql, &b), 0);
}
