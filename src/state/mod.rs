//! The pipeline state store (Meltano `StateStoreManager` parity): `partial` / `completed` JSON
//! per state id in a `ReplacingMergeTree` read with `FINAL`, glob listing, bulk get/set,
//! delete, clear-all, and an advisory lock ([`lock`]).
//!
//! Submodules: [`schema`] (DDL and checks), [`tables`] (table names, lock engines), [`ids`]
//! (id checks, the printed form), [`json`] (parts, deep merge), [`glob`] (fnmatch), [`lock`]
//! (the dispatch between the lock engines: [`lock::merge_tree`], the commit-order lock, and
//! [`lock::keeper_map`], the Keeper-backed lock).

pub mod glob;
pub mod held;
pub mod ids;
pub mod json;
pub mod known;
pub mod lock;
mod planted;
pub mod schema;
pub mod steps;
pub mod tables;

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};

use crate::client::response::json_rows;
use crate::client::retry::{RetryPolicy, DEFAULT_RETRIES};
use crate::client::{escape_param, Client, Error, ErrorKind, ExternalTable, Transport};
use crate::platform::Platform;

use known::{Known, Stored};
use lock::Tried;
use steps::{Request, Session, Step};

pub use held::HeldLock;
pub use ids::{check_id, check_new_id, escape_id, MAX_ID_BYTES};
pub use lock::{LockHandle, LockOptions};
pub use tables::{LockEngine, LockEngineChoice, Replication, Tables};

/// Default database.
pub const DEFAULT_DATABASE: &str = "meltano";
/// Default state table.
pub const DEFAULT_TABLE: &str = "state";
/// The default lock table is the state table's name with this suffix (`state_component_lock`):
/// not `<table>_lock`, which is meltano-state-backend-clickhouse's lock table (another layout),
/// so both can run beside each other on one state table.
pub const DEFAULT_LOCK_TABLE_SUFFIX: &str = "_component_lock";

/// How to open a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Database (default `meltano`).
    pub database: String,
    /// State table (default `state`).
    pub table: String,
    /// Lock table (default `<table>_component_lock`: [`DEFAULT_LOCK_TABLE_SUFFIX`]).
    pub lock_table: Option<String>,
    /// Create the database and tables if missing (default true); false never issues DDL and
    /// fails if the tables are missing.
    pub create_schema: bool,
    /// Lock timing.
    pub lock: LockOptions,
    /// Lock engine (default: auto).
    pub lock_engine: LockEngineChoice,
    /// A cluster (`remote_servers`) to create the schema on: with `create_schema`, the
    /// database and tables are created `ON CLUSTER`, the state table as a
    /// ReplicatedReplacingMergeTree and the lock table as KeeperMap (the merge-tree lock is
    /// refused: it is sound on one server only). None (default): on the server reached.
    pub cluster: Option<String>,
    /// How many times a request that failed in a way that may pass (`disconnected`,
    /// `transient`, `uncertain`, `throttled`) is repeated, with capped exponential backoff
    /// (default [`DEFAULT_RETRIES`]). Releases of a lock are repeated until the lease ends
    /// whatever this says. See [`steps`].
    pub retries: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            database: DEFAULT_DATABASE.into(),
            table: DEFAULT_TABLE.into(),
            lock_table: None,
            create_schema: true,
            lock: LockOptions::default(),
            lock_engine: LockEngineChoice::Auto,
            cluster: None,
            retries: DEFAULT_RETRIES,
        }
    }
}

impl StoreOptions {
    /// The lock table: `lock_table` if set, else `<table>_component_lock`.
    pub fn lock_table_name(&self) -> String {
        self.lock_table
            .clone()
            .unwrap_or_else(|| format!("{}{DEFAULT_LOCK_TABLE_SUFFIX}", self.table))
    }
}

/// One state: both parts, as JSON objects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    /// State id.
    pub id: String,
    /// Partial (incremental, not yet completed) state.
    pub partial: Map<String, Value>,
    /// Completed state.
    pub completed: Map<String, Value>,
}

impl State {
    /// Parses both parts from JSON text (empty text is `{}`), validating the id as one to be
    /// written ([`check_new_id`]): the state is given to a write.
    pub fn from_json(id: &str, partial: &str, completed: &str) -> Result<State, Error> {
        check_new_id(id)?;
        Ok(State {
            id: id.to_string(),
            partial: json::parse_part(partial, "partial state")?,
            completed: json::parse_part(completed, "completed state")?,
        })
    }

    /// The merged view Meltano shows: the completed part with the partial merged over it.
    pub fn merged(&self) -> Map<String, Value> {
        let mut merged = self.completed.clone();
        json::deep_merge(&mut merged, &self.partial);
        merged
    }
}

/// The longest request target a fenced write sends with the state in the URL (a larger one
/// sends it in the body, as an external table): under the HTTP stack's limit of 65,534 bytes
/// (the `http` crate's `Uri`, which wasi:http hosts use; a server's `http_max_uri_size` is
/// 1 MiB), with room for the scheme and authority.
const MAX_FENCED_URL_BYTES: usize = 60_000;

/// A stored part's text as an object (`None`: empty); a part that is not a JSON object is
/// `permanent` (the store never writes one).
fn stored_part(text: Option<&str>, what: &str, id: &str) -> Result<Map<String, Value>, Error> {
    match text {
        None => Ok(Map::new()),
        Some(text) => json::parse_part(text, what).map_err(|e| {
            Error::new(
                ErrorKind::Permanent,
                format!(
                    "the stored {what} of '{}' is unusable: {}",
                    lock::shorten(id),
                    e.message
                ),
            )
        }),
    }
}

/// `update`'s write computed before its lock is confirmed: the new state, and the stored state
/// it was merged into (`None` for a completed part, which replaces whatever is stored).
struct WriteAhead {
    new: State,
    base: Option<Stored>,
}

/// `state` applied to the stored parts `base` by Meltano's `update` rule.
fn merge_into(state: &State, base: Stored) -> Result<State, Error> {
    let id = state.id.as_str();
    let [p, c] = base.unwrap_or_default();
    updated(
        state,
        stored_part(p.as_deref(), "partial state", id)?,
        stored_part(c.as_deref(), "completed state", id)?,
    )
}

/// The stored parts as the lock's confirming query read them ([`StateStore::also_read_state`]).
fn decode_stored(read: Option<Value>) -> Result<Stored, Error> {
    let parts: Vec<Option<String>> = match read {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => serde_json::from_value(value).map_err(|e| {
            Error::new(
                ErrorKind::Permanent,
                format!("unexpected answer for the stored state: {e}"),
            )
        })?,
    };
    match <[Option<String>; 2]>::try_from(parts) {
        Ok(parts) => Ok(Some(parts)),
        Err(parts) if parts.is_empty() => Ok(None),
        Err(parts) => Err(Error::new(
            ErrorKind::Permanent,
            format!(
                "unexpected answer for the stored state: {} parts",
                parts.len()
            ),
        )),
    }
}

/// Checks the options that need no server: names, the lock engine on a cluster, the lease.
/// Returns the lock table's name.
fn check_options(options: &StoreOptions) -> Result<String, Error> {
    check_name("database", &options.database)?;
    check_name("table", &options.table)?;
    let lock_table = options.lock_table_name();
    check_name("lock table", &lock_table)?;
    if let Some(cluster) = &options.cluster {
        check_name("cluster", cluster)?;
        if options.lock_engine == LockEngineChoice::MergeTree {
            return Err(Error::invalid(
                    "the merge-tree lock is only sound on one server (block numbers follow commit order only there): on a cluster use the keeper-map lock (or auto)",
                ));
        }
    }
    if lock_table == options.table {
        return Err(Error::invalid(
            "the lock table must differ from the state table",
        ));
    }
    if options.lock.stale_after.is_zero() {
        return Err(Error::invalid(
            "the stale-after window must be greater than 0",
        ));
    }
    if options.lock.stale_after > lock::MAX_STALE_AFTER {
        return Err(Error::invalid(format!(
            "the stale-after window is at most {} s ({} h); renew a long-held lock instead",
            lock::MAX_STALE_AFTER.as_secs(),
            lock::MAX_STALE_AFTER.as_secs() / 3600
        )));
    }
    Ok(lock_table)
}

/// `request` with the parameters of its condition that the stored state is `base` (`b_row`:
/// there is a row; `b_pn`/`b_cn`: its part is NULL; `b_p`/`b_c`: the parts).
fn with_base(request: Request, base: &Stored) -> Request {
    let [p, c] = base.clone().unwrap_or_default();
    let flag = |b: bool| if b { "1" } else { "0" };
    request
        .param("b_row", flag(base.is_some()))
        .param("b_pn", flag(p.is_none()))
        .param("b_p", p.unwrap_or_default())
        .param("b_cn", flag(c.is_none()))
        .param("b_c", c.unwrap_or_default())
}

/// The external table `state_parts` (`p`, `c`) of one state's parts, for a statement too long
/// for the URL.
fn parts_table(partial: &str, completed: &str) -> ExternalTable {
    let mut rows = escape_param(partial).into_bytes();
    rows.push(b'\t');
    rows.extend(escape_param(completed).into_bytes());
    rows.push(b'\n');
    ExternalTable {
        name: "state_parts".into(),
        structure: "p String, c String".into(),
        rows,
    }
}

/// What a write of `state` leaves stored.
fn stored(state: &State) -> Stored {
    Some([
        json::part_text(&state.partial),
        json::part_text(&state.completed),
    ])
}

/// Whose lock a write runs under, which decides whether an attempt whose answer was lost may
/// be repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holding {
    /// The call's own lock, released when it returns: a late first attempt is fenced out by
    /// then, so a lost answer may be repeated.
    OwnLock,
    /// The caller's lock, held across writes: a late first attempt could land after a later
    /// write of the same holder and undo it, so a lost answer is `uncertain`.
    CallersLock,
}

/// A failed DELETE mutation: the server may have registered it before failing (a timeout, an
/// overload), so anything but "nothing reached the server" or a refusal of the statement
/// may still apply it: `uncertain`.
fn mutation_may_apply(e: Error) -> Error {
    match e.kind {
        ErrorKind::Transient | ErrorKind::Throttled => {
            let message = format!("the delete may still be applied: {}", e.message);
            e.reclassify(ErrorKind::Uncertain, message)
        }
        _ => e,
    }
}

/// Checks that `handle` is a lock on `id`.
fn check_held(id: &str, handle: &LockHandle) -> Result<(), Error> {
    check_id(id)?;
    if handle.id != id {
        return Err(Error::invalid(format!(
            "the lock held is on state id '{}', not '{}'",
            lock::shorten(&handle.id),
            lock::shorten(id)
        )));
    }
    Ok(())
}

/// Meltano `update` semantics: a non-empty completed part replaces the state and clears the
/// partial; otherwise the partial is deep-merged into the stored partial and the stored
/// completed part is kept.
fn updated(
    state: &State,
    stored_partial: Map<String, Value>,
    stored_completed: Map<String, Value>,
) -> Result<State, Error> {
    if !state.completed.is_empty() {
        return Ok(State {
            id: state.id.clone(),
            partial: Map::new(),
            completed: state.completed.clone(),
        });
    }
    let mut partial = stored_partial;
    json::deep_merge(&mut partial, &state.partial);
    let size = json::object_text(&partial).len();
    if size > json::MAX_PART_BYTES {
        return Err(Error::invalid(format!(
            "the merged partial state would be {size} bytes; the limit is {} bytes",
            json::MAX_PART_BYTES
        )));
    }
    Ok(State {
        id: state.id.clone(),
        partial,
        completed: stored_completed,
    })
}

fn check_name(what: &str, name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "{what} name must be 1 to 200 characters without control characters"
        )));
    }
    Ok(())
}

/// A state store over one client.
pub struct StateStore<T: Transport, P: Platform> {
    client: Client<T>,
    platform: P,
    tables: Tables,
    lock_options: LockOptions,
    retry: RetryPolicy,
    /// What this store last wrote or read of a few ids: `update`'s base before its lock is
    /// confirmed.
    known: Known,
    /// The server refused a write ahead of the lock's confirmation (a statement it cannot
    /// run): `update` takes the plain path from then on.
    write_ahead_refused: AtomicBool,
}

impl<T: Transport, P: Platform> StateStore<T, P> {
    /// Opens the store: validates the options, then creates the schema (`create_schema`) or
    /// checks that it exists with the right layout.
    pub fn open(client: Client<T>, platform: P, options: &StoreOptions) -> Result<Self, Error> {
        let lock_table = check_options(options)?;
        let mut tables = Tables {
            database: options.database.clone(),
            state: options.table.clone(),
            lock: lock_table,
            lock_engine: LockEngine::MergeTree,
            replication: Replication::None,
        };
        // Every statement of the store names its database: the connection's (a URI's path,
        // as in `clickhouse://host:8123/meltano` on a server without `meltano` yet) is not
        // sent, so the first run on a fresh server creates the schema instead of failing.
        let client = client.without_database();
        let retry = RetryPolicy::new(options.retries);
        let session = Session {
            client: &client,
            platform: &platform,
            retry,
            lease: options.lock.stale_after,
            replication: Replication::None,
        };
        tables.lock_engine = schema::prepare(
            &session,
            &tables,
            options.create_schema.then_some(schema::Create {
                cluster: options.cluster.as_deref(),
            }),
            options.lock_engine,
        )?;
        tables.replication = schema::verify(&session, &tables)?;
        Ok(StateStore {
            client,
            platform,
            tables,
            lock_options: options.lock,
            retry,
            known: Known::default(),
            write_ahead_refused: AtomicBool::new(false),
        })
    }

    /// What the store's requests are sent with.
    fn session(&self) -> Session<'_, T, P> {
        Session {
            client: &self.client,
            platform: &self.platform,
            retry: self.retry,
            lease: self.lock_options.stale_after,
            replication: self.tables.replication,
        }
    }

    fn query(&self, step: Step, sql: &str) -> Request {
        step.query(sql)
            .param("db", &self.tables.database)
            .param("t", &self.tables.state)
    }

    fn read_states(&self, query: Request) -> Result<Vec<State>, Error> {
        Ok(self
            .read_stored(query)?
            .into_iter()
            .map(|(state, _)| state)
            .collect())
    }

    /// [`Self::read_states`], with each state's parts as the server returned them.
    fn read_stored(&self, query: Request) -> Result<Vec<(State, Stored)>, Error> {
        let response = self.session().execute(&query.format("JSONEachRow"))?;
        // One row as the store selects it; any other shape is an error, never a default.
        let rows = json_rows(&response.body, "the state query")?;
        rows.into_iter()
            .map(|mut row| {
                let id = row.text("state_id")?;
                let partial = row.optional_text("partial_state")?;
                let completed = row.optional_text("completed_state")?;
                row.all_taken()?;
                let state = State {
                    partial: stored_part(partial.as_deref(), "partial state", &id)?,
                    completed: stored_part(completed.as_deref(), "completed state", &id)?,
                    id,
                };
                Ok((state, Some([partial, completed])))
            })
            .collect()
    }

    /// The state of `id`, or `None` if there is none. Missing parts read as `{}`.
    /// Consistency: reads the newest committed version (`FINAL`).
    pub fn get(&self, id: &str) -> Result<Option<State>, Error> {
        check_id(id)?;
        let query = self
            .query(
                Step::Get,
                "SELECT state_id, partial_state, completed_state
                 FROM {db:Identifier}.{t:Identifier} FINAL
                 WHERE state_id = {id:String} LIMIT 1",
            )
            .param("id", id);
        let (state, parts) = self.read_stored(query)?.pop().unzip();
        self.known.record(id, parts.flatten());
        Ok(state)
    }

    /// Writes both parts of each state (overwrite), in one INSERT. Ids must be distinct.
    /// Consistency: once it returns, every reader sees the new versions.
    pub fn set_all(&self, states: &[State]) -> Result<(), Error> {
        self.write_states(states, false)
    }

    /// The INSERT of [`Self::set_all`]; `repeat_lost` also repeats an attempt whose answer was
    /// lost (only for states the caller alone writes, forward: see [`Self::set_own`]).
    fn write_states(&self, states: &[State], repeat_lost: bool) -> Result<(), Error> {
        if states.is_empty() {
            return Ok(());
        }
        let mut body = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for state in states {
            check_new_id(&state.id)?;
            if !seen.insert(state.id.as_str()) {
                return Err(Error::invalid(format!(
                    "state id '{}' appears twice in one set-all",
                    lock::shorten(&state.id)
                )));
            }
            let row = serde_json::json!({
                "state_id": state.id,
                "partial_state": json::part_text(&state.partial),
                "completed_state": json::part_text(&state.completed),
            });
            let line = row.to_string();
            if line.len() > 2 * json::MAX_PART_BYTES + MAX_ID_BYTES + 1024 {
                return Err(Error::invalid(format!(
                    "state '{}' is too large",
                    lock::shorten(&state.id)
                )));
            }
            body.extend_from_slice(line.as_bytes());
            body.push(b'\n');
        }
        // Repeated only when nothing reached the server, or the server said it failed: a lost
        // answer is `uncertain`, because the first attempt could still land after a later
        // write of the same caller and undo it.
        let query = self
            .query(
                Step::Set,
                "INSERT INTO {db:Identifier}.{t:Identifier} (state_id, partial_state, completed_state) FORMAT JSONEachRow",
            )
            .data(body);
        let result = self
            .session()
            .send(&lock::write_settings(query).lost_answer_is_final(!repeat_lost))
            .map(|_| ());
        for state in states {
            self.remember(&state.id, &result, stored(state));
        }
        result
    }

    /// Records what a write of `id` leaves stored (`written`) if it succeeded, else forgets
    /// the id.
    fn remember<R>(&self, id: &str, result: &Result<R, Error>, written: Stored) {
        match result {
            Ok(_) => self.known.record(id, written),
            Err(_) => self.known.forget(id),
        }
    }

    /// Overwrites both parts of one state (Meltano `set`).
    pub fn set(&self, state: &State) -> Result<(), Error> {
        self.set_all(std::slice::from_ref(state))
    }

    /// As [`Self::set`], for a state only this caller writes, and only forward (e.g. a sink's
    /// checkpoint): an attempt whose answer was lost is repeated too, since a late first
    /// attempt can at worst bring back the caller's previous version.
    pub fn set_own(&self, state: &State) -> Result<(), Error> {
        self.write_states(std::slice::from_ref(state), true)
    }

    /// Meltano `update`, under the lock: a state with a non-empty completed part replaces the
    /// row and clears the partial; otherwise its partial part is deep-merged into the stored
    /// partial and the stored completed part is kept. Returns the state as stored.
    ///
    /// Three requests when the result is known before the lock is confirmed (a completed part,
    /// or a partial one and this store knows what the id holds: [`known`]): the lock's claim,
    /// the fenced write (its fence confirms the claim; a partial write also checks on the
    /// server that the stored state is the one it was computed from), the release. Otherwise,
    /// or when that write lets nothing through, the claim is confirmed by a query that also
    /// reads the stored state, and the write follows: four requests (five after a wasted
    /// write).
    pub fn update(&self, state: &State) -> Result<State, Error> {
        check_new_id(&state.id)?;
        let id = state.id.as_str();
        let early = planted::read_before_lock(|| self.read_parts(id))?;
        let ahead = self
            .write_ahead(state)?
            .filter(|_| early.is_none() && !self.write_ahead_refused.load(Ordering::Relaxed));
        let first = |handle: &LockHandle| self.try_write_ahead(ahead.as_ref(), handle);
        let acquired = lock::acquire_trying(
            &self.session(),
            &self.tables,
            id,
            &self.lock_options,
            Some(&self.also_read_state()),
            ahead.is_some().then_some(&first as lock::First<'_>),
        );
        let acquired = acquired.inspect_err(|_| self.known.forget(id))?;
        let result = match (acquired.first, &ahead) {
            (Some(Tried::Written), Some(ahead)) => {
                self.known.record(id, stored(&ahead.new));
                Ok(ahead.new.clone())
            }
            _ => {
                let read = early.unwrap_or(acquired.read);
                let lost_ahead = ahead
                    .as_ref()
                    .filter(|_| acquired.first == Some(Tried::Unknown));
                self.update_under_lock(state, read, &acquired.handle, lost_ahead)
            }
        };
        // The write ahead whose answer was lost may land yet (the server may still be running
        // it), whatever failed after it: nothing is known.
        let result = result.map_err(|e| match acquired.first {
            Some(Tried::Unknown) if e.kind != ErrorKind::Uncertain => {
                let message = format!(
                    "{} (and an earlier attempt of this update's write, whose answer was lost, may have been applied)",
                    e.message
                );
                e.reclassify(ErrorKind::Uncertain, message)
            }
            _ => e,
        });
        self.finish_locked(result, &acquired.handle)
    }

    /// What the lock's confirming query also reads for `update`: the stored parts, as an array
    /// (one round trip less; a tuple would print as an object under
    /// enable_named_columns_in_function_tuple=1; an aggregate always yields one row, so no
    /// stored row reads as []).
    fn also_read_state(&self) -> lock::AlsoRead {
        lock::AlsoRead {
            expression: "(SELECT anyLast([partial_state, completed_state])
                 FROM {db:Identifier}.{t:Identifier} FINAL WHERE state_id = {id:String})"
                .into(),
            params: vec![("t".into(), self.tables.state.clone())],
        }
    }

    /// The stored parts of `id` in the form [`Self::also_read_state`] reads them (for the
    /// planted bug that reads them before the lock).
    fn read_parts(&self, id: &str) -> Result<Option<Value>, Error> {
        Ok(self.get(id)?.map(|s| {
            let text = |p: &Map<String, Value>| json::part_text(p).map(Value::String);
            Value::Array(vec![
                text(&s.partial).unwrap_or(Value::Null),
                text(&s.completed).unwrap_or(Value::Null),
            ])
        }))
    }

    /// `update`'s result if it can be known before the lock is confirmed: a completed part
    /// replaces whatever is stored; a partial part is merged into the state this store knows
    /// of the id ([`known`]), which the write then checks is still stored.
    fn write_ahead(&self, state: &State) -> Result<Option<WriteAhead>, Error> {
        if !state.completed.is_empty() {
            let new = updated(state, Map::new(), Map::new())?;
            return Ok(Some(WriteAhead { new, base: None }));
        }
        Ok(self.known.base(&state.id).and_then(|base| {
            let new = merge_into(state, base.clone()).ok()?;
            Some(WriteAhead {
                new,
                base: Some(base),
            })
        }))
    }

    /// The write ahead, right after the lock's first claim ([`lock::First`]). Only a write
    /// that fits in the URL goes ahead (its check carries the base too); one that does not is
    /// not sent, and the lock is confirmed as usual.
    fn try_write_ahead(
        &self,
        ahead: Option<&WriteAhead>,
        handle: &LockHandle,
    ) -> Result<Tried, Error> {
        let Some(ahead) = ahead else {
            return Ok(Tried::NotWritten);
        };
        let Some(request) = self.fenced_insert(&ahead.new, handle, ahead.base.as_ref()) else {
            return Ok(Tried::NotWritten);
        };
        match lock::execute_fenced(&self.session(), request, handle) {
            Ok(()) => Ok(Tried::Written),
            Err(e) if e.kind == ErrorKind::Locked => Ok(Tried::NotWritten),
            // The server refused the statement (nothing was written): this store writes ahead
            // no more, and the update goes on the plain way.
            Err(e)
                if matches!(e.kind, ErrorKind::Permanent | ErrorKind::Misconfigured)
                    && e.server.is_some() =>
            {
                self.write_ahead_refused.store(true, Ordering::Relaxed);
                Ok(Tried::NotWritten)
            }
            Err(e) => Err(e),
        }
    }

    /// `update` the plain way, with the lock confirmed by `handle`'s query, which read the
    /// stored parts `read`: merge into them and write, fenced. If the stored state already is
    /// the result of a write ahead whose answer was lost (`lost_ahead`), that write landed (or
    /// the state already was its result): that is the result.
    fn update_under_lock(
        &self,
        state: &State,
        read: Option<Value>,
        handle: &LockHandle,
        lost_ahead: Option<&WriteAhead>,
    ) -> Result<State, Error> {
        let id = state.id.as_str();
        let now = decode_stored(read)?;
        if let Some(ahead) = lost_ahead.filter(|a| now == stored(&a.new)) {
            self.known.record(id, now);
            return Ok(ahead.new.clone());
        }
        self.known.record_read(id, now.clone());
        let new = merge_into(state, now)?;
        self.set_fenced(&new, handle, Holding::OwnLock)?;
        Ok(new)
    }

    /// Releases `handle` after a locked operation and returns the operation's outcome. The
    /// release is repeated until it lands or the lease has ended; if it still failed, the lock
    /// frees itself at the lease's end, and the operation's outcome stands either way (what it
    /// wrote is written: reporting an error would tell the caller it may not be).
    fn finish_locked<R>(&self, result: Result<R, Error>, handle: &LockHandle) -> Result<R, Error> {
        let _ = self.release(handle);
        result
    }

    /// Writes both parts of `state` only while `handle` holds its lock (fenced): `locked` and
    /// nothing written otherwise. The parts travel as query parameters in the URL when they fit
    /// [`MAX_FENCED_URL_BYTES`], else as an external table (`multipart/form-data` body): a
    /// request target is limited to 64 KiB.
    fn set_fenced(
        &self,
        state: &State,
        handle: &LockHandle,
        holding: Holding,
    ) -> Result<(), Error> {
        let request = self
            .fenced_insert(state, handle, None)
            .ok_or_else(|| Error::invalid("the state does not fit in a request"))?
            .lost_answer_is_final(holding == Holding::CallersLock);
        let result = lock::execute_fenced(&self.session(), request, handle);
        self.remember(&state.id, &result, stored(state));
        result
    }

    /// The fenced INSERT of [`Self::set_fenced`]. With `base` (what the id held when `state`
    /// was computed from it), it writes only if the stored state is `base` or already `state`
    /// (read in the same statement as the fence), and only with the parts in the URL: `None`
    /// if they do not fit. Without, `None` only if the statement cannot be built at all.
    fn fenced_insert(
        &self,
        state: &State,
        handle: &LockHandle,
        base: Option<&Stored>,
    ) -> Option<Request> {
        let partial = json::part_text(&state.partial).unwrap_or_default();
        let completed = json::part_text(&state.completed).unwrap_or_default();
        // The stored state, and the condition that it is `base` or the new state.
        let (with, unchanged) = match base {
            None => ("", ""),
            Some(_) => planted::write_ahead_check(
                "WITH (SELECT anyLast([partial_state, completed_state])
                       FROM {db:Identifier}.{t:Identifier} FINAL WHERE state_id = {id:String}) AS stored
                 ",
                " AND (stored = if({b_row:UInt8} = 1, [if({b_pn:UInt8} = 1, NULL, {b_p:String}), if({b_cn:UInt8} = 1, NULL, {b_c:String})], [])
                     OR stored = [nullIf({p:String}, ''), nullIf({c:String}, '')])",
            ),
        };
        // The two parts, as expressions, and where they come from.
        let step = base.map_or(Step::Set, |_| Step::SetUnlessChanged);
        let insert = |p: &str, c: &str, from: &str| {
            step.query(format!(
                    "INSERT INTO {{db:Identifier}}.{{t:Identifier}} (state_id, partial_state, completed_state)
                 {with}SELECT {{id:String}}, nullIf({p}, ''), nullIf({c}, ''){from}
                 WHERE {}{unchanged}",
                    lock::holds(&self.tables)
                ))
                .param("t", &self.tables.state)
        };
        let fenced = |query: Request| {
            lock::write_settings(lock::fence(query, &self.tables, handle, &self.lock_options))
        };
        let in_url = insert("{p:String}", "{c:String}", "")
            .param("p", partial.clone())
            .param("c", completed.clone());
        let in_url = fenced(match base {
            Some(base) => with_base(in_url, base),
            None => in_url,
        });
        // The request target as it would be sent (escaped values, the id, the connection's
        // settings): in the URL if it fits, else the parts go in the body (a target too long
        // to build at all is one that does not fit; any other fault of the statement shows
        // when the body's is built).
        let fits = in_url
            .query()
            .to_http(self.client.endpoint())
            .is_ok_and(|r| r.path_and_query.len() <= MAX_FENCED_URL_BYTES);
        if fits {
            return Some(in_url);
        }
        if base.is_some() {
            return None;
        }
        let query =
            insert("p", "c", " FROM state_parts").external(parts_table(&partial, &completed));
        Some(fenced(query))
    }

    /// Meltano `update` by a caller that already holds the lock on the id (`handle`): reads
    /// the stored state, then writes fenced by `handle` (`locked`, nothing written, if the
    /// lock was lost). Takes no lock itself.
    pub fn update_held(&self, state: &State, handle: &LockHandle) -> Result<State, Error> {
        check_new_id(&state.id)?;
        check_held(&state.id, handle)?;
        let stored = self.get(&state.id)?.unwrap_or_default();
        let new = updated(state, stored.partial, stored.completed)?;
        self.set_fenced(&new, handle, Holding::CallersLock)?;
        Ok(new)
    }

    /// Overwrites a state by a caller that already holds the lock on its id (fenced by
    /// `handle`: `locked`, nothing written, if the lock was lost).
    pub fn set_held(&self, state: &State, handle: &LockHandle) -> Result<(), Error> {
        check_new_id(&state.id)?;
        check_held(&state.id, handle)?;
        self.set_fenced(state, handle, Holding::CallersLock)
    }

    /// Deletes a state by a caller that already holds the lock on its id (fenced by
    /// `handle`); returns 1 if there was one, else 0.
    pub fn delete_held(&self, id: &str, handle: &LockHandle) -> Result<u64, Error> {
        check_held(id, handle)?;
        self.delete_fenced(id, handle, Holding::CallersLock)
    }

    /// Overwrites both parts of one state under its lock (waits for it like [`Self::lock`]);
    /// the write is fenced, so a holder that lost its lock writes nothing.
    #[cfg(any(test, feature = "command"))]
    pub fn set_locked(&self, state: &State) -> Result<(), Error> {
        check_new_id(&state.id)?;
        let handle = self.lock(&state.id)?;
        let result = self.set_fenced(state, &handle, Holding::OwnLock);
        self.finish_locked(result, &handle)
    }

    /// Deletes the state of `id` under its lock (as Meltano does: an `update` racing a delete
    /// cannot bring the state back); returns 1 if there was one, else 0 (lightweight DELETE,
    /// fenced like every write under the lock). Any id [`check_id`] takes can be deleted, also
    /// one a new write could not create (with control characters, written by another backend).
    pub fn delete(&self, id: &str) -> Result<u64, Error> {
        check_id(id)?;
        let handle = lock::acquire(&self.session(), &self.tables, id, &self.lock_options)?;
        let result = self.delete_fenced(id, &handle, Holding::OwnLock);
        self.finish_locked(result, &handle)
    }

    fn delete_fenced(&self, id: &str, handle: &LockHandle, holding: Holding) -> Result<u64, Error> {
        self.known.forget(id);
        let (count, version) = self.count_rows(id)?;
        if count > 0 {
            let query = Step::Delete
                .query(format!(
                    "DELETE FROM {{db:Identifier}}.{{t:Identifier}}
                     WHERE state_id = {{id:String}} AND {}",
                    lock::holds(&self.tables)
                ))
                .param("t", &self.tables.state)
                // The fence's subqueries are evaluated once, before the delete touches any part:
                // the delete applies everywhere or nowhere, and replicated and Cloud tables accept
                // it (a subquery evaluated per part is "nondeterministic" there).
                .setting("mutations_execute_subqueries_on_initiator", "1");
            let sent = self
                .session()
                .send(
                    &lock::fence(query, &self.tables, handle, &self.lock_options)
                        .lost_answer_is_final(holding == Holding::CallersLock),
                )
                .map_err(mutation_may_apply)?;
            // A lightweight DELETE reports no row count: check that the fence let it through.
            let (left, now) = self.count_rows(id).map_err(|e| {
                let message = format!(
                    "the delete was sent, but checking whether it was applied failed: {}",
                    e.message
                );
                e.reclassify(ErrorKind::Uncertain, message)
            })?;
            if left > 0 {
                // Another version than the one we meant to delete: someone wrote after our
                // delete may have applied.
                return Err(if sent.after_uncertain || now != version {
                    Error::new(
                        ErrorKind::Uncertain,
                        format!(
                            "the state of '{}' is still there (written again) and the lock is no longer held; the delete may have been applied before the new state was written",
                            lock::shorten(id)
                        ),
                    )
                } else {
                    Error::new(
                        ErrorKind::Locked,
                        format!(
                            "the lock on state id '{}' was lost before the delete: nothing was deleted",
                            lock::shorten(id)
                        ),
                    )
                });
            }
        }
        Ok(count)
    }

    /// How many rows `id` has (0 or 1, read with `FINAL`), and the version (`updated_at`) of
    /// the newest.
    fn count_rows(&self, id: &str) -> Result<(u64, String), Error> {
        let query = self
            .query(
                Step::CountRows,
                "SELECT count(), toString(max(updated_at)) FROM {db:Identifier}.{t:Identifier} FINAL WHERE state_id = {id:String}",
            )
            .param("id", id)
            .format("TabSeparated");
        let response = self.session().execute(&query)?;
        let text = String::from_utf8_lossy(&response.body);
        let (count, version) = text
            .trim_end_matches('\n')
            .split_once('\t')
            .unwrap_or(("", ""));
        let count = count
            .parse()
            .map_err(|_| Error::new(ErrorKind::Permanent, "unexpected answer to count()"))?;
        Ok((count, version.to_string()))
    }

    /// Deletes every state written before the call; returns how many states that removed.
    /// A state written concurrently (after the snapshot) survives and is not counted.
    pub fn clear_all(&self) -> Result<u64, Error> {
        self.known.clear();
        let response = self.session().execute(&self
                .query(
                    Step::ClearAllSnapshot,
                    "SELECT count(), toUnixTimestamp64Milli(max(updated_at)) FROM {db:Identifier}.{t:Identifier} FINAL",
                )
                .format("TabSeparated"),
        )?;
        let text = String::from_utf8_lossy(&response.body);
        let mut fields = text.trim().split('\t');
        let count: u64 = fields
            .next()
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::Transient, "unexpected answer to count()"))?;
        let snapshot: i64 = fields.next().and_then(|c| c.parse().ok()).ok_or_else(|| {
            Error::new(ErrorKind::Permanent, "unexpected answer to max(updated_at)")
        })?;
        if count > 0 {
            // The same bound on every attempt: a repeat deletes nothing more.
            self.session()
                .execute(&self
                        .query(
                            Step::ClearAll,
                            "DELETE FROM {db:Identifier}.{t:Identifier} WHERE toUnixTimestamp64Milli(updated_at) <= {snapshot:Int64}",
                        )
                        .param("snapshot", snapshot.to_string()),
                )
                .map_err(mutation_may_apply)?;
        }
        Ok(count)
    }

    /// State ids matching an fnmatch pattern (all ids without one), sorted.
    pub fn ids(&self, pattern: Option<&str>) -> Result<Vec<String>, Error> {
        let (query, glob) = self.select_matching(
            Step::Ids,
            "SELECT state_id FROM {db:Identifier}.{t:Identifier} FINAL",
            pattern,
        );
        let response = self.session().execute(&query.format("JSONEachRow"))?;
        let mut ids = Vec::new();
        for line in String::from_utf8_lossy(&response.body).lines() {
            if line.is_empty() {
                continue;
            }
            let row: Value = serde_json::from_str(line).map_err(|e| {
                Error::new(ErrorKind::Transient, format!("unexpected answer row: {e}"))
            })?;
            let id = row["state_id"].as_str().unwrap_or_default();
            if glob.as_ref().is_none_or(|g| g.matches(id)) {
                ids.push(id.to_string());
            }
        }
        Ok(ids)
    }

    /// Every state whose id matches the pattern (all without one), in one query, sorted by id.
    pub fn get_all(&self, pattern: Option<&str>) -> Result<Vec<State>, Error> {
        let (query, glob) = self.select_matching(
            Step::GetAll,
            "SELECT state_id, partial_state, completed_state FROM {db:Identifier}.{t:Identifier} FINAL",
            pattern,
        );
        let mut states = self.read_states(query)?;
        if let Some(glob) = glob {
            states.retain(|s| glob.matches(&s.id));
        }
        Ok(states)
    }

    /// A query narrowed by the pattern's literal prefix, and the glob to filter exactly.
    fn select_matching(
        &self,
        step: Step,
        select: &str,
        pattern: Option<&str>,
    ) -> (Request, Option<glob::Glob>) {
        let glob = pattern.map(glob::Glob::new);
        let (clause, prefix) = match &glob {
            None => ("", None),
            Some(g) if g.is_literal() => (" WHERE state_id = {p:String}", Some(g.literal_prefix())),
            Some(g) => (
                " WHERE startsWith(state_id, {p:String})",
                Some(g.literal_prefix()),
            ),
        };
        let mut query = self.query(step, &format!("{select}{clause} ORDER BY state_id"));
        if let Some(prefix) = prefix {
            query = query.param("p", prefix);
        }
        (query, glob)
    }

    /// The token holding the lock on `id` now, if any (for the integration tests).
    #[cfg(feature = "test-util")]
    pub fn holder(&self, id: &str) -> Result<Option<String>, Error> {
        check_id(id)?;
        lock::holder(&self.session(), &self.tables, id)
    }

    /// Acquires the lock on `id` (see [`lock`]), for writes: the id is checked as one to be
    /// written ([`check_new_id`]).
    pub fn lock(&self, id: &str) -> Result<LockHandle, Error> {
        check_new_id(id)?;
        lock::acquire(&self.session(), &self.tables, id, &self.lock_options)
    }

    /// Releases a lock (idempotent), repeating the release until it lands or the lease has
    /// certainly ended.
    pub fn release(&self, handle: &LockHandle) -> Result<(), Error> {
        lock::release(&self.session(), &self.tables, handle)
    }

    /// Extends a held lock's lease by the stale window.
    pub fn renew(&self, handle: &LockHandle) -> Result<(), Error> {
        lock::renew(&self.session(), &self.tables, handle, &self.lock_options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lock_table_is_not_the_python_backends() {
        let d = StoreOptions::default();
        assert_eq!(d.lock_table_name(), "state_component_lock");
        let custom = StoreOptions {
            table: "jobs".into(),
            ..StoreOptions::default()
        };
        assert_eq!(custom.lock_table_name(), "jobs_component_lock");
        let explicit = StoreOptions {
            lock_table: Some("state_lock".into()),
            ..StoreOptions::default()
        };
        assert_eq!(explicit.lock_table_name(), "state_lock");
    }

    #[test]
    fn merged_view_puts_partial_over_completed() {
        let s = State::from_json("a", r#"{"b":{"s":2}}"#, r#"{"b":{"s":1,"t":1},"c":1}"#).unwrap();
        assert_eq!(
            Value::Object(s.merged()),
            serde_json::json!({"b":{"s":2,"t":1},"c":1})
        );
    }
}
