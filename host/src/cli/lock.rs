//! `lock ID -- COMMAND ARGS...`: hold the advisory lock on a state id while a command runs,
//! renewing its lease, release it after, and exit with the command's status. Only the host can
//! start processes, so this one command runs here, through the component's library exports;
//! `lock ID --hold D` runs in the component like every other command.

use std::time::{Duration, Instant};

use clickhouse_component::cli::lock::LockArgs;
use clickhouse_component::cli::{GlobalArgs, StoreArgs};
use clickhouse_component_host::config::HostArgs;
use clickhouse_component_host::{CallError, Runtime, StoreOptions};
use serde_json::json;

/// The WIT store options for the shared store arguments.
fn store_options(store: &StoreArgs) -> Result<StoreOptions, CallError> {
    let o = store.options().map_err(CallError::Component)?;
    let ms = |d: Duration| Some(u32::try_from(d.as_millis()).unwrap_or(u32::MAX));
    Ok(StoreOptions {
        database: Some(o.database),
        table: Some(o.table),
        lock_table: o.lock_table,
        create_schema: Some(o.create_schema),
        lock_timeout_ms: ms(o.lock.timeout),
        lock_retry_ms: ms(o.lock.retry),
        stale_after_ms: ms(o.lock.stale_after),
    })
}

/// Runs `lock ID -- COMMAND`; returns the command's exit code and the JSON report.
pub async fn run(
    host: &HostArgs,
    global: &GlobalArgs,
    args: &LockArgs,
) -> Result<(i32, serde_json::Value), CallError> {
    let options = store_options(&args.store)?;
    let stale = Duration::from_millis(u64::from(options.stale_after_ms.unwrap_or(300_000)));
    let connection = global.connection().map_err(CallError::Component)?;
    let allow = host.allow_list(&connection).map_err(CallError::Component)?;
    let runtime = Runtime::new(&host.component_source(), &host.cache_policy())?;
    let mut instance = runtime.instantiate(allow).await?;
    let store = instance.open_store(&connection, &options).await?;
    let started = Instant::now();
    let lock = instance.lock(store, &args.id).await?;
    let token = instance.lock_token(lock).await?;
    let waited = started.elapsed();
    eprintln!(
        "lock: acquired '{}' (token {token}) after {:.1} ms",
        args.id.escape_debug(),
        waited.as_secs_f64() * 1e3
    );
    // Renew well within the lease so a long command keeps the lock.
    let mut renew = tokio::time::interval((stale / 3).max(Duration::from_millis(50)));
    renew.tick().await;
    let held_from = Instant::now();
    let mut child = match tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let _ = instance.lock_release(lock).await;
            eprintln!("lock: cannot run '{}': {e}", args.command[0]);
            return Ok((
                127,
                json!({"ok": false, "error": {"kind": "command", "message": e.to_string()}}),
            ));
        }
    };
    let code = loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| CallError::Runner(e.into()))?;
                break exit_code(status);
            }
            _ = renew.tick() => instance.lock_renew(lock).await?,
        }
    };
    let held = held_from.elapsed();
    instance.lock_release(lock).await?;
    Ok((
        code,
        json!({
            "ok": code == 0,
            "id": args.id,
            "token": token,
            "waited_ms": waited.as_secs_f64() * 1e3,
            "held_ms": held.as_secs_f64() * 1e3,
            "exit_code": code,
        }),
    ))
}

#[cfg(unix)]
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[cfg(not(unix))]
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or(1)
}
