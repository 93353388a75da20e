//! Test helper: a critical section that records its enter and exit times in ClickHouse
//! (server clock), for the lock contention tests. Run under `clickhouse-component lock ID --`.
//!
//! `cs-record DATABASE TABLE WORKER SEQ` with CLICKHOUSE_URL / _USER / _PASSWORD set.

use clickhouse_component::client::ConnectionOptions;
use clickhouse_component_tests::native::Sql;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, db, table, worker, seq] = args.as_slice() else {
        eprintln!("usage: cs-record DATABASE TABLE WORKER SEQ");
        std::process::exit(2);
    };
    let sql = Sql::new(&ConnectionOptions {
        url: std::env::var("CLICKHOUSE_URL").expect("CLICKHOUSE_URL"),
        user: std::env::var("CLICKHOUSE_USER").ok(),
        password: std::env::var("CLICKHOUSE_PASSWORD").ok(),
        ..Default::default()
    });
    clickhouse_component_tests::record_section(&sql, db, table, worker, seq.parse().unwrap());
}
