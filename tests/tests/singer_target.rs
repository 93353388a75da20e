//! The Singer target (`clickhouse-component target`) through the reference host against the
//! real engine: a target killed (SIGKILL) at a chosen point of its INSERTs, then run again on
//! the messages after the last STATE it emitted (as Meltano reruns a tap from the last stored
//! bookmark), leaves every record in the table exactly once. The point is chosen with the
//! proxy, not with timing: the Nth INSERT is held before it reaches the server (`Pause`: not
//! written) or after the server wrote it (`StallUntilReleased`: written, not acknowledged),
//! and the target is killed while it waits. The table is a plain MergeTree, so a duplicate
//! would stay visible (no merge collapses it).

use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::time::Duration;

use clickhouse_component::client::Query;
use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::{cli, clickhouse, unique_name};
use serde_json::json;

/// Records per input, a STATE after every `STATE_EVERY`, `BATCH` rows a chunk: each flush (at
/// a STATE with at least `BATCH` records waiting) sends two chunks (10 + 5 rows).
const RECORDS: u64 = 60;
const STATE_EVERY: u64 = 15;
const BATCH: u64 = 10;

/// The tap's messages: SCHEMA, then records with a STATE after every `STATE_EVERY`. `after`:
/// only the records after that id (a tap resumed from that bookmark).
fn messages(after: u64) -> String {
    let mut out = String::new();
    let schema = json!({"type": "SCHEMA", "stream": "rows", "key_properties": ["id"],
        "schema": {"properties": {"id": {"type": "integer"}, "name": {"type": ["null", "string"]}}}});
    out.push_str(&format!("{schema}\n"));
    for id in after + 1..=RECORDS {
        let record = json!({"type": "RECORD", "stream": "rows", "record": {"id": id, "name": format!("row {id}")},
            "time_extracted": extracted_at(id)});
        out.push_str(&format!("{record}\n"));
        if id % STATE_EVERY == 0 {
            let state = json!({"type": "STATE", "value": {"bookmarks": {"rows": {"last": id}}}});
            out.push_str(&format!("{state}\n"));
        }
    }
    out
}

/// The `time_extracted` of record `id`.
fn extracted_at(id: u64) -> String {
    format!("2026-12-05T10:{:02}:00.{id:06}Z", id % 60)
}

struct Run {
    dir: tempdir::Dir,
    database: String,
    /// [`Run::counts`] reads with FINAL (an upsert's table).
    final_reads: std::cell::Cell<bool>,
}

mod tempdir {
    /// A directory of the test's own, removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Run {
    fn new(url: &str) -> Run {
        let database = unique_name("target");
        let dir = std::env::temp_dir().join(unique_name("target-test"));
        std::fs::create_dir_all(&dir).unwrap();
        let server = clickhouse();
        let config = json!({"uri": url, "username": server.user, "password": server.password,
            "database": database, "engine_type": "MergeTree", "batch_size_rows": BATCH});
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        Run {
            dir: tempdir::Dir(dir),
            database,
            final_reads: std::cell::Cell::new(false),
        }
    }

    fn spawn(&self, input: &str) -> Child {
        let config = self.dir.0.join("config.json");
        let mut child = cli(clickhouse())
            .args(["target", "--config", config.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_string();
        std::thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        });
        child
    }

    /// Sets these settings in the run's config file.
    fn configure(&self, settings: &[(&str, serde_json::Value)]) {
        let path = self.dir.0.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for (name, value) in settings {
            config[*name] = value.clone();
        }
        std::fs::write(&path, config.to_string()).unwrap();
    }

    /// (count, distinct ids) of the table, without FINAL (unless `final_reads`).
    fn counts(&self) -> (u64, u64) {
        let sql = sql();
        let args = [("db", self.database.as_str())];
        let rows = match self.final_reads.get() {
            true => "rows FINAL",
            false => "rows",
        };
        (
            sql.count(
                &format!("SELECT count() FROM {{db:Identifier}}.{rows}"),
                &args,
            ),
            sql.count(
                &format!("SELECT uniqExact(id) FROM {{db:Identifier}}.{rows}"),
                &args,
            ),
        )
    }
}

/// A number of a JSONEachRow row (64-bit integers come quoted).
fn number(v: &serde_json::Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str()?.parse().ok())
        .unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The bookmarks of the STATE lines a target printed.
fn bookmarks(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["bookmarks"]["rows"]["last"].as_u64().unwrap()
        })
        .collect()
}

fn finish(mut child: Child) -> (Option<i32>, String, String) {
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap().code(), out, err)
}

/// Has the proxy hold the `nth` INSERT into the run's database with `fault`.
fn hold_insert(proxy: &Proxy, run: &Run, nth: usize, fault: Fault) {
    let needle = run.database.clone();
    proxy.add(
        Rule::when(
            move |r| {
                let t = r.target_decoded();
                t.contains("INSERT INTO") && t.contains(&needle)
            },
            fault,
        )
        .after(nth - 1)
        .times(1),
    );
}

/// Kills the target while the `nth` INSERT into its table is held by `fault`; reruns it from
/// the last STATE it printed (and, as if Meltano had not stored that one, from the one
/// before); every record is in the table once.
fn killed_at(nth: usize, fault: Fault, what: &str) {
    killed_with(nth, fault, what, &[], &|_| ());
}

/// [`killed_at`] with these settings, after `setup`; returns the run, for a look at its table.
fn killed_with(
    nth: usize,
    fault: Fault,
    what: &str,
    settings: &[(&str, serde_json::Value)],
    setup: &dyn Fn(&Run),
) -> (Run, Proxy) {
    let proxy = Proxy::start(&clickhouse().url);
    let run = Run::new(&proxy.url());
    run.configure(settings);
    setup(&run);
    hold_insert(&proxy, &run, nth, fault);
    let mut child = run.spawn(&messages(0));
    proxy.wait_held(1, Duration::from_secs(60));
    child.kill().unwrap();
    let (_, out, _) = finish(child);
    let printed = bookmarks(&out);
    // Every STATE printed covers committed records only.
    let (count, distinct) = run.counts();
    assert_eq!(count, distinct, "{what}: duplicates before the rerun");
    let last = printed.last().copied().unwrap_or(0);
    assert!(
        count >= last,
        "{what}: STATE {last} printed with {count} rows committed"
    );
    proxy.release_all();
    proxy.clear_rules();

    // As if Meltano had stored only the STATE before the last one: rerun from there first,
    // killed again at the same point... then from the last one. Both reruns complete.
    let earlier = printed.iter().rev().nth(1).copied().unwrap_or(0);
    for from in [earlier, last] {
        let child = run.spawn(&messages(from));
        let (code, out, err) = finish(child);
        assert_eq!(code, Some(0), "{what}: rerun from {from}: {err}");
        assert_eq!(
            bookmarks(&out).last().copied(),
            Some(RECORDS),
            "{what}: rerun from {from} printed {out}"
        );
        assert_eq!(
            run.counts(),
            (RECORDS, RECORDS),
            "{what}: after the rerun from {from} (printed before the kill: {printed:?})"
        );
    }
    (run, proxy)
}

#[test]
fn killed_mid_insert_before_the_server_wrote_it() {
    // The 3rd INSERT: flush 2's first chunk; STATE 15 printed.
    killed_at(3, Fault::Pause, "held before the server");
}

#[test]
fn killed_after_the_server_wrote_an_insert_it_did_not_acknowledge() {
    killed_at(3, Fault::StallUntilReleased, "written, unacknowledged");
}

#[test]
fn killed_after_an_acknowledged_insert_before_its_state() {
    // The 4th INSERT: flush 2's second chunk; its first (11-20... ) is acknowledged, STATE 30
    // not printed.
    killed_at(4, Fault::Pause, "acknowledged, no STATE");
}

/// With `add_record_metadata` the rows of a rerun hold other clocks (`_sdc_received_at`, ...)
/// than the first run's: tokens over the records as read (not over the rows' bytes) still
/// let the server drop the chunk that landed before the kill. Every row's metadata is filled
/// as the Singer SDK fills it.
#[test]
fn killed_after_an_unacknowledged_insert_with_record_metadata_on() {
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (run, _proxy) = killed_with(
        3,
        Fault::StallUntilReleased,
        "metadata on, written, unacknowledged",
        &[("add_record_metadata", json!(true))],
        &|_| (),
    );
    let rows = sql().rows(
        "SELECT id, toString(_sdc_extracted_at) AS extracted, _sdc_table_version IS NULL AS no_version,
                _sdc_deleted_at IS NULL AS not_deleted, _sdc_sequence AS sequence,
                toUnixTimestamp64Milli(_sdc_received_at) AS received,
                toUnixTimestamp64Milli(_sdc_batched_at) AS batched, _sdc_sync_started_at AS started
         FROM {db:Identifier}.rows ORDER BY id",
        &[("db", run.database.as_str())],
    );
    assert_eq!(rows.len() as u64, RECORDS);
    for (row, id) in rows.iter().zip(1..) {
        let shown = format!("{row}");
        assert_eq!(number(&row["id"]), id, "{shown}");
        // time_extracted, as sent (microseconds), in UTC.
        let want = extracted_at(id).replace('T', " ").replace('Z', "");
        assert_eq!(row["extracted"], json!(want), "{shown}");
        assert_eq!(number(&row["no_version"]), 1, "{shown}");
        assert_eq!(number(&row["not_deleted"]), 1, "{shown}");
        let (received, batched) = (number(&row["received"]), number(&row["batched"]));
        let (sequence, started) = (number(&row["sequence"]), number(&row["started"]));
        assert!(started >= before && started <= batched, "{shown}");
        assert!(
            batched <= received && received.abs_diff(sequence) <= 1,
            "{shown}"
        );
    }
}

#[test]
fn killed_right_after_a_state() {
    // The 5th INSERT: flush 3's first chunk, right after STATE 30 was printed.
    killed_at(5, Fault::StallUntilReleased, "right after a STATE");
}

/// Bad input stops the target with `invalid-input` naming the line (and stream), and no STATE
/// is printed for records that were not committed.
#[test]
fn bad_input_is_refused_by_line_and_no_state_passes_it() {
    let run = Run::new(&clickhouse().url);
    let good = messages(0);
    let lines: Vec<&str> = good.lines().collect();
    // SCHEMA, 15 records, STATE 15 (line 17): flushed and printed (15 >= BATCH).
    let head = lines[..17].join("\n");
    let cases = [
        (
            "{\"type\": \"RECORD\", \"stream\": \"rows\", \"record\": {\"id\": 99, \"name\"",
            "line 18 is not valid JSON",
        ),
        (
            r#"{"type": "RECORD", "stream": "other", "record": {"id": 1}}"#,
            "line 18: a RECORD of stream 'other' before its SCHEMA",
        ),
        (
            r#"{"type": "RECORD", "stream": "rows", "record": {"id": 1, "id": 2, "name": "a"}}"#,
            "line 18 (stream 'rows'): property 'id' appears twice",
        ),
        (
            r#"{"type": "LOG", "stream": "rows"}"#,
            "line 18: unknown message type 'LOG'",
        ),
        (
            r#"{"type": "BATCH", "stream": "rows"}"#,
            "line 18: a BATCH of stream 'rows' without a \"encoding\"",
        ),
        (
            r#"{"type": "BATCH", "stream": "rows", "encoding": {"format": "jsonl"}, "manifest": ["file:///etc/passwd"]}"#,
            "line 18 (BATCH of stream 'rows'): /etc/passwd is not in a directory batch_dirs names",
        ),
        (
            r#"{"type": "RECORD", "stream": "rows", "record": {"name": "no id"}}"#,
            "line 18 (stream 'rows'): property 'id' is missing",
        ),
    ];
    for (bad, says) in cases {
        let input = format!("{head}\n{bad}\n{}\n", lines[18..].join("\n"));
        let (code, out, err) = finish(run.spawn(&input));
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains(says), "{bad}: {err}");
        assert_eq!(
            bookmarks(&out),
            [15],
            "{bad}: only the STATE before the bad line"
        );
    }
    // A value its column refuses is found when the chunk is read: named by its input line.
    let value = r#"{"type": "RECORD", "stream": "rows", "record": {"id": "abc", "name": "x"}}"#;
    let input = format!("{head}\n{value}\n{}\n", lines[18..].join("\n"));
    let (code, out, err) = finish(run.spawn(&input));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 18 (stream 'rows')") && err.contains("'id'"),
        "{err}"
    );
    assert_eq!(bookmarks(&out), [15]);
    // Every run above committed records 1-15 only (the same tokens each time).
    assert_eq!(run.counts(), (15, 15));
    // Deeper than the server reads (input_format_json_max_depth).
    let deep = format!(
        "{{\"type\": \"RECORD\", \"stream\": \"rows\", \"record\": {{\"id\": 1, \"name\": {}{}}}}}",
        "[".repeat(2000),
        "]".repeat(2000)
    );
    let (code, _, err) = finish(run.spawn(&format!("{head}\n{deep}\n")));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("line 18 is nested more than 1000 levels"),
        "{err}"
    );
}

/// An existing table that does not deduplicate is refused when its stream's SCHEMA arrives
/// (misconfigured, naming the setting), nothing written; with `dedup` off the target loads into
/// it and says at start that delivery is at least once.
#[test]
fn a_table_without_a_deduplication_window_is_refused_unless_dedup_is_off() {
    let run = Run::new(&clickhouse().url);
    let sql = sql();
    sql.exec(
        "CREATE DATABASE {db:Identifier}",
        &[("db", run.database.as_str())],
    );
    sql.exec(
        "CREATE TABLE {db:Identifier}.rows (id Int64, name Nullable(String)) \
         ENGINE = MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 0",
        &[("db", run.database.as_str())],
    );
    let (code, out, err) = finish(run.spawn(&messages(0)));
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("line 1: stream 'rows': dedup needs a table that deduplicates inserts")
            && err.contains("non_replicated_deduplication_window"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    assert_eq!(run.counts(), (0, 0));
    // dedup off: loaded, at least once, and said so.
    run.configure(&[("dedup", false.into())]);
    let (code, out, err) = finish(run.spawn(&messages(0)));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("delivery is at least once"), "{err}");
    assert_eq!(bookmarks(&out).last().copied(), Some(RECORDS));
    assert_eq!(run.counts(), (RECORDS, RECORDS));
}

/// The `ca_file` setting reaches the reference host, which reads it before the component
/// starts: a file that holds no certificate is refused naming the setting, nothing sent (the
/// trust it gives is tested through an HTTPS front in tests/python/test_target.py).
#[test]
fn a_ca_file_setting_is_read_by_the_host() {
    let run = Run::new(&clickhouse().url);
    let not_pem = run.dir.0.join("ca.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    run.configure(&[("ca_file", not_pem.to_str().unwrap().into())]);
    let (code, out, err) = finish(run.spawn(&messages(0)));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("setting ca_file") && err.contains("no PEM certificate"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    let exists = sql().count(
        "SELECT count() FROM system.databases WHERE name = {db:String}",
        &[("db", run.database.as_str())],
    );
    assert_eq!(exists, 0, "nothing was created");
}

/// A flush forced by `batch_size_bytes` that sends records after a STATE read but not yet
/// emitted (fewer than `batch_size_rows` were waiting at it): that STATE is never emitted, so
/// the rerun starts from the STATE before it (here: the beginning), makes the same chunks and
/// loads every record once. Emitting it would make the rerun, started after it, send the
/// records the forced flush already wrote in chunks of its own, with other tokens.
#[test]
fn a_state_passed_by_a_forced_flush_is_not_emitted() {
    let run = Run::new(&clickhouse().url);
    run.configure(&[
        ("batch_size_rows", 1000.into()),
        ("batch_size_bytes", 1024.into()),
    ]);
    // The tap's messages after bookmark `after`: records to `last`, a STATE at 5 and at 100.
    let tap = |after: u64, last: u64| {
        let mut out = messages(RECORDS).lines().next().unwrap().to_string() + "\n";
        for id in after + 1..=last {
            let record = json!({"type": "RECORD", "stream": "rows",
                "record": {"id": id, "name": format!("row {id}")}});
            out.push_str(&format!("{record}\n"));
            if id == 5 || id == 100 {
                let state =
                    json!({"type": "STATE", "value": {"bookmarks": {"rows": {"last": id}}}});
                out.push_str(&format!("{state}\n"));
            }
        }
        out
    };
    // The tap dies after record 60: about 40 records (1,024 bytes) were flushed past STATE 5;
    // the rest, after that flush, fill no whole chunk: they wait for the rerun.
    let (code, out, err) = finish(run.spawn(&tap(0, 60)));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("records after the input's last STATE are not loaded"),
        "{err}"
    );
    assert_eq!(
        bookmarks(&out),
        Vec::<u64>::new(),
        "STATE 5 was passed by the flush"
    );
    let (written, unique) = run.counts();
    assert!(
        written == unique && written > 5 && written < 60,
        "the forced flush wrote {written} rows"
    );
    // Meltano reruns the tap from the last bookmark the target emitted: none. The forced
    // flush's chunk comes again and is dropped.
    let resumed = bookmarks(&out).last().copied().unwrap_or(0);
    let (code, out, err) = finish(run.spawn(&tap(resumed, 100)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(bookmarks(&out), vec![100]);
    assert_eq!(run.counts(), (100, 100));
}

/// Records after the input's last STATE are loaded in whole chunks, which a rerun from that
/// STATE makes again with the same tokens (the server drops them); the last partial chunk
/// waits for the rerun. With
/// `load_partial_tail` it is loaded too, and a rerun that reads further stores it twice (the
/// one case of at least once, docs/meltano.md).
#[test]
fn records_after_the_last_state_are_loaded_in_whole_chunks_once() {
    let run = Run::new(&clickhouse().url);
    // Records up to `last` of the tap resumed after `after` (a STATE after every 15).
    let until = |after: u64, last: u64| -> String {
        messages(after)
            .lines()
            .take_while(|l| !l.contains(&format!("\"id\":{}", last + 1)))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    // 1..=42: STATEs 15 and 30 flush; 31..=40 is a whole chunk after STATE 30, 41 and 42 wait.
    let (code, out, err) = finish(run.spawn(&until(0, 42)));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("10 records after the input's last STATE are loaded"),
        "{err}"
    );
    assert!(err.contains("not loaded (2 of stream 'rows')"), "{err}");
    assert_eq!(bookmarks(&out), vec![15, 30]);
    assert_eq!(run.counts(), (40, 40));
    // The rerun from 30 reads on: 31..=40 again (dropped), then the rest once. (A rerun that
    // stopped at 42 again would print no STATE at all, and a run without one loads
    // everything: the target cannot tell it from a tap that never sends a STATE.)
    let (code, out, err) = finish(run.spawn(&messages(30)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(bookmarks(&out), vec![45, 60]);
    assert_eq!(run.counts(), (RECORDS, RECORDS));

    // load_partial_tail: the partial chunk is loaded, and a rerun reading on stores it twice.
    let run = Run::new(&clickhouse().url);
    run.configure(&[("load_partial_tail", true.into())]);
    let (code, _, err) = finish(run.spawn(&until(0, 37)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(run.counts(), (37, 37));
    let (code, _, err) = finish(run.spawn(&messages(30)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(run.counts(), (RECORDS + 7, RECORDS));
}

/// `count` records of a full-table stream `rows` (ids 1..=count, names tagged `tag`), one STATE
/// after every `STATE_EVERY` and one at the end.
fn full_table(count: u64, tag: &str) -> String {
    let mut out = messages(RECORDS); // the SCHEMA alone
    for id in 1..=count {
        let record = json!({"type": "RECORD", "stream": "rows", "record": {"id": id, "name": format!("{tag} {id}")}});
        out.push_str(&format!("{record}\n"));
        if id % STATE_EVERY == 0 || id == count {
            let state = json!({"type": "STATE", "value": {"bookmarks": {"rows": {"last": id}}}});
            out.push_str(&format!("{state}\n"));
        }
    }
    out
}

/// `load_method: overwrite` on a fresh server, then again with other records, killed while
/// the proxy holds an INSERT of that load, then rerun. A reader polling the table throughout
/// sees the old table whole or the new one whole, nothing else; STATE comes only once the new
/// table is in place; the table loaded aside is gone at the end.
#[test]
fn an_overwrite_killed_mid_way_leaves_the_old_table_whole_and_its_rerun_replaces_it() {
    const OLD: u64 = 60;
    const NEW: u64 = 45;
    let proxy = Proxy::start(&clickhouse().url);
    let run = Run::new(&proxy.url());
    run.configure(&[("load_method", json!("overwrite"))]);
    let db = run.database.clone();
    let tagged = |tag: &str| -> (u64, u64) {
        let sql = sql();
        let args = [("db", db.as_str()), ("tag", tag)];
        (
            sql.count("SELECT count() FROM {db:Identifier}.rows", &args),
            sql.count(
                "SELECT countIf(startsWith(name, {tag:String})) FROM {db:Identifier}.rows",
                &args,
            ),
        )
    };

    // The first run: nothing there yet; the loaded table is renamed into place.
    let (code, out, err) = finish(run.spawn(&full_table(OLD, "old")));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(bookmarks(&out), [OLD], "one STATE, after the swap: {out}");
    assert_eq!(tagged("old"), (OLD, OLD));

    // A reader polls the table from now until the rerun is done.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (done, db) = (done.clone(), run.database.clone());
        std::thread::spawn(move || {
            let sql = sql();
            let args = [("db", db.as_str())];
            let mut seen = std::collections::BTreeSet::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let rows = sql.rows(
                    "SELECT count() AS n, countIf(startsWith(name, 'new')) AS new FROM {db:Identifier}.rows",
                    &args,
                );
                seen.insert((number(&rows[0]["n"]), number(&rows[0]["new"])));
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        })
    };

    // The second run, killed while its 3rd INSERT is held: the old table is whole.
    let needle = run.database.clone();
    proxy.add(
        Rule::when(
            move |r| {
                let t = r.target_decoded();
                t.contains("INSERT INTO") && t.contains(&needle) && t.contains("rows__loading")
            },
            Fault::StallUntilReleased,
        )
        .after(2)
        .times(1),
    );
    let mut child = run.spawn(&full_table(NEW, "new"));
    proxy.wait_held(1, Duration::from_secs(60));
    assert_eq!(tagged("old"), (OLD, OLD), "while the new records load");
    child.kill().unwrap();
    let (_, out, _) = finish(child);
    assert!(out.is_empty(), "no STATE before the swap: {out}");
    proxy.release_all();
    proxy.clear_rules();
    assert_eq!(tagged("old"), (OLD, OLD), "after the kill");

    // The rerun (Meltano's state is still the first run's last STATE: a full-table tap sends
    // everything again) replaces the table.
    let (code, out, err) = finish(run.spawn(&full_table(NEW, "new")));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(bookmarks(&out), [NEW], "{out}");
    assert_eq!(tagged("new"), (NEW, NEW));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = reader.join().unwrap();
    let (old, new) = ((OLD, 0), (NEW, NEW));
    assert!(
        seen.iter().all(|s| *s == old || *s == new) && seen.contains(&old),
        "the reader saw (count, new rows) {seen:?}"
    );
    let left = sql().count(
        "SELECT count() FROM system.tables WHERE database = {db:String}",
        &[("db", run.database.as_str())],
    );
    assert_eq!(left, 1, "the table loaded aside and the old one are gone");
}

/// `load_method: upsert` on a fresh server: the created table is a ReplacingMergeTree versioned
/// by `_sdc_upsert_version`; a record updated at the source replaces its row under FINAL, and
/// an older version of it inserted afterwards does not.
#[test]
fn an_upsert_keeps_the_newest_record_per_key_under_final() {
    let run = Run::new(&clickhouse().url);
    run.configure(&[
        ("engine_type", json!("auto")),
        ("load_method", json!("upsert")),
    ]);
    let db = run.database.as_str();
    let schema = messages(RECORDS); // the SCHEMA alone
    let record = |id: u64, name: &str| {
        let r = json!({"type": "RECORD", "stream": "rows", "record": {"id": id, "name": name}});
        format!("{r}\n")
    };
    let first = format!(
        "{schema}{}{}{}",
        record(1, "a"),
        record(2, "b"),
        record(3, "c")
    );
    let (code, _, err) = finish(run.spawn(&first));
    assert_eq!(code, Some(0), "{err}");
    let engine = sql().rows(
        "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = 'rows'",
        &[("db", db)],
    );
    let engine = engine[0]["engine_full"].as_str().unwrap().to_string();
    assert!(
        engine.starts_with("ReplacingMergeTree(_sdc_upsert_version)"),
        "{engine}"
    );
    let second = format!("{schema}{}{}", record(2, "b, updated"), record(4, "d"));
    let (code, _, err) = finish(run.spawn(&second));
    assert_eq!(code, Some(0), "{err}");
    let names = || {
        sql()
            .rows(
                "SELECT id, name FROM {db:Identifier}.rows FINAL ORDER BY id",
                &[("db", db)],
            )
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(), ["a", "b, updated", "c", "d"]);
    // An older version of record 2 inserted later (a replay, another writer) loses.
    sql().exec(
        "INSERT INTO {db:Identifier}.rows (id, name, _sdc_upsert_version) VALUES (2, 'stale', 1)",
        &[("db", db)],
    );
    assert_eq!(names(), ["a", "b, updated", "c", "d"]);
    // Record 2 back to its first value, in a chunk equal to the first run's but for the
    // versions: a new chunk, not taken for the first run's.
    let (code, _, err) = finish(run.spawn(&first));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(names(), ["a", "b", "c", "d"]);
}

/// An upsert's tokens cover its versions, so the chunk that landed before the kill is sent
/// again with newer versions and stored again: under FINAL every record is there once, the
/// rerun's copy. Merges are stopped on the table, so the copies stay visible without FINAL.
#[test]
fn killed_after_an_unacknowledged_insert_with_upsert() {
    let (run, _proxy) = killed_with(
        3,
        Fault::StallUntilReleased,
        "upsert, written, unacknowledged",
        &[
            ("engine_type", json!("auto")),
            ("load_method", json!("upsert")),
        ],
        &|run| {
            let sql = sql();
            let args = [("db", run.database.as_str())];
            sql.exec("CREATE DATABASE {db:Identifier}", &args);
            sql.exec(
                "CREATE TABLE {db:Identifier}.rows (id Int64, name Nullable(String), _sdc_upsert_version UInt64)
                 ENGINE = ReplacingMergeTree(_sdc_upsert_version) ORDER BY id
                 SETTINGS non_replicated_deduplication_window = 1000",
                &args,
            );
            sql.exec("SYSTEM STOP MERGES {db:Identifier}.rows", &args);
            run.final_reads.set(true);
        },
    );
    let args = [("db", run.database.as_str())];
    let copies = sql().count("SELECT count() FROM {db:Identifier}.rows", &args);
    assert!(copies > RECORDS, "the landed chunk stored again: {copies}");
    let versions = sql().count(
        "SELECT uniqExact(_sdc_upsert_version) FROM {db:Identifier}.rows",
        &args,
    );
    assert_eq!(versions, copies, "each row its own version");
}

/// An overwrite into a database that cannot swap tables (Ordinary: every table's UUID is nil,
/// and EXCHANGE is refused) fails, with the old table whole and no STATE: the failed swap is
/// not taken for a done one, so the loaded records are not dropped as the "old" table.
#[test]
fn an_overwrite_whose_swap_fails_keeps_the_old_table_and_prints_no_state() {
    let run = Run::new(&clickhouse().url);
    run.configure(&[("load_method", json!("overwrite"))]);
    let args = [("db", run.database.as_str())];
    let create = Query::write("test", "CREATE DATABASE {db:Identifier} ENGINE = Ordinary")
        .param("db", run.database.as_str())
        .setting("allow_deprecated_database_ordinary", "1");
    sql().client().execute(&create).unwrap();
    sql().exec(
        "CREATE TABLE {db:Identifier}.rows (id Int64, name Nullable(String)) ENGINE = MergeTree ORDER BY id
         SETTINGS non_replicated_deduplication_window = 1000",
        &args,
    );
    sql().exec("INSERT INTO {db:Identifier}.rows VALUES (7, 'old')", &args);
    let (code, out, err) = finish(run.spawn(&full_table(20, "new")));
    assert_ne!(code, Some(0), "{err}");
    assert!(out.is_empty(), "no STATE: {out}");
    assert!(err.contains("replacing"), "{err}");
    assert_eq!(run.counts(), (1, 1), "the old table whole");
    let loaded = sql().count("SELECT count() FROM {db:Identifier}.rows__loading", &args);
    assert_eq!(
        loaded, 20,
        "the loaded records kept (a rerun drops them first)"
    );
}

/// `count` records of the full-table stream `rows` as an SDK tap sends them with
/// `emit_activate_version_messages`: ACTIVATE_VERSION first, then each record with the version,
/// a STATE after every `STATE_EVERY` and one at the end.
fn versioned(count: u64, version: i64) -> String {
    let mut out = messages(RECORDS); // the SCHEMA alone
    let activate = json!({"type": "ACTIVATE_VERSION", "stream": "rows", "version": version});
    out.push_str(&format!("{activate}\n"));
    for id in 1..=count {
        let record = json!({"type": "RECORD", "stream": "rows", "record": {"id": id, "name": format!("row {id}")},
            "version": version, "time_extracted": extracted_at(id)});
        out.push_str(&format!("{record}\n"));
        if id % STATE_EVERY == 0 || id == count {
            let state = json!({"type": "STATE", "value": {"bookmarks": {"rows": {"last": id}}}});
            out.push_str(&format!("{state}\n"));
        }
    }
    out
}

/// (rows, rows of `version`, rows not marked deleted) of the run's table.
fn versions(run: &Run, version: i64) -> (u64, u64, u64) {
    let rows = sql().rows(
        "SELECT count() AS n, countIf(_sdc_table_version = {v:Int64}) AS current,
                countIf(_sdc_deleted_at IS NULL) AS live
         FROM {db:Identifier}.rows",
        &[("db", run.database.as_str()), ("v", &version.to_string())],
    );
    let row = &rows[0];
    (
        number(&row["n"]),
        number(&row["current"]),
        number(&row["live"]),
    )
}

/// ACTIVATE_VERSION with `hard_delete`, from a fresh server: a full-table sync of 60 rows,
/// then one of 45 (15 deleted at the source) killed while an INSERT the server wrote is
/// held, then its rerun (a full-table tap starts over, with a new version). The table ends
/// with the rerun's 45 rows once: its chunks equal the killed run's but for the version, and
/// the version is in their tokens, so they are stored, not dropped as repeats and then
/// deleted with the older versions.
#[test]
fn a_full_table_rerun_after_a_kill_retires_the_older_versions_exactly_once() {
    let proxy = Proxy::start(&clickhouse().url);
    let run = Run::new(&proxy.url());
    run.configure(&[
        ("add_record_metadata", json!(true)),
        ("hard_delete", json!(true)),
    ]);
    let (code, out, err) = finish(run.spawn(&versioned(RECORDS, 1)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(bookmarks(&out).last(), Some(&RECORDS));
    assert_eq!(versions(&run, 1), (RECORDS, RECORDS, RECORDS));

    hold_insert(&proxy, &run, 3, Fault::StallUntilReleased);
    let mut child = run.spawn(&versioned(45, 2));
    proxy.wait_held(1, Duration::from_secs(60));
    child.kill().unwrap();
    finish(child);
    proxy.release_all();
    proxy.clear_rules();
    let (rows, killed_run, _) = versions(&run, 2);
    assert!(
        killed_run >= 15 && rows == RECORDS + killed_run,
        "the killed run's chunks landed beside the first run's rows: {rows}, {killed_run}"
    );

    let (code, out, err) = finish(run.spawn(&versioned(45, 3)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(bookmarks(&out).last(), Some(&45));
    assert!(err.contains("versions before 3 deleted"), "{err}");
    assert_eq!(run.counts(), (45, 45), "each of the rerun's rows once");
    assert_eq!(versions(&run, 3), (45, 45, 45));
}

/// ACTIVATE_VERSION without `hard_delete`: the rows of older versions are marked in
/// `_sdc_deleted_at` (once: a later run does not move the mark), the current ones not. With
/// `add_record_metadata` off the rows carry no version: nothing is retired, with a warning.
#[test]
fn an_activate_version_marks_the_rows_of_older_versions_deleted() {
    let run = Run::new(&clickhouse().url);
    run.configure(&[("add_record_metadata", json!(true))]);
    for (count, version) in [(RECORDS, 1), (45, 2)] {
        let (code, _, err) = finish(run.spawn(&versioned(count, version)));
        assert_eq!(code, Some(0), "{err}");
    }
    assert_eq!(versions(&run, 2), (105, 45, 45));
    let marked = || {
        sql().rows(
            "SELECT min(_sdc_deleted_at) AS first, max(_sdc_deleted_at) AS last,
                    countIf(_sdc_deleted_at IS NOT NULL AND _sdc_table_version = 1) AS old
             FROM {db:Identifier}.rows",
            &[("db", run.database.as_str())],
        )[0]
        .clone()
    };
    let before = marked();
    assert_eq!(number(&before["old"]), RECORDS, "{before}");
    assert_eq!(before["first"], before["last"], "one mark: {before}");

    let (code, _, err) = finish(run.spawn(&versioned(45, 3)));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(versions(&run, 3), (150, 45, 45));
    assert_eq!(marked()["first"], before["first"], "the v1 marks kept");

    run.configure(&[("add_record_metadata", json!(false))]);
    let (code, _, err) = finish(run.spawn(&versioned(45, 4)));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("ACTIVATE_VERSION is not acted on"), "{err}");
    assert_eq!(versions(&run, 3).2, 90, "nothing more marked");
}

/// `flattening_enabled` with depth 1, on a fresh server: nested properties become columns
/// named as the Singer SDK names them, arrays and deeper objects their JSON text as the SDK
/// writes it, a null object's columns null; then a rerun of the same input, from the start,
/// adds nothing (the flattened chunks are the same, their tokens too).
#[test]
fn flattening_makes_columns_as_the_sdk_does_and_loads_once() {
    let run = Run::new(&clickhouse().url);
    run.configure(&[
        ("flattening_enabled", json!(true)),
        ("flattening_max_depth", json!(1)),
    ]);
    let schema = json!({"type": "SCHEMA", "stream": "rows", "key_properties": ["id"],
        "schema": {"properties": {
            "id": {"type": "integer"},
            "address": {"type": ["object", "null"], "properties": {
                "city": {"type": "string"},
                "geo": {"type": "object", "properties": {"lat": {"type": "number"}}}}},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}}}}});
    let mut input = format!("{schema}\n");
    for id in 1..=RECORDS {
        let record = match id % 2 {
            0 => json!({"id": id, "address": null, "tags": null}),
            _ => {
                json!({"id": id, "address": {"city": "K\u{f6}ln", "geo": {"lat": 50.94, "x": "\u{e9}"}},
                "tags": ["a", id]})
            }
        };
        input.push_str(&format!(
            "{}\n",
            json!({"type": "RECORD", "stream": "rows", "record": record})
        ));
    }
    input.push_str("{\"type\":\"STATE\",\"value\":{\"bookmarks\":{\"rows\":{\"last\":60}}}}\n");
    for _ in 0..2 {
        let (code, _, err) = finish(run.spawn(&input));
        assert_eq!(code, Some(0), "{err}");
        assert!(!err.contains("not in the stream's SCHEMA"), "{err}");
        assert_eq!(run.counts(), (RECORDS, RECORDS));
    }
    let types = sql().rows(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = 'rows' ORDER BY position",
        &[("db", run.database.as_str())],
    );
    let types: Vec<String> = types
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["name"].as_str().unwrap(),
                r["type"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        types,
        [
            "id Int64",
            "address__city Nullable(String)",
            "address__geo Nullable(String)",
            "tags Nullable(String)"
        ]
    );
    let rows = sql().rows(
        "SELECT id, address__city, address__geo, tags FROM {db:Identifier}.rows WHERE id IN (1, 2) ORDER BY id",
        &[("db", run.database.as_str())],
    );
    assert_eq!(
        rows[0],
        json!({"id": 1, "address__city": "K\u{f6}ln",
            "address__geo": "{\"lat\":50.94,\"x\":\"\\u00e9\"}", "tags": "[\"a\",1]"})
    );
    assert_eq!(
        rows[1],
        json!({"id": 2, "address__city": null, "address__geo": null, "tags": null})
    );
}

/// A tap's input with its records in BATCH files, as the Singer SDK writes them (`batch_config`
/// with jsonl and gzip): SCHEMA, then a BATCH of records `first..=30` in a new gzip file, STATE
/// 30, a BATCH of the rest, STATE 60. `from`: the records after that bookmark only (a rerun).
/// Each call writes new files (a tap's rerun names its files anew).
fn batched(run: &Run, from: u64) -> String {
    use std::io::Write as _;
    let dir = run.dir.0.join("batches");
    std::fs::create_dir_all(&dir).unwrap();
    let mut out = messages(RECORDS); // the SCHEMA alone
    for (first, last) in [(1, 30), (31, RECORDS)] {
        if last <= from {
            continue;
        }
        let path = dir.join(unique_name("batch") + ".json.gz");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for id in first.max(from + 1)..=last {
            writeln!(gz, "{}", json!({"id": id, "name": format!("row {id}")})).unwrap();
        }
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        let batch = json!({"type": "BATCH", "stream": "rows",
            "encoding": {"format": "jsonl", "compression": "gzip"},
            "manifest": [format!("file://{}", path.display())]});
        let state = json!({"type": "STATE", "value": {"bookmarks": {"rows": {"last": last}}}});
        out.push_str(&format!("{batch}\n{state}\n"));
    }
    out
}

/// BATCH files, from a fresh server, killed while the proxy holds the 3rd INSERT (written,
/// not acknowledged: no STATE printed) and the 4th (STATE 30 printed), each rerun from the
/// last STATE printed with the tap's new files: every record once.
#[test]
fn batch_files_load_exactly_once_through_a_kill() {
    for nth in [3, 4] {
        let proxy = Proxy::start(&clickhouse().url);
        let run = Run::new(&proxy.url());
        let dir = run.dir.0.join("batches");
        run.configure(&[("batch_dirs", json!([dir.to_str().unwrap()]))]);
        hold_insert(&proxy, &run, nth, Fault::StallUntilReleased);
        let mut child = run.spawn(&batched(&run, 0));
        proxy.wait_held(1, Duration::from_secs(60));
        child.kill().unwrap();
        let (_, out, _) = finish(child);
        proxy.release_all();
        proxy.clear_rules();
        let from = bookmarks(&out).last().copied().unwrap_or(0);
        assert_eq!(from, if nth == 3 { 0 } else { 30 }, "{out}");
        let (code, out, err) = finish(run.spawn(&batched(&run, from)));
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(bookmarks(&out).last(), Some(&RECORDS), "{out}");
        assert_eq!(run.counts(), (RECORDS, RECORDS), "killed at INSERT {nth}");
    }
}

/// A BATCH naming a file outside `batch_dirs` (or with none set), or in another format, is
/// refused naming its line and the setting; nothing is written.
#[test]
fn a_batch_outside_batch_dirs_or_in_another_format_is_refused() {
    let run = Run::new(&clickhouse().url);
    let input = batched(&run, 0);
    let (code, out, err) = finish(run.spawn(&input));
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("line 2 (BATCH of stream 'rows')") && err.contains("batch_dirs"),
        "{err}"
    );
    let parquet = input.replace("\"jsonl\"", "\"parquet\"");
    let dir = run.dir.0.join("batches");
    run.configure(&[("batch_dirs", json!([dir.to_str().unwrap()]))]);
    let (code, _, err) = finish(run.spawn(&parquet));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("format 'parquet' is not read"), "{err}");
    let tables = sql().count(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND total_rows > 0",
        &[("db", run.database.as_str())],
    );
    assert_eq!(tables, 0, "nothing written");
}

/// A value the sink refuses in a batch file is named by its BATCH line, and by the file and
/// the line in it (the typed read of a chunk runs when the chunk is sent, long after the file
/// was read); nothing is written and no STATE passes it.
#[test]
fn a_value_refused_in_a_batch_file_names_the_file_and_its_line() {
    let run = Run::new(&clickhouse().url);
    let dir = run.dir.0.join("batches");
    std::fs::create_dir_all(&dir).unwrap();
    run.configure(&[("batch_dirs", json!([dir.to_str().unwrap()]))]);
    let path = dir.join("bad.jsonl");
    let lines: Vec<String> = (1..=5)
        .map(|id| match id {
            4 => json!({"id": "four", "name": "row 4"}).to_string(),
            _ => json!({"id": id, "name": format!("row {id}")}).to_string(),
        })
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let batch = json!({"type": "BATCH", "stream": "rows",
        "encoding": {"format": "jsonl"},
        "manifest": [format!("file://{}", path.display())]});
    let state = json!({"type": "STATE", "value": {"bookmarks": {"rows": {"last": 5}}}});
    let input = format!("{}{batch}\n{state}\n", messages(RECORDS));
    let (code, out, err) = finish(run.spawn(&input));
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty(), "no STATE: {out}");
    let named = format!("(file {}, line 4)", path.display());
    assert!(
        err.contains("line 2 (stream 'rows')") && err.contains(&named) && err.contains("'id'"),
        "{err}"
    );
    // The same refusal found by a flush of batch_size_bytes while a later line of the file is
    // read: named once, by its own line (not also by the line being read).
    let lines: Vec<String> = (1..=RECORDS)
        .map(|id| match id {
            4 => json!({"id": "four", "name": "row 4"}).to_string(),
            _ => json!({"id": id, "name": format!("row {id} {}", "x".repeat(40))}).to_string(),
        })
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    run.configure(&[
        ("batch_dirs", json!([dir.to_str().unwrap()])),
        ("batch_size_bytes", json!(1024)),
    ]);
    let (code, out, err) = finish(run.spawn(&input));
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty(), "no STATE: {out}");
    assert!(err.contains(&named), "{err}");
    assert_eq!(err.matches(&path.display().to_string()).count(), 1, "{err}");
    let tables = sql().count(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND total_rows > 0",
        &[("db", run.database.as_str())],
    );
    assert_eq!(tables, 0, "nothing written");
}

/// Replicated tables with the default `table_path` (`/clickhouse/tables/{uuid}/{shard}`), on a
/// fresh server without `cluster_name`: ClickHouse expands `{uuid}` only `ON CLUSTER`, in a
/// Replicated database, or with the table's UUID in the statement, so the target puts a UUID
/// it draws in the path (before, every such table was refused: BAD_ARGUMENTS). An overwrite's
/// tables each get their own path, and the swap (RENAME, then EXCHANGE and DROP ... SYNC)
/// runs on them. SCHEMAs only: the local engine never activates a replica, so it refuses
/// writes to Replicated tables (tests/tests/replicated_state.rs); inserts and mutations on
/// them are not run here.
#[test]
fn replicated_tables_get_a_path_of_their_own_and_an_overwrite_swaps_them() {
    let run = Run::new(&clickhouse().url);
    run.configure(&[
        ("engine_type", json!("ReplicatedMergeTree")),
        ("load_method", json!("overwrite")),
    ]);
    let mut paths = Vec::new();
    for _ in 0..2 {
        let (code, _, err) = finish(run.spawn(&messages(RECORDS)));
        assert_eq!(code, Some(0), "{err}");
        let rows = sql().rows(
            "SELECT name, engine, zookeeper_path FROM system.tables t
             JOIN system.replicas r ON r.database = t.database AND r.table = t.name
             WHERE t.database = {db:String}",
            &[("db", run.database.as_str())],
        );
        assert_eq!(
            rows.len(),
            1,
            "the loaded table swapped in, the old one gone: {rows:?}"
        );
        assert_eq!(rows[0]["name"], json!("rows"));
        assert_eq!(rows[0]["engine"], json!("ReplicatedMergeTree"));
        let path = rows[0]["zookeeper_path"].as_str().unwrap().to_string();
        let uuid = path
            .strip_prefix("/clickhouse/tables/")
            .and_then(|p| p.strip_suffix("/1"))
            .unwrap_or_else(|| panic!("{path}"));
        assert!(uuid.len() == 36 && uuid.matches('-').count() == 4, "{path}");
        paths.push(path);
    }
    assert_ne!(paths[0], paths[1], "each run's table has a path of its own");
}

/// ACTIVATE_VERSION is acted on only once the tap got past the stream: a run whose input ends
/// without a STATE after the stream's last record (a tap that failed mid-stream) keeps the
/// older versions, with a warning. Records from BATCH files get the version their stream's
/// ACTIVATE_VERSION made current, so a full-table sync in batches retires the rows it
/// replaces.
#[test]
fn activate_version_waits_for_a_state_after_the_last_record_and_covers_batch_files() {
    let run = Run::new(&clickhouse().url);
    run.configure(&[
        ("add_record_metadata", json!(true)),
        ("hard_delete", json!(true)),
    ]);
    let (code, _, err) = finish(run.spawn(&versioned(RECORDS, 1)));
    assert_eq!(code, Some(0), "{err}");
    // Version 2's sync stops after 25 records, before any STATE after them.
    let cut: String = versioned(45, 2)
        .lines()
        .take(2 + 25 + 1) // SCHEMA, ACTIVATE_VERSION, 15 records, STATE 15, 10 records
        .map(|l| format!("{l}\n"))
        .collect();
    let (code, _, err) = finish(run.spawn(&cut));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("rows of versions before 2 are kept") && err.contains("no STATE came after"),
        "{err}"
    );
    assert_eq!(versions(&run, 1).1, RECORDS, "version 1 whole");

    // The same in BATCH files, version 3: the files' records carry it, version 1 and 2 go.
    let dir = run.dir.0.join("batches");
    run.configure(&[("batch_dirs", json!([dir.to_str().unwrap()]))]);
    let activate = json!({"type": "ACTIVATE_VERSION", "stream": "rows", "version": 3});
    let input = batched(&run, 0).replacen('\n', &format!("\n{activate}\n"), 1);
    let (code, _, err) = finish(run.spawn(&input));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("versions before 3 deleted"), "{err}");
    assert_eq!(versions(&run, 3), (RECORDS, RECORDS, RECORDS));
}
