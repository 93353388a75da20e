//! Drives a send: every row is read first, each value for its column's type (the table's
//! columns are read once per sink), and encoded as one Native block per `batch_size` chunk
//! (JSONEachRow lines for a table with a type the sink does not encode); each chunk is one
//! INSERT, sent and acknowledged before the next (no queue, no timer, no batching across
//! sends). The receipt reports the server's `written_rows`; a failure after a committed
//! chunk is `uncertain` and says how many rows committed. With `dedup` and `retries`, a chunk
//! that failed in a way that may pass is resent with the same deduplication token, so a chunk
//! that landed before its answer was lost is not written twice.

use std::cell::{OnceCell, RefCell};
use std::collections::VecDeque;

use sha2::{Digest, Sha256};

use crate::client::error_codes::{SETTING_CONSTRAINT_VIOLATION, UNKNOWN_SETTING};
use crate::client::response::json_rows;
use crate::client::retry::Retried;
use crate::client::sql::quote_identifier;
use crate::client::{Client, Error, ErrorKind, HttpRequest, InFlight, Query, Response, Transport};
use crate::platform::Platform;
use crate::state::StateStore;

use super::columns::{Format, TableColumns};
use super::config::{SinkConfig, SinkOptions};
#[cfg(any(test, feature = "command"))]
use super::encode::encode_lines;
#[cfg(feature = "speed")]
use super::encode::encode_packed;
use super::encode::{encode_json, encode_rows, Encoded, Row};
use super::native::Block;
use super::resume::{Checkpoints, InFlightSend};
use super::statements::{self, Statement};
use super::types::Type;

/// What a successful send did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Receipt {
    /// Rows sent.
    pub rows: u64,
    /// INSERTs acknowledged.
    pub chunks: u32,
    /// Rows the server reported written (`X-ClickHouse-Summary`), summed over chunks.
    pub written_rows: u64,
    /// Chunks the server acknowledged without writing (deduplicated by their token).
    pub deduplicated_chunks: u32,
    /// Chunks whose written rows could not be checked (no summary, or async inserts).
    pub unverified_chunks: u32,
    /// Chunks resent after a failure that may pass (same token each time).
    pub retries: u32,
    /// How the rows travelled (none when no chunk was sent).
    pub format: Option<Format>,
}

impl Receipt {
    /// Adds another receipt's counts to this one.
    #[cfg(any(test, feature = "command"))]
    pub fn add(&mut self, other: &Receipt) {
        self.rows += other.rows;
        self.chunks += other.chunks;
        self.written_rows += other.written_rows;
        self.deduplicated_chunks += other.deduplicated_chunks;
        self.unverified_chunks += other.unverified_chunks;
        self.retries += other.retries;
        self.format = other.format.or(self.format);
    }
}

/// One chunk's INSERT request, its row count and its deduplication token (empty without
/// `dedup`).
struct ChunkRequest {
    request: HttpRequest,
    rows: u64,
    token: String,
}

/// Builds chunk `n`'s request of a send (its body encoded already).
type BuildChunk<'e> = Box<dyn FnMut(usize) -> Result<ChunkRequest, Error> + 'e>;

/// A send whose rows are checked and whose requests are built ([`Sink::prepare_json`]).
pub struct PreparedSend {
    chunks: VecDeque<ChunkRequest>,
    format: Format,
}

#[cfg(any(test, feature = "command"))]
impl PreparedSend {
    /// Gives back what its request bodies hold beyond their bytes (an lz4 body's buffer is
    /// made for a third of the uncompressed body): before it is kept a while.
    pub fn shrink(&mut self) {
        for chunk in &mut self.chunks {
            chunk.request.body.shrink_to_fit();
        }
    }

    /// The memory holding it takes: every chunk's request (body, statement, headers, as
    /// allocated) and token, not only the bodies' bytes (a send of one small row holds far
    /// more statement than body).
    pub fn held_bytes(&self) -> usize {
        let strings = |c: &ChunkRequest| {
            let r = &c.request;
            r.body.capacity()
                + r.path_and_query.capacity()
                + r.authority.capacity()
                + r.headers.capacity() * std::mem::size_of::<(String, Vec<u8>)>()
                + r.headers
                    .iter()
                    .map(|(k, v)| k.capacity() + v.capacity())
                    .sum::<usize>()
                + c.token.capacity()
        };
        std::mem::size_of::<Self>()
            + self.chunks.capacity() * std::mem::size_of::<ChunkRequest>()
            + self.chunks.iter().map(strings).sum::<usize>()
    }
}

/// A send whose first INSERT is on the wire ([`Sink::start`]); [`Sink::finish`] completes it.
pub struct StartedSend {
    chunks: VecDeque<ChunkRequest>,
    first: Option<InFlight>,
    format: Format,
    /// Begun with a position ([`Sink::start_at`]): its acknowledgement advances the checkpoint.
    resumable: bool,
}

/// A sink bound to one client and table.
pub struct Sink<T: Transport, P: Platform> {
    client: Client<T>,
    platform: P,
    config: SinkConfig,
    closed: bool,
    /// The table's columns and their types, read at the first send.
    columns: OnceCell<TableColumns>,
    /// The server named `distributed_foreground_insert` unknown (before 23.x): INSERTs carry
    /// its old name, `insert_distributed_sync`, from then on.
    old_setting_name: std::cell::Cell<bool>,
    /// `database.table`, the database read by the dedup check when the options leave it out.
    qualified: String,
    /// The checkpoint of a resumable sink ([`Sink::resume`]).
    checkpoints: RefCell<Option<Checkpoints<T, P>>>,
    /// Bytes every token also covers ([`Sink::set_token_salt`]); none by default.
    token_salt: RefCell<Vec<u8>>,
    /// What tokens cover in place of the chunks' bytes ([`Sink::set_token_content`]).
    #[cfg(any(test, feature = "command"))]
    token_content: RefCell<Option<Vec<u8>>>,
    #[cfg(feature = "speed")]
    /// The last send's block, emptied, kept for its allocations as a buffered writer keeps
    /// its buffer: the next send of the same columns reads into it without growing a new
    /// block's columns from nothing (a tenth of the CLI's first pass went to that copying).
    spare_block: RefCell<Option<Block>>,
}

/// The setting every INSERT carries so that a Distributed table answers once its shards have
/// the rows, as the URL parameter a request carries it; and its name on older servers.
const FOREGROUND: &str = "distributed_foreground_insert=1";
const FOREGROUND_OLD: &str = "insert_distributed_sync=1";

impl<T: Transport, P: Platform> Sink<T, P> {
    /// Validates the options; with `dedup`, also checks (one read) that the table deduplicates
    /// inserts, `misconfigured` naming the setting otherwise. Without `dedup` no request is
    /// sent.
    pub fn open(client: Client<T>, platform: P, options: &SinkOptions) -> Result<Self, Error> {
        let config = SinkConfig::new(options, client.endpoint())?;
        let mut sink = Sink {
            client,
            platform,
            qualified: config.qualified_table(),
            config,
            closed: false,
            columns: OnceCell::new(),
            old_setting_name: std::cell::Cell::new(false),
            checkpoints: RefCell::new(None),
            token_salt: RefCell::new(Vec::new()),
            #[cfg(any(test, feature = "command"))]
            token_content: RefCell::new(None),
            #[cfg(feature = "speed")]
            spare_block: RefCell::new(None),
        };
        if sink.config.dedup {
            sink.qualified = sink.check_deduplicates()?;
        }
        Ok(sink)
    }

    /// Sends `request` as every statement of the sink is sent ([`statements::send`]).
    fn send_request(
        &self,
        request: &HttpRequest,
        in_flight: Option<InFlight>,
    ) -> Result<Retried<Response>, Error> {
        statements::send(
            &self.client,
            &self.platform,
            self.config.retries,
            request,
            in_flight,
        )
    }

    /// A read of the sink's own (the dedup check, the column types): nothing has been sent
    /// yet.
    fn read(&self, query: Query) -> Result<Response, Error> {
        let request = self.client.prepare(query)?;
        self.send_request(&request, None)
            .map(|retried| retried.value)
    }

    /// Checks that the target table deduplicates inserts (see [`deduplication_refusal`]);
    /// returns it as `database.table`.
    fn check_deduplicates(&self) -> Result<String, Error> {
        let database = if self.config.database.is_some() {
            "{db:String}"
        } else {
            "currentDatabase()"
        };
        let mut query = Statement::CheckDedup
            .query(format!(
                "SELECT engine, engine_full, database,
                    (SELECT any(value) FROM system.merge_tree_settings
                     WHERE name = 'non_replicated_deduplication_window') AS non_replicated_default,
                    (SELECT any(value) FROM system.merge_tree_settings
                     WHERE name = 'replicated_deduplication_window') AS replicated_default
                 FROM system.tables WHERE database = {database} AND name = {{t:String}}"
            ))
            .param("t", &self.config.table)
            .format("JSONEachRow");
        if let Some(db) = &self.config.database {
            query = query.param("db", db);
        }
        let response = self.read(query)?;
        let rows = json_rows(&response.body, "the table engine query")?;
        let table = self.config.qualified_table();
        let Some(mut row) = rows.into_iter().next() else {
            return Err(Error::new(
                ErrorKind::Misconfigured,
                format!(
                    "table {} does not exist (dedup checks that it deduplicates inserts)",
                    crate::text::escaped(&table)
                ),
            ));
        };
        match deduplication_refusal(
            &row.text("engine")?,
            &row.text("engine_full")?,
            &row.text("non_replicated_default")?,
            &row.text("replicated_default")?,
        ) {
            None => Ok(format!("{}.{}", row.text("database")?, self.config.table)),
            Some(why) => Err(Error::new(
                ErrorKind::Misconfigured,
                format!(
                    "dedup needs a table that deduplicates inserts, and {} does not: {why}",
                    crate::text::escaped(&table)
                ),
            )),
        }
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.closed {
            Err(Error::invalid("the sink is closed"))
        } else {
            Ok(())
        }
    }

    /// Sends typed rows. Every row is read for its columns' types before the first INSERT.
    pub fn send(&self, rows: &[Row]) -> Result<Receipt, Error> {
        self.check_plain()?;
        let encoded = encode_rows(rows, self.config.columns.as_deref())?;
        self.deliver(&encoded)
    }

    /// Sends NDJSON or a JSON array of objects. Every row is read for its columns' types
    /// before the first INSERT.
    pub fn send_json(&self, data: &[u8]) -> Result<Receipt, Error> {
        self.check_plain()?;
        let encoded = encode_json(data, self.config.columns.as_deref())?;
        self.deliver(&encoded)
    }

    #[cfg(feature = "speed")]
    /// Sends packed rows ([`super::packed`], a binding's own values without JSON text). Every
    /// row is read for its columns' types before the first INSERT.
    pub fn send_packed(&self, data: &[u8]) -> Result<Receipt, Error> {
        self.check_plain()?;
        let encoded = encode_packed(data, self.config.columns.as_deref())?;
        self.deliver(&encoded)
    }

    #[cfg(feature = "speed")]
    /// [`Sink::send_json_at`] for packed rows.
    pub fn send_packed_at(&self, data: &[u8], position: &str) -> Result<Receipt, Error> {
        let prepared = self.prepare_packed(data)?;
        self.finish(self.start_at(prepared, position)?)
    }

    #[cfg(feature = "speed")]
    /// [`Sink::prepare_json`] for packed rows.
    pub fn prepare_packed(&self, data: &[u8]) -> Result<PreparedSend, Error> {
        self.check_open()?;
        self.prepare(&encode_packed(data, self.columns().as_deref())?)
    }

    /// Reads every row of `encoded` for its columns' types, `batch_size` rows at a time into
    /// one block: `invalid-input` naming the first value refused, before anything is sent.
    /// Returns the format, the block (for the chunks' turns) and, with `keep`, the body of a
    /// send of one chunk.
    fn read_rows(
        &self,
        encoded: &Encoded,
        keep: bool,
    ) -> Result<(Format, Block, Option<Vec<u8>>), Error> {
        let table = self.table_columns()?;
        let format = table.format(&encoded.columns);
        #[cfg(feature = "speed")]
        let spare = self.spare_block.take();
        #[cfg(not(feature = "speed"))]
        let spare: Option<Block> = None;
        let mut block = match spare.filter(|b| b.has_columns(&encoded.columns)) {
            Some(mut block) => {
                block.clear();
                block
            }
            None => table.block(&encoded.columns, &self.config.qualified_table())?,
        };
        let total = encoded.len();
        let batch = self.config.batch_size;
        for start in (0..total).step_by(batch) {
            let end = (start + batch).min(total);
            block.clear();
            table.read(encoded, start, end, &mut block)?;
        }
        let single =
            (keep && total <= batch).then(|| chunk_body(format, &block, encoded, 0, total));
        Ok((format, block, single))
    }

    /// Keeps `block`, emptied by its next user, for the next send (with `speed`).
    fn keep_block(&self, block: Block) {
        #[cfg(feature = "speed")]
        self.spare_block.replace(Some(block));
        #[cfg(not(feature = "speed"))]
        drop(block);
    }

    /// Closes the sink; idempotent. A resumable sink writes its last acknowledged send down
    /// first (if that fails, the sink is closed all the same, and a later resume sends that
    /// send again, which its tokens absorb).
    pub fn close(&mut self) -> Result<(), Error> {
        self.closed = true;
        match self.checkpoints.get_mut() {
            Some(checkpoints) => checkpoints.close(),
            None => Ok(()),
        }
    }

    /// The INSERT statement for these columns: the table (and database) as `Identifier`
    /// parameters, the column names backquoted by [`quote_identifier`] (ClickHouse's grammar
    /// takes no parameter in an INSERT column list).
    fn insert_query(&self, columns: &[String], format: Format) -> Query {
        let column_list: Vec<String> = columns.iter().map(|c| quote_identifier(c)).collect();
        let target = if self.config.database.is_some() {
            "{db:Identifier}.{t:Identifier}"
        } else {
            "{t:Identifier}"
        };
        let mut query = Statement::Insert
            .query(format!(
                "INSERT INTO {target} ({}) FORMAT {}",
                column_list.join(", "),
                format.name()
            ))
            .param("t", &self.config.table);
        if let Some(db) = &self.config.database {
            query = query.param("db", db);
        }
        for (name, value) in &self.config.settings {
            query = query.setting(name, value.clone());
        }
        query.compress(self.config.compression)
    }

    /// One chunk's INSERT, built once: a resend is the same request, token included.
    fn chunk_request(
        &self,
        base: &Query,
        columns: &[String],
        (chunk, body): (usize, Vec<u8>),
        rows: usize,
    ) -> Result<ChunkRequest, Error> {
        let mut query = base.clone();
        let mut token = String::new();
        if self.config.dedup {
            token = self.token(columns, &body, chunk);
            query = query
                .setting("insert_deduplicate", "1")
                .setting("insert_deduplication_token", token.clone());
        }
        Ok(ChunkRequest {
            request: self.client.prepare(query.data(body))?,
            rows: rows as u64,
            token,
        })
    }

    /// Every chunk's request of `encoded`, `batch_size` rows each, built when `build` is
    /// called with its index. Every row is read first ([`Sink::read_rows`]); a send of one
    /// chunk keeps the body of that pass, a longer one reads each chunk's rows again when its
    /// turn comes, so one chunk's body is in memory at a time, not the whole send's (a
    /// `FixedString(1000)` of short strings is far larger as Native than as JSON).
    fn chunk_builder<'e>(
        &'e self,
        encoded: &'e Encoded,
    ) -> Result<(usize, Format, BuildChunk<'e>), Error> {
        let (format, block, mut single) = self.read_rows(encoded, true)?;
        // One chunk's body is built: its block is spare.
        let mut block = match single {
            Some(_) => {
                self.keep_block(block);
                None
            }
            None => Some(block),
        };
        let table = self.table_columns()?;
        let total = encoded.len();
        let base = self.insert_query(&encoded.columns, format);
        let batch = self.config.batch_size;
        let build = move |chunk: usize| {
            let start = chunk * batch;
            let end = (start + batch).min(total);
            let body = match single.take() {
                Some(body) => body,
                None => {
                    let block = block.as_mut().expect("kept for a send of many chunks");
                    if format == Format::Native {
                        block.clear();
                        table.read(encoded, start, end, block)?;
                    }
                    chunk_body(format, block, encoded, start, end)
                }
            };
            self.chunk_request(&base, &encoded.columns, (chunk, body), end - start)
        };
        Ok((total.div_ceil(batch), format, Box::new(build)))
    }

    /// `request` made as this server takes it, in place (chunks are built ahead, some before
    /// the switch): the foreground setting under its old name once the server has named the
    /// new one unknown.
    fn for_server(&self, request: &mut HttpRequest) {
        if self.old_setting_name.get() && request.path_and_query.contains(FOREGROUND) {
            request.path_and_query = request.path_and_query.replace(FOREGROUND, FOREGROUND_OLD);
        }
    }

    /// Whether `e` (the first chunk's failure: nothing committed) is a server that does not
    /// know `distributed_foreground_insert` (older than 23.x, where it is
    /// `insert_distributed_sync`): the sink then uses the old name and sends the chunk again.
    /// The server refused the statement before running it, so nothing was written.
    fn switch_setting_name(&self, e: &Error) -> bool {
        let unknown = e.server.as_ref().is_some_and(|s| s.code == UNKNOWN_SETTING)
            && e.message.contains("distributed_foreground_insert");
        if unknown && !self.old_setting_name.get() {
            self.old_setting_name.set(true);
            return true;
        }
        false
    }

    fn deliver(&self, encoded: &Encoded) -> Result<Receipt, Error> {
        let (count, format, mut build) = self.chunk_builder(encoded)?;
        let mut receipt = self.deliver_chunks(count, &mut build, None)?;
        receipt.format = Some(format);
        Ok(receipt)
    }

    /// Sends `count` chunks in order, each acknowledged before the next is sent; the next
    /// chunk's request (copy, token, compression) is built while the current one is on the
    /// wire. `first`: chunk 0's request, already started.
    fn deliver_chunks(
        &self,
        count: usize,
        // `dyn`: one copy of this function for both callers (the library's size budget).
        build: &mut dyn FnMut(usize) -> Result<ChunkRequest, Error>,
        first: Option<InFlight>,
    ) -> Result<Receipt, Error> {
        let mut receipt = Receipt::default();
        let mut started = first;
        let mut current = if count > 0 { Some(build(0)?) } else { None };
        for chunk in 0..count {
            let ChunkRequest {
                mut request, rows, ..
            } = current.take().expect("built before its turn");
            self.for_server(&mut request);
            let in_flight = started
                .take()
                .unwrap_or_else(|| self.client.start(&request));
            let upcoming = (chunk + 1 < count).then(|| build(chunk + 1));
            let sent = match self.send_request(&request, Some(in_flight)) {
                Err(e) if receipt.chunks == 0 && self.switch_setting_name(&e) => {
                    self.for_server(&mut request);
                    self.send_request(&request, None)
                }
                sent => sent.map_err(constraint_on_foreground),
            };
            match sent {
                Ok(sent) => {
                    let response = sent.value;
                    receipt.retries += sent.retries;
                    receipt.rows += rows;
                    receipt.chunks += 1;
                    match response.summary {
                        Some(s) if self.config.async_insert => {
                            receipt.written_rows += s.written_rows;
                            receipt.unverified_chunks += 1;
                        }
                        Some(s) if s.written_rows >= rows => receipt.written_rows += s.written_rows,
                        Some(s) if s.written_rows == 0 && self.config.dedup => {
                            receipt.deduplicated_chunks += 1
                        }
                        Some(s) => {
                            return Err(Error {
                                committed_rows: receipt.rows - rows,
                                ..Error::new(
                                    ErrorKind::Uncertain,
                                    format!(
                                        "chunk {} of {count} was acknowledged with {} of {rows} rows written; {} rows were committed before it",
                                        chunk + 1,
                                        s.written_rows,
                                        receipt.rows - rows
                                    ),
                                )
                            })
                        }
                        None => receipt.unverified_chunks += 1,
                    }
                }
                Err(e) if receipt.chunks == 0 => return Err(e),
                Err(e) => {
                    return Err(Error::uncertain_after(
                        receipt.rows,
                        &format!(
                            "chunk {} of {count} failed after {} rows in {} chunks were committed",
                            chunk + 1,
                            receipt.rows,
                            receipt.chunks,
                        ),
                        e,
                    ))
                }
            }
            current = match upcoming {
                None => None,
                Some(Ok(next)) => Some(next),
                Some(Err(e)) => {
                    return Err(Error::uncertain_after(
                        receipt.rows,
                        &format!(
                            "chunk {} of {count} could not be built after {} rows were committed",
                            chunk + 2,
                            receipt.rows
                        ),
                        e,
                    ))
                }
            };
        }
        Ok(receipt)
    }

    /// Checks every row of `data` (as [`Sink::send_json`]) and builds every chunk's request,
    /// sending nothing: [`Sink::start`] sends the first chunk, [`Sink::finish`] the rest. A
    /// caller that streams sends prepares its next send while the current one is on the wire
    /// (the CLI reads and checks its next batch so), and starts it once the current one is
    /// acknowledged. Holds every chunk's request in memory.
    pub fn prepare_json(&self, data: &[u8]) -> Result<PreparedSend, Error> {
        self.check_open()?;
        self.prepare(&encode_json(data, self.columns().as_deref())?)
    }

    /// [`Sink::prepare_json`] for typed rows.
    pub fn prepare_rows(&self, rows: &[Row]) -> Result<PreparedSend, Error> {
        self.check_open()?;
        self.prepare(&encode_rows(rows, self.columns().as_deref())?)
    }

    fn prepare(&self, encoded: &Encoded) -> Result<PreparedSend, Error> {
        let (count, format, mut build) = self.chunk_builder(encoded)?;
        let chunks = (0..count)
            .map(&mut build)
            .collect::<Result<VecDeque<_>, _>>()?;
        // Only rows that were all read fix a checkpoint's columns.
        self.fix_columns(encoded);
        Ok(PreparedSend { chunks, format })
    }

    /// The columns a send fills: the configured ones, else those a resumed checkpoint fixed.
    fn columns(&self) -> Option<Vec<String>> {
        self.config.columns.clone().or_else(|| {
            let checkpoints = self.checkpoints.borrow();
            let fixed = &checkpoints.as_ref()?.current.columns;
            (!fixed.is_empty()).then(|| fixed.clone())
        })
    }

    /// A resumable sink without configured columns: the first send's (or check's) columns,
    /// its first row's keys, are every later send's, in this run and the ones that resume it.
    fn fix_columns(&self, encoded: &Encoded) {
        if let Some(checkpoints) = self.checkpoints.borrow_mut().as_mut() {
            if checkpoints.current.columns.is_empty() {
                checkpoints.current.columns = encoded.columns.clone();
            }
        }
    }

    /// [`Sink::prepare_json`] for NDJSON whose rows were found as it was read: `rows` holds
    /// each row's span in `data` ([`super::encode::encode_lines`]).
    #[cfg(any(test, feature = "command"))]
    pub fn prepare_lines(
        &self,
        data: &[u8],
        rows: &[(usize, usize)],
    ) -> Result<PreparedSend, Error> {
        self.check_open()?;
        self.prepare(&encode_lines(data, rows, self.columns().as_deref())?)
    }

    /// Checks every row of `data` as [`Sink::prepare_json`] does, and keeps nothing (no
    /// chunk bodies, no compression): the CLI's first pass over a file. `rows`: each row's
    /// span in `data`, when its lines were found as it was read.
    #[cfg(any(test, feature = "command"))]
    pub fn check_json(&self, data: &[u8], rows: Option<&[(usize, usize)]>) -> Result<(), Error> {
        self.check_open()?;
        let columns = self.columns();
        let encoded = match rows {
            Some(rows) => encode_lines(data, rows, columns.as_deref())?,
            None => encode_json(data, columns.as_deref())?,
        };
        let (_, block, _) = self.read_rows(&encoded, false)?;
        self.keep_block(block);
        self.fix_columns(&encoded);
        Ok(())
    }

    /// Sends the first chunk of a prepared send without waiting for its answer. A resumable
    /// sink ([`Sink::resume`]) refuses it: each of its sends needs a position
    /// ([`Sink::start_at`]).
    #[cfg(any(test, feature = "command"))]
    pub fn start(&self, prepared: PreparedSend) -> Result<StartedSend, Error> {
        self.check_plain()?;
        Ok(self.start_unchecked(prepared, false))
    }

    /// A send without a position: refused by a closed sink, and by a resumable one (its
    /// checkpoint would not cover the rows).
    fn check_plain(&self) -> Result<(), Error> {
        self.check_open()?;
        if self.checkpoints.borrow().is_some() {
            return Err(Error::invalid(
                "this sink keeps a checkpoint: each send needs the position its rows end at (send-at, send-json-at)",
            ));
        }
        Ok(())
    }

    fn start_unchecked(&self, mut prepared: PreparedSend, resumable: bool) -> StartedSend {
        let first = prepared.chunks.front_mut().map(|chunk| {
            self.for_server(&mut chunk.request);
            self.client.start(&chunk.request)
        });
        StartedSend {
            chunks: prepared.chunks,
            first,
            format: prepared.format,
            resumable,
        }
    }

    /// Keeps this sink's progress in the state store under `id` ([`super::resume`]): reads
    /// the checkpoint there (a new one if none) and returns the position of the last
    /// acknowledged send, where the caller's source continues. From then on every send
    /// carries its position ([`Sink::start_at`], [`Sink::send_json_at`], [`Sink::send_at`]),
    /// and the first must be the send that was in flight, if one was. Needs `dedup`; once
    /// per sink.
    pub fn resume(&self, store: StateStore<T, P>, id: &str) -> Result<Option<String>, Error> {
        self.check_open()?;
        if !self.config.dedup {
            return Err(Error::invalid(
                "a checkpoint needs dedup: a send in flight when a process stops is sent again by the next, and only its tokens keep it from being written twice",
            ));
        }
        if self.checkpoints.borrow().is_some() {
            return Err(Error::invalid("this sink already keeps a checkpoint"));
        }
        let checkpoints = Checkpoints::open(
            store,
            id,
            self.qualified.clone(),
            u32::try_from(self.config.batch_size).unwrap_or(u32::MAX),
            self.config.columns.as_deref(),
        )?;
        let position = checkpoints.current.position.clone();
        *self.checkpoints.borrow_mut() = Some(checkpoints);
        Ok(position)
    }

    /// Makes the tokens of the next sends also cover `salt`: a caller that can send the same
    /// rows twice on purpose (the Singer target: the same records after two different STATE
    /// messages) tells the sends apart, while a send repeated with the same salt still gets
    /// the same tokens.
    #[cfg(any(test, feature = "command"))]
    pub fn set_token_salt(&self, salt: &[u8]) {
        *self.token_salt.borrow_mut() = salt.to_vec();
    }

    /// Makes the tokens of the next sends cover `content` (with each chunk's place in its
    /// send) in place of the chunks' bytes; `None`: the bytes again. For a caller whose rows
    /// hold values that change when the same rows are sent again (the Singer target's
    /// `_sdc_received_at`): `content` must then say everything else the rows hold, or two
    /// different sends would share tokens and the server would drop the second.
    #[cfg(any(test, feature = "command"))]
    pub fn set_token_content(&self, content: Option<&[u8]>) {
        *self.token_content.borrow_mut() = content.map(<[u8]>::to_vec);
    }

    /// The checkpoint's committed position and rows, and the position of the send that was
    /// in flight when it was written (which must be sent first); `None` without a checkpoint.
    #[cfg(any(test, feature = "command"))]
    pub fn progress(&self) -> Option<(Option<String>, u64, Option<String>)> {
        let checkpoints = self.checkpoints.borrow();
        let current = &checkpoints.as_ref()?.current;
        Some((
            current.position.clone(),
            current.rows,
            current.in_flight.as_ref().map(|f| f.position.clone()),
        ))
    }

    /// Starts a prepared send of a resumable sink whose rows end at the caller's `position`:
    /// the checkpoint is written first (this send in flight, the ones before it acknowledged),
    /// then the first chunk is sent.
    pub fn start_at(&self, prepared: PreparedSend, position: &str) -> Result<StartedSend, Error> {
        {
            let mut checkpoints = self.checkpoints.borrow_mut();
            let checkpoints = checkpoints.as_mut().ok_or_else(|| {
                Error::invalid("a send with a position needs a checkpoint (resume first)")
            })?;
            let mut digest = Sha256::new();
            for chunk in &prepared.chunks {
                digest.update(chunk.token.as_bytes());
            }
            checkpoints
                .begin(InFlightSend {
                    position: position.to_string(),
                    rows: prepared.chunks.iter().map(|c| c.rows).sum(),
                    digest: crate::hex::hex(&digest.finalize()),
                })
                .map_err(|e| {
                    let message = format!(
                        "the checkpoint could not be written, so this send was not sent: {}",
                        e.message
                    );
                    e.clone().reclassify(e.kind, message)
                })?;
        }
        Ok(self.start_unchecked(prepared, true))
    }

    /// Sends NDJSON or a JSON array of objects through a resumable sink, its rows ending at
    /// the caller's `position` (see [`Sink::resume`]). Holds every chunk in memory (their
    /// tokens identify the send in the checkpoint).
    pub fn send_json_at(&self, data: &[u8], position: &str) -> Result<Receipt, Error> {
        let prepared = self.prepare_json(data)?;
        self.finish(self.start_at(prepared, position)?)
    }

    /// [`Sink::send_json_at`] for typed rows.
    pub fn send_at(&self, rows: &[Row], position: &str) -> Result<Receipt, Error> {
        let prepared = self.prepare_rows(rows)?;
        self.finish(self.start_at(prepared, position)?)
    }

    /// Completes a send [`Sink::start`] began, as [`Sink::send_json`] does from there on
    /// (acknowledged chunks in order, retries, `uncertain` after a committed chunk).
    pub fn finish(&self, started: StartedSend) -> Result<Receipt, Error> {
        let StartedSend {
            mut chunks,
            first,
            format,
            resumable,
        } = started;
        let count = chunks.len();
        let delivered = self.deliver_chunks(
            count,
            &mut |_| Ok(chunks.pop_front().expect("one request per chunk")),
            first,
        );
        let mut receipt = match delivered {
            // Refused with nothing committed (not `uncertain`): no chunk of it landed, so a
            // later send need not repeat it, in this process or one that resumes.
            Err(e) if resumable && e.committed_rows == 0 && e.kind != ErrorKind::Uncertain => {
                if let Some(checkpoints) = self.checkpoints.borrow_mut().as_mut() {
                    checkpoints.abandon_in_flight();
                }
                return Err(e);
            }
            delivered => delivered?,
        };
        receipt.format = Some(format);
        if resumable {
            if let Some(checkpoints) = self.checkpoints.borrow_mut().as_mut() {
                checkpoints.acknowledged(receipt.rows);
            }
        }
        Ok(receipt)
    }

    /// The deduplication token of a chunk: SHA-256 of the table, the columns and the exact
    /// bytes, so the same rows sent again carry the same token.
    fn token(&self, columns: &[String], body: &[u8], chunk: usize) -> String {
        let mut hash = Sha256::new();
        // `database.table` as the server names it (with dedup the database is read at open),
        // so `t` and `db.t` make the same tokens, as they make the same checkpoint.
        hash.update(self.qualified.as_bytes());
        hash.update(b"\n");
        for c in columns {
            hash.update(c.as_bytes());
            hash.update(b"\0");
        }
        hash.update(b"\n");
        #[cfg(any(test, feature = "command"))]
        if let Some(content) = &*self.token_content.borrow() {
            hash.update(content);
            hash.update((chunk as u64).to_le_bytes());
        } else {
            hash.update(body);
        }
        #[cfg(not(any(test, feature = "command")))]
        let _ = chunk;
        #[cfg(not(any(test, feature = "command")))]
        hash.update(body);
        // Empty by default: the digest is then the one of the bytes alone.
        hash.update(&*self.token_salt.borrow());
        crate::hex::hex(&hash.finalize())
    }
}

/// A chunk's body: the rows read into `block` as one Native block, or (a table with a type
/// the sink does not encode) rows `start..end` of `encoded` as JSONEachRow lines.
fn chunk_body(
    format: Format,
    block: &Block,
    encoded: &Encoded,
    start: usize,
    end: usize,
) -> Vec<u8> {
    match format {
        Format::Native => {
            let mut body = Vec::with_capacity(block.size() + 256);
            block.write(&mut body);
            body
        }
        Format::JsonEachRow => encoded.rows(start, end),
    }
}

/// A settings profile that does not allow `distributed_foreground_insert=1` (ClickHouse
/// Cloud's profiles may constrain settings): `misconfigured`, saying what to change.
fn constraint_on_foreground(e: Error) -> Error {
    let constrained = e
        .server
        .as_ref()
        .is_some_and(|s| s.code == SETTING_CONSTRAINT_VIOLATION)
        && (e.message.contains("distributed_foreground_insert")
            || e.message.contains("insert_distributed_sync"));
    if !constrained {
        return e;
    }
    let message = format!(
        "the user's settings profile does not allow distributed_foreground_insert=1, which every INSERT of the sink carries so that an acknowledged row is on its shards, not queued on this server: allow it in the profile (a constraint `changeable_in_readonly` or no constraint on it), or use a user whose profile does: {}",
        e.message
    );
    e.reclassify(ErrorKind::Misconfigured, message)
}

/// Why a table with this engine does not deduplicate inserts that carry a token, or `None` if
/// it does: Replicated and Shared (ClickHouse Cloud) MergeTree engines with a
/// `replicated_deduplication_window` above 0, other MergeTree engines with a
/// `non_replicated_deduplication_window` above 0 (the table's own setting, else the server's
/// default). Nothing else deduplicates.
pub fn deduplication_refusal(
    engine: &str,
    engine_full: &str,
    non_replicated_default: &str,
    replicated_default: &str,
) -> Option<String> {
    if engine == "Distributed" {
        return Some(
            "it is a Distributed table: each chunk is split among the shards by the sharding key, and a resent chunk whose rows reach other shards (a random key, a changed cluster) would meet a token its shard has seen and be dropped there (send with dedup into the shards' local tables instead)".to_string(),
        );
    }
    if !engine.ends_with("MergeTree") {
        return Some(format!(
            "its engine is {engine}; only MergeTree-family tables deduplicate inserts"
        ));
    }
    let (setting, default) = if engine.starts_with("Replicated") || engine.starts_with("Shared") {
        ("replicated_deduplication_window", replicated_default)
    } else {
        (
            "non_replicated_deduplication_window",
            non_replicated_default,
        )
    };
    let window = table_setting(engine_full, setting)
        .unwrap_or(default)
        .trim();
    match window.parse::<u64>() {
        Ok(0) => Some(format!(
            "it is a {engine} table with {setting} = 0 (set it above 0, e.g. ALTER TABLE ... MODIFY SETTING {setting} = 1000, or turn dedup off)"
        )),
        Ok(_) => None,
        Err(_) => Some(format!(
            "its {setting} could not be read ('{}')",
            crate::text::escaped(window)
        )),
    }
}

/// The value of a setting in the `SETTINGS` clause of a table's `engine_full`, if set there.
fn table_setting<'a>(engine_full: &'a str, name: &str) -> Option<&'a str> {
    let (_, clause) = engine_full.rsplit_once(" SETTINGS ")?;
    clause.split(", ").find_map(|pair| {
        let (key, value) = pair.split_once(" = ")?;
        (key.trim() == name).then_some(value.trim())
    })
}

impl<T: Transport, P: Platform> Sink<T, P> {
    /// The table's columns: `DESCRIBE TABLE`, one read request at the first send (a missing
    /// table is the server's `misconfigured` error, before any row is sent); and, when a
    /// date-time column names no zone, the server's time zone (`timezone()`, one more).
    fn table_columns(&self) -> Result<&TableColumns, Error> {
        if let Some(columns) = self.columns.get() {
            return Ok(columns);
        }
        let sql = if self.config.database.is_some() {
            "DESCRIBE TABLE {db:Identifier}.{t:Identifier}"
        } else {
            "DESCRIBE TABLE {t:Identifier}"
        };
        // Pinned so a connection's settings cannot change the answer's shape.
        let mut query = Statement::Describe
            .query(sql)
            .param("t", &self.config.table)
            .setting("output_format_json_array_of_rows", "0")
            .setting("describe_include_subcolumns", "0")
            .format("JSONEachRow");
        if let Some(db) = &self.config.database {
            query = query.param("db", db);
        }
        let response = self.read(query)?;
        // Comments and default expressions are free text, whose bytes ClickHouse writes
        // unchecked: read the answer lossily (the names and types read are the table's
        // identifiers; a name that is not UTF-8 is one no row of ours can name anyway).
        let body = String::from_utf8_lossy(&response.body);
        let described = json_rows(body.as_bytes(), "DESCRIBE TABLE")?;
        let mut columns = Vec::with_capacity(described.len());
        for mut c in described {
            let name = c.text("name")?;
            let ty = Type::parse(&c.text("type")?).map_err(|e| {
                Error::new(
                    ErrorKind::Misconfigured,
                    format!("column '{}': {e}", crate::text::escaped(&name)),
                )
            })?;
            columns.push((name, ty));
        }
        let zone = if TableColumns::needs_server_zone(&columns) {
            let answer = self.read(Statement::Timezone.query("SELECT timezone()"))?;
            String::from_utf8_lossy(&answer.body).trim().to_string()
        } else {
            String::new()
        };
        Ok(self
            .columns
            .get_or_init(|| TableColumns::new(columns, zone)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::error::{TransportError, TransportFailure};
    use crate::client::testing::{fail, ok, written, Scripted};
    use crate::client::{Compression, ConnectionOptions, HttpResponse};
    use crate::platform::testing::FakePlatform;
    use crate::sink::encode::Value;
    use std::cell::RefCell;

    fn ack(written: u64) -> Result<HttpResponse, TransportError> {
        Ok(HttpResponse {
            status: 200,
            headers: vec![(
                "x-clickhouse-summary".into(),
                format!(r#"{{"written_rows":"{written}"}}"#).into_bytes(),
            )],
            body: vec![],
            elapsed_us: 1,
        })
    }

    fn rejected() -> Result<HttpResponse, TransportError> {
        Ok(HttpResponse {
            status: 400,
            headers: vec![("x-clickhouse-exception-code".into(), b"27".to_vec())],
            body:
                b"Code: 27. DB::Exception: Cannot parse input (CANNOT_PARSE_INPUT_ASSERTION_FAILED)"
                    .to_vec(),
            elapsed_us: 1,
        })
    }

    fn sink(t: &Scripted, batch: u32, dedup: bool) -> Sink<&Scripted, FakePlatform> {
        sink_with(t, batch, dedup, 0)
    }

    fn sink_with(
        t: &Scripted,
        batch: u32,
        dedup: bool,
        retries: u32,
    ) -> Sink<&Scripted, FakePlatform> {
        let client = Client::new(&ConnectionOptions::from_url("http://h"), t).unwrap();
        Sink::open(
            client,
            FakePlatform::default(),
            &SinkOptions {
                table: "db.events".into(),
                batch_size: Some(batch),
                dedup,
                retries,
                // The bytes on the wire are what these tests read.
                compression: Compression::None,
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// The answer to the dedup check for a table with this engine.
    fn engine(engine_full: &str) -> Result<HttpResponse, TransportError> {
        let engine = engine_full.split([' ', '(']).next().unwrap();
        ok(&serde_json::json!({
            "engine": engine,
            "engine_full": engine_full,
            "database": "db",
            "non_replicated_default": "0",
            "replicated_default": "10000",
        })
        .to_string())
    }

    const DEDUPLICATING: &str =
        "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 100, index_granularity = 8192";

    /// The DESCRIBE answer of the tests' table, `(id UInt64)`.
    fn id_table() -> Result<HttpResponse, TransportError> {
        described(&[("id", "UInt64")])
    }

    /// The Native block of rows `{"id": n}` for `ids`.
    fn ids_block(ids: std::ops::Range<u64>) -> Vec<u8> {
        let mut b = vec![1, (ids.end - ids.start) as u8, 2, b'i', b'd', 6];
        b.extend_from_slice(b"UInt64");
        for id in ids {
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    fn ndjson(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| format!("{{\"id\":{i}}}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn inserts_are_lz4_compressed_by_default_and_the_token_is_of_the_rows() {
        let data = ndjson(3);
        let t = Scripted::new(vec![id_table(), ack(3)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let options = SinkOptions {
            table: "db.events".into(),
            dedup: false,
            ..Default::default()
        };
        Sink::open(client, FakePlatform::default(), &options)
            .unwrap()
            .send_json(&data)
            .unwrap();
        let sent = t.sent.borrow();
        let encoding = sent[1]
            .headers
            .iter()
            .find(|(n, _)| n == "content-encoding");
        assert_eq!(encoding.map(|(_, v)| v.as_slice()), Some(&b"lz4"[..]));
        assert_eq!(sent[1].body, Compression::Lz4.encode(ids_block(0..3)));
        drop(sent);
        // The same rows make the same deduplication token whatever the compression: a
        // resend with another method is still recognised as the same chunk.
        let token = |compression| {
            let t = Scripted::new(vec![engine(DEDUPLICATING), id_table(), ack(3)]);
            let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
            let options = SinkOptions {
                table: "db.events".into(),
                dedup: true,
                compression,
                ..Default::default()
            };
            Sink::open(client, FakePlatform::default(), &options)
                .unwrap()
                .send_json(&data)
                .unwrap();
            let target = t.sent.borrow()[2].path_and_query.clone();
            target
                .split('&')
                .find(|p| p.starts_with("insert_deduplication_token="))
                .unwrap()
                .to_string()
        };
        assert_eq!(token(Compression::None), token(Compression::Zstd));
    }

    /// A transport that answers every request with `ack(rows)` and logs when a request is
    /// started and when its answer is awaited.
    struct Overlapping {
        events: std::rc::Rc<RefCell<Vec<String>>>,
        answers: RefCell<Vec<Result<HttpResponse, TransportError>>>,
    }

    impl Transport for Overlapping {
        fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
            self.start(request).wait()
        }

        fn start(&self, request: &HttpRequest) -> InFlight {
            let n = request.body.len();
            self.events.borrow_mut().push(format!("start {n}"));
            let answer = self.answers.borrow_mut().remove(0);
            let events = self.events.clone();
            InFlight::pending(move || {
                events.borrow_mut().push(format!("answer {n}"));
                answer
            })
        }
    }

    #[test]
    fn a_prepared_send_waits_for_the_one_on_the_wire_and_goes_in_order() {
        let events = std::rc::Rc::new(RefCell::new(Vec::new()));
        let t = Overlapping {
            events: events.clone(),
            answers: RefCell::new(vec![
                id_table(),
                ack(2),
                ack(1),
                ack(1),
                fail(TransportFailure::Refused),
            ]),
        };
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let options = SinkOptions {
            table: "db.events".into(),
            batch_size: Some(2),
            compression: Compression::None,
            ..Default::default()
        };
        let sink = Sink::open(client, FakePlatform::default(), &options).unwrap();
        // Three rows: two chunks (28 and 20 bytes); the second is started only after the
        // first's answer.
        let first = sink.start(sink.prepare_json(&ndjson(3)).unwrap()).unwrap();
        // Checking the next send (and a bad one) while the first is on the wire sends nothing.
        let next = sink.prepare_json(b"{\"id\":7}\n").unwrap();
        assert!(sink.prepare_json(b"{\"id\":").is_err());
        events.borrow_mut().push("prepared".into());
        let r = sink.finish(first).unwrap();
        assert_eq!((r.rows, r.chunks, r.written_rows), (3, 2, 3));
        let r = sink.finish(sink.start(next).unwrap()).unwrap();
        assert_eq!((r.rows, r.chunks), (1, 1));
        assert_eq!(
            *events.borrow(),
            [
                "start 45",
                "answer 45",
                "start 28",
                "prepared",
                "answer 28",
                "start 20",
                "answer 20",
                "start 20",
                "answer 20"
            ]
        );
        // A started send whose first answer is a failure fails as send_json does.
        let err = sink
            .finish(sink.start(sink.prepare_json(&ndjson(1)).unwrap()).unwrap())
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Disconnected);
    }

    fn server_error(status: u16, code: i32, text: &str) -> Result<HttpResponse, TransportError> {
        Ok(HttpResponse {
            status,
            headers: vec![(
                "x-clickhouse-exception-code".into(),
                code.to_string().into_bytes(),
            )],
            body: format!("Code: {code}. DB::Exception: {text}").into_bytes(),
            elapsed_us: 1,
        })
    }

    #[test]
    fn a_server_that_does_not_know_distributed_foreground_insert_gets_its_old_name() {
        let unknown = || {
            server_error(
                404,
                115,
                "Setting distributed_foreground_insert is neither a builtin setting nor started with the prefix 'custom_' registered for user-defined settings. (UNKNOWN_SETTING)",
            )
        };
        let t = Scripted::new(vec![id_table(), unknown(), ack(2), ack(2), ack(1)]);
        let r = sink(&t, 2, false).send_json(&ndjson(5)).unwrap();
        assert_eq!((r.rows, r.chunks, r.written_rows), (5, 3, 5));
        let all = t.sent.borrow();
        let sent = &all[1..];
        assert_eq!(
            sent.len(),
            4,
            "the refused first chunk once more, then the rest"
        );
        assert!(
            sent[0].path_and_query.contains(FOREGROUND),
            "{}",
            sent[0].path_and_query
        );
        assert_eq!(sent[1].body, sent[0].body);
        for request in &sent[1..] {
            assert!(!request
                .path_and_query
                .contains("distributed_foreground_insert"));
            assert!(
                request.path_and_query.contains(FOREGROUND_OLD),
                "{}",
                request.path_and_query
            );
        }
        drop(all);

        // A send prepared ahead (the CLI's next batch) and started after the switch, too.
        let t = Scripted::new(vec![id_table(), unknown(), ack(1), ack(1)]);
        let s = sink(&t, 2, false);
        s.send_json(&ndjson(1)).unwrap();
        let prepared = s.prepare_json(&ndjson(1)).unwrap();
        s.finish(s.start(prepared).unwrap()).unwrap();
        let last = &t.sent.borrow()[3];
        assert!(
            last.path_and_query.contains(FOREGROUND_OLD),
            "{}",
            last.path_and_query
        );
        assert!(!last.path_and_query.contains(FOREGROUND));

        // Any other unknown setting keeps its kind; so does the old name refused as well.
        let t = Scripted::new(vec![
            id_table(),
            unknown(),
            server_error(
                404,
                115,
                "Setting insert_distributed_sync is neither a builtin setting (UNKNOWN_SETTING)",
            ),
        ]);
        let e = sink(&t, 2, false).send_json(&ndjson(1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
        assert_eq!(t.sent.borrow().len(), 3);
    }

    #[test]
    fn a_profile_that_forbids_the_foreground_setting_is_misconfigured_saying_what_to_change() {
        let t = Scripted::new(vec![
            id_table(),
            server_error(
            500,
            452,
            "Setting distributed_foreground_insert should not be changed. (SETTING_CONSTRAINT_VIOLATION)",
        )
        ]);
        let e = sink(&t, 2, false).send_json(&ndjson(1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Misconfigured, "{e}");
        assert!(
            e.message
                .contains("settings profile does not allow distributed_foreground_insert=1"),
            "{}",
            e.message
        );
        assert_eq!(e.committed_rows, 0);
    }

    #[test]
    fn chunks_are_sent_in_order_and_acknowledged() {
        let t = Scripted::new(vec![id_table(), ack(2), ack(2), ack(1)]);
        let r = sink(&t, 2, false).send_json(&ndjson(5)).unwrap();
        assert_eq!(
            r,
            Receipt {
                rows: 5,
                chunks: 3,
                written_rows: 5,
                format: Some(Format::Native),
                ..Default::default()
            }
        );
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 4);
        assert_eq!(sent[1].body, ids_block(0..2));
        assert_eq!(sent[3].body, ids_block(4..5));
        let url = &sent[1].path_and_query;
        // The table is a parameter; the column list is backquoted text (no parameter there).
        assert!(url.contains("query=INSERT%20INTO%20%7Bdb%3AIdentifier%7D.%7Bt%3AIdentifier%7D%20%28%60id%60%29%20FORMAT%20Native"), "{url}");
        assert!(url.contains("param_db=db&"), "{url}");
        assert!(url.contains("param_t=events"), "{url}");
        assert!(!url.contains("param_c0"), "{url}");
        assert!(url.contains("input_format_null_as_default=0"), "{url}");
        assert!(!url.contains("insert_deduplication_token"), "{url}");
    }

    #[test]
    fn awkward_column_names_are_backquoted_in_the_statement() {
        let t = Scripted::new(vec![ack(1)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let columns = ["id", "weird col", "a`b", "x.y", "{c0:Identifier}"];
        let sink = Sink::open(
            client,
            FakePlatform::default(),
            &SinkOptions {
                table: "events".into(),
                columns: Some(columns.iter().map(|c| c.to_string()).collect()),
                ..Default::default()
            },
        )
        .unwrap();
        let query = sink.insert_query(&sink.config.columns.clone().unwrap(), Format::JsonEachRow);
        assert_eq!(
            query.sql,
            "INSERT INTO {t:Identifier} (`id`, `weird col`, `a\\`b`, `x.y`, `{c0:Identifier}`) FORMAT JSONEachRow"
        );
        assert_eq!(query.params, vec![("t".to_string(), "events".to_string())]);
    }

    #[test]
    fn a_failure_after_a_committed_chunk_is_uncertain() {
        let t = Scripted::new(vec![id_table(), ack(2), ack(2), rejected()]);
        let e = sink(&t, 2, false).send_json(&ndjson(6)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain);
        assert_eq!(e.committed_rows, 4);
        assert!(
            e.message.starts_with(
                "chunk 3 of 3 failed after 4 rows in 2 chunks were committed (permanent:"
            ),
            "{}",
            e.message
        );
        assert_eq!(e.server.unwrap().code, 27);
    }

    #[test]
    fn a_failure_of_the_first_chunk_keeps_its_kind() {
        let t = Scripted::new(vec![id_table(), rejected()]);
        let e = sink(&t, 2, false).send_json(&ndjson(6)).unwrap_err();
        assert_eq!((e.kind, e.committed_rows), (ErrorKind::Permanent, 0));
        let t = Scripted::new(vec![
            id_table(),
            Err(TransportError::new(TransportFailure::Timeout, "")),
        ]);
        let e = sink(&t, 2, false).send_json(&ndjson(1)).unwrap_err();
        assert_eq!(
            e.kind,
            ErrorKind::Uncertain,
            "a timed-out insert may have committed"
        );
        let t = Scripted::new(vec![
            id_table(),
            Err(TransportError::new(TransportFailure::Refused, "")),
        ]);
        let e = sink(&t, 2, false).send_json(&ndjson(1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Disconnected);
    }

    #[test]
    fn fewer_rows_written_than_sent_is_an_error() {
        let t = Scripted::new(vec![id_table(), ack(2), ack(1)]);
        let e = sink(&t, 2, false).send_json(&ndjson(4)).unwrap_err();
        assert_eq!((e.kind, e.committed_rows), (ErrorKind::Uncertain, 2));
        assert!(
            e.message
                .contains("chunk 2 of 2 was acknowledged with 1 of 2 rows written"),
            "{}",
            e.message
        );
        // More rows written than sent (materialized views) is fine.
        let t = Scripted::new(vec![id_table(), ack(4)]);
        assert_eq!(
            sink(&t, 2, false)
                .send_json(&ndjson(2))
                .unwrap()
                .written_rows,
            4
        );
    }

    #[test]
    fn dedup_tokens_are_stable_and_zero_written_means_deduplicated() {
        let t = Scripted::new(vec![engine(DEDUPLICATING), id_table(), ack(2), ack(0)]);
        let s = sink(&t, 2, true);
        s.send_json(&ndjson(2)).unwrap();
        let r = s.send_json(&ndjson(2)).unwrap();
        assert_eq!(r.deduplicated_chunks, 1);
        let sent = &t.sent.borrow()[2..];
        let token = |i: usize| {
            let url = &sent[i].path_and_query;
            let at = url.find("insert_deduplication_token=").unwrap();
            url[at..].split('&').next().unwrap().to_string()
        };
        assert_eq!(token(0), token(1));
        assert_eq!(token(0).len(), "insert_deduplication_token=".len() + 64);
    }

    #[test]
    fn a_failed_chunk_is_resent_with_the_same_token_and_a_lost_commit_is_deduplicated() {
        let t = Scripted::new(vec![
            engine(DEDUPLICATING),
            id_table(),
            ack(2),
            // Chunk 2: refused, then the answer is lost after the server wrote it, then the
            // resend is acknowledged as a duplicate.
            fail(TransportFailure::Refused),
            fail(TransportFailure::Reset),
            ack(0),
            ack(1),
        ]);
        let r = sink_with(&t, 2, true, 3).send_json(&ndjson(5)).unwrap();
        assert_eq!(
            r,
            Receipt {
                rows: 5,
                chunks: 3,
                written_rows: 3,
                deduplicated_chunks: 1,
                retries: 2,
                format: Some(Format::Native),
                ..Default::default()
            }
        );
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 7);
        // The three attempts of chunk 2 are the same request, token and body included.
        assert_eq!(sent[3], sent[4]);
        assert_eq!(sent[4], sent[5]);
        assert_ne!(sent[2].path_and_query, sent[3].path_and_query);
    }

    #[test]
    fn tokens_depend_only_on_target_columns_and_bytes_not_on_the_sink() {
        // Two sinks (two processes, in effect) send the same rows: the same tokens.
        let token_of = |table: &str, data: &[u8]| {
            // More rows written than sent is fine (materialized views): one answer fits all.
            let t = Scripted::new(vec![
                engine(DEDUPLICATING),
                described(&[("id", "UInt64"), ("x", "UInt8")]),
                ack(100),
            ]);
            let client = Client::new(&ConnectionOptions::from_url("http://other:1"), &t).unwrap();
            Sink::open(
                client,
                FakePlatform::default(),
                &SinkOptions {
                    table: table.into(),
                    batch_size: Some(10),
                    dedup: true,
                    ..Default::default()
                },
            )
            .unwrap()
            .send_json(data)
            .unwrap();
            let url = t.sent.borrow()[2].path_and_query.clone();
            let at = url.find("insert_deduplication_token=").unwrap();
            url[at..].split('&').next().unwrap().to_string()
        };
        let a = token_of("db.events", &ndjson(2));
        assert_eq!(a, token_of("db.events", &ndjson(2)));
        assert_ne!(a, token_of("db.other", &ndjson(2)), "another table");
        assert_ne!(a, token_of("db.events", &ndjson(3)), "other rows");
        // Another column set.
        assert_ne!(
            a,
            token_of("db.events", b"{\"id\":0,\"x\":1}\n{\"id\":1,\"x\":1}\n")
        );
    }

    #[test]
    fn a_token_content_replaces_the_bytes_and_each_chunk_keeps_its_own_token() {
        // The tokens of a send of `data` in chunks of 2, with `content` set.
        let tokens_of = |data: &[u8], content: Option<&[u8]>| {
            let t = Scripted::new(vec![
                engine(DEDUPLICATING),
                described(&[("id", "UInt64"), ("x", "UInt8")]),
                ack(2),
                ack(2),
            ]);
            let sink = sink_with(&t, 2, true, 0);
            sink.set_token_content(content);
            sink.send_json(data).unwrap();
            let sent = t.sent.borrow();
            sent[2..]
                .iter()
                .map(|r| {
                    let at = r
                        .path_and_query
                        .find("insert_deduplication_token=")
                        .unwrap();
                    r.path_and_query[at..]
                        .split('&')
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect::<Vec<_>>()
        };
        let rows = |x: u8| format!("{{\"id\":1,\"x\":{x}}}\n{{\"id\":2,\"x\":{x}}}\n").repeat(2);
        let (one, two) = (rows(1), rows(2));
        // Without a content the bytes decide.
        assert_ne!(
            tokens_of(one.as_bytes(), None),
            tokens_of(two.as_bytes(), None)
        );
        // With one, other bytes under the same content: the same tokens, one per chunk.
        let a = tokens_of(one.as_bytes(), Some(b"the records as read"));
        assert_eq!(a, tokens_of(two.as_bytes(), Some(b"the records as read")));
        assert_eq!(a.len(), 2);
        assert_ne!(
            a[0], a[1],
            "two chunks of one send share a content, not a token"
        );
        assert_ne!(a, tokens_of(one.as_bytes(), Some(b"other records")));
    }

    #[test]
    fn retries_stop_at_errors_that_cannot_pass_and_after_the_budget() {
        // A rejected chunk is never resent.
        let t = Scripted::new(vec![engine(DEDUPLICATING), id_table(), rejected()]);
        let e = sink_with(&t, 2, true, 5).send_json(&ndjson(2)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Permanent);
        assert_eq!(t.sent.borrow().len(), 3);
        // Out of retries after a committed chunk: uncertain, with what was committed.
        let t = Scripted::new(vec![
            engine(DEDUPLICATING),
            id_table(),
            ack(2),
            fail(TransportFailure::Timeout),
            fail(TransportFailure::Refused),
        ]);
        let e = sink_with(&t, 2, true, 1).send_json(&ndjson(4)).unwrap_err();
        assert_eq!((e.kind, e.committed_rows), (ErrorKind::Uncertain, 2));
        assert!(e.message.contains("chunk 2 of 2 failed"), "{}", e.message);
    }

    #[test]
    fn dedup_is_refused_on_a_table_that_does_not_deduplicate() {
        for (engine_full, why) in [
            (
                "MergeTree ORDER BY id SETTINGS index_granularity = 8192",
                "non_replicated_deduplication_window = 0",
            ),
            (
                "ReplicatedMergeTree('/t', 'r') ORDER BY id SETTINGS replicated_deduplication_window = 0",
                "replicated_deduplication_window = 0",
            ),
            ("Memory", "only MergeTree-family tables"),
        ] {
            let t = Scripted::new(vec![engine(engine_full)]);
            let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
            let e = Sink::open(
                client,
                FakePlatform::default(),
                &SinkOptions {
                    table: "db.events".into(),
                    dedup: true,
                    ..Default::default()
                },
            )
            .err()
            .unwrap();
            assert_eq!(e.kind, ErrorKind::Misconfigured, "{engine_full}");
            assert!(e.message.contains(why), "{engine_full}: {}", e.message);
        }
        // A missing table is misconfigured too, before any row is read.
        let t = Scripted::new(vec![ok("")]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let e = Sink::open(
            client,
            FakePlatform::default(),
            &SinkOptions {
                table: "events".into(),
                dedup: true,
                ..Default::default()
            },
        )
        .err()
        .unwrap();
        assert_eq!(e.kind, ErrorKind::Misconfigured);
        assert!(e.message.contains("does not exist"), "{}", e.message);
        let sql = String::from_utf8_lossy(&t.sent.borrow()[0].body).into_owned();
        assert!(sql.contains("currentDatabase()"), "{sql}");
    }

    #[test]
    fn deduplicating_engines() {
        let ok_engines = [
            ("MergeTree", "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 1"),
            ("ReplacingMergeTree", "ReplacingMergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 10, index_granularity = 8192"),
            ("ReplicatedMergeTree", "ReplicatedMergeTree('/t', 'r') ORDER BY id"),
            ("SharedMergeTree", "SharedMergeTree('/t', 'r') ORDER BY id SETTINGS index_granularity = 8192"),
        ];
        for (engine, full) in ok_engines {
            assert_eq!(
                deduplication_refusal(engine, full, "0", "10000"),
                None,
                "{full}"
            );
        }
        // The server's default decides when the table sets nothing.
        assert_eq!(
            deduplication_refusal("MergeTree", "MergeTree ORDER BY id", "100", "10000"),
            None
        );
        // `replicated_deduplication_window` inside `non_replicated_...` is not mistaken for it.
        assert!(deduplication_refusal(
            "ReplicatedMergeTree",
            "ReplicatedMergeTree('/t', 'r') ORDER BY id SETTINGS non_replicated_deduplication_window = 5",
            "0",
            "0"
        )
        .is_some());
        assert!(
            deduplication_refusal("Distributed", "Distributed(c, d, t)", "100", "100").is_some()
        );
    }

    fn described(columns: &[(&str, &str)]) -> Result<HttpResponse, TransportError> {
        let body: String = columns
            .iter()
            .map(|(n, t)| format!("{{\"name\":\"{n}\",\"type\":\"{t}\",\"default_type\":\"\"}}\n"))
            .collect();
        Ok(HttpResponse {
            status: 200,
            headers: vec![],
            body: body.into_bytes(),
            elapsed_us: 1,
        })
    }

    #[test]
    fn a_null_a_column_cannot_hold_is_refused_before_any_insert() {
        let t = Scripted::new(vec![described(&[
            ("id", "UInt32"),
            ("n", "Nullable(String)"),
        ])]);
        let s = sink(&t, 10, false);
        let e = s
            .send_json(b"{\"id\":1,\"n\":null}\n{\"id\":null,\"n\":\"x\"}\n")
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(
            e.message.starts_with(
                "line 2, column 'id': null is not allowed: the column is not Nullable"
            ),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("the column's type is UInt32"),
            "{}",
            e.message
        );
        // Only the DESCRIBE was sent, once, with the table as parameters.
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 1);
        assert!(sent[0]
            .body
            .starts_with(b"DESCRIBE TABLE {db:Identifier}.{t:Identifier}"));
        drop(sent);
        // Typed rows use the cached types: no second DESCRIBE.
        let e = s
            .send(&[vec![("id".into(), Value::Null), ("n".into(), Value::Null)]])
            .unwrap_err();
        assert!(e.message.contains("column 'id'"), "{}", e.message);
        assert_eq!(t.sent.borrow().len(), 1);
    }

    #[test]
    fn a_describe_that_meets_a_fault_is_retried_as_the_sink_allows() {
        // With dedup and retries: the dedup check, a DESCRIBE cut off, the DESCRIBE again,
        // the insert.
        let t = Scripted::new(vec![
            engine("MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 100"),
            fail(TransportFailure::Reset),
            described(&[("id", "UInt64")]),
            written(1),
        ]);
        let s = sink_with(&t, 10, true, 2);
        let r = s.send_json(br#"{"id":1000}"#).unwrap();
        assert_eq!(r.rows, 1);
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 4);
        assert!(sent[1].body.starts_with(b"DESCRIBE TABLE"));
        assert!(sent[2].body.starts_with(b"DESCRIBE TABLE"));
    }

    /// A column COMMENT whose bytes are not UTF-8 does not fail the DESCRIBE.
    #[test]
    fn a_comment_that_is_not_utf8_does_not_fail_the_column_types() {
        let mut answer = described(&[("id", "UInt32")]).unwrap();
        answer.body = b"{\"name\":\"id\",\"type\":\"UInt32\",\"comment\":\"\xff\"}\n".to_vec();
        let t = Scripted::new(vec![Ok(answer)]);
        let e = sink(&t, 10, false)
            .send_json(b"{\"id\":null}\n")
            .unwrap_err();
        assert!(
            e.message
                .starts_with("line 1, column 'id': null is not allowed"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_table_is_described_once_per_sink_and_the_server_zone_asked_only_when_needed() {
        let t = Scripted::new(vec![id_table(), ack(2), ack(2)]);
        let s = sink(&t, 10, false);
        s.send_json(&ndjson(2)).unwrap();
        s.send_json(&ndjson(2)).unwrap();
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 3);
        assert!(sent[0].body.starts_with(b"DESCRIBE TABLE"));
        assert!(sent[1].path_and_query.contains("query=INSERT"));
        drop(sent);
        // A DateTime without a zone: its wall-clock values mean the server's zone; in a zone
        // other than UTC they go as text for the server to convert.
        let t = Scripted::new(vec![
            described(&[("ts", "DateTime")]),
            ok("Europe/Berlin\n"),
            ack(1),
        ]);
        sink(&t, 10, false)
            .send_json(b"{\"ts\":\"2026-01-01 10:00:00\"}\n")
            .unwrap();
        let sent = t.sent.borrow();
        assert!(sent[1].body.starts_with(b"SELECT timezone()"));
        let mut want = vec![1, 1, 2, b't', b's', 6];
        want.extend_from_slice(b"String\x132026-01-01 10:00:00");
        assert_eq!(sent[2].body, want);
    }

    #[test]
    fn closed_sinks_and_bad_rows_send_nothing() {
        // A bad row is found reading rows for the column types: one DESCRIBE, no INSERT.
        let t = Scripted::new(vec![described(&[("a", "UInt8")])]);
        let mut s = sink(&t, 2, false);
        let e = s.send_json(b"{\"a\":1}\n[2]").unwrap_err();
        assert_eq!(e.message, "line 2 is not a JSON object");
        s.close().unwrap();
        s.close().unwrap();
        let e = s.send_json(&ndjson(1)).unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::InvalidInput, "the sink is closed")
        );
        let sent = t.sent.borrow();
        assert_eq!(sent.len(), 1);
        assert!(!String::from_utf8_lossy(&sent[0].body).contains("INSERT"));
        assert!(!sent[0].path_and_query.contains("INSERT"));
    }
}
