//! `check`: connect through the component and show who the server is.

use clickhouse_component::client::Endpoint;
use clickhouse_component_host::config::GlobalArgs;
use clickhouse_component_host::CallError;
use serde_json::json;

use super::{session, Output};

/// Runs `check`.
pub async fn run(global: &GlobalArgs) -> Result<Output, CallError> {
    let started = std::time::Instant::now();
    let mut s = session(global).await?;
    let info = s.instance.ping(&s.connection).await?;
    let total = started.elapsed();
    let origin = Endpoint::parse(&s.connection)
        .map(|e| e.origin())
        .unwrap_or_default();
    let round_trip_ms = info.round_trip_us as f64 / 1e3;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let text = format!(
        "ClickHouse {} at {origin}\n  user        {}\n  database    {}\n  timezone    {}\n  round trip  {round_trip_ms:.2} ms\n  component   {:?} in {:.1} ms; ready in {:.1} ms; total {:.1} ms\n",
        info.version,
        info.user,
        info.database,
        info.timezone,
        s.load.kind,
        ms(s.load.duration),
        ms(s.ready),
        ms(total)
    );
    let json = json!({
        "ok": true,
        "server": origin,
        "version": info.version,
        "user": info.user,
        "database": info.database,
        "timezone": info.timezone,
        "round_trip_ms": round_trip_ms,
        "component_load": format!("{:?}", s.load.kind),
        "component_load_ms": ms(s.load.duration),
        "ready_ms": ms(s.ready),
        "total_ms": ms(total),
    });
    Ok(Output::new(text, json))
}
