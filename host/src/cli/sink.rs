//! `sink --table T [--columns a,b] [--batch-size N] [--dedup] [FILE|-]`: stream NDJSON (or a
//! JSON array) into a table chunk by chunk through the component. A reader thread cuts the input
//! into batches (memory stays bounded by a batch whatever the input size); each batch is one
//! `send-json` call, so one acknowledged INSERT per batch.

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use clickhouse_component::client::{Error, ErrorKind};
use clickhouse_component_host::config::GlobalArgs;
use clickhouse_component_host::{CallError, SinkOptions};
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{session, Output};

/// Arguments of `sink`.
#[derive(Args, Debug)]
pub struct SinkArgs {
    /// Target table: `table` or `database.table`.
    #[arg(long)]
    pub table: String,
    /// Columns every row must have (comma-separated), in order. Default: the first row's keys.
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Rows per INSERT.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: u32,
    /// Give each chunk a deduplication token (safe re-sends on deduplicating tables).
    #[arg(long)]
    pub dedup: bool,
    /// NDJSON or JSON-array file; - or nothing for stdin.
    pub file: Option<PathBuf>,
}

fn invalid(message: String) -> CallError {
    CallError::Component(Error::invalid(message))
}

/// A batch of input for one `send-json` call.
struct Batch {
    data: Vec<u8>,
    rows: u64,
}

/// Reads the input and sends batches of `batch_size` rows over `tx` (bounded: at most two
/// batches wait). NDJSON lines are passed through; array elements become an array per batch.
fn read_batches(
    reader: Box<dyn Read + Send>,
    batch_size: usize,
    tx: std::sync::mpsc::SyncSender<Result<Batch, String>>,
) {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let first = loop {
        let (skip, len, first) = match reader.fill_buf() {
            Ok(buf) => {
                let skip = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
                (skip, buf.len(), buf.get(skip).copied())
            }
            Err(e) => {
                let _ = tx.send(Err(format!("reading the input: {e}")));
                return;
            }
        };
        reader.consume(skip);
        if skip == len && len > 0 {
            continue;
        }
        break first;
    };
    if first == Some(b'[') {
        read_array(reader, batch_size, tx);
        return;
    }
    let mut batch = Batch {
        data: Vec::new(),
        rows: 0,
    };
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                batch.data.extend_from_slice(&line);
                if !line.ends_with(b"\n") {
                    batch.data.push(b'\n');
                }
                batch.rows += 1;
                if batch.rows as usize == batch_size {
                    let full = std::mem::replace(
                        &mut batch,
                        Batch {
                            data: Vec::new(),
                            rows: 0,
                        },
                    );
                    if tx.send(Ok(full)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(format!("reading the input: {e}")));
                return;
            }
        }
    }
    if batch.rows > 0 {
        let _ = tx.send(Ok(batch));
    }
}

/// Streams the elements of a top-level JSON array, `batch_size` at a time.
fn read_array(
    reader: BufReader<Box<dyn Read + Send>>,
    batch_size: usize,
    tx: std::sync::mpsc::SyncSender<Result<Batch, String>>,
) {
    struct Elements<'a> {
        batch_size: usize,
        tx: &'a std::sync::mpsc::SyncSender<Result<Batch, String>>,
    }
    impl<'de> Visitor<'de> for Elements<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of objects")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut batch = Batch {
                data: b"[".to_vec(),
                rows: 0,
            };
            while let Some(item) = seq.next_element::<Box<RawValue>>()? {
                if batch.rows > 0 {
                    batch.data.push(b',');
                }
                batch.data.extend_from_slice(item.get().as_bytes());
                batch.rows += 1;
                if batch.rows as usize == self.batch_size {
                    batch.data.push(b']');
                    let full = std::mem::replace(
                        &mut batch,
                        Batch {
                            data: b"[".to_vec(),
                            rows: 0,
                        },
                    );
                    if self.tx.send(Ok(full)).is_err() {
                        return Ok(());
                    }
                }
            }
            if batch.rows > 0 {
                batch.data.push(b']');
                let _ = self.tx.send(Ok(batch));
            }
            Ok(())
        }
    }
    impl<'de> DeserializeSeed<'de> for Elements<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    let mut de = serde_json::Deserializer::from_reader(reader);
    let result = Elements {
        batch_size,
        tx: &tx,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    if let Err(e) = result {
        let _ = tx.send(Err(format!("the JSON array is not valid JSON: {e}")));
    }
}

/// The first row's keys, in order (for `--columns` left out).
fn first_row_keys(data: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(data).ok()?;
    let first = if text.starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
        items.first()?.get().to_string()
    } else {
        text.lines().next()?.to_string()
    };
    match serde_json::from_str::<Value>(&first).ok()? {
        Value::Object(map) if !map.is_empty() => Some(map.keys().cloned().collect()),
        _ => None,
    }
}

/// Runs `sink`.
pub async fn run(global: &GlobalArgs, args: &SinkArgs) -> Result<Output, CallError> {
    if args.batch_size == 0 {
        return Err(invalid("--batch-size must be greater than 0".into()));
    }
    let reader: Box<dyn Read + Send> = match args.file.as_deref() {
        None => Box::new(std::io::stdin()),
        Some(p) if p.as_os_str() == "-" => Box::new(std::io::stdin()),
        Some(p) => Box::new(
            std::fs::File::open(p)
                .map_err(|e| invalid(format!("cannot open {}: {e}", p.display())))?,
        ),
    };
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Batch, String>>(2);
    let batch_size = args.batch_size as usize;
    let reader_thread = std::thread::spawn(move || read_batches(reader, batch_size, tx));
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let next = || {
        let rx = rx.clone();
        tokio::task::spawn_blocking(move || rx.lock().expect("receiver").recv().ok())
    };

    let mut s = session(global).await?;
    let started = Instant::now();
    let progress = std::io::stderr().is_terminal();
    let mut total = clickhouse_component_host::Receipt {
        rows: 0,
        chunks: 0,
        written_rows: 0,
        deduplicated_chunks: 0,
        unverified_chunks: 0,
    };
    let mut sink = None;
    let mut last_progress = Instant::now();
    let outcome: Result<(), CallError> = async {
        while let Some(batch) = next().await.map_err(|e| CallError::Runner(e.into()))? {
            let batch = batch.map_err(invalid)?;
            let handle = match sink {
                Some(h) => h,
                None => {
                    // The first row fixes the columns for the whole stream, not per batch.
                    let columns = args.columns.clone().or_else(|| first_row_keys(&batch.data));
                    let options = SinkOptions {
                        table: args.table.clone(),
                        columns,
                        batch_size: Some(args.batch_size),
                        settings: vec![],
                        dedup: Some(args.dedup),
                    };
                    let h = s.instance.open_sink(&s.connection, &options).await?;
                    sink = Some(h);
                    h
                }
            };
            let receipt = s.instance.sink_send_json(handle, &batch.data).await?;
            total.rows += receipt.rows;
            total.chunks += receipt.chunks;
            total.written_rows += receipt.written_rows;
            total.deduplicated_chunks += receipt.deduplicated_chunks;
            total.unverified_chunks += receipt.unverified_chunks;
            if progress && last_progress.elapsed() >= Duration::from_millis(200) {
                last_progress = Instant::now();
                let rate = total.rows as f64 / started.elapsed().as_secs_f64().max(1e-9);
                eprint!("\r{} rows, {:.0} rows/s   ", total.rows, rate);
                let _ = std::io::stderr().flush();
            }
        }
        if sink.is_none() {
            return Err(invalid("the input has no rows".into()));
        }
        Ok(())
    }
    .await;
    if progress && total.rows > 0 {
        eprintln!();
    }
    drop(rx);
    let _ = reader_thread.join();
    if let Some(h) = sink {
        s.instance.sink_close(h).await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Err(e) = outcome {
        return Err(match e {
            // A failure after earlier batches committed leaves the stream partly written.
            CallError::Component(e) if total.rows > 0 => CallError::Component(Error {
                kind: ErrorKind::Uncertain,
                message: clickhouse_component::client::error::cap(format!(
                    "{} rows were committed before the failure ({}: {})",
                    total.rows + e.committed_rows,
                    e.kind,
                    e.message
                )),
                committed_rows: total.rows + e.committed_rows,
                server: e.server,
            }),
            other => other,
        });
    }
    let rate = total.rows as f64 / seconds.max(1e-9);
    let text = format!(
        "sent {} rows in {} chunks to {} ({} written{}{}) in {seconds:.2} s, {rate:.0} rows/s",
        total.rows,
        total.chunks,
        args.table,
        total.written_rows,
        if total.deduplicated_chunks > 0 {
            format!(", {} chunks deduplicated", total.deduplicated_chunks)
        } else {
            String::new()
        },
        if total.unverified_chunks > 0 {
            format!(", {} chunks unverified", total.unverified_chunks)
        } else {
            String::new()
        },
    );
    Ok(Output::new(
        text,
        json!({
            "ok": true,
            "table": args.table,
            "rows": total.rows,
            "chunks": total.chunks,
            "written_rows": total.written_rows,
            "deduplicated_chunks": total.deduplicated_chunks,
            "unverified_chunks": total.unverified_chunks,
            "seconds": seconds,
            "rows_per_second": rate,
        }),
    ))
}
