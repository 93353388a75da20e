//! `lock ID --hold DURATION`: hold the advisory lock on a state id, renewing its lease, then
//! release it. Running a command under the lock (`lock ID -- COMMAND`) needs a runner that can
//! start processes: the reference host does it; the component alone refuses it.

use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::client::{Client, Error, Transport};
use crate::platform::Platform;
use crate::state::StateStore;

use super::{GlobalArgs, Output, Runner, StoreArgs};

/// Arguments of `lock`.
#[derive(Args, Debug, Clone)]
pub struct LockArgs {
    /// Where the states live.
    #[command(flatten)]
    pub store: StoreArgs,
    /// State id to lock.
    pub id: String,
    /// Hold the lock this long, then release it (e.g. 500ms, 10s, 2m).
    #[arg(long, value_parser = parse_duration, conflicts_with = "command")]
    pub hold: Option<Duration>,
    /// The command to run while holding the lock (after --; reference host only).
    #[arg(last = true)]
    pub command: Vec<String>,
    /// With a command: if renewals keep failing, stop it (SIGTERM) once its lease could end
    /// within this time (default: twice --term-grace, so SIGKILL comes --term-grace before the
    /// lease can end). Must be under 2/3 of the lease.
    #[arg(long, value_parser = parse_duration, conflicts_with = "hold")]
    pub stop_before: Option<Duration>,
    /// With a command: time it has after SIGTERM, or after a signal passed on to it, before
    /// SIGKILL (default: a tenth of the lease, at most 10s). Must be under --stop-before.
    #[arg(long, value_parser = parse_duration, conflicts_with = "hold")]
    pub term_grace: Option<Duration>,
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

/// Runs `lock ID --hold D` (the component's part of `lock`).
pub fn run<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    args: &LockArgs,
    runner: &mut Runner<'_, T, P>,
) -> Result<Output, Error> {
    if !args.command.is_empty() {
        return Err(Error::invalid(
            "running a command under the lock needs the reference host (clickhouse-component); this runner cannot start processes: use --hold",
        ));
    }
    let Some(hold) = args.hold else {
        return Err(Error::invalid("give --hold DURATION or a command after --"));
    };
    let options = args.store.options()?;
    let stale = options.lock.stale_after;
    let client = Client::new(&global.connection()?, runner.transport.clone())?;
    let store = StateStore::open(client, runner.platform.clone(), &options)?;
    let started = runner.platform.now();
    let handle = store.lock(&args.id)?;
    let waited = runner.platform.now() - started;
    let _ = writeln!(
        runner.stderr,
        "lock: acquired '{}' (token {}) after {:.1} ms",
        crate::state::escape_id(&args.id),
        handle.token,
        waited.as_secs_f64() * 1e3
    );
    let renew_every = (stale / 3).max(Duration::from_millis(50));
    let held_from = runner.platform.now();
    let until = held_from + hold;
    loop {
        let now = runner.platform.now();
        if now >= until {
            break;
        }
        runner.platform.sleep((until - now).min(renew_every));
        if runner.platform.now() < until {
            if let Err(e) = store.renew(&handle) {
                // Give back what may still be held (a no-op if the lease is gone).
                let _ = store.release(&handle);
                return Err(e);
            }
        }
    }
    let held = runner.platform.now() - held_from;
    store.release(&handle)?;
    Ok(Output::new(
        String::new(),
        json!({
            "ok": true,
            "id": args.id,
            "token": handle.token,
            "waited_ms": waited.as_secs_f64() * 1e3,
            "held_ms": held.as_secs_f64() * 1e3,
            "exit_code": 0,
        }),
    ))
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
