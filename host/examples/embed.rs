//! Embedding example: load the component once, then use it from several tasks at once, each
//! with its own instance (a store per task): a state-store round trip and a sink send per task.
//!
//! `cargo run -p clickhouse-component-host --example embed` with CLICKHOUSE_URL (and
//! CLICKHOUSE_USER / CLICKHOUSE_PASSWORD) set; with EXAMPLE_SINK_TABLE naming an existing table
//! with columns `task UInt64, n UInt64`, each task also sends rows into it. Prints one line per
//! task; exits non-zero on any error. The test suite runs it against the local ClickHouse.

use clickhouse_component::host_api::ConnectionOptions;
use clickhouse_component_host::{
    default_allow_list, CachePolicy, ComponentSource, Runtime, SinkOptions, State, StoreOptions,
    Value,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let connection = ConnectionOptions {
        url: std::env::var("CLICKHOUSE_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into()),
        user: std::env::var("CLICKHOUSE_USER").ok(),
        password: std::env::var("CLICKHOUSE_PASSWORD").ok(),
        ..Default::default()
    };
    let database = format!("embed_example_{}", std::process::id());
    let sink_table = std::env::var("EXAMPLE_SINK_TABLE").ok();

    // Once per process: engine, compiled component (cached on disk), linker.
    let runtime = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Default)?;
    let allow = default_allow_list(&connection)?;

    let mut tasks = Vec::new();
    for task in 0..4 {
        // `Runtime` is cheap to clone and Send + Sync; each task gets its own instance.
        let (runtime, allow, connection, database, sink_table) = (
            runtime.clone(),
            allow.clone(),
            connection.clone(),
            database.clone(),
            sink_table.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut instance = runtime.instantiate(allow).await?;
            let store = instance
                .open_store(
                    &connection,
                    &StoreOptions {
                        database: Some(database.clone()),
                        ..Default::default()
                    },
                )
                .await?;
            let id = format!("task-{task}");
            instance
                .state_update(
                    store,
                    &State {
                        id: id.clone(),
                        partial: format!(r#"{{"bookmark":{task}}}"#),
                        completed: String::new(),
                    },
                )
                .await?;
            let state = instance.state_get(store, &id).await?.expect("just written");
            let mut sent = String::new();
            if let Some(table) = sink_table {
                let sink = instance
                    .open_sink(
                        &connection,
                        &SinkOptions {
                            table,
                            columns: None,
                            batch_size: Some(2),
                            settings: vec![],
                            dedup: None,
                            retries: None,
                            compression: None,
                        },
                    )
                    .await?;
                let rows: Vec<Vec<(String, Value)>> = (0..5)
                    .map(|n| {
                        vec![
                            ("task".to_string(), Value::Uint(task)),
                            ("n".to_string(), Value::Uint(n)),
                        ]
                    })
                    .collect();
                let receipt = instance.sink_send(sink, &rows).await?;
                sent = format!(", sent {} rows in {} chunks", receipt.rows, receipt.chunks);
            }
            Ok::<_, anyhow::Error>(format!(
                "task {task}: state {} = {}{sent}",
                state.id, state.partial
            ))
        }));
    }

    let mut failed = false;
    for task in tasks {
        match task.await? {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("error: {e:#}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
