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

pub mod config;
pub mod schema;

use std::io::{BufRead, Write};

use serde_json::value::RawValue;

use crate::client::retry::DEFAULT_RETRIES;
use crate::client::{Client, Error, ErrorKind, Query, Transport};
use crate::platform::Platform;
use crate::sink::encode::read_line;
use crate::sink::native::object_fields;
use crate::sink::{Receipt, Sink, SinkOptions, StartedSend};

use config::TargetConfig;
use schema::Column;

/// One Singer message, as read (unknown fields are ignored, as Singer allows): the values
/// the target routes on, and the texts of the record and the state.
struct Message<'a> {
    kind: std::borrow::Cow<'a, str>,
    stream: Option<std::borrow::Cow<'a, str>>,
    record: Option<&'a [u8]>,
    schema: Option<serde_json::Value>,
    key_properties: Option<Vec<String>>,
    value: Option<&'a [u8]>,
}

/// A stream's table, sink and waiting records.
struct Stream<T: Transport, P: Platform> {
    name: String,
    table: String,
    columns: Vec<Column>,
    sink: Sink<T, P>,
    /// Waiting records, one NDJSON line each, and the input line each came from.
    pending: Vec<u8>,
    lines: Vec<u64>,
    /// Chunks sent since the last emitted STATE (their place, in the token).
    chunks_since_state: u64,
    /// How many of the waiting records (and their bytes) came before the last STATE read.
    covered: (usize, usize),
    /// Rows acknowledged in this run.
    rows: u64,
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
    database_ready: bool,
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
        if !config.dedup {
            let _ = writeln!(
                log,
                "target: dedup is off: delivery is at least once (a chunk sent again after a failure or a crash may be written twice)"
            );
        }
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
            database_ready: false,
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
        // Records after the last STATE are not sent when the input ends: a rerun from that
        // STATE (the tap stopped early) sends them again in chunks of its own, which this run
        // cannot foresee. A run without any STATE sends everything: its rerun starts from the
        // beginning, as it did.
        let mut uncovered = 0usize;
        let mut first_uncovered: Option<u64> = None;
        if self.seen_state {
            for s in &mut self.streams {
                let (lines, bytes) = s.covered;
                if s.lines.len() > lines {
                    uncovered += s.lines.len() - lines;
                    let first = s.lines[lines];
                    first_uncovered = Some(first_uncovered.map_or(first, |f| f.min(first)));
                    s.lines.truncate(lines);
                    s.pending.truncate(bytes);
                }
            }
        }
        let last = self.state.take();
        self.flush(last)?;
        self.complete()?;
        if let Some(line) = first_uncovered {
            return Err(Error::invalid(format!(
                "the input ended with {uncovered} records after its last STATE (from line {line}): the tap stopped before a STATE covered them, so they are not loaded; a rerun from that STATE loads them exactly once"
            )));
        }
        for s in &self.streams {
            let table = format!("{}.{}", self.config.database, s.table);
            self.summary.streams.push((s.name.clone(), table, s.rows));
        }
        Ok(self.summary)
    }

    fn message(&mut self, line: &[u8], line_no: u64) -> Result<(), Error> {
        // One structural pass over the line (the record's value is skipped, not parsed: the
        // sink reads it for its columns' types).
        // The record's keys are collected in the same pass.
        let mut keys = Vec::new();
        let fields = object_fields(line, Some((b"record".as_slice(), &mut keys)))
            .map_err(|r| crate::sink::encode::row_refusal(&format!("line {line_no}"), r))?;
        let field = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k.as_ref() == name.as_bytes())
                .map(|(_, v)| *v)
        };
        let text = |name: &str| -> Result<Option<String>, Error> {
            field(name)
                .map(|v| {
                    serde_json::from_slice::<String>(v).map_err(|_| {
                        Error::invalid(format!("line {line_no}: \"{name}\" is not a string"))
                    })
                })
                .transpose()
        };
        let kind = text("type")?.ok_or_else(|| {
            Error::invalid(format!(
                "line {line_no}: not a Singer message (no \"type\")"
            ))
        })?;
        let message = Message {
            kind: kind.into(),
            stream: text("stream")?.map(Into::into),
            record: field("record"),
            schema: field("schema")
                .map(serde_json::from_slice)
                .transpose()
                .map_err(|_| Error::invalid(format!("line {line_no}: the schema is not JSON")))?,
            key_properties: field("key_properties")
                .filter(|v| *v != b"null")
                .map(serde_json::from_slice)
                .transpose()
                .map_err(|_| {
                    Error::invalid(format!(
                        "line {line_no}: \"key_properties\" is not a list of names"
                    ))
                })?,
            value: field("value"),
        };
        let stream = message.stream.as_deref();
        let needs_stream = || {
            stream.ok_or_else(|| {
                Error::invalid(format!(
                    "line {line_no}: a {} message without a \"stream\"",
                    crate::text::escaped(&message.kind)
                ))
            })
        };
        match &*message.kind {
            "RECORD" => {
                let stream = needs_stream()?;
                let record = message.record.ok_or_else(|| {
                    Error::invalid(format!(
                        "line {line_no}: a RECORD of stream '{}' without a \"record\"",
                        crate::text::escaped(stream)
                    ))
                })?;
                self.record(stream, record, &keys, line_no)
            }
            "SCHEMA" => {
                let stream = needs_stream()?.to_string();
                let schema = message.schema.as_ref().ok_or_else(|| {
                    Error::invalid(format!(
                        "line {line_no}: a SCHEMA of stream '{}' without a \"schema\"",
                        crate::text::escaped(&stream)
                    ))
                })?;
                let keys = message.key_properties.clone().unwrap_or_default();
                self.schema(&stream, schema, &keys)
                    .map_err(|e| at_line(e, line_no))
            }
            "STATE" => {
                let value = message.value.ok_or_else(|| {
                    Error::invalid(format!(
                        "line {line_no}: a STATE message without a \"value\""
                    ))
                })?;
                let value = std::str::from_utf8(value).map_err(|_| {
                    Error::invalid(format!("line {line_no}: the STATE is not UTF-8"))
                })?;
                self.state = Some(value.to_string());
                self.seen_state = true;
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
            "ACTIVATE_VERSION" => {
                // Full-table replication's marker: rows of older versions are not deleted
                // (the tables have no version column); the records are loaded as any others.
                Ok(())
            }
            "BATCH" => Err(Error::invalid(format!(
                "line {line_no}{}: BATCH messages are not supported: turn off the tap's batch_config so it sends RECORD messages",
                stream
                    .map(|s| format!(" (stream '{}')", crate::text::escaped(s)))
                    .unwrap_or_default()
            ))),
            other => Err(Error::invalid(format!(
                "line {line_no}: unknown message type '{}' (SCHEMA, RECORD, STATE and ACTIVATE_VERSION are read)",
                crate::text::escaped(other)
            ))),
        }
    }

    /// A SCHEMA: the stream's table made ready (created, or its new properties added, with
    /// `create_tables`) and its sink opened.
    fn schema(
        &mut self,
        stream: &str,
        schema: &serde_json::Value,
        keys: &[String],
    ) -> Result<(), Error> {
        let columns = schema::columns(stream, schema, keys)?;
        if let Some(known) = self.streams.iter().find(|s| s.name == stream) {
            if known.columns == columns {
                return Ok(());
            }
            // The waiting records were read for the old columns: send them first.
            self.flush(None)?;
            self.complete()?;
        }
        let table = self
            .config
            .table_name
            .clone()
            .unwrap_or_else(|| stream.to_string());
        let client = self.client()?;
        let existing = self.existing_columns(&client, &table)?;
        match existing {
            None if !self.config.create_tables => {
                return Err(Error::new(
                    ErrorKind::Misconfigured,
                    format!(
                        "table {}.{} (stream '{}') does not exist, and create_tables is off",
                        crate::text::escaped(&self.config.database),
                        crate::text::escaped(&table),
                        crate::text::escaped(stream)
                    ),
                ))
            }
            None => {
                if !self.database_ready {
                    self.execute(&client, &schema::create_database(&self.config))?;
                    self.database_ready = true;
                }
                self.execute(
                    &client,
                    &schema::create_table(&self.config, &table, &columns, keys),
                )?;
                self.summary.tables_created += 1;
                let _ = writeln!(
                    self.log,
                    "target: created table {}.{} for stream '{}'",
                    crate::text::escaped(&self.config.database),
                    crate::text::escaped(&table),
                    crate::text::escaped(stream)
                );
            }
            Some(names) => {
                for column in columns.iter().filter(|c| !names.contains(&c.name)) {
                    if !self.config.create_tables {
                        return Err(Error::new(
                            ErrorKind::Misconfigured,
                            format!(
                                "stream '{}': property '{}' has no column in {}.{}, and create_tables is off",
                                crate::text::escaped(stream),
                                crate::text::escaped(&column.name),
                                crate::text::escaped(&self.config.database),
                                crate::text::escaped(&table)
                            ),
                        ));
                    }
                    self.execute(&client, &schema::add_column(&self.config, &table, column))?;
                    let _ = writeln!(
                        self.log,
                        "target: added column '{}' to {}.{}",
                        crate::text::escaped(&column.name),
                        crate::text::escaped(&self.config.database),
                        crate::text::escaped(&table)
                    );
                }
            }
        }
        let options = SinkOptions {
            table: format!("{}.{}", self.config.database, table),
            columns: Some(columns.iter().map(|c| c.name.clone()).collect()),
            batch_size: Some(self.config.batch_size_rows),
            settings: vec![],
            dedup: self.config.dedup,
            retries: if self.config.dedup {
                DEFAULT_RETRIES
            } else {
                0
            },
            compression: self.config.compression,
        };
        let sink = Sink::open(client, self.platform.clone(), &options).map_err(|e| {
            let message = format!("stream '{}': {}", crate::text::escaped(stream), e.message);
            e.clone().reclassify(e.kind, message)
        })?;
        let fresh = Stream {
            name: stream.to_string(),
            table,
            columns,
            sink,
            pending: Vec::new(),
            lines: Vec::new(),
            chunks_since_state: 0,
            covered: (0, 0),
            rows: 0,
        };
        match self.streams.iter_mut().find(|s| s.name == stream) {
            Some(known) => {
                let carried = (known.chunks_since_state, known.rows);
                *known = fresh;
                (known.chunks_since_state, known.rows) = carried;
            }
            None => self.streams.push(fresh),
        }
        Ok(())
    }

    /// One of the target's own statements (the columns read, `CREATE ... IF NOT EXISTS`,
    /// `ADD COLUMN IF NOT EXISTS`: each safe to repeat, even after a lost answer), repeated
    /// as the sink's requests are when it fails in a way that may pass.
    fn execute(&self, client: &Client<T>, query: &Query) -> Result<crate::client::Response, Error> {
        crate::client::retry::run(
            &crate::client::retry::RetryPolicy::new(DEFAULT_RETRIES),
            &self.platform,
            None,
            || client.execute(query),
            |e| crate::client::retry::is_worth_retrying(e.kind),
        )
        .map(|retried| retried.value)
    }

    /// The column names of `table` in the target's database, or `None` if it does not exist.
    fn existing_columns(
        &self,
        client: &Client<T>,
        table: &str,
    ) -> Result<Option<Vec<String>>, Error> {
        let query = Query::read(
            "target-columns",
            "SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
        )
        .param("db", &self.config.database)
        .param("t", table)
        .format("TabSeparatedRaw");
        let response = self.execute(client, &query)?;
        let text = String::from_utf8_lossy(&response.body);
        let names: Vec<String> = text.lines().map(String::from).collect();
        Ok((!names.is_empty()).then_some(names))
    }

    /// A RECORD: checked against its stream's properties and put in its buffer (made to fit:
    /// a property the record leaves out is null when its column takes null; objects, arrays
    /// and mixed types become their JSON text).
    fn record(
        &mut self,
        stream: &str,
        record: &[u8],
        keys: &[std::borrow::Cow<[u8]>],
        line_no: u64,
    ) -> Result<(), Error> {
        let Some(index) = self.streams.iter().position(|s| s.name == stream) else {
            return Err(Error::invalid(format!(
                "line {line_no}: a RECORD of stream '{}' before its SCHEMA",
                crate::text::escaped(stream)
            )));
        };
        let s = &mut self.streams[index];
        let refused = |why: String| {
            Error::invalid(format!(
                "line {line_no} (stream '{}'): {why}",
                crate::text::escaped(stream)
            ))
        };
        if !record.starts_with(b"{") {
            return Err(refused("the record is not a JSON object".into()));
        }
        if let Some((_, twice)) = keys
            .iter()
            .enumerate()
            .find(|(n, k)| keys[..*n].contains(k))
        {
            return Err(refused(format!(
                "property '{}' appears twice",
                crate::text::escaped(&String::from_utf8_lossy(twice))
            )));
        }
        let known = |k: &[u8]| s.columns.iter().position(|c| c.name.as_bytes() == k);
        if let Some(extra) = keys.iter().find(|k| known(k).is_none()) {
            return Err(refused(format!(
                "property '{}' is not in the stream's SCHEMA",
                crate::text::escaped(&String::from_utf8_lossy(extra))
            )));
        }
        let missing: Vec<&Column> = s
            .columns
            .iter()
            .filter(|c| !keys.iter().any(|k| k.as_ref() == c.name.as_bytes()))
            .collect();
        if let Some(required) = missing.iter().find(|c| !c.nullable) {
            return Err(refused(format!(
                "property '{}' is missing, and its column takes no null",
                crate::text::escaped(&required.name)
            )));
        }
        let before = s.pending.len();
        if missing.is_empty() && !s.columns.iter().any(|c| c.json_text) {
            s.pending.extend_from_slice(record);
        } else {
            rewrite(record, &s.columns, &missing, &mut s.pending).map_err(refused)?;
        }
        s.pending.push(b'\n');
        s.lines.push(line_no);
        self.summary.records += 1;
        self.pending_rows += 1;
        self.pending_bytes += (s.pending.len() - before) as u64;
        if self.pending_bytes >= self.config.batch_size_bytes {
            self.flush(None)?;
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
        let batch = self.config.batch_size_rows as usize;
        for index in 0..self.streams.len() {
            if self.streams[index].lines.is_empty() {
                continue;
            }
            let pending = std::mem::take(&mut self.streams[index].pending);
            let lines = std::mem::take(&mut self.streams[index].lines);
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
                s.chunks_since_state += 1;
                let prepared = s.sink.prepare_json(&pending[start..end]);
                let name = s.name.clone();
                // The chunk before this one is acknowledged first (its error comes first).
                self.complete()?;
                let prepared = prepared.map_err(|e| {
                    let message = in_input(&e.message, chunk_lines, &name);
                    e.clone().reclassify(e.kind, message)
                })?;
                let started = self.streams[index].sink.start(prepared)?;
                self.in_flight = Some((index, started));
                start = end;
            }
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
            self.deferred_state = Some(state);
            if self.in_flight.is_none() {
                self.emit_state()?;
            }
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

/// The index of the first newline (the buffer's lines all end with one).
fn memchr_newline(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .position(|b| *b == b'\n')
        .unwrap_or(bytes.len())
}

/// A record written out to fit its columns: left-out nullable properties as null, and the
/// values of JSON-text columns as JSON strings of their text.
fn rewrite(
    record: &[u8],
    columns: &[Column],
    missing: &[&Column],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let fields: Vec<(String, &RawValue)> =
        serde_json::from_slice::<std::collections::BTreeMap<String, &RawValue>>(record)
            .map(|m| m.into_iter().collect())
            .map_err(|_| "the record is not a JSON object of properties".to_string())?;
    out.push(b'{');
    let mut first = true;
    let mut comma = |out: &mut Vec<u8>| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
    };
    for (name, value) in &fields {
        comma(out);
        serde_json::to_writer(&mut *out, name).map_err(|e| e.to_string())?;
        out.push(b':');
        let text = value.get();
        let as_text = columns.iter().any(|c| c.json_text && &c.name == name) && text != "null";
        if as_text {
            serde_json::to_writer(&mut *out, text).map_err(|e| e.to_string())?;
        } else {
            out.extend_from_slice(text.as_bytes());
        }
    }
    for column in missing {
        comma(out);
        serde_json::to_writer(&mut *out, &column.name).map_err(|e| e.to_string())?;
        out.extend_from_slice(b":null");
    }
    out.push(b'}');
    Ok(())
}

/// A sink message about `line N` of a chunk, about the input line it came from.
fn in_input(message: &str, lines: &[u64], stream: &str) -> String {
    let stream = crate::text::escaped(stream);
    if let Some(rest) = message.strip_prefix("line ") {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if let Some(input_line) = rest[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| lines.get(n.checked_sub(1)?))
        {
            return format!("line {input_line} (stream '{stream}'){}", &rest[digits..]);
        }
    }
    format!("stream '{stream}': {message}")
}

/// An error of a SCHEMA message, naming its line.
fn at_line(e: Error, line_no: u64) -> Error {
    let message = format!("line {line_no}: {}", e.message);
    e.clone().reclassify(e.kind, message)
}
