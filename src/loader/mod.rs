//! A Singer target (Meltano's loader slot): SCHEMA, RECORD, STATE and ACTIVATE_VERSION messages
//! in, rows into ClickHouse through the acknowledged sink, STATE out only once every record
//! read before it is acknowledged.
//!
//! **Exactly once.** Chunk boundaries depend only on the messages since the last STATE this
//! target emitted: records wait in per-stream buffers; a STATE flushes them (and is then
//! emitted) once `batch_size_rows` records are waiting, or `batch_size_bytes` flushes them
//! without one (a STATE read before such a flush, with records after it sent too, is then
//! never emitted: see `Target::flush`), and the input's end flushes the rest. Each
//! stream's waiting records are sent `batch_size_rows` at a time, each chunk with a
//! deduplication token over its bytes, its stream and its place since that STATE (the
//! place only: a rerun cannot know which STATE its tap started from, so the STATE's text
//! cannot be in the token). A rerun from the last STATE
//! Meltano stored (the one emitted last, or one before it if the target died before Meltano
//! read it) starts from an empty buffer, as the first run did right after emitting that
//! STATE, so a deterministic tap makes the same chunks with the same tokens, and the server
//! drops those that landed. No clock decides anything. Rooms: [`config`] (settings), [`schema`] (types and DDL).

pub mod batch;
pub mod config;
pub mod flatten;
pub mod message;
pub mod names;
pub mod schema;
pub mod settings;

mod records;
mod tables;

use std::io::{BufRead, Write};
use std::num::NonZeroU32;
use std::time::Duration;

use crate::client::{Client, Error, ErrorKind, Transport};
use crate::platform::Platform;
use crate::sink::encode::read_line;
use crate::sink::{Receipt, Sink, StartedSend};
use crate::text::escaped;

use config::TargetConfig;
use message::Message;
use schema::Column;

/// A stream's table, sink and waiting records.
struct Stream<T: Transport, P: Platform> {
    name: String,
    /// `database.table`.
    table: String,
    /// Its database and table.
    place: (String, String),
    /// The columns as the stream's SCHEMA declares them (a new SCHEMA that declares the same
    /// keeps the sink).
    declared: Vec<Column>,
    /// The columns with the types the table has.
    columns: Vec<Column>,
    /// Records are rewritten to fit the columns (renamed, JSON text, dates).
    rewrites: bool,
    /// Properties not in the SCHEMA, warned about once.
    dropped: Vec<Vec<u8>>,
    sink: Sink<T, P>,
    /// Waiting records, one NDJSON line each, and where each came from.
    pending: Vec<u8>,
    lines: Vec<RecordOrigin>,
    /// Chunks sent since the last emitted STATE (their place, in the token).
    chunks_since_state: u64,
    /// How many of the waiting records (and their bytes) came before the last STATE read.
    covered: (usize, usize),
    /// Rows acknowledged in this run.
    rows: u64,
    /// When the first of the waiting records was read (wall clock, `_sdc_batched_at`).
    batch_started: Option<Duration>,
    /// `load_method: upsert` and the stream has keys: each record gets a version.
    upsert: bool,
    /// The version of the stream's last ACTIVATE_VERSION acted on: its rows of older versions
    /// are retired at the end of the input.
    activated: Option<i64>,
    /// Records of the stream wait for the tap's next run (not loaded at the end): its older
    /// versions are kept.
    held: bool,
    /// A STATE was read after the stream's ACTIVATE_VERSION and its last record: the tap got
    /// past them (one that fails mid-stream leaves its older versions in place).
    settled: bool,
}

impl<T: Transport, P: Platform> Stream<T, P> {
    fn new(name: &str, table: tables::Table, declared: Vec<Column>, sink: Sink<T, P>) -> Self {
        Stream {
            name: name.to_string(),
            table: format!("{}.{}", table.database, table.table),
            place: (table.database.clone(), table.table.clone()),
            declared,
            rewrites: records::rewrites(&table.columns),
            columns: table.columns,
            dropped: Vec::new(),
            sink,
            pending: Vec::new(),
            lines: Vec::new(),
            chunks_since_state: 0,
            covered: (0, 0),
            rows: 0,
            batch_started: None,
            upsert: false,
            activated: None,
            held: false,
            settled: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Records read.
    pub records: u64,
    /// Rows acknowledged (all streams).
    pub rows: u64,
    /// INSERT chunks acknowledged.
    pub chunks: u64,
    /// STATE messages emitted.
    pub states_emitted: u64,
    /// Tables created.
    pub tables_created: u64,
    /// Each stream's table (`database.table`) and rows acknowledged in this run.
    pub streams: Vec<(String, String, u64)>,
}

/// The target over one input.
pub struct Target<'w, T: Transport + Clone, P: Platform + Clone> {
    config: TargetConfig,
    transport: T,
    platform: P,
    streams: Vec<Stream<T, P>>,
    pending_rows: u64,
    pending_bytes: u64,
    /// The last STATE read and not yet flushed (its `value`'s text).
    state: Option<String>,
    /// A STATE was read in this run.
    seen_state: bool,
    /// A STATE flushed, waiting for the chunk on the wire to be acknowledged.
    deferred_state: Option<String>,
    /// The chunk on the wire: its stream and its send.
    in_flight: Option<(usize, StartedSend)>,
    /// Where STATE lines go (stdout) and what the target says (stderr).
    out: &'w mut dyn Write,
    log: &'w mut dyn Write,
    summary: Summary,
    /// Databases created (or found) in this run.
    databases_ready: Vec<String>,
    /// When the target started (wall clock, `_sdc_sync_started_at`).
    started: Duration,
    /// `load_method: overwrite`: the tables loaded, swapped in at the end of the input, and
    /// the last STATE flushed, emitted after the swap.
    stages: Vec<tables::Stage>,
    held_state: Option<String>,
    /// The last `load_method: upsert` version given (nanoseconds since 1970).
    last_version: u64,
    /// An ACTIVATE_VERSION was not acted on (warned once).
    activate_warned: bool,
    /// The input's last STATE waits for the older versions to be retired (in `held_state`).
    hold_final: bool,
    /// The batch files read in this run (a refusal names the file a record came from), and
    /// the one being read with the line in it: its index and the line's number.
    batch_files: Vec<String>,
    reading_file: Option<(u32, NonZeroU32)>,
}

/// Where a waiting record came from: its input line, and for a record of a BATCH's file, the
/// file (its index in `Target::batch_files`) and its line in it (from 1: 16 bytes in all).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RecordOrigin {
    line: u64,
    file: Option<(u32, NonZeroU32)>,
}

impl<'w, T: Transport + Clone, P: Platform + Clone> Target<'w, T, P> {
    /// A target with these settings, writing STATE lines to `out` and notes to `log`.
    pub fn new(
        config: TargetConfig,
        transport: T,
        platform: P,
        out: &'w mut dyn Write,
        log: &'w mut dyn Write,
    ) -> Self {
        for warning in &config.warnings {
            let _ = writeln!(log, "target: warning: {warning}");
        }
        if !config.dedup {
            let _ = writeln!(
                log,
                "target: dedup is off: delivery is at least once (a chunk sent again after a failure or a crash may be written twice)"
            );
        }
        let started = platform.wall_clock();
        Target {
            config,
            transport,
            platform,
            streams: Vec::new(),
            pending_rows: 0,
            pending_bytes: 0,
            state: None,
            seen_state: false,
            deferred_state: None,
            in_flight: None,
            out,
            log,
            summary: Summary::default(),
            databases_ready: Vec::new(),
            started,
            stages: Vec::new(),
            held_state: None,
            last_version: 0,
            activate_warned: false,
            batch_files: Vec::new(),
            reading_file: None,
            hold_final: false,
        }
    }

    fn client(&self) -> Result<Client<T>, Error> {
        Ok(Client::new(&self.config.connection, self.transport.clone())?.without_database())
    }

    /// Reads every message of `input`, then flushes what waits and emits the last STATE.
    /// On an error nothing more is sent and no STATE is emitted past the last flush.
    pub fn run(mut self, input: &mut dyn BufRead) -> Result<Summary, Error> {
        let mut line = Vec::new();
        let mut line_no = 0u64;
        loop {
            line.clear();
            line_no += 1;
            let n = match read_line(&mut &mut *input, &mut line, line_no) {
                Ok(n) => n,
                Err(e) => {
                    self.complete()?;
                    return Err(e);
                }
            };
            if n == 0 {
                break;
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if let Err(e) = self.message(&line, line_no) {
                // The chunk on the wire decides what was committed: its failure comes first;
                // once it is acknowledged, the STATE waiting for it is emitted.
                self.complete()?;
                return Err(e);
            }
        }
        self.finish()?;
        for s in &self.streams {
            // An overwrite's rows are in the table its loaded one replaced.
            let table = match self.config.overwrite {
                true => s.table.strip_suffix(tables::LOADING).unwrap_or(&s.table),
                false => &s.table,
            };
            self.summary
                .streams
                .push((s.name.clone(), table.to_string(), s.rows));
        }
        Ok(self.summary)
    }

    /// The input's end. The records the last STATE covers are flushed with it (and it is
    /// emitted). The records after it (a tap that failed before its next STATE, or one that
    /// ends without a final STATE) are then sent in the chunks a rerun from that STATE makes
    /// of them: the whole chunks of `batch_size_rows`, counted from that STATE, which a rerun
    /// that reads the same records makes again with the same tokens. The last partial chunk
    /// of each stream is not sent (a rerun that reads further puts its records in a chunk
    /// with later ones, which the server could not match): the tap's next run, from that
    /// STATE, sends them again. `load_partial_tail` sends it too (at least once). A run
    /// without any STATE sends everything: its rerun starts from the beginning, as it did.
    fn finish(&mut self) -> Result<(), Error> {
        let mut tails: Vec<(Vec<RecordOrigin>, Vec<u8>)> = Vec::with_capacity(self.streams.len());
        for s in &mut self.streams {
            let (lines, bytes) = if self.seen_state {
                s.covered
            } else {
                (s.lines.len(), s.pending.len())
            };
            tails.push((s.lines.split_off(lines), s.pending.split_off(bytes)));
        }
        let last = self.state.take();
        // The last STATE is printed once the older versions are retired: a rerun after a
        // failure there retires them.
        self.hold_final = self.streams.iter().any(|s| s.activated.is_some());
        self.flush(last)?;
        let batch = self.config.batch_size_rows as usize;
        let (mut sent, mut held) = (0usize, Vec::new());
        for (s, (mut lines, mut pending)) in self.streams.iter_mut().zip(tails) {
            // An overwrite loads every record: its rerun loads them all again.
            let whole = if self.config.load_partial_tail || self.config.overwrite {
                lines.len()
            } else {
                lines.len() / batch * batch
            };
            s.held = whole < lines.len();
            if s.held {
                held.push(format!(
                    "{} of stream '{}'",
                    lines.len() - whole,
                    escaped(&s.name)
                ));
                let cut = pending
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'\n')
                    .nth(whole.wrapping_sub(1))
                    .map_or(0, |(i, _)| i + 1);
                lines.truncate(whole);
                pending.truncate(if whole == 0 { 0 } else { cut });
            }
            sent += lines.len();
            s.lines = lines;
            s.pending = pending;
        }
        self.tail_notes(sent, &held);
        if sent > 0 {
            self.flush(None)?;
        }
        self.complete()?;
        self.retire_versions()?;
        if self.config.overwrite {
            self.swap_in()?;
        }
        self.deferred_state = self.held_state.take();
        self.emit_state()
    }

    fn tail_notes(&mut self, sent: usize, held: &[String]) {
        if sent > 0 {
            let _ = writeln!(
                self.log,
                "target: {sent} records after the input's last STATE are loaded, in the chunks a rerun from that STATE makes again"
            );
        }
        if !held.is_empty() {
            let _ = writeln!(
                self.log,
                "target: warning: records after the input's last STATE are not loaded ({}): they fill no whole chunk of batch_size_rows, which a rerun from that STATE could not make again; the tap's next run, from that STATE, sends them (load_partial_tail: true loads them now, at least once)",
                held.join(", ")
            );
        }
    }

    fn message(&mut self, line: &[u8], line_no: u64) -> Result<(), Error> {
        match Message::parse(line, line_no)? {
            Message::Record {
                stream,
                record,
                properties,
                time_extracted,
                version,
            } => {
                let message = records::FromMessage {
                    time_extracted,
                    version,
                };
                self.record_message(&stream, record, &properties, message, line_no)?;
                self.flush_if_full()
            }
            Message::Schema {
                stream,
                schema,
                keys,
            } => self
                .schema(&stream, &schema, &keys)
                .map_err(|e| at_line(e, line_no)),
            Message::State { value } => self.state(value),
            Message::ActivateVersion { stream, version } => {
                self.activate_version(&stream, version, line_no)
            }
            Message::Batch {
                stream,
                format,
                compression,
                manifest,
            } => self.batch(
                &stream,
                (&format, compression.as_deref()),
                &manifest,
                line_no,
            ),
        }
    }

    /// Flushes once the waiting records' bytes reach `batch_size_bytes` (after a record is
    /// taken, outside the errors of that record: the flush's name the records they are about).
    fn flush_if_full(&mut self) -> Result<(), Error> {
        if self.pending_bytes >= self.config.batch_size_bytes {
            self.flush(None)?;
        }
        Ok(())
    }

    /// A RECORD's record, flattened first with `flattening_enabled` (the SDK's mapper
    /// flattens it before its sink sees it).
    fn record_message(
        &mut self,
        stream: &str,
        record: &[u8],
        properties: &[crate::sink::json::Key],
        message: records::FromMessage,
        line_no: u64,
    ) -> Result<(), Error> {
        if let Some(s) = self.streams.iter_mut().find(|s| s.name == stream) {
            s.settled = false;
        }
        let Some(f) = &self.config.flattening else {
            return self.record(stream, record, properties, message, line_no);
        };
        let declared = |key: &str| {
            self.streams
                .iter()
                .find(|s| s.name == stream)
                .is_some_and(|s| s.declared.iter().any(|c| c.property == key))
        };
        let mut flat = Vec::with_capacity(record.len());
        flatten::flatten_record(record, &declared, f, &mut flat).map_err(|why| {
            Error::invalid(format!(
                "line {line_no} (stream '{}'): {why}",
                escaped(stream)
            ))
        })?;
        let properties = keys_of(&flat, line_no)?;
        self.record(stream, &flat, &properties, message, line_no)
    }

    /// A BATCH: each file of its manifest read (only under `batch_dirs`), and each of its
    /// records taken as a RECORD of the stream read at this line.
    fn batch(
        &mut self,
        stream: &str,
        (format, compression): (&str, Option<&str>),
        manifest: &[String],
        line_no: u64,
    ) -> Result<(), Error> {
        let bad = |why: String| {
            Error::invalid(format!(
                "line {line_no} (BATCH of stream '{}'): {why}",
                escaped(stream)
            ))
        };
        if format != "jsonl" {
            return Err(bad(format!(
                "encoding format '{}' is not read: set the tap's batch_config encoding format to jsonl",
                escaped(format)
            )));
        }
        // The files hold records alone: each gets the version its stream's ACTIVATE_VERSION
        // made current (as a RECORD of a full-table sync carries it).
        let version = (self.streams.iter())
            .find(|s| s.name == stream)
            .and_then(|s| s.activated)
            .map(|v| v.to_string());
        let message = records::FromMessage {
            time_extracted: None,
            version: version.as_deref().map(str::as_bytes),
        };
        for uri in manifest {
            let path = batch::file_path(uri).map_err(bad)?;
            if !batch::allowed(&path, &self.config.batch_dirs) {
                return Err(bad(format!(
                    "{} is not in a directory batch_dirs names: the target reads batch files only there (set batch_dirs to the tap's batch_config storage root)",
                    escaped(&path)
                )));
            }
            let text = batch::read(&path, compression).map_err(bad)?;
            let file = u32::try_from(self.batch_files.len()).unwrap_or(u32::MAX);
            self.batch_files.push(path.clone());
            for (n, line) in text.split(|b| *b == b'\n').enumerate() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let in_file = |e: Error| {
                    let message = format!("{}{}", e.message, in_batch_file(&path, n + 1));
                    e.clone().reclassify(e.kind, message)
                };
                let properties = keys_of(line, line_no).map_err(in_file)?;
                // (A file's text is at most 256 MiB: its line numbers fit.)
                let in_file_line = NonZeroU32::new(u32::try_from(n + 1).unwrap_or(u32::MAX));
                self.reading_file = in_file_line.map(|l| (file, l));
                let read = self.record_message(stream, line, &properties, message, line_no);
                self.reading_file = None;
                read.map_err(in_file)?;
                // Not in the file's terms: the flush's errors name their own records.
                self.flush_if_full()?;
            }
        }
        Ok(())
    }

    /// Full-table replication's marker: the stream's rows of versions before `version` are
    /// retired at the end of the input ([`Target::retire_versions`]), once its records are
    /// acknowledged. Not where rows carry no version (`add_record_metadata` off: warned once),
    /// nor for an overwrite (the table is replaced anyway).
    fn activate_version(&mut self, stream: &str, version: i64, line_no: u64) -> Result<(), Error> {
        if !self.config.activate_versions || self.config.overwrite {
            return Ok(());
        }
        let Some(s) = self.streams.iter_mut().find(|s| s.name == stream) else {
            return Err(Error::invalid(format!(
                "line {line_no}: an ACTIVATE_VERSION of stream '{}' before its SCHEMA",
                escaped(stream)
            )));
        };
        if !self.config.add_record_metadata {
            if !std::mem::replace(&mut self.activate_warned, true) {
                let _ = writeln!(
                    self.log,
                    "target: warning: stream '{}': ACTIVATE_VERSION is not acted on: rows carry their version (_sdc_table_version) only with add_record_metadata: true, so rows of older versions are kept",
                    escaped(stream)
                );
            }
            return Ok(());
        }
        s.activated = Some(version);
        s.settled = false;
        Ok(())
    }

    /// A STATE: kept until the records before it are flushed; it asks for a flush once
    /// `batch_size_rows` records wait.
    fn state(&mut self, value: &str) -> Result<(), Error> {
        self.state = Some(value.to_string());
        self.seen_state = true;
        for s in &mut self.streams {
            s.settled = true;
        }
        if self.pending_rows >= u64::from(self.config.batch_size_rows) {
            let state = self.state.take();
            self.flush(state)?;
        } else {
            for s in &mut self.streams {
                s.covered = (s.lines.len(), s.pending.len());
            }
        }
        Ok(())
    }

    /// Sends every waiting record, stream by stream, `batch_size_rows` a chunk, each chunk
    /// read and encoded while the one before it is on the wire. `state`: the STATE that asked
    /// for the flush, emitted once the flush's last chunk is acknowledged; the chunks after it
    /// count their place from it.
    fn flush(&mut self, state: Option<String>) -> Result<(), Error> {
        // A flush without a STATE (too many bytes waiting, or a stream's new SCHEMA) while a
        // STATE read is not flushed yet: when every waiting record came before that STATE, the
        // flush is that STATE's (a rerun from it starts after them). Otherwise records after
        // it are sent now, in chunks counted from the last flushed STATE, and it is never
        // emitted: a rerun from it would send those records again in chunks of its own, with
        // other tokens. The next STATE is emitted instead; a rerun from the one before sends
        // the same chunks again, which the server drops.
        let state = match state {
            Some(state) => Some(state),
            None => self
                .state
                .take()
                .filter(|_| self.streams.iter().all(|s| s.lines.len() == s.covered.0)),
        };
        for index in 0..self.streams.len() {
            self.send_waiting(index)?;
        }
        self.pending_rows = 0;
        self.pending_bytes = 0;
        for s in &mut self.streams {
            s.covered = (0, 0);
        }
        if let Some(state) = state {
            for s in &mut self.streams {
                s.chunks_since_state = 0;
            }
            if self.config.overwrite || self.hold_final {
                // Its records are in tables swapped in at the end, or older versions are
                // retired at the end: emitted then (`finish`).
                self.held_state = Some(state);
            } else {
                self.deferred_state = Some(state);
                if self.in_flight.is_none() {
                    self.emit_state()?;
                }
            }
        }
        Ok(())
    }

    /// Sends a stream's waiting records, `batch_size_rows` a chunk, each read and encoded
    /// while the chunk before it is on the wire, with a token salted by the stream and the
    /// chunk's place since the last emitted STATE.
    fn send_waiting(&mut self, index: usize) -> Result<(), Error> {
        let batch = self.config.batch_size_rows as usize;
        let pending = std::mem::take(&mut self.streams[index].pending);
        let lines = std::mem::take(&mut self.streams[index].lines);
        self.streams[index].batch_started = None;
        let mut start = 0usize;
        for chunk_lines in lines.chunks(batch) {
            // The chunk's bytes: as many lines as it has rows.
            let mut end = start;
            for _ in 0..chunk_lines.len() {
                end += memchr_newline(&pending[end..]) + 1;
            }
            let s = &mut self.streams[index];
            let mut salt = Vec::with_capacity(s.name.len() + 9);
            salt.extend_from_slice(s.name.as_bytes());
            salt.push(0);
            salt.extend_from_slice(&s.chunks_since_state.to_le_bytes());
            s.sink.set_token_salt(&salt);
            // An upsert's tokens cover its versions too: every chunk is new, so one that only
            // returns a record to an earlier value is never taken for an earlier chunk, and a
            // rerun's copies collapse by key under FINAL, the newest kept.
            if self.config.add_record_metadata && !s.upsert {
                // The records as read, without the clocks (the tap's and ours) a rerun reads anew.
                let mut content = Vec::with_capacity(end - start);
                for line in pending[start..end].split_inclusive(|b| *b == b'\n') {
                    content.extend_from_slice(records::stable_part(line));
                    content.push(b'\n');
                }
                s.sink.set_token_content(Some(&content));
            }
            s.chunks_since_state += 1;
            let prepared = s.sink.prepare_json(&pending[start..end]);
            let name = s.name.clone();
            // The chunk before this one is acknowledged first (its error comes first).
            self.complete()?;
            let prepared = prepared.map_err(|e| {
                let message = in_input(&e.message, chunk_lines, &name, &self.batch_files);
                e.clone().reclassify(e.kind, message)
            })?;
            let started = self.streams[index].sink.start(prepared)?;
            self.in_flight = Some((index, started));
            start = end;
        }
        Ok(())
    }

    /// Waits for the chunk on the wire, if any, then emits the STATE waiting for it.
    fn complete(&mut self) -> Result<(), Error> {
        if let Some((index, started)) = self.in_flight.take() {
            let s = &mut self.streams[index];
            let receipt: Receipt = s.sink.finish(started).map_err(|e| {
                let message = format!("stream '{}': {}", crate::text::escaped(&s.name), e.message);
                e.clone().reclassify(e.kind, message)
            })?;
            s.rows += receipt.rows;
            self.summary.rows += receipt.rows;
            self.summary.chunks += u64::from(receipt.chunks);
        }
        self.emit_state()
    }

    /// Emits the STATE whose records are all acknowledged, if one waits.
    fn emit_state(&mut self) -> Result<(), Error> {
        let Some(state) = self.deferred_state.take() else {
            return Ok(());
        };
        writeln!(self.out, "{state}")
            .and_then(|()| self.out.flush())
            .map_err(|e| {
                Error::new(
                    ErrorKind::Permanent,
                    format!("cannot write the STATE to stdout: {e}"),
                )
            })?;
        self.summary.states_emitted += 1;
        Ok(())
    }
}

/// The property names of a record object (refused, naming the line, when it is not one).
fn keys_of(record: &[u8], line_no: u64) -> Result<Vec<crate::sink::json::Key<'_>>, Error> {
    let fields = crate::sink::json::object_fields(record, None)
        .map_err(|r| crate::sink::encode::row_refusal(&format!("line {line_no}"), r))?;
    Ok(fields.into_iter().map(|(k, _)| k).collect())
}

/// The index of the first newline (the buffer's lines all end with one).
fn memchr_newline(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .position(|b| *b == b'\n')
        .unwrap_or(bytes.len())
}

/// Where in a batch file a record was, as messages name it: ` (file PATH, line N)`.
fn in_batch_file(path: &str, line: impl std::fmt::Display) -> String {
    format!(" (file {}, line {line})", escaped(path))
}

/// A sink message about `line N` of a chunk, about the input line it came from.
fn in_input(message: &str, lines: &[RecordOrigin], stream: &str, files: &[String]) -> String {
    let stream = crate::text::escaped(stream);
    if let Some(rest) = message.strip_prefix("line ") {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if let Some(origin) = rest[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| lines.get(n.checked_sub(1)?))
        {
            let line = origin.line;
            let file = origin.file.and_then(|(index, in_file)| {
                let path = files.get(index as usize)?;
                Some(in_batch_file(path, in_file))
            });
            let file = file.unwrap_or_default();
            return format!("line {line} (stream '{stream}'){}{file}", &rest[digits..]);
        }
    }
    format!("stream '{stream}': {message}")
}

/// An error of a SCHEMA message, naming its line.
fn at_line(e: Error, line_no: u64) -> Error {
    let message = format!("line {line_no}: {}", e.message);
    e.clone().reclassify(e.kind, message)
}
