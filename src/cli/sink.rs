//! `sink --table T [--columns a,b] [--batch-size N] [--compression C] [--dedup [--retries N]] [--checkpoint ID]
//! [FILE|-]`: stream NDJSON (or a JSON array) into a table. Input is read batch by batch (a JSON
//! array element by element); each batch is one `send-json`, so one acknowledged INSERT per
//! batch. Memory stays bounded whatever the input size: by a batch or two when streaming, and a
//! FILE's first pass keeps its prepared batches only up to a quarter of the memory limit.
//!
//! With `--checkpoint ID` the progress (input bytes and rows committed, and what identifies the
//! input, the table, the columns and the batch size) is written to the state store under `ID`
//! after each acknowledged batch, and a later run of the same command skips what was committed.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use clap::Args;
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde_json::json;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::client::retry::DEFAULT_RETRIES;
use crate::client::{Client, Compression, Error, ErrorKind, Transport};
use crate::hex::hex;
use crate::platform::Platform;
use crate::sink::encode::{read_line, row_span, BOM, MAX_ROW_BYTES};
use crate::sink::json::{array_elements, object_keys_until};
use crate::sink::{PreparedSend, Receipt, Sink, SinkOptions, StartedSend};
use crate::state::StateStore;

use super::{GlobalArgs, Output, Runner, StoreArgs, DEFAULT_MEMORY_LIMIT};

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
    /// Give each chunk a deduplication token (safe re-sends); the table must deduplicate
    /// inserts (checked before anything is sent).
    #[arg(long)]
    pub dedup: bool,
    /// How INSERT bodies are compressed on the wire: none, lz4, zstd or gzip (the server
    /// decodes them by their Content-Encoding).
    #[arg(long, env = "CLICKHOUSE_COMPRESSION", default_value = "lz4", value_parser = parse_compression)]
    pub compression: Compression,
    /// Record progress in the state store under this id after each acknowledged batch; a
    /// later run with the same id continues after what was committed (needs --dedup and
    /// NDJSON input; the store is chosen by the --state-* options).
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// Send each batch as soon as it is read and checked. Without it every row of a FILE is
    /// checked first (nothing is sent if one is refused), then sent: from what that pass kept
    /// when it fits in a quarter of the memory limit, else by reading the file again. Standard
    /// input (and a FIFO or other unseekable file) is always streamed: a row refused in a later
    /// batch leaves the earlier batches committed (`uncertain`).
    #[arg(long)]
    pub stream: bool,
    /// Where checkpoints live, and --retries (default 5 with --dedup, else 0; resends need
    /// --dedup).
    #[command(flatten)]
    pub store: StoreArgs,
    /// NDJSON or JSON-array file; - or nothing for stdin.
    pub file: Option<PathBuf>,
}

/// `--compression`'s value (see [`Compression::parse`]).
fn parse_compression(text: &str) -> Result<Compression, String> {
    Compression::parse(text).map_err(|e| e.message)
}

/// The first row's keys, in order (for `--columns` left out), read by the sink's own reader;
/// `None` when the first row is not an object of distinct keys (the sink then says why).
fn first_row_keys(batch: &[u8]) -> Option<Vec<String>> {
    let first = if batch.first() == Some(&b'[') {
        let (a, b) = *array_elements(batch).ok()?.first()?;
        &batch[a..b]
    } else {
        batch
            .split(|b| *b == b'\n')
            .find(|line| !line.iter().all(u8::is_ascii_whitespace))?
    };
    let (keys, None) = object_keys_until(first) else {
        return None;
    };
    let keys: Vec<String> = keys
        .into_iter()
        .map(String::from_utf8)
        .collect::<Result<_, _>>()
        .ok()?;
    let distinct = keys.iter().enumerate().all(|(n, k)| !keys[..n].contains(k));
    (!keys.is_empty() && distinct).then_some(keys)
}

/// The position a `--checkpoint` run gives each batch: the input bytes through the batch and
/// their SHA-256, as JSON (`{"input_bytes":N,"input_sha256":"..."}`).
fn position_text(position: &Position) -> String {
    json!({"input_bytes": position.bytes, "input_sha256": position.sha256}).to_string()
}

/// Where a `--checkpoint` run continues: the committed position, and the end of the batch
/// that was in flight (sent again exactly); `invalid-input` for a position this command did
/// not write.
fn resume_from(committed: Option<&str>, in_flight: Option<&str>) -> Result<Resume, Error> {
    let read = |text: &str| -> Result<(u64, String), Error> {
        let value: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        match (value["input_bytes"].as_u64(), value["input_sha256"].as_str()) {
            (Some(bytes), Some(sha)) => Ok((bytes, sha.to_string())),
            _ => Err(Error::invalid(
                "the checkpoint was written by another kind of sender (its position is not one of `sink`'s): use another --checkpoint id",
            )),
        }
    };
    let (bytes, sha256) = match committed {
        Some(text) => read(text)?,
        None => (0, hex(&Sha256::new().finalize())),
    };
    let cut_at = in_flight.map(read).transpose()?.map(|(bytes, _)| bytes);
    Ok(Resume {
        bytes,
        sha256,
        cut_at,
    })
}

/// Sends batches as they are read; keeps the totals.
struct Stream<'r, 'a, T: Transport + Clone, P: Platform + Clone> {
    args: &'r SinkArgs,
    retries: u32,
    client: Option<Client<T>>,
    sink: Option<Sink<T, P>>,
    total: Receipt,
    runner: &'r mut Runner<'a, T, P>,
    started: std::time::Duration,
    last_progress: std::time::Duration,
    /// The batch on the wire.
    in_flight: Option<StartedSend>,
    /// Batches read (sent or checked).
    batches: u64,
    /// The first pass over a file: batches are checked, not sent.
    checking: bool,
    /// The first pass's batches, prepared (read, checked, encoded, compressed) and kept with
    /// their positions while they fit in `keep_budget` bytes: when the whole input
    /// fits, the second pass sends them as they are, without reading the input again (the
    /// bytes sent are the bytes checked, from one read of the file). `None` once they do not
    /// fit: the rest of the first pass only checks, and the second pass reads the input again.
    kept: Option<Vec<(PreparedSend, Option<Position>)>>,
    /// Memory the batches kept so far hold ([`PreparedSend::held_bytes`], their positions).
    kept_bytes: usize,
    /// The most memory the first pass keeps batches in.
    keep_budget: usize,
}

impl<T: Transport + Clone, P: Platform + Clone> Stream<'_, '_, T, P> {
    /// Sends (or checks) `batch`, which starts after `before` lines (NDJSON) or elements (a
    /// JSON array) of the input: a refused row is named by its place in the input.
    fn send(
        &mut self,
        batch: Batch<'_>,
        before: u64,
        position: Option<&Position>,
    ) -> Result<(), Error> {
        self.batches += 1;
        if self.sink.is_none() {
            // The first row fixes the columns for the whole stream, not per batch (with
            // --checkpoint the sink is open already, and its checkpoint fixes them).
            let columns = self
                .args
                .columns
                .clone()
                .or_else(|| first_row_keys(batch.bytes));
            let client = self.client.take().expect("a client until the sink opens");
            self.sink = Some(open_sink(
                self.args,
                self.retries,
                columns,
                client,
                self.runner,
            )?);
        }
        let sink = self.sink.as_ref().expect("opened");
        if self.checking {
            let Some(kept) = self.kept.as_mut() else {
                return sink
                    .check_json(batch.bytes, batch.rows)
                    .map_err(|e| counted_from_the_start(e, before));
            };
            let mut prepared = batch
                .prepare(sink)
                .map_err(|e| counted_from_the_start(e, before))?;
            prepared.shrink();
            let held = prepared.held_bytes()
                + std::mem::size_of::<(PreparedSend, Option<Position>)>()
                + position.map_or(0, |p| p.sha256.capacity());
            self.kept_bytes = self.kept_bytes.saturating_add(held);
            if self.kept_bytes <= self.keep_budget {
                kept.push((prepared, position.cloned()));
            } else {
                // Too much to keep: freed now; the second pass reads the input again.
                self.kept = None;
            }
            return Ok(());
        }
        // Read and checked (and compressed) while the previous batch is on the wire; sent
        // only once that one is acknowledged.
        let prepared = match batch.prepare(sink) {
            Ok(prepared) => prepared,
            Err(e) => {
                self.complete()?;
                return Err(counted_from_the_start(e, before));
            }
        };
        self.start(prepared, position)
    }

    /// Waits for the batch in flight, then starts `prepared`. With --checkpoint the checkpoint
    /// is written first: this batch in flight (its end in the input, so a rerun sends the same
    /// bytes, the same tokens, even if the input has grown meanwhile), every batch before it
    /// committed.
    fn start(&mut self, prepared: PreparedSend, position: Option<&Position>) -> Result<(), Error> {
        self.complete()?;
        let sink = self.sink.as_ref().expect("opened");
        self.in_flight = Some(match position {
            Some(position) => sink.start_at(prepared, &position_text(position))?,
            None => sink.start(prepared)?,
        });
        Ok(())
    }

    /// The second pass over a file whose first pass kept every batch: sends them in order.
    fn send_kept(&mut self, kept: Vec<(PreparedSend, Option<Position>)>) -> Result<(), Error> {
        for (prepared, position) in kept {
            self.start(prepared, position.as_ref())?;
        }
        Ok(())
    }

    /// Reads `input` batch by batch (from the checkpoint's position, with one) and sends (or,
    /// in the first pass over a file, checks) each.
    fn read(&mut self, input: &mut dyn Read, resume: Option<Resume>) -> Result<(), Error> {
        let batch_size = self.args.batch_size as usize;
        if self.args.checkpoint.is_some() {
            read_ndjson_from(input, batch_size, resume, |batch, before, position| {
                self.send(batch, before, Some(position))
            })
        } else {
            read_batches(input, batch_size, |batch, before| {
                self.send(batch, before, None)
            })
        }
    }

    /// Waits for the batch in flight, if any: its receipt, its checkpoint, the progress line.
    fn complete(&mut self) -> Result<(), Error> {
        let Some(started) = self.in_flight.take() else {
            return Ok(());
        };
        let sink = self.sink.as_ref().expect("a batch in flight has a sink");
        let receipt = sink.finish(started)?;
        self.total.add(&receipt);
        let now = self.runner.platform.now();
        if self.runner.progress && now - self.last_progress >= std::time::Duration::from_millis(200)
        {
            self.last_progress = now;
            let rate = self.total.rows as f64 / (now - self.started).as_secs_f64().max(1e-9);
            let retries = if self.total.retries > 0 {
                format!(", {} retries", self.total.retries)
            } else {
                String::new()
            };
            let _ = write!(
                self.runner.stderr,
                "\r{} rows, {:.0} rows/s{retries}   ",
                self.total.rows, rate
            );
            let _ = self.runner.stderr.flush();
        }
        Ok(())
    }
}

/// Opens the sink of a run, with these columns.
fn open_sink<T: Transport + Clone, P: Platform + Clone>(
    args: &SinkArgs,
    retries: u32,
    columns: Option<Vec<String>>,
    client: Client<T>,
    runner: &Runner<'_, T, P>,
) -> Result<Sink<T, P>, Error> {
    let options = SinkOptions {
        table: args.table.clone(),
        columns,
        batch_size: Some(args.batch_size),
        settings: vec![],
        dedup: args.dedup,
        retries,
        compression: args.compression,
    };
    Sink::open(client, runner.platform.clone(), &options)
}

/// Runs `sink`.
pub fn run<T: Transport + Clone, P: Platform + Clone>(
    global: &GlobalArgs,
    args: &SinkArgs,
    runner: &mut Runner<'_, T, P>,
) -> Result<Output, Error> {
    let retries = check_args(args)?;
    let connection = global.connection()?;
    let client = Client::new(&connection, runner.transport.clone())?;
    let (mut input, whole) = open_input(args, runner)?;
    // With --checkpoint the sink opens first: where the input continues is in its checkpoint.
    let (client, sink, resume, resumed_rows) = match &args.checkpoint {
        None => (Some(client), None, None, 0),
        Some(id) => {
            let sink = open_sink(args, retries, args.columns.clone(), client, runner)?;
            let mut options = args.store.options()?;
            options.retries = retries.max(DEFAULT_RETRIES);
            let store = StateStore::open(
                Client::new(&connection, runner.transport.clone())?,
                runner.platform.clone(),
                &options,
            )?;
            sink.resume(store, id)?;
            let (committed, rows, in_flight) = sink.progress().expect("resumed");
            let resume = resume_from(committed.as_deref(), in_flight.as_deref())?;
            (None, Some(sink), Some(resume), rows)
        }
    };
    let started = runner.platform.now();
    let mut stream = Stream {
        args,
        retries,
        client,
        sink,
        batches: 0,
        total: Receipt::default(),
        started,
        last_progress: started,
        in_flight: None,
        checking: whole.is_some(),
        kept: whole.is_some().then(Vec::new),
        kept_bytes: 0,
        keep_budget: usize::try_from(runner.memory_limit.unwrap_or(DEFAULT_MEMORY_LIMIT) / 4)
            .unwrap_or(usize::MAX),
        runner,
    };
    let mut kept = None;
    // How long the first pass took, and whether it kept every batch.
    let mut first_pass = None;
    if let Some(mut file) = whole {
        // First pass: every row checked (the sink opened, the column types read), nothing
        // sent; what it prepared is sent as it is if all of it was kept, else the second pass
        // reads `input` from its start.
        stream.read(&mut file, resume.clone())?;
        stream.checking = false;
        kept = stream.kept.take();
        first_pass = Some((
            (stream.runner.platform.now() - started).as_secs_f64(),
            kept.is_some(),
        ));
    }
    let outcome = match kept {
        Some(kept) => stream.send_kept(kept),
        None => stream.read(&mut input, resume),
    };
    // The last batch is still on the wire (also when reading failed): its outcome decides
    // what was committed, so its failure comes first.
    let outcome = match (outcome, stream.complete()) {
        (_, Err(e)) => Err(e),
        (outcome, Ok(())) => outcome,
    };
    // A checkpoint records the last batch's acknowledgement when the sink closes (if that
    // fails, a rerun sends that batch again, which its tokens absorb).
    // Also after a failure: the batches acknowledged before it are recorded.
    let closed = match stream.sink.as_mut() {
        Some(sink) => sink.close(),
        None => Ok(()),
    };
    let total = stream.total;
    let progress = stream.runner.progress;
    let seconds = (stream.runner.platform.now() - started).as_secs_f64();
    if progress && total.rows > 0 {
        let _ = writeln!(stream.runner.stderr);
    }
    // What the checkpoint records, if its last write went through.
    let checkpoint_rows = stream
        .sink
        .as_ref()
        .and_then(Sink::progress)
        .map(|(_, rows, _)| rows)
        .filter(|_| closed.is_ok());
    if let Err(e) = outcome {
        return Err(failure(e, &total, args, checkpoint_rows));
    }
    if let Err(e) = closed {
        let _ = writeln!(
            stream.runner.stderr,
            "sink: every batch was committed, but recording the last one in the checkpoint failed (a rerun sends it again, which dedup absorbs): {}",
            e.message
        );
    }
    if stream.batches == 0 && resumed_rows == 0 {
        return Err(Error::invalid("the input has no rows"));
    }
    Ok(summary(args, &total, resumed_rows, seconds, first_pass))
}

/// The option rules `sink` checks before anything else; the retries to use.
fn check_args(args: &SinkArgs) -> Result<u32, Error> {
    if args.batch_size == 0 {
        return Err(Error::invalid("--batch-size must be greater than 0"));
    }
    if args.checkpoint.is_some() && !args.dedup {
        return Err(Error::invalid(
            "--checkpoint needs --dedup: a batch committed just before a crash is resent by the next run, and only its token keeps it from being written twice",
        ));
    }
    if let Some(id) = &args.checkpoint {
        // The checkpoint is written under this id: a new id's rules.
        crate::state::check_new_id(id)?;
    }
    Ok(args
        .store
        .retries
        .unwrap_or(if args.dedup { DEFAULT_RETRIES } else { 0 }))
}

/// The input (stdin, or the FILE), and, for a regular FILE checked whole before anything is
/// sent (unless --stream), the same file opened again for that first pass (WASI has no dup).
/// The second pass sends what the first kept, or reads the file again and checks every batch
/// again as it sends it: either way a file changed in between sends only checked rows.
fn open_input<'r, T, P>(
    args: &SinkArgs,
    runner: &mut Runner<'r, T, P>,
) -> Result<(Box<dyn Read + 'r>, Option<std::fs::File>), Error> {
    let open = |p: &std::path::Path| {
        std::fs::File::open(p).map_err(|e| {
            Error::invalid(format!(
                "cannot open {}: {e}{}",
                p.display(),
                super::no_files_hint()
            ))
        })
    };
    match args.file.as_deref() {
        Some(p) if p.as_os_str() != "-" => {
            let file = open(p)?;
            let seekable = file.metadata().is_ok_and(|m| m.is_file());
            let whole = if args.stream {
                None
            } else if seekable {
                Some(open(p)?)
            } else {
                let _ = writeln!(
                    runner.stderr,
                    "sink: {} is not a regular file: its rows are checked batch by batch as they are sent",
                    p.display()
                );
                None
            };
            Ok((Box::new(file), whole))
        }
        _ => Ok((
            std::mem::replace(&mut runner.stdin, Box::new(std::io::empty())),
            None,
        )),
    }
}

/// The error of a run that failed: `uncertain` once earlier batches were committed (with how
/// many), and where its checkpoint stands.
fn failure(e: Error, total: &Receipt, args: &SinkArgs, checkpoint_rows: Option<u64>) -> Error {
    let record = match &args.checkpoint {
        Some(id) => match checkpoint_rows {
            Some(rows) => format!(
                "; checkpoint '{}' records {rows} rows: run the same command again to continue",
                crate::state::escape_id(id)
            ),
            None => format!(
                "; checkpoint '{}' could not be written last: run the same command again to continue from what it recorded before",
                crate::state::escape_id(id)
            ),
        },
        None => String::new(),
    };
    // A failure after earlier batches committed leaves the stream partly written.
    if total.rows > 0 {
        let committed = total.rows + e.committed_rows;
        Error {
            committed_rows: committed,
            ..e.clone().reclassify(
                ErrorKind::Uncertain,
                format!(
                    "{committed} rows were committed before the failure ({}: {}){record}",
                    e.kind, e.message
                ),
            )
        }
    } else if record.is_empty() || e.kind == ErrorKind::InvalidInput {
        e
    } else {
        let message = format!("{}{record}", e.message);
        e.clone().reclassify(e.kind, message)
    }
}

/// The receipt of a run that succeeded, as text and JSON; `first_pass`: the seconds of the first
/// pass over a FILE, and whether it kept every batch (then the file was read once).
fn summary(
    args: &SinkArgs,
    total: &Receipt,
    resumed_rows: u64,
    seconds: f64,
    first_pass: Option<(f64, bool)>,
) -> Output {
    let rate = total.rows as f64 / seconds.max(1e-9);
    let resumed = if resumed_rows > 0 {
        format!(", after {resumed_rows} rows committed by earlier runs")
    } else {
        String::new()
    };
    let format = total.format.map(|f| f.name());
    let text = format!(
        "sent {} rows in {} chunks to {}{} ({} written{}{}{}){resumed} in {seconds:.2} s, {rate:.0} rows/s",
        total.rows,
        total.chunks,
        args.table,
        format.map(|f| format!(" as {f}")).unwrap_or_default(),
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
        if total.retries > 0 {
            format!(", {} retries", total.retries)
        } else {
            String::new()
        },
    );
    Output::new(
        text,
        json!({
            "ok": true,
            "table": args.table,
            "rows": total.rows,
            "chunks": total.chunks,
            "written_rows": total.written_rows,
            "deduplicated_chunks": total.deduplicated_chunks,
            "unverified_chunks": total.unverified_chunks,
            "retries": total.retries,
            "format": format,
            "resumed_after_rows": resumed_rows,
            "checkpoint": args.checkpoint,
            "seconds": seconds,
            "rows_per_second": rate,
            "first_pass_seconds": first_pass.map(|(seconds, _)| seconds),
            "first_pass_kept": first_pass.map(|(_, kept)| kept),
        }),
    )
}

/// A refused row named by its place in the input (the sink counts from its batch's start):
/// `line N` (or `element N`) becomes `line N + before`.
fn counted_from_the_start(e: Error, before: u64) -> Error {
    let Some((word, rest)) = ["line ", "element "]
        .into_iter()
        .find_map(|word| Some((word, e.message.strip_prefix(word)?)))
    else {
        return e;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    match rest[..digits].parse::<u64>() {
        Ok(n) if before > 0 => {
            let message = format!("{word}{}{}", n + before, &rest[digits..]);
            let kind = e.kind;
            e.reclassify(kind, message)
        }
        _ => e,
    }
}

/// How far an NDJSON input has been read: bytes from its start, and their SHA-256 (hex).
#[derive(Clone, Debug)]
pub struct Position {
    /// Bytes consumed.
    pub bytes: u64,
    /// SHA-256 of those bytes, hex.
    pub sha256: String,
}

/// Where a run continues: after `bytes` input bytes whose SHA-256 is `sha256`, and, when the
/// earlier run stopped with a short batch in flight, with a batch ending exactly at
/// `cut_at` (the same bytes, so the same token, even if the input has grown since).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    /// Bytes already committed.
    pub bytes: u64,
    /// Their SHA-256, hex.
    pub sha256: String,
    /// The end of the short batch that was in flight, if one was.
    pub cut_at: Option<u64>,
}

/// Reads NDJSON input in batches of `batch_size` lines, hashing everything it consumes, and
/// calls `send` with each batch and the position after it. With `resume`, first skips the
/// committed bytes, which must end at a line end and hash the same (`invalid-input`
/// otherwise: another input), then cuts the first batch at `cut_at` if given.
pub fn read_ndjson_from(
    input: &mut dyn Read,
    batch_size: usize,
    resume: Option<Resume>,
    mut send: impl FnMut(Batch<'_>, u64, &Position) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut reader = BufReader::with_capacity(1 << 20, input);
    let other_input = || {
        Error::invalid(
            "the input is not the one the checkpoint was written for (its first bytes differ, or it is shorter): use another --checkpoint id for another input",
        )
    };
    let mut hash = Sha256::new();
    let mut consumed = 0u64;
    let mut line = Vec::new();
    let mut line_no = 0u64;
    let mut cut_at = None;
    if let Some(resume) = resume {
        while consumed < resume.bytes {
            line.clear();
            line_no += 1;
            let n = read_line(&mut reader, &mut line, line_no)?;
            if n == 0 || consumed + n as u64 > resume.bytes {
                return Err(other_input());
            }
            hash.update(&line);
            consumed += n as u64;
        }
        if hex(&hash.clone().finalize()) != resume.sha256 {
            return Err(other_input());
        }
        cut_at = resume.cut_at.filter(|&c| c > consumed);
    }
    // The batch holds its blank lines too, so its line numbers are the input's from `before`.
    let mut batch = Vec::new();
    let mut spans = Vec::new();
    let mut before = line_no;
    let mut seen_row = consumed > 0;
    let position = |hash: &Sha256, bytes: u64| Position {
        bytes,
        sha256: hex(&hash.clone().finalize()),
    };
    loop {
        line.clear();
        line_no += 1;
        let n = read_line(&mut reader, &mut line, line_no)?;
        if n == 0 {
            break;
        }
        hash.update(&line);
        consumed += n as u64;
        if cut_at.is_some_and(|c| consumed > c) {
            // The batch in flight ended inside this line: the input changed under it.
            return Err(other_input());
        }
        let at_cut = cut_at == Some(consumed);
        if line.iter().all(u8::is_ascii_whitespace) {
            batch.push(b'\n');
            if at_cut && !spans.is_empty() {
                send(
                    Batch::lines(&batch, &spans),
                    before,
                    &position(&hash, consumed),
                )?;
                batch.clear();
                spans.clear();
                before = line_no;
            }
            if at_cut {
                cut_at = None;
            }
            continue;
        }
        if !seen_row && line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(Error::invalid(
                "--checkpoint reads NDJSON input (one object per line), not a JSON array",
            ));
        }
        seen_row = true;
        let start = batch.len();
        batch.extend_from_slice(&line);
        spans.extend(row_span(&batch, start));
        if !line.ends_with(b"\n") {
            batch.push(b'\n');
        }
        if spans.len() == batch_size || at_cut {
            send(
                Batch::lines(&batch, &spans),
                before,
                &position(&hash, consumed),
            )?;
            batch.clear();
            spans.clear();
            before = line_no;
            if at_cut {
                cut_at = None;
            }
        }
    }
    if cut_at.is_some() {
        return Err(other_input());
    }
    if !spans.is_empty() {
        send(
            Batch::lines(&batch, &spans),
            before,
            &position(&hash, consumed),
        )?;
    }
    Ok(())
}

/// A batch of the input as read: its bytes (NDJSON lines, blank ones kept as their line ends so
/// that rows are named by their line, or a JSON array) and, for NDJSON, each row's span in
/// them, found as the lines were read.
#[derive(Clone, Copy)]
pub struct Batch<'a> {
    /// The batch's bytes.
    pub bytes: &'a [u8],
    /// Each row's span in `bytes` (NDJSON only).
    pub rows: Option<&'a [(usize, usize)]>,
}

impl<'a> Batch<'a> {
    fn lines(bytes: &'a [u8], rows: &'a [(usize, usize)]) -> Self {
        Batch {
            bytes,
            rows: Some(rows),
        }
    }

    /// The batch read and checked into its chunks' requests by `sink`.
    fn prepare<T: Transport + Clone, P: Platform + Clone>(
        self,
        sink: &Sink<T, P>,
    ) -> Result<PreparedSend, Error> {
        match self.rows {
            Some(rows) => sink.prepare_lines(self.bytes, rows),
            None => sink.prepare_json(self.bytes),
        }
    }
}

/// Reads the input and calls `send` with batches of `batch_size` rows: NDJSON lines as they
/// are, JSON array elements as an array per batch.
pub fn read_batches(
    input: &mut dyn Read,
    batch_size: usize,
    mut send: impl FnMut(Batch<'_>, u64) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut reader = BufReader::with_capacity(1 << 20, input);
    // Lines before the batch being read (the blank ones at the start too).
    let mut before = 0u64;
    // A byte order mark may start the input: not part of its first row or array.
    if reader.fill_buf().map_err(read_error)?.starts_with(BOM) {
        reader.consume(BOM.len());
    }
    let first = loop {
        let (skip, len, first, lines) = {
            let buf = reader.fill_buf().map_err(read_error)?;
            let skip = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
            let lines = buf[..skip].iter().filter(|&&b| b == b'\n').count();
            (skip, buf.len(), buf.get(skip).copied(), lines as u64)
        };
        reader.consume(skip);
        before += lines;
        if skip == len && len > 0 {
            continue;
        }
        break first;
    };
    if first == Some(b'[') {
        return read_array(reader, batch_size, |bytes, before| {
            send(Batch { bytes, rows: None }, before)
        });
    }
    // The batch holds its blank lines too, so its line numbers are the input's from `before`.
    let mut batch = Vec::new();
    // Each row's span in the batch, found as its line is read (the sink does not look again).
    let mut spans = Vec::new();
    let mut line_no = before;
    loop {
        // Each line is read straight into the batch; a blank one stays as its line end.
        let start = batch.len();
        line_no += 1;
        if read_line(&mut reader, &mut batch, line_no)? == 0 {
            break;
        }
        let Some(span) = row_span(&batch, start) else {
            batch.truncate(start);
            batch.push(b'\n');
            continue;
        };
        spans.push(span);
        if !batch.ends_with(b"\n") {
            batch.push(b'\n');
        }
        if spans.len() == batch_size {
            send(Batch::lines(&batch, &spans), before)?;
            batch.clear();
            spans.clear();
            before = line_no;
        }
    }
    if !spans.is_empty() {
        send(Batch::lines(&batch, &spans), before)?;
    }
    Ok(())
}

/// An input that could not be read.
fn read_error(e: std::io::Error) -> Error {
    Error::invalid(format!("reading the input: {e}"))
}

/// Streams the elements of a top-level JSON array, `batch_size` at a time.
fn read_array(
    reader: BufReader<&mut dyn Read>,
    batch_size: usize,
    send: impl FnMut(&[u8], u64) -> Result<(), Error>,
) -> Result<(), Error> {
    struct Elements<F> {
        batch_size: usize,
        send: F,
        failure: Option<Error>,
        /// Bytes read since the last element ended (see [`ElementBound`]).
        read: std::rc::Rc<std::cell::Cell<usize>>,
    }
    impl<'de, F: FnMut(&[u8], u64) -> Result<(), Error>> Visitor<'de> for &mut Elements<F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of objects")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut batch = b"[".to_vec();
            let mut rows = 0usize;
            // Elements before the batch.
            let mut before = 0u64;
            self.read.set(0);
            while let Some(item) = seq.next_element::<Box<RawValue>>()? {
                self.read.set(0);
                if rows > 0 {
                    batch.push(b',');
                }
                batch.extend_from_slice(item.get().as_bytes());
                rows += 1;
                if rows == self.batch_size {
                    batch.push(b']');
                    if let Err(e) = (self.send)(&batch, before) {
                        self.failure = Some(e);
                        return Err(serde::de::Error::custom("send failed"));
                    }
                    batch = b"[".to_vec();
                    before += rows as u64;
                    rows = 0;
                }
            }
            if rows > 0 {
                batch.push(b']');
                if let Err(e) = (self.send)(&batch, before) {
                    self.failure = Some(e);
                    return Err(serde::de::Error::custom("send failed"));
                }
            }
            Ok(())
        }
    }
    impl<'de, F: FnMut(&[u8], u64) -> Result<(), Error>> DeserializeSeed<'de> for &mut Elements<F> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    let read = std::rc::Rc::new(std::cell::Cell::new(0));
    let mut elements = Elements {
        batch_size,
        send,
        failure: None,
        read: read.clone(),
    };
    let bounded = ElementBound {
        inner: reader,
        read,
    };
    let mut de = serde_json::Deserializer::from_reader(bounded);
    let result = (&mut elements).deserialize(&mut de).and_then(|()| de.end());
    if let Some(e) = elements.failure {
        return Err(e);
    }
    result.map_err(|e| {
        if elements.read.get() == usize::MAX {
            Error::invalid(format!(
                "an element of the JSON array is over {} MiB, the most one row may be (nothing of its batch was sent)",
                MAX_ROW_BYTES >> 20
            ))
        } else if e.is_io() {
            Error::invalid(format!("reading the input: {e}"))
        } else {
            Error::invalid(format!("the JSON array is not valid JSON: {e}"))
        }
    })
}

/// The input of a JSON array, failing once more than [`MAX_ROW_BYTES`] have been read since
/// the last element ended (the count then stays at `usize::MAX`): one element (a row) is never
/// held whole past that.
struct ElementBound<R> {
    inner: R,
    read: std::rc::Rc<std::cell::Cell<usize>>,
}

impl<R: Read> Read for ElementBound<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.read.get();
        if read > MAX_ROW_BYTES + 64 {
            self.read.set(usize::MAX);
            return Err(std::io::Error::other("row over the limit"));
        }
        let n = self.inner.read(buf)?;
        self.read.set(read + n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::encode::{encode_json, encode_lines};

    /// Batches and positions of an NDJSON input, resuming at `resume`.
    fn positions(
        input: &str,
        size: usize,
        resume: Option<(u64, String)>,
    ) -> Result<Vec<(String, u64, String)>, Error> {
        let resume = resume.map(|(bytes, sha256)| Resume {
            bytes,
            sha256,
            cut_at: None,
        });
        let mut out = Vec::new();
        read_ndjson_from(&mut input.as_bytes(), size, resume, |b, _, p| {
            assert_rows_as_found_by_the_sink(b);
            out.push((
                String::from_utf8(b.bytes.to_vec()).unwrap(),
                p.bytes,
                p.sha256.clone(),
            ));
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn ndjson_positions_hash_what_was_consumed_and_resume_after_it() {
        let input = "\n{\"a\":1}\n\n{\"a\":2}\n{\"a\":3}";
        let all = positions(input, 2, None).unwrap();
        assert_eq!(all.len(), 2);
        // A batch keeps its blank lines (the sink skips them; its line numbers stay right).
        assert_eq!(all[0].0, "\n{\"a\":1}\n\n{\"a\":2}\n");
        assert_eq!(all[0].1, 18);
        assert_eq!(all[0].2, hex(&Sha256::digest(&input.as_bytes()[..18])));
        assert_eq!(
            (all[1].0.as_str(), all[1].1),
            ("{\"a\":3}\n", input.len() as u64)
        );
        // Resuming after the first batch sends only the rest, with the same positions.
        let rest = positions(input, 2, Some((all[0].1, all[0].2.clone()))).unwrap();
        assert_eq!(rest, all[1..]);
        // Resuming after everything sends nothing.
        assert!(positions(input, 2, Some((all[1].1, all[1].2.clone())))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn another_input_is_refused_on_resume() {
        let input = "{\"a\":1}\n{\"a\":2}\n";
        let first = positions(input, 1, None).unwrap();
        let checkpoint = (first[0].1, first[0].2.clone());
        for other in ["{\"a\":9}\n{\"a\":2}\n", "{\"a\":1}", "{\"a\":1,\"b\":2}\n"] {
            let e = positions(other, 1, Some(checkpoint.clone())).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput, "{other}");
            assert!(
                e.message.contains("not the one the checkpoint"),
                "{}",
                e.message
            );
        }
        let e = positions(" [{\"a\":1}]", 1, None).unwrap_err();
        assert!(e.message.contains("not a JSON array"), "{}", e.message);
    }

    #[test]
    fn a_short_batch_in_flight_is_sent_again_with_the_same_bounds_when_the_input_grew() {
        let first = "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n";
        // Batch size 2: [1,2] committed, then [3] (short) in flight when the run stopped.
        let all = positions(first, 2, None).unwrap();
        let grown = format!("{first}{{\"a\":4}}\n{{\"a\":5}}\n");
        let resume = Resume {
            bytes: all[0].1,
            sha256: all[0].2.clone(),
            cut_at: Some(all[1].1),
        };
        let mut sent = Vec::new();
        read_ndjson_from(&mut grown.as_bytes(), 2, Some(resume.clone()), |b, _, p| {
            sent.push((String::from_utf8(b.bytes.to_vec()).unwrap(), p.bytes));
            Ok(())
        })
        .unwrap();
        // [3] alone again (the same bytes as before), then the new rows in full batches.
        assert_eq!(
            sent,
            [
                ("{\"a\":3}\n".to_string(), all[1].1),
                ("{\"a\":4}\n{\"a\":5}\n".to_string(), grown.len() as u64)
            ]
        );
        // An input now shorter than the batch in flight is another input.
        let e = read_ndjson_from(
            &mut &first.as_bytes()[..all[0].1 as usize],
            2,
            Some(resume),
            |_, _, _| Ok(()),
        )
        .unwrap_err();
        assert!(
            e.message.contains("not the one the checkpoint"),
            "{}",
            e.message
        );
    }

    #[test]
    fn positions_read_back_and_another_senders_are_refused() {
        let position = Position {
            bytes: 18,
            sha256: "ab".into(),
        };
        let text = position_text(&position);
        let resume = resume_from(Some(&text), Some(&text)).unwrap();
        assert_eq!(
            resume,
            Resume {
                bytes: 18,
                sha256: "ab".into(),
                cut_at: Some(18)
            }
        );
        let fresh = resume_from(None, None).unwrap();
        assert_eq!((fresh.bytes, fresh.cut_at), (0, None));
        assert_eq!(fresh.sha256, hex(&Sha256::new().finalize()));
        for other in ["7", "{\"offset\":3}", "not json"] {
            let e = resume_from(Some(other), None).unwrap_err();
            assert!(
                e.message.contains("another kind of sender"),
                "{}",
                e.message
            );
        }
    }

    /// The rows a batch's spans name are the ones the sink finds in its bytes by itself.
    fn assert_rows_as_found_by_the_sink(batch: Batch<'_>) {
        let Some(rows) = batch.rows else {
            return;
        };
        let columns = ["a".to_string()];
        let found = encode_json(batch.bytes, Some(&columns)).unwrap();
        let given = encode_lines(batch.bytes, rows, Some(&columns)).unwrap();
        assert_eq!(found.len(), given.len());
        for n in 0..found.len() {
            assert_eq!(found.line(n), given.line(n));
            assert_eq!(found.name(n), given.name(n));
        }
    }

    /// The batches of `input` and how many lines (or elements) come before each.
    fn batches(input: &str, size: usize) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        read_batches(&mut input.as_bytes(), size, |b, before| {
            assert_rows_as_found_by_the_sink(b);
            out.push((String::from_utf8(b.bytes.to_vec()).unwrap(), before));
            Ok(())
        })
        .unwrap();
        out
    }

    /// An input that starts with `head`, then never ends: `x` forever.
    struct Endless(std::io::Cursor<Vec<u8>>);

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.read(buf)? {
                0 => {
                    buf.fill(b'x');
                    Ok(buf.len())
                }
                n => Ok(n),
            }
        }
    }

    #[test]
    fn a_line_or_element_over_the_row_limit_stops_the_read() {
        for (head, want) in [
            ("{\"a\":1}\n{\"a\":\"", "line 2 is over 64 MiB"),
            (
                "[{\"a\":1},{\"a\":\"",
                "an element of the JSON array is over 64 MiB",
            ),
        ] {
            let mut sent = Vec::new();
            let mut input = Endless(std::io::Cursor::new(head.as_bytes().to_vec()));
            let e = read_batches(&mut input, 1, |b, _| {
                sent.push(b.bytes.len());
                Ok(())
            })
            .unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput);
            assert!(e.message.starts_with(want), "{}", e.message);
            // The first row went; nothing of the long one did.
            assert_eq!(sent.len(), 1, "{head}");
        }
        let mut input = Endless(std::io::Cursor::new(b"{\"a\":1}\n{".to_vec()));
        let e = read_ndjson_from(&mut input, 5, None, |_, _, _| Ok(())).unwrap_err();
        assert!(e.message.starts_with("line 2 is over"), "{}", e.message);
    }

    #[test]
    fn the_first_rows_keys_name_the_columns() {
        let keys = |b: &str| first_row_keys(b.as_bytes());
        let ab = Some(vec!["a".to_string(), "b".to_string()]);
        assert_eq!(keys("\n  \n{\"a\":1,\"b\":[2]}\n{\"c\":3}\n"), ab);
        assert_eq!(keys("[{\"a\":1,\"b\":{}},{\"c\":3}]"), ab);
        // Not an object of distinct keys: left to the sink, which says why.
        for bad in ["{}", "{\"a\":1,\"a\":2}", "[1]", "{\"a\":", "[]"] {
            assert_eq!(keys(bad), None, "{bad}");
        }
    }

    #[test]
    fn ndjson_in_batches() {
        let owned = |b: &[(&str, u64)]| -> Vec<(String, u64)> {
            b.iter().map(|(s, n)| (s.to_string(), *n)).collect()
        };
        assert_eq!(
            batches("\n \n{\"a\":1}\n\n{\"a\":2}\r\n{\"a\":3}", 2),
            owned(&[("{\"a\":1}\n\n{\"a\":2}\r\n", 2), ("{\"a\":3}\n", 5)])
        );
        assert!(batches("  \n ", 2).is_empty());
        // Each batch's rows, found as its lines are read, are the ones the sink would find in
        // it (`batches` checks): a byte order mark, trailing spaces, a line of one mark.
        assert_eq!(batches("\u{feff}{\"a\":1} \t\n{\"a\":2}", 5).len(), 1);
        assert_eq!(batches("\u{feff}\n{\"a\":1}\n", 5).len(), 1);
        // A row refused in a later batch is named by its line in the input.
        let e = counted_from_the_start(Error::invalid("line 2, column 'a': x"), 5);
        assert_eq!(e.message, "line 7, column 'a': x");
        let e = counted_from_the_start(Error::invalid("element 1 is not a JSON object"), 4);
        assert_eq!(e.message, "element 5 is not a JSON object");
    }

    #[test]
    fn arrays_element_by_element() {
        assert_eq!(
            batches(" [ {\"a\":1}, {\"a\":2},\n {\"a\":3} ] ", 2),
            vec![
                ("[{\"a\":1},{\"a\":2}]".to_string(), 0),
                ("[{\"a\":3}]".to_string(), 2)
            ]
        );
        // A byte order mark before the array.
        assert_eq!(
            batches("\u{feff}[{\"a\":1}]", 5),
            vec![("[{\"a\":1}]".to_string(), 0)]
        );
        let mut input = "[{\"a\":1}".as_bytes();
        assert!(read_batches(&mut input, 5, |_, _| Ok(()))
            .unwrap_err()
            .message
            .contains("not valid JSON"));
    }
}
