//! Embedding example: load the component once, instantiate, ping a ClickHouse server.
//!
//! `cargo run -p clickhouse-component-host --example ping -- http://127.0.0.1:8123`
//! (credentials from CLICKHOUSE_USER / CLICKHOUSE_PASSWORD).

use clickhouse_component::host_api::ConnectionOptions;
use clickhouse_component_host::{default_allow_list, CachePolicy, ComponentSource, Runtime};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("CLICKHOUSE_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:8123".into());
    let connection = ConnectionOptions {
        url,
        user: std::env::var("CLICKHOUSE_USER").ok(),
        password: std::env::var("CLICKHOUSE_PASSWORD").ok(),
        ..Default::default()
    };

    // Once per process: engine + compiled component (cached on disk) + linker.
    let runtime = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Default)?;
    // Per session: an instance that may reach only the configured server.
    let mut instance = runtime
        .instantiate(default_allow_list(&connection)?)
        .await?;
    match instance.ping(&connection).await {
        Ok(info) => {
            println!(
                "ClickHouse {} ({}), user {}, round trip {} us",
                info.version, info.timezone, info.user, info.round_trip_us
            );
            Ok(())
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(e.exit_code());
        }
    }
}
