//! `check`: connect and show who the server is.

use serde_json::json;

use crate::client::{Client, Endpoint, Error, Transport};
use crate::platform::Platform;

use super::{GlobalArgs, Output, Runner};

/// Runs `check`.
pub fn run<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    runner: &mut Runner<'_, T, P>,
) -> Result<Output, Error> {
    let connection = global.connection()?;
    let client = Client::new(&connection, runner.transport.clone())?;
    let info = crate::server::ping(&client)?;
    let origin = Endpoint::parse(&connection)
        .map(|e| e.origin())
        .unwrap_or_default();
    let round_trip_ms = info.round_trip_us as f64 / 1e3;
    let text = format!(
        "ClickHouse {} at {origin}\n  user        {}\n  database    {}\n  timezone    {}\n  round trip  {round_trip_ms:.2} ms\n",
        info.version, info.user, info.database, info.timezone,
    );
    let json = json!({
        "ok": true,
        "server": origin,
        "version": info.version,
        "user": info.user,
        "database": info.database,
        "timezone": info.timezone,
        "round_trip_ms": round_trip_ms,
    });
    Ok(Output::new(text, json))
}
