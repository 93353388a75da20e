//! `sink --table T [--columns a,b] [--batch-size N] [--dedup] [FILE|-]`: stream NDJSON (or a
//! JSON array) into a table. Input is read batch by batch (a JSON array element by element), so
//! memory stays bounded by a batch whatever the input size; each batch is one `send-json`, so
//! one acknowledged INSERT per batch.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use clap::Args;
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::client::{Client, Error, ErrorKind, Transport};
use crate::platform::Platform;
use crate::sink::{Receipt, Sink, SinkOptions};

use super::{GlobalArgs, Output, Runner};

/// Arguments of `sink`.
#[derive(Args, Debug, Clone)]
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

/// The first row's keys, in order (for `--columns` left out).
fn first_row_keys(batch: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(batch).ok()?;
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

/// Sends batches as they are read; keeps the totals.
struct Stream<'r, 'a, T: Transport + Clone, P: Platform + Clone> {
    args: &'r SinkArgs,
    client: Option<Client<T>>,
    sink: Option<Sink<T>>,
    total: Receipt,
    runner: &'r mut Runner<'a, T, P>,
    started: std::time::Duration,
    last_progress: std::time::Duration,
}

impl<T: Transport + Clone, P: Platform + Clone> Stream<'_, '_, T, P> {
    fn send(&mut self, batch: &[u8]) -> Result<(), Error> {
        if self.sink.is_none() {
            // The first row fixes the columns for the whole stream, not per batch.
            let columns = self.args.columns.clone().or_else(|| first_row_keys(batch));
            let options = SinkOptions {
                table: self.args.table.clone(),
                columns,
                batch_size: Some(self.args.batch_size),
                settings: vec![],
                dedup: self.args.dedup,
            };
            let client = self.client.take().expect("a client until the sink opens");
            self.sink = Some(Sink::open(client, &options)?);
        }
        let receipt = self.sink.as_ref().expect("opened").send_json(batch)?;
        self.total.rows += receipt.rows;
        self.total.chunks += receipt.chunks;
        self.total.written_rows += receipt.written_rows;
        self.total.deduplicated_chunks += receipt.deduplicated_chunks;
        self.total.unverified_chunks += receipt.unverified_chunks;
        let now = self.runner.platform.now();
        if self.runner.progress && now - self.last_progress >= std::time::Duration::from_millis(200)
        {
            self.last_progress = now;
            let rate = self.total.rows as f64 / (now - self.started).as_secs_f64().max(1e-9);
            let _ = write!(
                self.runner.stderr,
                "\r{} rows, {:.0} rows/s   ",
                self.total.rows, rate
            );
            let _ = self.runner.stderr.flush();
        }
        Ok(())
    }
}

/// Runs `sink`.
pub fn run<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    args: &SinkArgs,
    runner: &mut Runner<'_, T, P>,
) -> Result<Output, Error> {
    if args.batch_size == 0 {
        return Err(Error::invalid("--batch-size must be greater than 0"));
    }
    let client = Client::new(&global.connection()?, runner.transport.clone())?;
    let mut input: Box<dyn Read + '_> = match args.file.as_deref() {
        None => std::mem::replace(&mut runner.stdin, Box::new(std::io::empty())),
        Some(p) if p.as_os_str() == "-" => {
            std::mem::replace(&mut runner.stdin, Box::new(std::io::empty()))
        }
        Some(p) => Box::new(
            std::fs::File::open(p)
                .map_err(|e| Error::invalid(format!("cannot open {}: {e}", p.display())))?,
        ),
    };
    let started = runner.platform.now();
    let mut stream = Stream {
        args,
        client: Some(client),
        sink: None,
        total: Receipt::default(),
        started,
        last_progress: started,
        runner,
    };
    let outcome = read_batches(&mut input, args.batch_size as usize, |batch| {
        stream.send(batch)
    });
    let total = stream.total;
    let progress = stream.runner.progress;
    let seconds = (stream.runner.platform.now() - started).as_secs_f64();
    if progress && total.rows > 0 {
        let _ = writeln!(stream.runner.stderr);
    }
    if let Err(e) = outcome {
        // A failure after earlier batches committed leaves the stream partly written.
        return Err(if total.rows > 0 {
            Error {
                kind: ErrorKind::Uncertain,
                message: crate::client::error::cap(format!(
                    "{} rows were committed before the failure ({}: {})",
                    total.rows + e.committed_rows,
                    e.kind,
                    e.message
                )),
                committed_rows: total.rows + e.committed_rows,
                server: e.server,
            }
        } else {
            e
        });
    }
    if stream.sink.is_none() {
        return Err(Error::invalid("the input has no rows"));
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

/// Reads the input and calls `send` with batches of `batch_size` rows: NDJSON lines as they
/// are, JSON array elements as an array per batch.
pub fn read_batches(
    input: &mut dyn Read,
    batch_size: usize,
    mut send: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut reader = BufReader::with_capacity(1 << 20, input);
    let read_error = |e: std::io::Error| Error::invalid(format!("reading the input: {e}"));
    let first = loop {
        let (skip, len, first) = {
            let buf = reader.fill_buf().map_err(read_error)?;
            let skip = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
            (skip, buf.len(), buf.get(skip).copied())
        };
        reader.consume(skip);
        if skip == len && len > 0 {
            continue;
        }
        break first;
    };
    if first == Some(b'[') {
        return read_array(reader, batch_size, send);
    }
    let mut batch = Vec::new();
    let mut rows = 0usize;
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(read_error)? == 0 {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        batch.extend_from_slice(&line);
        if !line.ends_with(b"\n") {
            batch.push(b'\n');
        }
        rows += 1;
        if rows == batch_size {
            send(&batch)?;
            batch.clear();
            rows = 0;
        }
    }
    if rows > 0 {
        send(&batch)?;
    }
    Ok(())
}

/// Streams the elements of a top-level JSON array, `batch_size` at a time.
fn read_array(
    reader: BufReader<&mut dyn Read>,
    batch_size: usize,
    send: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    struct Elements<F> {
        batch_size: usize,
        send: F,
        failure: Option<Error>,
    }
    impl<'de, F: FnMut(&[u8]) -> Result<(), Error>> Visitor<'de> for &mut Elements<F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of objects")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut batch = b"[".to_vec();
            let mut rows = 0usize;
            while let Some(item) = seq.next_element::<Box<RawValue>>()? {
                if rows > 0 {
                    batch.push(b',');
                }
                batch.extend_from_slice(item.get().as_bytes());
                rows += 1;
                if rows == self.batch_size {
                    batch.push(b']');
                    if let Err(e) = (self.send)(&batch) {
                        self.failure = Some(e);
                        return Err(serde::de::Error::custom("send failed"));
                    }
                    batch = b"[".to_vec();
                    rows = 0;
                }
            }
            if rows > 0 {
                batch.push(b']');
                if let Err(e) = (self.send)(&batch) {
                    self.failure = Some(e);
                    return Err(serde::de::Error::custom("send failed"));
                }
            }
            Ok(())
        }
    }
    impl<'de, F: FnMut(&[u8]) -> Result<(), Error>> DeserializeSeed<'de> for &mut Elements<F> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    let mut elements = Elements {
        batch_size,
        send,
        failure: None,
    };
    let mut de = serde_json::Deserializer::from_reader(reader);
    let result = (&mut elements).deserialize(&mut de).and_then(|()| de.end());
    if let Some(e) = elements.failure {
        return Err(e);
    }
    result.map_err(|e| Error::invalid(format!("the JSON array is not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::read_batches;

    fn batches(input: &str, size: usize) -> Vec<String> {
        let mut out = Vec::new();
        read_batches(&mut input.as_bytes(), size, |b| {
            out.push(String::from_utf8(b.to_vec()).unwrap());
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn ndjson_in_batches() {
        assert_eq!(
            batches("{\"a\":1}\n\n{\"a\":2}\r\n{\"a\":3}", 2),
            vec!["{\"a\":1}\n{\"a\":2}\r\n", "{\"a\":3}\n"]
        );
        assert!(batches("  \n ", 2).is_empty());
    }

    #[test]
    fn arrays_element_by_element() {
        assert_eq!(
            batches(" [ {\"a\":1}, {\"a\":2},\n {\"a\":3} ] ", 2),
            vec!["[{\"a\":1},{\"a\":2}]", "[{\"a\":3}]"]
        );
        let mut input = "[{\"a\":1}".as_bytes();
        assert!(read_batches(&mut input, 5, |_| Ok(()))
            .unwrap_err()
            .message
            .contains("not valid JSON"));
    }
}
