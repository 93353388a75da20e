//! Histories of the lock and the state store (docs/verification.md): one JSON line per
//! operation, with its invocation and completion on `CLOCK_MONOTONIC` (one clock for every
//! thread and process on the machine), written by the workload's threads ([`Recorder`]), by
//! the drivers of CLI processes, and by the CLI itself through its recording hook
//! (`CLICKHOUSE_COMPONENT_LOCK_RECORD`, host/src/cli/record.rs: the same format).
//!
//! ```json
//! {"process":"t3","op":"update","id":"s1","key":"t3-17","start":1200,"end":3400,"outcome":"ok","keys":["t0-2","t3-17"]}
//! ```
//!
//! * `op`: `acquire`, `renew`, `release` (the lock: `token`, `lease_ms`), `update` (Meltano's
//!   update adding the unique top-level partial key `key`; `keys`: the partial's keys as
//!   returned, when known), `lock.update` / `lock.set` (fenced by `token`: add `key` / replace
//!   the state by `{key}`), `get` (`keys`: the partial's keys, `null` for no state), `delete`.
//! * `outcome`: `ok`, `fail` (certainly not applied: an error kind other than `uncertain`),
//!   `unknown` (`uncertain`, a lost answer, a runner failure, a process killed midway: it may
//!   or may not have taken effect, at any time after `start`). `end` is when the caller learnt
//!   the outcome; an unknown operation may take effect later than that.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock of every record).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into; CLOCK_MONOTONIC exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It took effect (and returned what is recorded).
    Ok,
    /// It certainly took no effect.
    Fail,
    /// It may or may not have taken effect.
    Unknown,
}

/// One operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The client (thread `t3`, process `pid-4242`, CLI driver `p1`).
    pub process: String,
    /// The operation (module documentation).
    pub op: String,
    /// The state id.
    pub id: String,
    /// Invocation (ns, `CLOCK_MONOTONIC`).
    pub start: u64,
    /// Completion (ns), when the caller learnt the outcome.
    pub end: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The lock token (lock operations and fenced writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The lease (lock operations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// The key an update or set writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The partial's keys read (a `get`; `None` inside, `null` in the file: no state) or
    /// returned (an `update`); `None` (absent from the line): not known.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub keys: Option<Option<Vec<String>>>,
    /// The error, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Record {
    /// A record of `op` on `id` by `process` from `start` to now.
    pub fn new(process: &str, op: &str, id: &str, start: u64, outcome: Outcome) -> Record {
        Record {
            process: process.into(),
            op: op.into(),
            id: id.into(),
            start,
            end: now_ns(),
            outcome,
            token: None,
            lease_ms: None,
            key: None,
            keys: None,
            error: None,
        }
    }
}

/// A field that is present is `Some`, also when it is `null` (serde would read `null` as an
/// absent field: `None`).
fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<Vec<String>>>, D::Error> {
    Option::<Vec<String>>::deserialize(d).map(Some)
}

/// Appends records to a history file (one JSON line each), shared by threads.
pub struct Recorder {
    file: Mutex<std::fs::File>,
}

impl Recorder {
    /// Creates (or appends to) the file at `path`.
    pub fn create(path: &Path) -> Recorder {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("opening the history {}: {e}", path.display()));
        Recorder {
            file: Mutex::new(file),
        }
    }

    /// Appends one record.
    pub fn record(&self, record: &Record) {
        let mut line = serde_json::to_string(record).unwrap();
        line.push('\n');
        self.file
            .lock()
            .unwrap()
            .write_all(line.as_bytes())
            .expect("writing the history");
    }
}

/// Reads a history file: every line a [`Record`].
pub fn read(path: &Path) -> Result<Vec<Record>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_of_no_state_survives_the_file() {
        let mut r = Record::new("t0", "get", "job", 1, Outcome::Ok);
        for keys in [None, Some(None), Some(Some(vec!["k1".to_string()]))] {
            r.keys = keys;
            let line = serde_json::to_string(&r).unwrap();
            let back: Record = serde_json::from_str(&line).unwrap();
            assert_eq!(back, r, "{line}");
        }
    }
}
