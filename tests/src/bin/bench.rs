//! Benchmarks: prints a table. Run with `make bench` (starts the local ClickHouse unless
//! CLICKHOUSE_URL is set). Sections: `state` (state store latencies against a raw HTTP round
//! trip of the same query); select with `bench state`; all by default.

use std::time::{Duration, Instant};

use clickhouse_component::client::Query;
use clickhouse_component_host::{default_allow_list, State, StoreOptions};
use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::{clickhouse, runtime, unique_name};

/// p50 and p99 of samples, in milliseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e3
    };
    (at(0.50), at(0.99))
}

fn row(name: &str, samples: &mut [Duration], note: &str) -> (f64, f64) {
    let (p50, p99) = percentiles(samples);
    println!("| {name:<44} | {p50:>8.2} | {p99:>8.2} | {note} |");
    (p50, p99)
}

async fn bench_state(iterations: usize) {
    let server = clickhouse();
    let conn = server.connection();
    let db = unique_name("bench_state");
    let mut i = runtime()
        .instantiate(default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    let s = i
        .open_store(
            &conn,
            &StoreOptions {
                database: Some(db.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let state = |n: usize| State {
        id: "tap-bench--target-bench".into(),
        partial: String::new(),
        completed: format!(
            r#"{{"singer_state":{{"bookmarks":{{"stream":{{"replication_key_value":"2026-11-29T00:00:{:02}Z"}}}}}}}}"#,
            n % 60
        ),
    };
    i.state_set(s, &state(0)).await.unwrap();
    let sql = Sql::new(&conn);
    let raw_get = Query::read(
        "raw-get",
        "SELECT state_id, partial_state, completed_state FROM {db:Identifier}.{t:Identifier} FINAL WHERE state_id = {id:String} LIMIT 1",
    )
    .param("db", &db)
    .param("t", "state")
    .param("id", "tap-bench--target-bench")
    .format("JSONEachRow");
    // Warm up every path.
    for n in 0..20 {
        sql.client().execute(&raw_get).unwrap();
        i.state_get(s, "tap-bench--target-bench").await.unwrap();
        i.state_set(s, &state(n)).await.unwrap();
    }
    let mut raw = Vec::new();
    let mut get = Vec::new();
    let mut set = Vec::new();
    let mut update = Vec::new();
    let mut lock = Vec::new();
    let mut raw_insert = Vec::new();
    let insert_body = |n: usize| {
        format!(
            "{}\n",
            serde_json::json!({"state_id": "raw", "partial_state": null, "completed_state": state(n).completed})
        )
        .into_bytes()
    };
    for n in 0..iterations {
        let t = Instant::now();
        sql.client().execute(&raw_get).unwrap();
        raw.push(t.elapsed());

        let t = Instant::now();
        sql.client()
            .execute(
                &Query::write(
                    "raw-set",
                    "INSERT INTO {db:Identifier}.{t:Identifier} (state_id, partial_state, completed_state) FORMAT JSONEachRow",
                )
                .param("db", &db)
                .param("t", "state")
                .data(insert_body(n)),
            )
            .unwrap();
        raw_insert.push(t.elapsed());

        let t = Instant::now();
        i.state_get(s, "tap-bench--target-bench")
            .await
            .unwrap()
            .unwrap();
        get.push(t.elapsed());

        let t = Instant::now();
        i.state_set(s, &state(n)).await.unwrap();
        set.push(t.elapsed());

        let t = Instant::now();
        let partial = State {
            id: "tap-bench--target-bench".into(),
            partial: format!(
                r#"{{"singer_state":{{"bookmarks":{{"s{}":{{"v":{n}}}}}}}}}"#,
                n % 5
            ),
            completed: String::new(),
        };
        i.state_update(s, &partial).await.unwrap();
        update.push(t.elapsed());

        let t = Instant::now();
        let l = i.lock(s, "lock-bench").await.unwrap();
        i.lock_release(l).await.unwrap();
        lock.push(t.elapsed());
    }
    println!(
        "\nState store ({iterations} iterations each, one warm component instance, {})\n",
        server.url
    );
    println!("| operation                                    | p50 (ms) | p99 (ms) | notes |");
    println!("|----------------------------------------------|---------:|---------:|-------|");
    let (raw50, _) = row(
        "raw HTTP round trip: the get query (native)",
        &mut raw,
        "ureq, keep-alive",
    );
    let (rawi50, _) = row(
        "raw HTTP round trip: the set INSERT (native)",
        &mut raw_insert,
        "ureq, keep-alive",
    );
    let (get50, _) = row("get", &mut get, "1 request");
    let (set50, _) = row("set", &mut set, "1 request");
    let (upd50, _) = row(
        "update (lock + read + write + release)",
        &mut update,
        "4 requests",
    );
    row(
        "lock + release (uncontended)",
        &mut lock,
        "3 requests, no sleep",
    );
    println!();
    println!(
        "get - raw get:  {:+.2} ms (target: within 2 ms)",
        get50 - raw50
    );
    println!(
        "set - raw set:  {:+.2} ms (target: within 2 ms)",
        set50 - rawi50
    );
    println!("update p50:     {upd50:.2} ms (target: under 30 ms; meltano-state-backend-clickhouse sleeps >= 1000 ms per update)");
}

fn main() {
    let which: Vec<String> = std::env::args().skip(1).collect();
    let all = which.is_empty();
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if all || which.iter().any(|w| w == "state") {
        rt.block_on(bench_state(iterations));
    }
}
