//! Histories of the lock and the state store, checked (docs/verification.md): the workload of
//! `clickhouse_component_tests::workload` (8 threads with their own component instances and 2
//! CLI processes on 3 state ids, directed episodes on a fourth, a seeded nemesis) on each lock engine, then the checker. A
//! run passes only if the checker finds the history legal *and* the nemesis bit: unknown
//! outcomes and lock takeovers both happened, and faults of every kind scheduled were injected.
//! The planted-bug components (scripts/planted-bugs) run the same workload and must be caught.
//!
//! `VERIFY_SEED` chooses the seed (default 1); `VERIFY_SECONDS` the length of the soak runs
//! (`make soak SECONDS=N`, ignored by default). Histories are kept in
//! target/verify/NAME-seedN.jsonl (`make check-history FILE=...`), and each run's line is
//! appended to target/verify/results.txt. The runs always start their own local ClickHouse (and
//! ensemble), whatever `CLICKHOUSE_URL` says: the nemesis kills and restarts them.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use clickhouse_component_host::LockEngine;
use clickhouse_component_tests::repo_root;
use clickhouse_component_tests::workload::{run, Config, RunResult};

/// One run at a time: each starts its own ClickHouse (and ensemble) on a 2-core machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn out_dir() -> PathBuf {
    let dir = repo_root().join("target/verify");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn seed() -> u64 {
    std::env::var("VERIFY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn config(name: &str, engine: LockEngine, seconds: u64) -> Config {
    Config {
        engine,
        seed: seed(),
        duration: Duration::from_secs(seconds),
        component: None,
        threads: 8,
        processes: 2,
        ids: 3,
        history: out_dir().join(format!("{name}-seed{}.jsonl", seed())),
        process_faults: true,
    }
}

fn run_and_log(name: &str, config: &Config) -> RunResult {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let result = run(config);
    let line = format!("{name}: {}", result.summary(config));
    println!("{line}\n{}", result.report);
    use std::io::Write;
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out_dir().join("results.txt"))
        .and_then(|mut f| writeln!(f, "{line}"));
    result
}

/// A real run: legal, and the nemesis bit.
fn assert_legal_and_bitten(name: &str, result: &RunResult, kinds: &[&str]) {
    let history = format!("target/verify/{name}-seed{}.jsonl", seed());
    assert!(
        result.report.legal(),
        "{name}: the checker found anomalies (history {history}):\n{}",
        result.report
    );
    assert!(
        result.report.unknown() > 0,
        "{name}: no operation had an unknown outcome: the nemesis did not bite"
    );
    assert!(
        result.random_takeovers > 0,
        "{name}: no lock takeover on the random workload's ids: the nemesis did not bite"
    );
    assert!(
        result.cli_leases > 0,
        "{name}: no lease recorded by a CLI process (CLICKHOUSE_COMPONENT_LOCK_RECORD)"
    );
    assert!(
        result.writes_ahead > 0,
        "{name}: no update wrote ahead of its lock's confirmation: that path went unchecked"
    );
    for kind in kinds {
        assert!(
            result.faults.get(*kind).copied().unwrap_or(0) > 0,
            "{name}: no '{kind}' fault was injected ({:?})",
            result.faults
        );
    }
}

const REQUEST_FAULTS: [&str; 6] = [
    "refuse",
    "cut request",
    "lost reply",
    "cut reply",
    "stall",
    "delay",
];

#[test]
fn merge_tree_history_under_restarts_and_request_faults_is_legal() {
    let name = "merge-tree";
    let result = run_and_log(name, &config(name, LockEngine::MergeTree, 30));
    let mut kinds = REQUEST_FAULTS.to_vec();
    kinds.push("clickhouse restart");
    assert_legal_and_bitten(name, &result, &kinds);
}

#[test]
fn keeper_map_history_on_a_three_node_ensemble_under_the_full_nemesis_is_legal() {
    let name = "keeper-map";
    let result = run_and_log(name, &config(name, LockEngine::KeeperMap, 45));
    let mut kinds = REQUEST_FAULTS.to_vec();
    kinds.extend([
        "clickhouse restart",
        "zookeeper leader kill",
        "zookeeper pause",
    ]);
    assert_legal_and_bitten(name, &result, &kinds);
}

/// Each planted bug (a build of the real component with one `planted-bug-*` feature) runs the
/// same workload against the same engine, and the checker must find the anomaly it causes.
#[test]
fn the_checker_catches_each_planted_bug() {
    let bugs = [
        // A fenced write lets a holder whose lease ended write (the slow holder's write).
        (
            "planted-bug-no-fence",
            "fenced write accepted after its lease ended",
        ),
        // A renewal after the lease ended brings the lease back over the next holder's.
        ("planted-bug-renew-ignores-expiry", "mutual exclusion"),
        // Two updates read the same state before either holds the lock: the second writes a
        // state without the first's key, which no order of the operations explains.
        ("planted-bug-update-reads-outside-lock", "not linearizable"),
        // An update written ahead of its lock's confirmation does not check that the state it
        // merged into is still stored: it drops what another client wrote since.
        ("planted-bug-write-ahead-unchecked", "not linearizable"),
    ];
    // VERIFY_PLANTED=FEATURE runs that one only.
    let only = std::env::var("VERIFY_PLANTED").ok();
    let mut missed = Vec::new();
    for (feature, expected) in bugs {
        if only.as_deref().is_some_and(|f| f != feature) {
            continue;
        }
        let wasm = repo_root().join(format!("target/planted-bugs/{feature}.wasm"));
        assert!(
            wasm.exists(),
            "{} not built: run scripts/planted-bugs (make test and make planted-bugs do)",
            wasm.display()
        );
        let mut config = config(feature, LockEngine::MergeTree, 15);
        config.component = Some(wasm);
        config.processes = 1;
        config.process_faults = false;
        let result = run_and_log(feature, &config);
        // The directed episodes (workload.rs) catch each bug every run: on their own id, not
        // only when the random workload happens on the bug's schedule.
        let found = result
            .report
            .anomalies
            .iter()
            .any(|a| a.contains(expected) && a.contains("\"job-directed\""));
        if !found {
            missed.push(format!(
                "{feature}: expected '{expected}' on \"job-directed\"\n{}",
                result.report
            ));
        }
    }
    assert!(
        missed.is_empty(),
        "planted bugs not caught:\n{}",
        missed.join("\n")
    );
}

/// `make soak SECONDS=N`: each engine for N seconds (`VERIFY_SECONDS`, default 300).
#[test]
#[ignore = "long: make soak SECONDS=N"]
fn soak() {
    let seconds = std::env::var("VERIFY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    for (name, engine) in [
        ("soak-merge-tree", LockEngine::MergeTree),
        ("soak-keeper-map", LockEngine::KeeperMap),
    ] {
        let result = run_and_log(name, &config(name, engine, seconds));
        let kinds: &[&str] = if engine == LockEngine::KeeperMap {
            &[
                "zookeeper leader kill",
                "zookeeper pause",
                "clickhouse restart",
            ]
        } else {
            &["clickhouse restart"]
        };
        assert_legal_and_bitten(name, &result, kinds);
    }
}

/// `make check-history FILE=F`: the checker alone on a recorded history exits 0 on a legal one,
/// 1 on one with an anomaly (a lost update here), 2 on a file it cannot read.
#[test]
fn check_history_judges_a_recorded_history_by_its_exit_code() {
    let dir = out_dir();
    let line = |process: &str, op: &str, start: u64, end: u64, extra: &str| {
        format!(
            r#"{{"process":"{process}","op":"{op}","id":"job","start":{start},"end":{end},"outcome":"ok"{extra}}}"#
        )
    };
    let write = line("a", "update", 0, 10, r#","key":"k1","keys":["k1"]"#);
    let legal = [write.clone(), line("b", "get", 20, 30, r#","keys":["k1"]"#)];
    let lost = [write, line("b", "get", 20, 30, r#","keys":null"#)];
    let run = |name: &str, lines: &[String]| {
        let path = dir.join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_check-history"))
            .arg(&path)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, stdout) = run("check-legal.jsonl", &legal);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("legal: no anomaly"), "{stdout}");
    let (code, stdout) = run("check-lost.jsonl", &lost);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("lost update"), "{stdout}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_check-history"))
        .arg(dir.join("no-such-history.jsonl"))
        .status()
        .unwrap();
    assert_eq!(missing.code(), Some(2));
}
