//! The tests crate's fault-injecting proxy ([`clickhouse_component_tests::proxy`]) as a
//! program, for tests in other languages (tests/python: `meltano run` through it).
//!
//! `fault_proxy UPSTREAM [--seed N] [--in-20 K] [--faults refuse,cut-request,drop-reply,cut-reply,stall] [--stall-ms MS]`
//!
//! Forwards to UPSTREAM (`http://127.0.0.1:PORT`), printing its own URL as the first line of
//! stdout. Request number `seq` (1-based) gets a fault when `seeded_hash(seed, seq) % 20` is
//! below K (default 5: a quarter), the fault chosen among `--faults` (default all five) by the
//! same slot; others pass. Commands on stdin, one a line: `pass` (every request passes from
//! now), `faults` (the seeded faults again), each answered `ok` on stdout once in force. At
//! the end of stdin it prints one JSON line,
//! `{"requests": N, "faults": {"DropReply": n, ...}}`, and exits.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use clickhouse_component_tests::proxy::{seeded_hash, Fault, Proxy, Rule};

fn fault_named(name: &str, stall: Duration) -> Option<Fault> {
    Some(match name {
        "refuse" => Fault::Refuse,
        "cut-request" => Fault::CutRequest,
        "drop-reply" => Fault::DropReply,
        "cut-reply" => Fault::CutReply,
        "stall" => Fault::Stall(stall),
        _ => return None,
    })
}

/// Says on stdout that a command is in force.
fn acknowledge() {
    println!("ok");
    let _ = std::io::stdout().flush();
}

fn usage(problem: &str) -> ! {
    eprintln!("fault_proxy: {problem}");
    eprintln!(
        "usage: fault_proxy UPSTREAM [--seed N] [--in-20 K] [--faults refuse,cut-request,drop-reply,cut-reply,stall] [--stall-ms MS]"
    );
    std::process::exit(2);
}

fn add_seeded(proxy: &Proxy, seed: u64, in_20: u64, faults: &Arc<Vec<Fault>>) {
    for (index, fault) in faults.iter().enumerate() {
        let faults = faults.clone();
        proxy.add(Rule::when(
            move |r| {
                let slot = seeded_hash(seed, r.seq) % 20;
                slot < in_20 && (slot as usize) % faults.len() == index
            },
            fault.clone(),
        ));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut upstream = None;
    let mut seed = 1u64;
    let mut in_20 = 5u64;
    let mut names = "refuse,cut-request,drop-reply,cut-reply,stall".to_string();
    let mut stall_ms = 2_000u64;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--seed" => {
                seed = value("--seed")
                    .parse()
                    .unwrap_or_else(|_| usage("bad --seed"))
            }
            "--in-20" => {
                in_20 = value("--in-20")
                    .parse()
                    .ok()
                    .filter(|k| *k <= 20)
                    .unwrap_or_else(|| usage("--in-20 takes 0 to 20"))
            }
            "--faults" => names = value("--faults"),
            "--stall-ms" => {
                stall_ms = value("--stall-ms")
                    .parse()
                    .unwrap_or_else(|_| usage("bad --stall-ms"))
            }
            _ if upstream.is_none() && !arg.starts_with('-') => upstream = Some(arg),
            _ => usage(&format!("unexpected argument {arg:?}")),
        }
    }
    let Some(upstream) = upstream else {
        usage("UPSTREAM is required")
    };
    let stall = Duration::from_millis(stall_ms);
    let faults: Vec<Fault> = names
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| fault_named(n, stall).unwrap_or_else(|| usage(&format!("unknown fault {n:?}"))))
        .collect();
    if faults.is_empty() {
        usage("--faults names none");
    }
    let faults = Arc::new(faults);
    let proxy = Proxy::start(&upstream);
    add_seeded(&proxy, seed, in_20, &faults);
    println!("{}", proxy.url());
    let _ = std::io::stdout().flush();
    for line in std::io::stdin().lock().lines() {
        match line.as_deref().map(str::trim) {
            Ok("pass") => {
                proxy.clear_rules();
                acknowledge();
            }
            Ok("faults") => {
                proxy.clear_rules();
                add_seeded(&proxy, seed, in_20, &faults);
                acknowledge();
            }
            Ok("") => {}
            Ok(other) => eprintln!("fault_proxy: unknown command {other:?}"),
            Err(_) => break,
        }
    }
    let log = proxy.log();
    let mut by_fault: BTreeMap<String, usize> = BTreeMap::new();
    for r in &log {
        if r.fault != Fault::Pass {
            let name = format!("{:?}", r.fault);
            *by_fault
                .entry(name.split('(').next().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    println!(
        "{}",
        serde_json::json!({"requests": log.len(), "faults": by_fault})
    );
}
