//! `lock ID [--hold DURATION | -- COMMAND ARGS...]`: hold the advisory lock on a state id
//! while a command runs (renewing its lease), release it after, and exit with the command's
//! status.

use std::time::{Duration, Instant};

use clap::Args;
use clickhouse_component::client::Error;
use clickhouse_component_host::config::GlobalArgs;
use clickhouse_component_host::CallError;
use serde_json::json;

use super::{open_store, Output, StoreArgs};

/// Arguments of `lock`.
#[derive(Args, Debug)]
pub struct LockArgs {
    /// Where the states live.
    #[command(flatten)]
    pub store: StoreArgs,
    /// State id to lock.
    pub id: String,
    /// Hold the lock this long, then release it (e.g. 500ms, 10s, 2m).
    #[arg(long, value_parser = parse_duration, conflicts_with = "command")]
    pub hold: Option<Duration>,
    /// The command to run while holding the lock (after --).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Parses `500ms`, `10s`, `2m`, `1h` or a plain number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&text[..i], &text[i..]),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration '{text}' (examples: 500ms, 10s, 2m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("unknown unit '{unit}' (use ms, s, m or h)")),
    };
    if !seconds.is_finite() || !(0.0..=365.0 * 86400.0).contains(&seconds) {
        return Err(format!("duration '{text}' is out of range"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Runs `lock`.
pub async fn run(global: &GlobalArgs, args: &LockArgs) -> Result<Output, CallError> {
    if args.hold.is_none() && args.command.is_empty() {
        return Err(CallError::Component(Error::invalid(
            "give --hold DURATION or a command after --",
        )));
    }
    let options = args.store.options().map_err(CallError::Component)?;
    let stale = Duration::from_millis(u64::from(options.stale_after_ms.unwrap_or(300_000)));
    let (mut session, store) = open_store(global, &args.store).await?;
    let instance = &mut session.instance;
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

    let code: i32 = if let Some(hold) = args.hold {
        let until = tokio::time::sleep(hold);
        tokio::pin!(until);
        loop {
            tokio::select! {
                _ = &mut until => break 0,
                _ = renew.tick() => instance.lock_renew(lock).await?,
            }
        }
    } else {
        let mut child = match tokio::process::Command::new(&args.command[0])
            .args(&args.command[1..])
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                let _ = instance.lock_release(lock).await;
                eprintln!("lock: cannot run '{}': {e}", args.command[0]);
                return Ok(Output {
                    text: String::new(),
                    json: json!({"ok": false, "error": {"kind": "command", "message": e.to_string()}}),
                    code: 127,
                });
            }
        };
        loop {
            tokio::select! {
                status = child.wait() => {
                    let status = status.map_err(|e| CallError::Runner(e.into()))?;
                    break exit_code(status);
                }
                _ = renew.tick() => instance.lock_renew(lock).await?,
            }
        }
    };
    let held = held_from.elapsed();
    instance.lock_release(lock).await?;
    let json = json!({
        "ok": code == 0,
        "id": args.id,
        "token": token,
        "waited_ms": waited.as_secs_f64() * 1e3,
        "held_ms": held.as_secs_f64() * 1e3,
        "exit_code": code,
    });
    Ok(Output {
        text: String::new(),
        json,
        code: u8::try_from(code).unwrap_or(1),
    })
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

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
