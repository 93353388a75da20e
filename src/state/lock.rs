//! The advisory lock: contenders are ordered by **commit order** in a plain MergeTree with
//! `enable_block_number_column = 1`, so every row keeps the block number it was committed
//! with, through merges.
//!
//! * Acquire: insert an `acquire` row (a fresh random token, lease = now + stale window, by the
//!   server's clock), then ask who wins: the live token (not released, lease not over) with the
//!   smallest block number. On one node a part's block number is taken and the part becomes
//!   visible atomically, so whoever commits later always sees every earlier row: two live
//!   contenders can never both see themselves first. Uncontended: two round trips, no sleep;
//!   the second can read something else in the same query ([`AlsoRead`]).
//! * Lost: insert a `release` row for our token (withdraw), poll the winner query every retry
//!   interval (half to all of it, jittered) until nobody holds the lock, then try again with a new token; after
//!   the timeout, fail with `locked`.
//! * Release: a `release` row, which outlives every acquire row of its token (leases are at
//!   most [`MAX_STALE_AFTER`]; a release row expires [`MAX_STALE_AFTER`] after it was written),
//!   so the TTL never reaps a release before the acquire rows it cancels.
//! * Renew: one statement that writes a new `acquire` row with the same token (the lease
//!   moves, the place does not) **only while the token holds** with at least the fence margin
//!   of its lease left; otherwise nothing is written and the holder gets `locked`. So an
//!   expired lease is never resurrected by a late renewal.
//! * Fencing: writes made under the lock ([`HOLDS`]) are `INSERT ... SELECT ... WHERE` the
//!   token still holds with the fence margin left; a fenced-out write writes nothing and is
//!   `locked`. The margin bounds the time between the server evaluating the condition and
//!   committing the row; a server stalled longer than that inside one INSERT can still land a
//!   stale write (with either engine: the state table is a MergeTree either way).
//! * A crashed holder's lease ends after the stale window; its rows are then ignored, and the
//!   TTL reaps them a day later. Nothing on these paths is a mutation.

use std::time::Duration;

use serde_json::Value;

use crate::client::response::json_text;
use crate::client::{Error, ErrorKind, Query, Transport};
use crate::platform::Platform;

use super::keeper_lock;
use super::schema::Tables;
use super::steps::{Session, Step};
use crate::client::retry;

/// The lock implementation a store uses (decided at open, see [`LockEngineChoice`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockEngine {
    /// The commit-order lock on a plain MergeTree (this module): one server only.
    MergeTree,
    /// The Keeper-backed lock on a KeeperMap table ([`keeper_lock`]): clusters and Cloud.
    KeeperMap,
}

impl LockEngine {
    /// The name used in options and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            LockEngine::MergeTree => "merge-tree",
            LockEngine::KeeperMap => "keeper-map",
        }
    }
}

/// Which lock engine to use (`--lock-engine`, `CLICKHOUSE_LOCK_ENGINE`, WIT `lock-engine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LockEngineChoice {
    /// An existing lock table's engine; else KeeperMap when the server supports it
    /// (`keeper_map_path_prefix` configured), else the commit-order lock on a plain MergeTree
    /// (refused where `MergeTree` is not plain, e.g. ClickHouse Cloud).
    #[default]
    Auto,
    /// The commit-order lock (one server, plain MergeTree).
    MergeTree,
    /// The Keeper-backed lock (KeeperMap).
    KeeperMap,
}

impl std::str::FromStr for LockEngineChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(LockEngineChoice::Auto),
            "merge-tree" => Ok(LockEngineChoice::MergeTree),
            "keeper-map" => Ok(LockEngineChoice::KeeperMap),
            other => Err(Error::invalid(format!(
                "lock engine '{}' is not one of auto, keeper-map, merge-tree",
                other.escape_debug()
            ))),
        }
    }
}

/// Default time to wait for a lock.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default pause between attempts while another holder has the lock.
pub const DEFAULT_RETRY: Duration = Duration::from_millis(100);
/// Default lease: a holder that neither releases nor renews within it loses the lock.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(300);
/// Longest lease (release rows are kept at least this long, so they outlive every acquire).
pub const MAX_STALE_AFTER: Duration = Duration::from_secs(12 * 3600);
/// Most of the fence margin: renewals and fenced writes need this much of the lease left.
const MAX_FENCE_MARGIN: Duration = Duration::from_secs(2);

/// Lock timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockOptions {
    /// How long `lock` waits before failing with `locked` (0: one attempt).
    pub timeout: Duration,
    /// Pause between attempts (a random 0-50% is added).
    pub retry: Duration,
    /// Lease length; a crashed holder's lock is free after this.
    pub stale_after: Duration,
}

impl LockOptions {
    /// How much of its lease a holder must have left for a renewal or a fenced write: a
    /// quarter of the lease, at most 2 s.
    pub fn fence_margin(&self) -> Duration {
        (self.stale_after / 4).min(MAX_FENCE_MARGIN)
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            timeout: DEFAULT_TIMEOUT,
            retry: DEFAULT_RETRY,
            stale_after: DEFAULT_STALE_AFTER,
        }
    }
}

/// A held lock.
#[derive(Debug)]
pub struct LockHandle {
    /// The locked state id.
    pub id: String,
    /// This holder's token.
    pub token: String,
    /// Platform time (ns) by which the lease has certainly ended: when the request that last
    /// set it was sent, plus the lease; 0 when unknown (a lock held by another process).
    lease_ends_ns: std::sync::atomic::AtomicU64,
}

impl LockHandle {
    /// A handle for a lock held elsewhere (e.g. by an enclosing `lock ID -- COMMAND`): its
    /// lease end is unknown.
    pub fn held_elsewhere(id: impl Into<String>, token: impl Into<String>) -> LockHandle {
        LockHandle {
            id: id.into(),
            token: token.into(),
            lease_ends_ns: Default::default(),
        }
    }

    fn new(id: &str, token: String, lease_ends: Duration) -> LockHandle {
        let handle = LockHandle::held_elsewhere(id, token);
        handle.lease_ends_by(lease_ends);
        handle
    }

    /// The lease has certainly ended by then (platform time), if known.
    pub fn lease_ends(&self) -> Option<Duration> {
        match self
            .lease_ends_ns
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Records a later lease end (after a renewal).
    pub(crate) fn lease_ends_by(&self, at: Duration) {
        let ns = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.lease_ends_ns
            .fetch_max(ns, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clone for LockHandle {
    fn clone(&self) -> Self {
        LockHandle {
            id: self.id.clone(),
            token: self.token.clone(),
            lease_ends_ns: self
                .lease_ends_ns
                .load(std::sync::atomic::Ordering::Relaxed)
                .into(),
        }
    }
}

/// Handles are the same lock when they name the same id and token.
impl PartialEq for LockHandle {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.token == other.token
    }
}

impl Eq for LockHandle {}

const INSERT_ACQUIRE: &str = "INSERT INTO {db:Identifier}.{lt:Identifier} (state_id, token, kind, expires_at)
    SELECT {id:String}, {token:String}, 'acquire', now64(3) + toIntervalMillisecond({lease_ms:UInt64})";

const INSERT_RELEASE: &str = "INSERT INTO {db:Identifier}.{lt:Identifier} (state_id, token, kind, expires_at)
    SELECT {id:String}, {token:String}, 'release', now64(3) + toIntervalMillisecond({keep_ms:UInt64})";

const WINNER: &str = "SELECT token FROM {db:Identifier}.{lt:Identifier}
    WHERE state_id = {id:String}
    GROUP BY token
    HAVING countIf(kind = 'release') = 0 AND maxIf(expires_at, kind = 'acquire') > now64(3)
    ORDER BY min(_block_number), token
    LIMIT 1";

/// The fence: true while `{token}` holds the lock on `{id}` with at least `{margin_ms}` of its
/// lease left. Needs the parameters `db`, `lt`, `id`, `token`, `margin_ms` ([`fence`]).
pub const HOLDS: &str = "(SELECT token FROM {db:Identifier}.{lt:Identifier}
        WHERE state_id = {id:String}
        GROUP BY token
        HAVING countIf(kind = 'release') = 0 AND maxIf(expires_at, kind = 'acquire') > now64(3)
        ORDER BY min(_block_number), token
        LIMIT 1) = {token:String}
    AND (SELECT maxIf(expires_at, kind = 'acquire') > now64(3) + toIntervalMillisecond({margin_ms:UInt64})
        FROM {db:Identifier}.{lt:Identifier}
        WHERE state_id = {id:String} AND token = {token:String}) = 1";

/// The fence condition of the store's lock engine ([`HOLDS`] or [`keeper_lock::HOLDS`]).
pub fn holds(tables: &Tables) -> &'static str {
    match tables.lock_engine {
        LockEngine::MergeTree => HOLDS,
        LockEngine::KeeperMap => keeper_lock::HOLDS,
    }
}

/// Binds the parameters of the fence condition ([`holds`]) for `handle`.
pub fn fence(query: Query, tables: &Tables, handle: &LockHandle, options: &LockOptions) -> Query {
    query
        .param("db", &tables.database)
        .param("lt", &tables.lock)
        .param("id", &handle.id)
        .param("token", &handle.token)
        .param("margin_ms", options.fence_margin().as_millis().to_string())
}

/// Settings every write of the store and the lock sends: a synchronous insert (read-after-write
/// and the lock need it, whatever the connection's profile says), and never a deduplication
/// token inherited from the connection.
pub fn write_settings(query: Query) -> Query {
    query
        .setting("async_insert", "0")
        .setting("insert_deduplication_token", "")
}

/// Runs a fenced write (repeated as its step allows); `locked` when the fence let nothing
/// through, `uncertain` when it let nothing through after an attempt whose answer was lost (that
/// attempt may have landed before the lock was lost).
pub fn execute_fenced<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    step: Step,
    query: Query,
    handle: &LockHandle,
    repeat_lost_answers: bool,
) -> Result<(), Error> {
    let sent = s.send_unless(step, &write_settings(query), |e| {
        !repeat_lost_answers && e.kind == ErrorKind::Uncertain
    })?;
    match sent.value.summary {
        Some(summary) if summary.written_rows > 0 => Ok(()),
        // A renewal fenced out proves the lease is gone (a lost earlier renewal that landed
        // would have let this one through): `locked`.
        Some(_) if sent.after_uncertain && step != Step::Renew => Err(Error::new(
            ErrorKind::Uncertain,
            format!(
                "the lock on state id '{}' is no longer held by this holder, and an earlier attempt of this write whose answer was lost may have been applied",
                shorten(&handle.id)
            ),
        )),
        Some(_) => Err(Error::new(
            ErrorKind::Locked,
            format!(
                "the lock on state id '{}' is no longer held by this holder (or its lease is about to end): nothing was written",
                shorten(&handle.id)
            ),
        )),
        None => Err(Error::new(
            ErrorKind::Uncertain,
            "the server did not say whether the fenced write was applied (no X-ClickHouse-Summary)",
        )),
    }
}

/// Something to read in the same query that checks who won (saves a round trip): a scalar SQL
/// expression and its parameters (`db` and `id` are bound already; don't use `lt`).
#[derive(Clone, Debug, Default)]
pub struct AlsoRead {
    /// A scalar expression, e.g. a `(SELECT ...)` subquery.
    pub expression: String,
    /// Its parameters.
    pub params: Vec<(String, String)>,
}

/// Writes a contender's `acquire` row (lease: `stale_after`), once: an acquire is never
/// repeated with the same token (a repeat landing after the first row's lease ended would bring
/// the token back at its old place, ahead of a holder that came meanwhile). An `uncertain`
/// error means the row may exist.
fn insert_acquire<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    token: &str,
    lease: Duration,
) -> Result<(), Error> {
    let query = Step::Acquire
        .query(INSERT_ACQUIRE)
        .param("lease_ms", lease.as_millis().to_string());
    s.send_once(
        Step::Acquire,
        &write_settings(bind(query, tables, id, token)),
    )
    .map(|_| ())
}

/// Writes the `release` row of a token (release by the holder, or withdrawal by a contender),
/// repeated until it lands or `lease_ends` (platform time) has passed.
fn insert_release<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    token: &str,
    lease_ends: Duration,
) -> Result<(), Error> {
    let query = Step::Release
        .query(INSERT_RELEASE)
        .param("keep_ms", MAX_STALE_AFTER.as_millis().to_string());
    s.send_until(
        Step::Release,
        &write_settings(bind(query, tables, id, token)),
        lease_ends,
        |_| false,
    )
    .map(|_| ())
}

fn bind(query: Query, tables: &Tables, id: &str, token: &str) -> Query {
    query
        .param("db", &tables.database)
        .param("lt", &tables.lock)
        .param("id", id)
        .param("token", token)
}

/// The token that holds the lock on `id` now, if any.
pub fn holder<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
) -> Result<Option<String>, Error> {
    Ok(holder_and(s, tables, id, None)?.0)
}

/// The holder, and the value of `also` read in the same query.
pub(crate) fn holder_and<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    also: Option<&AlsoRead>,
) -> Result<(Option<String>, Option<Value>), Error> {
    let extra = also.map_or("NULL".to_string(), |a| a.expression.clone());
    let winner = match tables.lock_engine {
        LockEngine::MergeTree => WINNER,
        LockEngine::KeeperMap => keeper_lock::WINNER,
    };
    let mut query = Step::Holder
        .query(format!("SELECT ({winner}) AS holder, {extra} AS also"))
        .param("db", &tables.database)
        .param("lt", &tables.lock)
        .param("id", id)
        .format("JSONEachRow");
    if let Some(also) = also {
        for (name, value) in &also.params {
            query = query.param(name, value.clone());
        }
    }
    /// The answer's one row; any other shape is an error, never a default.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Row {
        holder: Option<String>,
        also: Value,
    }
    let response = s.execute(Step::Holder, &query)?;
    let row: Row = json_text(&response.body).map_err(|e| {
        Error::new(
            ErrorKind::Permanent,
            format!("unexpected answer to the lock query: {e}"),
        )
    })?;
    let token = row.holder.unwrap_or_default();
    Ok(((!token.is_empty()).then_some(token), also.map(|_| row.also)))
}

/// Acquires the lock on `id`, waiting up to `options.timeout`.
pub fn acquire<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    options: &LockOptions,
) -> Result<LockHandle, Error> {
    acquire_and_read(s, tables, id, options, None).map(|(handle, _)| handle)
}

/// Acquires the lock and, in the query that confirms it, reads `also` (its value as of the
/// moment the lock was confirmed held).
///
/// Nothing is left behind on failure: a contender whose acquire row may exist (written, or its
/// answer lost) withdraws it before it returns, so an error here means this call holds nothing
/// and changed nothing else; it is never `uncertain` (an unknown outcome of the lock's own
/// writes is resolved, or reported as `transient`).
pub fn acquire_and_read<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    options: &LockOptions,
    also: Option<&AlsoRead>,
) -> Result<(LockHandle, Option<Value>), Error> {
    if tables.lock_engine == LockEngine::KeeperMap {
        return keeper_lock::acquire_and_read(s, tables, id, options, also)
            .map_err(|e| not_acquired(e, id));
    }
    let started = s.platform.now();
    // Failed attempts (a fault, not someone else holding the lock), each with its own token.
    let mut faults = 0;
    loop {
        let token = s.platform.random_uuid();
        let attempt = match insert_acquire(s, tables, id, &token, options.stale_after) {
            Ok(()) => holder_and(s, tables, id, also).map(Some),
            Err(e) => Err(e),
        };
        let error = match attempt {
            Ok(Some((Some(winner), read))) if winner == token => {
                // The lease was set before now: it has certainly ended a lease from now.
                let lease_ends = s.platform.now() + options.stale_after;
                return Ok((LockHandle::new(id, token, lease_ends), read));
            }
            // Someone else holds it.
            Ok(_) => None,
            Err(e) => Some(e),
        };
        // Our row may exist (written, or its answer lost): withdraw it, for good (a release
        // row outlives every acquire row of its token).
        let wrote = error
            .as_ref()
            .is_none_or(|e| e.kind != ErrorKind::Disconnected);
        if wrote {
            let lease_ends = s.platform.now() + options.stale_after;
            insert_release(s, tables, id, &token, lease_ends).map_err(|e| not_acquired(e, id))?;
        }
        if let Some(e) = error {
            faults += 1;
            if faults > s.retry.retries || !retry::is_worth_retrying(e.kind) {
                return Err(not_acquired(e, id));
            }
            // Try again with a new token after a pause (within the lock timeout).
            if !s.pause(faults, started + options.timeout) {
                return Err(not_acquired(e, id));
            }
            continue;
        }
        // Someone else holds it: wait until nobody does, then try again.
        loop {
            pause_or_give_up(s.platform, id, options, started)?;
            if holder(s, tables, id)
                .map_err(|e| not_acquired(e, id))?
                .is_none()
            {
                break;
            }
        }
    }
}

/// An error met while acquiring, after this contender withdrew whatever it may have written:
/// nothing was applied, so an unknown outcome of a lock write is no longer `uncertain`.
fn not_acquired(e: Error, id: &str) -> Error {
    if e.kind != ErrorKind::Uncertain {
        return e;
    }
    Error {
        kind: ErrorKind::Transient,
        message: crate::client::error::cap(format!(
            "could not acquire the lock on state id '{}' (anything this attempt wrote was withdrawn): {}",
            shorten(id),
            e.message
        )),
        ..e
    }
}

/// One wait between lock attempts: `locked` once the lock timeout (counted from `started`) is
/// over, else a pause of half to all of the retry interval ([`crate::client::retry::backoff`]
/// at a constant interval; never past the deadline).
pub(crate) fn pause_or_give_up<P: Platform>(
    platform: &P,
    id: &str,
    options: &LockOptions,
    started: Duration,
) -> Result<(), Error> {
    let deadline = started + options.timeout;
    let now = platform.now();
    if now >= deadline {
        return Err(Error::new(
            ErrorKind::Locked,
            format!(
                "state id '{}' is locked by another holder (waited {:.1} s; the lock timeout is {:.1} s)",
                shorten(id),
                (now - started).as_secs_f64(),
                options.timeout.as_secs_f64()
            ),
        ));
    }
    let pause =
        crate::client::retry::backoff(options.retry, options.retry, 1, platform.random_u64());
    platform.sleep(pause.min(deadline - now));
    Ok(())
}

/// Releases a held lock (idempotent: releasing twice is harmless), repeating the release until
/// it lands or the lease has certainly ended.
pub fn release<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    handle: &LockHandle,
) -> Result<(), Error> {
    if tables.lock_engine == LockEngine::KeeperMap {
        return keeper_lock::release(s, tables, handle);
    }
    let lease_ends = handle
        .lease_ends()
        .unwrap_or_else(|| s.platform.now() + s.lease);
    insert_release(s, tables, &handle.id, &handle.token, lease_ends)
}

/// Extends the lease of a held lock by a full stale window, in one statement that writes only
/// while the token holds with at least the fence margin of its lease left; `locked` otherwise
/// (released, lease over or about to be, or taken by someone else). A renewal never brings an
/// ended lease back.
pub fn renew<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    handle: &LockHandle,
    options: &LockOptions,
) -> Result<(), Error> {
    if tables.lock_engine == LockEngine::KeeperMap {
        return keeper_lock::renew(s, tables, handle, options);
    }
    let query = Step::Renew
        .query(format!(
            "INSERT INTO {{db:Identifier}}.{{lt:Identifier}} (state_id, token, kind, expires_at)
             SELECT {{id:String}}, {{token:String}}, 'acquire',
                    now64(3) + toIntervalMillisecond({{lease_ms:UInt64}})
             WHERE {HOLDS}"
        ))
        .param("lease_ms", options.stale_after.as_millis().to_string());
    execute_fenced(
        s,
        Step::Renew,
        fence(query, tables, handle, options),
        handle,
        true,
    )?;
    handle.lease_ends_by(s.platform.now() + options.stale_after);
    Ok(())
}

/// An id short enough for a message, escaped as ids are printed ([`super::escape_id`]).
pub(crate) fn shorten(id: &str) -> String {
    let s: String = id.chars().take(100).collect();
    let mut s = super::escape_id(&s).into_owned();
    if id.chars().nth(100).is_some() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::error::TransportFailure;
    use crate::client::retry::RetryPolicy;
    use crate::client::testing::{fail, ok, param, written, Answering, Scripted};
    use crate::client::{Client, ConnectionOptions, HttpRequest, HttpResponse, Transport};
    use crate::platform::testing::FakePlatform;

    fn tables() -> Tables {
        Tables {
            database: "d".into(),
            state: "s".into(),
            lock: "l".into(),
            lock_engine: LockEngine::MergeTree,
        }
    }

    fn session<'a, T: Transport>(
        client: &'a Client<T>,
        platform: &'a FakePlatform,
        retries: u32,
    ) -> Session<'a, T, FakePlatform> {
        Session {
            client,
            platform,
            retry: RetryPolicy::new(retries),
            lease: DEFAULT_STALE_AFTER,
        }
    }

    /// The holder query's answer naming `token`.
    fn holder_is(token: &str) -> Result<HttpResponse, crate::client::error::TransportError> {
        ok(&format!(r#"{{"holder":"{token}","also":null}}"#))
    }

    #[test]
    fn writes_are_synchronous_and_never_inherit_a_dedup_token() {
        let t = Scripted::new(vec![written(1)]);
        let client = Client::new(
            &ConnectionOptions::from_url(
                "http://h?async_insert=1&wait_for_async_insert=0&insert_deduplication_token=x",
            ),
            &t,
        )
        .unwrap();
        let handle = LockHandle::held_elsewhere("job", "tok");
        let platform = FakePlatform::default();
        renew(
            &session(&client, &platform, 0),
            &tables(),
            &handle,
            &LockOptions::default(),
        )
        .unwrap();
        let url = t.sent.borrow()[0].path_and_query.clone();
        assert!(url.contains("&async_insert=0&"), "{url}");
        assert!(!url.contains("async_insert=1"), "{url}");
        assert!(url.contains("insert_deduplication_token=&"), "{url}");
        assert!(!url.contains("insert_deduplication_token=x"), "{url}");
        assert!(url.contains("wait_for_async_insert=0"), "{url}");
    }

    #[test]
    fn a_lost_acquire_answer_is_withdrawn_and_tried_again_with_a_new_token() {
        // The holder query carries no token: it is answered with the last one sent.
        let token_seen = std::cell::RefCell::new(String::new());
        let t = Answering::new(|request: &HttpRequest, n| {
            if let Some(token) = param(request, "token") {
                *token_seen.borrow_mut() = token;
            }
            match n {
                0 => fail(TransportFailure::Reset),
                1 | 2 => written(1),
                _ => holder_is(&token_seen.borrow()),
            }
        });
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let s = session(&client, &platform, 5);
        let handle = acquire(&s, &tables(), "job", &LockOptions::default()).unwrap();
        assert_eq!(t.operations(), ["lock", "unlock", "lock", "lock-holder"]);
        let sent = t.sent.borrow();
        // The lost token is withdrawn for good, never inserted again: a repeat landing after
        // its first row's lease ended would bring it back at its old place, ahead of a holder
        // that came meanwhile.
        let first = param(&sent[0], "token");
        assert_eq!(param(&sent[1], "token"), first);
        assert_ne!(param(&sent[2], "token"), first);
        assert_eq!(Some(handle.token.clone()), param(&sent[2], "token"));
        assert!(handle.lease_ends().is_some());
    }

    #[test]
    fn a_contender_that_gives_up_on_an_unknown_acquire_withdraws_it() {
        let t = Answering::new(|_: &HttpRequest, n| match n {
            0 => fail(TransportFailure::Timeout),
            1 => fail(TransportFailure::Refused),
            _ => written(1),
        });
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let e = acquire(
            &session(&client, &platform, 0),
            &tables(),
            "job",
            &LockOptions::default(),
        )
        .unwrap_err();
        // Nothing of this call stands, so the outcome is certain: not `uncertain`.
        assert_eq!(e.kind, ErrorKind::Transient, "{e}");
        // The withdrawal is repeated until it lands, whatever the retries (0 here).
        assert_eq!(t.operations(), ["lock", "unlock", "unlock"]);
        let sent = t.sent.borrow();
        assert_eq!(param(&sent[0], "token"), param(&sent[2], "token"));
    }

    #[test]
    fn an_acquire_that_never_reached_the_server_leaves_nothing_to_withdraw() {
        let t = Answering::new(|_: &HttpRequest, _| fail(TransportFailure::Refused));
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let e = acquire(
            &session(&client, &platform, 2),
            &tables(),
            "job",
            &LockOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Disconnected, "{e}");
        // Nothing reached the server: nothing to withdraw, a new token each time.
        assert_eq!(t.operations(), ["lock", "lock", "lock"]);
        let sent = t.sent.borrow();
        assert_ne!(param(&sent[0], "token"), param(&sent[1], "token"));
    }

    #[test]
    fn a_lost_contender_withdraws_and_a_failed_holder_query_too() {
        // Someone else holds it; our withdrawal fails once and is repeated.
        let t = Answering::new(|_: &HttpRequest, n| match n {
            0 => written(1),
            1 => holder_is("someone-else"),
            2 => fail(TransportFailure::Reset),
            3 => written(1),
            _ => holder_is("someone-else"),
        });
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let options = LockOptions {
            timeout: Duration::ZERO,
            ..LockOptions::default()
        };
        let e = acquire(&session(&client, &platform, 0), &tables(), "job", &options).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Locked, "{e}");
        assert_eq!(t.operations(), ["lock", "lock-holder", "unlock", "unlock"]);

        // The holder query fails for good: the row is withdrawn, the error is the query's.
        let t = Answering::new(|_: &HttpRequest, n| match n {
            0 => written(1),
            1 => fail(TransportFailure::Timeout),
            _ => written(1),
        });
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let e = acquire(&session(&client, &platform, 0), &tables(), "job", &options).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transient, "{e}");
        assert_eq!(t.operations(), ["lock", "lock-holder", "unlock"]);
    }

    #[test]
    fn a_release_is_repeated_until_the_lease_ends() {
        let t = Answering::new(|_: &HttpRequest, _| fail(TransportFailure::Refused));
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let handle = LockHandle::held_elsewhere("job", "tok");
        let mut s = session(&client, &platform, 0);
        s.lease = Duration::from_secs(10);
        let e = release(&s, &tables(), &handle).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Disconnected);
        let tries = t.sent.borrow().len();
        assert!(tries >= 6, "{tries} attempts in the lease");
        assert!(
            platform.now() <= Duration::from_secs(10),
            "{:?}",
            platform.now()
        );
        assert!(
            platform.now() >= Duration::from_secs(8),
            "{:?}",
            platform.now()
        );
    }

    #[test]
    fn a_fenced_write_fenced_out_after_a_lost_answer_is_uncertain() {
        let handle = LockHandle::held_elsewhere("job", "tok");
        let platform = FakePlatform::default();
        let t = Scripted::new(vec![fail(TransportFailure::Timeout), written(0)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let e = execute_fenced(
            &session(&client, &platform, 3),
            Step::Set,
            Step::Set.query("INSERT"),
            &handle,
            true,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain, "{e}");

        let t = Scripted::new(vec![written(0)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let e = execute_fenced(
            &session(&client, &platform, 3),
            Step::Set,
            Step::Set.query("INSERT"),
            &handle,
            true,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Locked, "{e}");

        let t = Scripted::new(vec![fail(TransportFailure::Reset), written(1)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        execute_fenced(
            &session(&client, &platform, 3),
            Step::Set,
            Step::Set.query("INSERT"),
            &handle,
            true,
        )
        .unwrap();
    }

    #[test]
    fn a_held_lock_write_whose_answer_was_lost_is_uncertain_and_not_repeated() {
        let handle = LockHandle::held_elsewhere("job", "tok");
        let platform = FakePlatform::default();
        let t = Scripted::new(vec![fail(TransportFailure::Timeout)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let e = execute_fenced(
            &session(&client, &platform, 5),
            Step::Set,
            Step::Set.query("INSERT"),
            &handle,
            false,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain, "{e}");
        assert_eq!(t.sent.borrow().len(), 1);
    }

    #[test]
    fn a_release_stops_trying_when_the_known_lease_has_ended() {
        let t = Answering::new(|_: &HttpRequest, _| fail(TransportFailure::Refused));
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        // Configured lease 12 h, but this handle's lease ends 3 s from now.
        let mut s = session(&client, &platform, 0);
        s.lease = MAX_STALE_AFTER;
        let handle = LockHandle::new("job", "tok".into(), Duration::from_secs(3));
        release(&s, &tables(), &handle).unwrap_err();
        assert!(
            platform.now() <= Duration::from_secs(3),
            "{:?}",
            platform.now()
        );
    }

    #[test]
    fn the_fence_margin_is_a_quarter_of_the_lease_at_most_two_seconds() {
        let with = |ms| LockOptions {
            stale_after: Duration::from_millis(ms),
            ..Default::default()
        };
        assert_eq!(with(1000).fence_margin(), Duration::from_millis(250));
        assert_eq!(with(300_000).fence_margin(), Duration::from_secs(2));
    }
}
