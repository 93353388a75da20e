//! `check-history FILE...`: runs the history checker (docs/verification.md) on recorded
//! histories (JSON lines, tests/src/history.rs), prints what it found, and exits 1 when it
//! found an anomaly or could not decide, 2 on a file it cannot read.

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: check-history FILE...");
        std::process::exit(2);
    }
    let mut records = Vec::new();
    for file in &files {
        match clickhouse_component_tests::history::read(std::path::Path::new(file)) {
            Ok(r) => records.extend(r),
            Err(e) => {
                eprintln!("check-history: {e}");
                std::process::exit(2);
            }
        }
    }
    let report = clickhouse_component_tests::checker::check(&records);
    print!("{report}");
    if report.legal() {
        println!("legal: no anomaly");
    } else {
        std::process::exit(1);
    }
}
