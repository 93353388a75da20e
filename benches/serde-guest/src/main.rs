//! The bench-only serde guest (`make bench BENCH=typed`; never shipped): serde_json's typed read
//! of the typed section's NDJSON rows, built for `wasm32-wasip2` as a WASI command and run by
//! the bench under the host's wasmtime. It is the floor the component's first pass (read, check
//! every value for its column's type, encode Native, compress) must beat by 1.5x (issue 47).
//!
//! `serde-guest <events|mixed> <file.ndjson>`: reads the file, parses every line with
//! `serde_json::from_slice` into the shape's `#[derive(Deserialize)]` struct, folds each row into
//! a checksum (so no parse is optimised away) and prints one JSON line:
//! `{"rows":N,"bytes":B,"seconds":S,"checksum":C}`, `seconds` measured here with
//! `std::time::Instant` from opening the file to the last row (the bytes read include the
//! newlines: the file's size). A line that does not parse into the shape ends the program with
//! status 1 and a message naming the line.
//!
//! How it reads: `std::fs::File` in a 1 MiB `BufReader` (the CLI's buffer), one line at a time
//! with `read_until` into one reused buffer, as a program that streams a file would (the
//! CLI's own first pass reads lines the same way). The strings are `Cow<str>` borrowed from
//! that line (`#[serde(borrow)]`; owned only when a string has an escape, none here). Both
//! choices are the faster ones, as the floor should be: under wasmtime 48 (1M rows, best of
//! six, 2026-12-05) the events file read in 0.34 s this way, 0.42 s with `String` fields and
//! 0.45 s read whole (`read_to_end`, then split); the 6-column file 0.46, 0.54 and 0.56 s.
//!
//! Built as the CLI's component is (`make bench`: release, opt-level 3). Built with wasm's
//! `simd128` too it reads no faster (0.36 s and 0.53 s, within the runs' noise): serde_json's
//! scans are scalar, so the floor does not depend on that flag.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::time::Instant;

use serde::Deserialize;

/// A row of the `events` table (benches/src/typed.rs, `event_line`).
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    event_id: Cow<'a, str>,
    seq: u64,
    #[serde(borrow)]
    occurred_at: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    payload: Cow<'a, str>,
}

impl Event<'_> {
    fn checksum(&self) -> u64 {
        (self.event_id.len() + self.occurred_at.len() + self.kind.len() + self.payload.len()) as u64
            ^ self.seq
    }
}

/// A row of the 6-column `mixed` table (benches/src/typed.rs, `mixed_line`).
#[derive(Deserialize)]
struct Mixed<'a> {
    id: u64,
    #[serde(borrow)]
    at: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    amount: Cow<'a, str>,
    #[serde(borrow)]
    tags: Vec<Cow<'a, str>>,
    #[serde(borrow)]
    note: Cow<'a, str>,
}

impl Mixed<'_> {
    fn checksum(&self) -> u64 {
        let tags: usize = self.tags.iter().map(|t| t.len() + 1).sum();
        (self.at.len() + self.kind.len() + self.amount.len() + tags + self.note.len()) as u64
            ^ self.id
    }
}

/// What one read measured.
struct Read {
    rows: u64,
    bytes: u64,
    seconds: f64,
    checksum: u64,
}

/// Reads `path` line by line and parses each non-blank line with `parse` (which returns the
/// row's checksum); the first failure ends the read with a message naming its line.
fn read_lines(
    path: &str,
    parse: impl Fn(&[u8]) -> serde_json::Result<u64>,
) -> Result<Read, String> {
    let started = Instant::now();
    let file = File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(4096);
    let (mut rows, mut bytes, mut checksum, mut number) = (0u64, 0u64, 0u64, 0u64);
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("cannot read {path}: {e}"))?;
        if n == 0 {
            break;
        }
        number += 1;
        bytes += n as u64;
        // A blank line is no row (the first byte of a row is `{`: this stops there).
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let sum = parse(&line).map_err(|e| format!("{path}, line {number}: {e}"))?;
        checksum = checksum.wrapping_mul(31).wrapping_add(sum);
        rows += 1;
    }
    Ok(Read {
        rows,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        checksum,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [shape, path] = &args[..] else {
        eprintln!("usage: serde-guest <events|mixed> <file.ndjson>");
        std::process::exit(2);
    };
    let read = match shape.as_str() {
        "events" => read_lines(path, |line| {
            serde_json::from_slice::<Event>(line).map(|r| r.checksum())
        }),
        "mixed" => read_lines(path, |line| {
            serde_json::from_slice::<Mixed>(line).map(|r| r.checksum())
        }),
        other => {
            eprintln!("serde-guest: unknown shape {other:?} (events or mixed)");
            std::process::exit(2);
        }
    };
    match read {
        Ok(r) => println!(
            "{{\"rows\":{},\"bytes\":{},\"seconds\":{},\"checksum\":{}}}",
            r.rows, r.bytes, r.seconds, r.checksum
        ),
        Err(message) => {
            eprintln!("serde-guest: {message}");
            std::process::exit(1);
        }
    }
}
