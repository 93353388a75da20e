//! The recording hook of `lock ID -- COMMAND` (docs/verification.md): when
//! `CLICKHOUSE_COMPONENT_LOCK_RECORD` names a file, every acquire, renewal and release the host
//! makes for the command is appended to it as one JSON line, so a history checker can place
//! this process's lease beside those of other clients:
//!
//! ```json
//! {"process":"pid-4242","op":"renew","id":"job","token":"…","lease_ms":3000,
//!  "start":123456789,"end":123459999,"outcome":"ok"}
//! ```
//!
//! `start` and `end` are `CLOCK_MONOTONIC` nanoseconds (one clock for every process on the
//! machine) taken just before the call and just after its answer; `outcome` is `ok`, `fail`
//! (the call failed and certainly changed nothing: the component's error kinds other than
//! `uncertain`) or `unknown` (`uncertain`, or the runner failed). A line is written once the
//! call has ended, with one `write` on a file opened for appending, so lines of processes
//! sharing the file never interleave. An acquire that fails records no token. Failing to
//! record is a warning, never an error of the command.

use std::io::Write;
use std::time::Duration;

use clickhouse_component::host_api::ErrorKind;
use clickhouse_component_host::CallError;
use serde_json::json;

/// The environment variable naming the record file.
pub const RECORD_ENV: &str = "CLICKHOUSE_COMPONENT_LOCK_RECORD";

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Where lock calls are recorded, if anywhere.
#[derive(Clone, Debug)]
pub struct Recorder {
    path: Option<std::path::PathBuf>,
    lease: Duration,
}

impl Recorder {
    /// From the environment ([`RECORD_ENV`]); a no-op when unset or empty.
    pub fn from_env(lease: Duration) -> Recorder {
        Recorder {
            path: std::env::var_os(RECORD_ENV)
                .filter(|p| !p.is_empty())
                .map(Into::into),
            lease,
        }
    }

    /// Records one call: `op` (`acquire`, `renew`, `release`) on `id` by `token`, which ran
    /// from `start` to now with `result`.
    pub fn record<T>(
        &self,
        op: &str,
        id: &str,
        token: Option<&str>,
        start: u64,
        result: &Result<T, CallError>,
    ) {
        let Some(path) = &self.path else { return };
        let end = monotonic_ns();
        let outcome = match result {
            Ok(_) => "ok",
            Err(CallError::Component(e)) if e.kind != ErrorKind::Uncertain => "fail",
            Err(_) => "unknown",
        };
        let mut line = json!({
            "process": format!("pid-{}", std::process::id()),
            "op": op,
            "id": id,
            "token": token,
            "lease_ms": self.lease.as_millis() as u64,
            "start": start,
            "end": end,
            "outcome": outcome,
        });
        if let Err(e) = result {
            line["error"] = json!(e.to_string());
        }
        let mut text = line.to_string();
        text.push('\n');
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "lock: warning: could not record to {} ({RECORD_ENV}): {e}",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_one_json_line_per_call_with_its_outcome() {
        let dir = std::env::temp_dir().join(format!("lock-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let recorder = Recorder {
            path: Some(path.clone()),
            lease: Duration::from_secs(3),
        };
        let start = monotonic_ns();
        recorder.record(
            "acquire",
            "job",
            Some("t1"),
            start,
            &Ok::<(), CallError>(()),
        );
        let uncertain = CallError::Component(clickhouse_component::host_api::Error::new(
            ErrorKind::Uncertain,
            "lost answer",
        ));
        recorder.record::<()>("renew", "job", Some("t1"), start, &Err(uncertain));
        let locked = CallError::Component(clickhouse_component::host_api::Error::new(
            ErrorKind::Locked,
            "lost",
        ));
        recorder.record::<()>("release", "job", Some("t1"), start, &Err(locked));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        let outcomes: Vec<_> = lines.iter().map(|l| l["outcome"].clone()).collect();
        assert_eq!(outcomes, [json!("ok"), json!("unknown"), json!("fail")]);
        assert_eq!(lines[0]["op"], "acquire");
        assert_eq!(lines[0]["lease_ms"], 3000);
        assert!(lines[0]["end"].as_u64().unwrap() >= start);
    }
}
