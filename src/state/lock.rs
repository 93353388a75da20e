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
//!   interval (with jitter) until nobody holds the lock, then try again with a new token; after
//!   the timeout, fail with `locked`.
//! * Release: a `release` row. Renew: a new `acquire` row with the same token (the lease moves,
//!   the place does not).
//! * A crashed holder's lease ends after the stale window; its rows are then ignored, and the
//!   TTL reaps them a day later. Nothing on these paths is a mutation.

use std::time::Duration;

use serde_json::Value;

use crate::client::{Client, Error, ErrorKind, Query, Transport};
use crate::platform::Platform;

use super::schema::Tables;

/// Default time to wait for a lock.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default pause between attempts while another holder has the lock.
pub const DEFAULT_RETRY: Duration = Duration::from_millis(100);
/// Default lease: a holder that neither releases nor renews within it loses the lock.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(300);

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHandle {
    /// The locked state id.
    pub id: String,
    /// This holder's token.
    pub token: String,
}

const INSERT_ROW: &str = "INSERT INTO {db:Identifier}.{lt:Identifier} (state_id, token, kind, expires_at)
    SELECT {id:String}, {token:String}, {kind:String}, now64(3) + toIntervalMillisecond({lease_ms:UInt64})";

const WINNER: &str = "SELECT token FROM {db:Identifier}.{lt:Identifier}
    WHERE state_id = {id:String}
    GROUP BY token
    HAVING countIf(kind = 'release') = 0 AND max(expires_at) > now64(3)
    ORDER BY min(_block_number), token
    LIMIT 1";

/// Something to read in the same query that checks who won (saves a round trip): a scalar SQL
/// expression and its parameters (`db` and `id` are bound already; don't use `lt`).
#[derive(Clone, Debug, Default)]
pub struct AlsoRead {
    /// A scalar expression, e.g. a `(SELECT ...)` subquery.
    pub expression: String,
    /// Its parameters.
    pub params: Vec<(String, String)>,
}

fn insert_row<T: Transport>(
    client: &Client<T>,
    tables: &Tables,
    id: &str,
    token: &str,
    kind: &str,
    lease: Duration,
) -> Result<(), Error> {
    client
        .execute(
            &Query::read(
                if kind == "acquire" { "lock" } else { "unlock" },
                INSERT_ROW,
            )
            .param("db", &tables.database)
            .param("lt", &tables.lock)
            .param("id", id)
            .param("token", token)
            .param("kind", kind)
            .param("lease_ms", lease.as_millis().to_string()),
        )
        .map(|_| ())
}

/// The token that holds the lock on `id` now, if any.
pub fn holder<T: Transport>(
    client: &Client<T>,
    tables: &Tables,
    id: &str,
) -> Result<Option<String>, Error> {
    Ok(holder_and(client, tables, id, None)?.0)
}

/// The holder, and the value of `also` read in the same query.
fn holder_and<T: Transport>(
    client: &Client<T>,
    tables: &Tables,
    id: &str,
    also: Option<&AlsoRead>,
) -> Result<(Option<String>, Option<Value>), Error> {
    let extra = also.map_or("NULL".to_string(), |a| a.expression.clone());
    let mut query = Query::read(
        "lock-holder",
        format!("SELECT ({WINNER}) AS holder, {extra} AS also"),
    )
    .param("db", &tables.database)
    .param("lt", &tables.lock)
    .param("id", id)
    .format("JSONEachRow");
    if let Some(also) = also {
        for (name, value) in &also.params {
            query = query.param(name, value.clone());
        }
    }
    let response = client.execute_owned(query)?;
    let row: Value = serde_json::from_slice(&response.body).map_err(|e| {
        Error::new(
            ErrorKind::Transient,
            format!("unexpected answer to the lock query: {e}"),
        )
    })?;
    let token = row["holder"].as_str().unwrap_or_default().to_string();
    Ok((
        (!token.is_empty()).then_some(token),
        also.map(|_| row["also"].clone()),
    ))
}

/// Acquires the lock on `id`, waiting up to `options.timeout`.
pub fn acquire<T: Transport, P: Platform>(
    client: &Client<T>,
    platform: &P,
    tables: &Tables,
    id: &str,
    options: &LockOptions,
) -> Result<LockHandle, Error> {
    acquire_and_read(client, platform, tables, id, options, None).map(|(handle, _)| handle)
}

/// Acquires the lock and, in the query that confirms it, reads `also` (its value as of the
/// moment the lock was confirmed held).
pub fn acquire_and_read<T: Transport, P: Platform>(
    client: &Client<T>,
    platform: &P,
    tables: &Tables,
    id: &str,
    options: &LockOptions,
    also: Option<&AlsoRead>,
) -> Result<(LockHandle, Option<Value>), Error> {
    let started = platform.now();
    let deadline = started + options.timeout;
    loop {
        let token = platform.random_uuid();
        if let Err(e) = insert_row(client, tables, id, &token, "acquire", options.stale_after) {
            // The row may have been written: withdraw it so it cannot block anyone.
            let _ = insert_row(client, tables, id, &token, "release", Duration::ZERO);
            return Err(e);
        }
        match holder_and(client, tables, id, also) {
            Ok((Some(winner), read)) if winner == token => {
                return Ok((
                    LockHandle {
                        id: id.to_string(),
                        token,
                    },
                    read,
                ))
            }
            Ok(_) => insert_row(client, tables, id, &token, "release", Duration::ZERO)?,
            Err(e) => {
                let _ = insert_row(client, tables, id, &token, "release", Duration::ZERO);
                return Err(e);
            }
        }
        // Someone else holds it: wait until nobody does, then try again.
        loop {
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
            let jitter_ms = if options.retry.as_millis() > 0 {
                platform.random_u64() % (options.retry.as_millis() as u64 / 2 + 1)
            } else {
                0
            };
            let pause = (options.retry + Duration::from_millis(jitter_ms)).min(deadline - now);
            platform.sleep(pause);
            if holder(client, tables, id)?.is_none() {
                break;
            }
        }
    }
}

/// Releases a held lock (idempotent: releasing twice is harmless).
pub fn release<T: Transport>(
    client: &Client<T>,
    tables: &Tables,
    handle: &LockHandle,
) -> Result<(), Error> {
    insert_row(
        client,
        tables,
        &handle.id,
        &handle.token,
        "release",
        Duration::ZERO,
    )
}

/// Extends the lease of a held lock by a full stale window; `locked` if it is no longer held
/// (released, or its lease already ended and someone else may have taken it).
pub fn renew<T: Transport>(
    client: &Client<T>,
    tables: &Tables,
    handle: &LockHandle,
    options: &LockOptions,
) -> Result<(), Error> {
    match holder(client, tables, &handle.id)? {
        Some(token) if token == handle.token => insert_row(
            client,
            tables,
            &handle.id,
            &handle.token,
            "acquire",
            options.stale_after,
        ),
        _ => Err(Error::new(
            ErrorKind::Locked,
            format!(
                "the lock on state id '{}' is no longer held by this holder",
                shorten(&handle.id)
            ),
        )),
    }
}

/// An id short enough for a message.
pub(crate) fn shorten(id: &str) -> String {
    let mut s: String = id.chars().take(100).collect();
    if s.len() < id.len() {
        s.push('…');
    }
    s.escape_debug().to_string()
}
