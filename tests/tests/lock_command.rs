//! `lock ID -- COMMAND` never outlives its lease: when ClickHouse stops answering, the command
//! is stopped (SIGTERM, then SIGKILL) before the lease can end and the host exits with its
//! lease-lost code; signals sent to the host reach the command (SIGKILL follows if it outlives
//! them by `--term-grace`), and the lock is released when the command exits (a failed release
//! is only a warning). No process of the command's group outlives the host: what the command
//! leaves running is killed when it exits, and a watchdog kills the group if the host is killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::{cli, clickhouse, unique_name, Server};
use serde_json::Value;

/// The host's exit code when it stopped the command to keep the lease promise.
const LEASE_LOST: i32 = 11;

/// A fresh file path for this test.
fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(unique_name(name))
}

/// `lock --stale-after-seconds 3 [extra] job -- sh -c SCRIPT` against `server`.
fn start_lock(server: &Server, db: &str, extra: &[&str], script: &str) -> Child {
    cli(server)
        .args(["--json", "lock", "--state-database", db])
        .args(["--stale-after-seconds", "3"])
        .args(extra)
        .args(["job", "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the CLI")
}

/// The lock on `job` in `db` was released: another holder gets it at its first attempt.
fn assert_released(db: &str) {
    let started = Instant::now();
    let second = cli(clickhouse())
        .args([
            "lock",
            "--state-database",
            db,
            "--lock-timeout-seconds",
            "0",
        ])
        .args(["job", "--hold", "0s"])
        .output()
        .unwrap();
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Waits for the command to write its pid (the lock is held and the command runs).
fn wait_for_pid(path: &Path, host: &mut Child) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        if let Some(status) = host.try_wait().unwrap() {
            panic!("the host exited ({status}) before the command started");
        }
        assert!(Instant::now() < deadline, "the command did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a process runs (a zombie does not).
fn alive(pid: i32) -> bool {
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) STATE ...": comm may contain spaces, the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Polls until `pid` is gone; returns when, or panics after `timeout`.
fn wait_gone(pid: i32, timeout: Duration) -> Instant {
    let deadline = Instant::now() + timeout;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} still runs after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Instant::now()
}

/// The host's output, or a panic (after killing it) if it has not exited within `timeout`.
fn wait_exit(host: Child, timeout: Duration) -> Output {
    let pid = host.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(host.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the host did not exit within {timeout:?}");
        }
    }
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Starts the host through a proxy, lets a renewal go through, stops the proxy answering and
/// returns (the proxy, the host's output, when the proxy stopped, when the command was gone).
fn lose_the_lease(extra: &[&str], script: &str) -> (Proxy, Output, Duration) {
    let proxy = Proxy::start(&clickhouse().url);
    let db = unique_name("lock_cmd");
    let pidfile = temp_path("lock_cmd_pid");
    let script = script.replace("PIDFILE", pidfile.to_str().unwrap());
    let mut host = start_lock(&proxy.server(clickhouse()), &db, extra, &script);
    let pid = wait_for_pid(&pidfile, &mut host);
    // Renewals are due every second, one at a time: once the second is seen, the first was
    // answered, so the lease was renewed at least once before the proxy stops (the last
    // successful renewal is at most ~1 s before `stopped`).
    let deadline = Instant::now() + Duration::from_secs(10);
    while renewals(&proxy) < 2 {
        assert!(Instant::now() < deadline, "no second renewal within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(alive(pid));
    proxy.stop_answering();
    let stopped = Instant::now();
    // The last successful renewal started before `stopped`: measuring from `stopped` bounds it.
    let gone = wait_gone(pid, Duration::from_secs(10)).duration_since(stopped);
    let out = wait_exit(host, Duration::from_secs(20));
    let _ = std::fs::remove_file(&pidfile);
    (proxy, out, gone)
}

/// Renewals the proxy has seen.
fn renewals(proxy: &Proxy) -> usize {
    proxy
        .log()
        .iter()
        .filter(|r| r.header("x-component-operation").as_deref() == Some("renew"))
        .count()
}

#[test]
fn a_command_is_stopped_before_its_lease_can_end_when_clickhouse_stops_answering() {
    let (proxy, out, gone) = lose_the_lease(&[], "echo $$ > PIDFILE; exec sleep 60");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        gone < Duration::from_secs(3),
        "the command ran {gone:?} after the last renewal could have happened: {stderr}"
    );
    // It was not stopped while the lease was still safe (SIGTERM comes 2.4 s after the last
    // renewal, which was at most ~1 s before the proxy stopped).
    assert!(gone > Duration::from_millis(900), "stopped after {gone:?}");
    assert_eq!(out.status.code(), Some(LEASE_LOST), "{stderr}");
    assert!(stderr.contains("could no longer be guaranteed"), "{stderr}");
    assert!(
        stderr.contains("stopped the command (SIGTERM):"),
        "{stderr}"
    );
    let v = report(&out);
    assert_eq!(v["exit_code"], LEASE_LOST);
    assert_eq!(v["error"]["kind"], "lease-lost");
    assert_eq!(v["command_exit_code"], 128 + libc::SIGTERM);
    assert_eq!(v["ok"], false);
    assert!(proxy.requests() > 0);
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_before_its_lease_can_end() {
    // SIGTERM 1 s before the lease can end, SIGKILL 0.5 s later.
    let (_proxy, out, gone) = lose_the_lease(
        &["--stop-before", "1s", "--term-grace", "500ms"],
        "trap '' TERM; echo $$ > PIDFILE; exec sleep 60",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        gone < Duration::from_millis(2600),
        "gone {gone:?} after the proxy stopped: {stderr}"
    );
    assert_eq!(out.status.code(), Some(LEASE_LOST), "{stderr}");
    assert!(stderr.contains("SIGKILL after 0.500 s"), "{stderr}");
    assert_eq!(report(&out)["command_exit_code"], 128 + libc::SIGKILL);
}

#[test]
fn sigterm_to_the_host_reaches_the_command_and_the_lock_is_released() {
    let db = unique_name("lock_sig");
    let pidfile = temp_path("lock_sig_pid");
    let got = temp_path("lock_sig_got");
    let script = format!(
        "trap 'echo TERM > {got}; exit 3' TERM; echo $$ > {pid}; while :; do sleep 0.05; done",
        got = got.display(),
        pid = pidfile.display()
    );
    let mut host = start_lock(clickhouse(), &db, &[], &script);
    let pid = wait_for_pid(&pidfile, &mut host);
    unsafe { libc::kill(host.id() as i32, libc::SIGTERM) };
    let out = wait_exit(host, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The command got SIGTERM, handled it, and its exit code is the host's.
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default().trim(),
        "TERM",
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("passing SIGTERM on"), "{stderr}");
    assert!(!alive(pid));
    let v = report(&out);
    assert_eq!(
        (v["exit_code"].as_i64(), v["released"].as_bool()),
        (Some(3), Some(true))
    );
    assert_released(&db);
    let _ = std::fs::remove_file(pidfile);
    let _ = std::fs::remove_file(got);
}

#[test]
fn a_failed_release_after_a_successful_command_is_a_warning() {
    let proxy = Proxy::start(&clickhouse().url);
    let unlock = proxy.add(Rule::head_contains(
        "x-component-operation: unlock",
        Fault::Refuse,
    ));
    let db = unique_name("lock_rel");
    let host = start_lock(&proxy.server(clickhouse()), &db, &[], "exit 0");
    let out = wait_exit(host, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("warning: could not release"), "{stderr}");
    assert!(proxy.hits(unlock) >= 1);
    let v = report(&out);
    assert_eq!(
        (v["exit_code"].as_i64(), v["released"].as_bool()),
        (Some(0), Some(false))
    );
}

#[test]
fn renewals_are_retried_through_a_short_outage() {
    let proxy = Proxy::start(&clickhouse().url);
    let db = unique_name("lock_blip");
    let pidfile = temp_path("lock_blip_pid");
    let script = format!("echo $$ > {}; sleep 3.5", pidfile.display());
    // The first three renewal attempts are refused, whenever they come (the component
    // repeats a failed renewal; the host tries again if that was not enough): an outage
    // that meets the renewals by construction, not by timing.
    proxy.add(Rule::head_contains("x-component-operation: renew", Fault::Refuse).times(3));
    let mut host = start_lock(&proxy.server(clickhouse()), &db, &[], &script);
    wait_for_pid(&pidfile, &mut host);
    let out = wait_exit(host, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("can no longer be guaranteed"), "{stderr}");
    assert_eq!(report(&out)["released"], true);
    // A renewal met the outage, and a later one went through (the component repeats a failed
    // renewal; the host tries again if that was not enough).
    let renewals: Vec<Fault> = proxy
        .log()
        .into_iter()
        .filter(|r| r.header("x-component-operation").as_deref() == Some("renew"))
        .map(|r| r.fault)
        .collect();
    let first_refused = renewals.iter().position(|f| *f == Fault::Refuse);
    assert!(
        first_refused.is_some_and(|i| renewals[i..].contains(&Fault::Pass)),
        "{renewals:?}"
    );
    let _ = std::fs::remove_file(pidfile);
}

/// The processes of process group `pgid` that still run, as (pid, name); zombies do not count
/// (orphans are reaped by PID 1, which in some containers never reaps).
fn group_members(pgid: i32) -> Vec<(i32, String)> {
    // ESRCH: no process at all has this group id.
    if unsafe { libc::kill(-pgid, 0) } != 0 {
        return Vec::new();
    }
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) STATE PPID PGRP ...": comm may contain spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && !["Z", "X"].contains(&fields[0]) {
            members.push((pid, stat[open + 1..close].to_string()));
        }
    }
    members
}

/// Polls until process group `pgid` has no running process; returns how long that took from
/// `since`, or panics (listing what still runs) at `deadline`.
fn wait_group_gone(pgid: i32, since: Instant, deadline: Instant) -> Duration {
    loop {
        let members = group_members(pgid);
        if members.is_empty() {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{:?} after the signal, process group {pgid} still runs: {members:?}",
            since.elapsed()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills process group `pgid` when dropped, so that a failing test leaves nothing behind.
struct KillGroup(i32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
}

/// `lock --stale-after-seconds 10 [extra] job -- sh -c SCRIPT` against the test server, with
/// PIDFILE in SCRIPT replaced by a fresh path; returns the host, the command's process group
/// (read from that file) and the database.
fn start_guarded(extra: &[&str], script: &str) -> (Child, i32, String) {
    let db = unique_name("lock_guard");
    let pidfile = temp_path("lock_guard_pid");
    let script = script.replace("PIDFILE", pidfile.to_str().unwrap());
    let mut host = cli(clickhouse())
        .args(["--json", "lock", "--state-database", &db])
        .args(["--stale-after-seconds", "10"])
        .args(extra)
        .args(["job", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the CLI");
    let pgid = wait_for_pid(&pidfile, &mut host);
    let _ = std::fs::remove_file(&pidfile);
    (host, pgid, db)
}

/// Waits until process group `pgid` runs processes named `names` (each at least once).
fn wait_for_members(pgid: i32, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let members = group_members(pgid);
        if names.iter().all(|n| members.iter().any(|(_, m)| m == n)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process group {pgid} runs {members:?}, not {names:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn no_process_of_the_command_outlives_a_killed_host() {
    // Lease 10 s: the second holder could take the lock 10 s after the last renewal.
    let (mut host, pgid, _db) = start_guarded(&[], "echo $$ > PIDFILE; sleep 30 | cat");
    let _cleanup = KillGroup(pgid);
    wait_for_members(pgid, &["sh", "sleep", "cat"]);
    unsafe { libc::kill(host.id() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    host.wait().unwrap();
    // Well before the lease could end (and before another holder could get the lock).
    let gone = wait_group_gone(pgid, killed, killed + Duration::from_secs(5));
    eprintln!("measured: the command's process group was gone {gone:?} after SIGKILL of the host");
}

#[test]
fn a_command_that_ignores_a_passed_on_sigterm_is_killed_after_the_grace_and_the_lock_released() {
    // The shell (the group leader) ignores SIGTERM; so do the sleeps it starts (an ignored
    // signal stays ignored across exec), but they end by themselves, the loop does not.
    let (host, pgid, db) = start_guarded(
        &["--term-grace", "1s"],
        "trap '' TERM; echo $$ > PIDFILE; while :; do sleep 0.1; done",
    );
    let _cleanup = KillGroup(pgid);
    unsafe { libc::kill(host.id() as i32, libc::SIGTERM) };
    let sent = Instant::now();
    // Within the grace plus a margin, well before the 10 s lease could end.
    let gone = wait_group_gone(pgid, sent, sent + Duration::from_secs(5));
    eprintln!("measured: the command's process group was gone {gone:?} after SIGTERM to the host");
    // SIGTERM alone did not end it: SIGKILL came after the grace.
    assert!(gone >= Duration::from_secs(1), "gone after {gone:?}");
    let out = wait_exit(host, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("passing SIGTERM on"), "{stderr}");
    assert!(
        stderr.contains("did not exit within 1.000 s (--term-grace) of SIGTERM"),
        "{stderr}"
    );
    // The host's exit code is the command's: killed by SIGKILL.
    assert_eq!(out.status.code(), Some(128 + libc::SIGKILL), "{stderr}");
    let v = report(&out);
    assert_eq!(
        (
            v["exit_code"].as_i64(),
            v["killed"].as_bool(),
            v["released"].as_bool()
        ),
        (Some(i64::from(128 + libc::SIGKILL)), Some(true), Some(true)),
        "{v}"
    );
    assert_released(&db);
}

#[test]
fn what_the_command_leaves_running_in_its_group_is_killed_when_it_exits() {
    let (host, pgid, _db) = start_guarded(
        &[],
        // Not holding the host's output open: the host's output ends when the host exits.
        "echo $$ > PIDFILE; sleep 30 >/dev/null 2>&1 & exit 0",
    );
    let _cleanup = KillGroup(pgid);
    let out = wait_exit(host, Duration::from_secs(20));
    let exited = Instant::now();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The background sleep would otherwise run on without the lock.
    wait_group_gone(pgid, exited, exited + Duration::from_secs(2));
}
