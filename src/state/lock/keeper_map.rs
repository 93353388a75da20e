//! The Keeper-backed lock, for replicated clusters and ClickHouse Cloud: one row per state id in
//! a `KeeperMap` table (`token`, `expires_at`), every write in `keeper_map_strict_mode`, so
//! each one is a linearizable Keeper operation.
//!
//! The row of a state id is created once and never deleted: a strict-mode write checks the
//! Keeper node's version, and a node that is never removed only ever gets higher versions, so
//! every conditional write below is a real compare-and-swap (a deleted and re-created node
//! would start again at version 0 and let a stale compare succeed).
//!
//! * Acquire: take over the row if its lease has ended (a strict conditional
//!   `ALTER TABLE ... UPDATE token, expires_at WHERE expires_at < now64(3)`), then read who
//!   holds it; if nobody has a row yet, insert it (in strict mode an insert of an existing key
//!   fails, "Node exists": exactly one contender creates it) and read again. A lost reply is
//!   harmless: the read shows our own token.
//! * Renew: a strict conditional update of `expires_at` on the row with our token and at least
//!   the fence margin of lease left, then a read that confirms it (the answer of an `ALTER`
//!   does not say how many rows matched); `locked` when it did not apply.
//! * Release: a strict conditional update that ends our lease (`expires_at` = epoch) if the
//!   row still carries our token (idempotent).
//! * Fenced writes use [`HOLDS`]: our token's row with the fence margin left.
//!
//! Needs `keeper_map_path_prefix` in the server configuration (ClickHouse Cloud has it). The
//! table's Keeper path is `/clickhouse_component/<database>/<table>` (URL-encoded names) under
//! that prefix.

use std::time::Duration;

use serde_json::Value;

use crate::client::url::encode_component;
use crate::client::{Error, ErrorKind, Transport};
use crate::platform::Platform;

use crate::state::ids::shorten;
use crate::state::steps::{is_conflict, is_node_exists, Request, Session, Step};
use crate::state::tables::Tables;

use super::common::{
    acquire_with, holder_and, not_acquired, pause_or_give_up, reached_server, write_settings,
    Acquired, AlsoRead, Contender, First, LockHandle, LockOptions,
};

/// The lock table: one row per state id.
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS {db:Identifier}.{t:Identifier} (
    state_id String,
    token String,
    expires_at DateTime64(3)
) ENGINE = KeeperMap({path:String})
PRIMARY KEY state_id";

/// Columns of the lock table.
pub const COLUMNS: &[(&str, &str)] = &[
    ("state_id", "String"),
    ("token", "String"),
    ("expires_at", "DateTime64(3)"),
];

/// The Keeper path of a lock table (under the server's `keeper_map_path_prefix`).
pub fn keeper_path(tables: &Tables) -> String {
    format!(
        "/clickhouse_component/{}/{}",
        encode_component(&tables.database),
        encode_component(&tables.lock)
    )
}

/// The token holding the lock now (a scalar subquery; `''` when nobody does).
pub const WINNER: &str = "SELECT any(token) FROM {db:Identifier}.{lt:Identifier}
    WHERE state_id = {id:String} AND expires_at > now64(3)";

/// The fence: our token's row, with at least `{margin_ms}` of its lease left.
pub const HOLDS: &str = "(SELECT count() FROM {db:Identifier}.{lt:Identifier}
        WHERE state_id = {id:String} AND token = {token:String}
          AND expires_at > now64(3) + toIntervalMillisecond({margin_ms:UInt64})) = 1";

fn strict(query: Request, tables: &Tables, id: &str) -> Request {
    write_settings(query)
        .setting("keeper_map_strict_mode", "1")
        .param("db", &tables.database)
        .param("lt", &tables.lock)
        .param("id", id)
}

/// A strict-mode conflict as the caller should see it: the row changed under us, so the lock
/// is someone else's (never `transient`: retrying the same write cannot succeed).
fn lost(e: Error, id: &str) -> Error {
    Error {
        kind: ErrorKind::Locked,
        message: format!(
            "the lock row of state id '{}' was changed by another holder: {}",
            shorten(id),
            e.message
        ),
        ..e
    }
}

/// Creates the row of `id` for `token`, unless it exists already (then the insert is a no-op:
/// the read that follows decides). A repeat after a lost answer meets "node exists" and is
/// fine too.
fn try_create<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    token: &str,
    lease: Duration,
) -> Result<(), Error> {
    let query = Step::CreateLockRow
        .query(
            "INSERT INTO {db:Identifier}.{lt:Identifier} (state_id, token, expires_at)
             SELECT {id:String}, {token:String}, now64(3) + toIntervalMillisecond({lease_ms:UInt64})",
        )
        .param("token", token)
        .param("lease_ms", lease.as_millis().to_string());
    match s.send(&strict(query, tables, id)) {
        Err(e) if !is_node_exists(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Takes over the row of a holder whose lease has ended (a strict conditional update; a
/// conflicting change by someone else is fine: the read that follows decides).
fn take_over_stale<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    token: &str,
    lease: Duration,
) -> Result<(), Error> {
    let query = Step::TakeOver
        .query(
            "ALTER TABLE {db:Identifier}.{lt:Identifier}
             UPDATE token = {token:String}, expires_at = now64(3) + toIntervalMillisecond({lease_ms:UInt64})
             WHERE state_id = {id:String} AND expires_at < now64(3)",
        )
        .param("token", token)
        .param("lease_ms", lease.as_millis().to_string());
    match s.send(&strict(query, tables, id)) {
        Ok(_) => Ok(()),
        Err(e) if is_conflict(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether the row exists, and who holds it (a live lease).
fn row_and_holder<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    also: Option<&AlsoRead>,
) -> Result<(bool, Option<String>, Option<serde_json::Value>), Error> {
    let exists = AlsoRead {
        expression: format!(
            "tuple((SELECT count() FROM {{db:Identifier}}.{{lt:Identifier}} WHERE state_id = {{id:String}}), {})",
            also.map_or("NULL", |a| a.expression.as_str())
        ),
        params: also.map(|a| a.params.clone()).unwrap_or_default(),
    };
    let (holder, read) = holder_and(s, tables, id, WINNER, Some(&exists))?;
    // The tuple prints as an array, or as an object under named-tuple settings.
    let (count, value) = match read {
        Some(serde_json::Value::Array(mut items)) if items.len() == 2 => {
            let value = items.pop().unwrap_or_default();
            (items.pop().unwrap_or_default(), value)
        }
        Some(serde_json::Value::Object(map)) if map.len() == 2 => {
            let mut values = map.into_iter().map(|(_, v)| v);
            let count = values.next().unwrap_or_default();
            (count, values.next().unwrap_or_default())
        }
        other => {
            return Err(Error::new(
                ErrorKind::Permanent,
                format!(
                    "unexpected answer to the lock query: {}",
                    other.map_or("no row".to_string(), |v| v.to_string())
                ),
            ))
        }
    };
    let exists = match &count {
        serde_json::Value::Number(n) => n.as_u64().unwrap_or(0) > 0,
        serde_json::Value::String(s) => s != "0",
        _ => false,
    };
    Ok((exists, holder, also.map(|_| value)))
}

/// Acquires the lock on `id`, waiting up to `options.timeout`, and reads `also` once held,
/// trying `first` right after the first takeover (its fence is the confirmation when it
/// lands). On failure, a lease this call may have taken (a takeover or creation that was
/// applied, or whose answer was lost) is ended before it returns.
pub fn acquire_trying<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    options: &LockOptions,
    also: Option<&AlsoRead>,
    first: Option<First<'_>>,
) -> Result<Acquired, Error> {
    let mut contender = KeeperMapContender {
        s,
        tables,
        options,
        started: s.platform.now(),
        handle: LockHandle::held_elsewhere(id, s.platform.random_uuid()),
        maybe_ours: false,
    };
    acquire_with(&mut contender, s.platform, options.stale_after, also, first)
}

/// A contender on the Keeper-backed lock: one token for the whole acquire, claimed by taking
/// over the row when its lease has ended (or creating it, for an id without one). Its steps
/// repeat themselves, so a fault ends the acquire.
struct KeeperMapContender<'a, 's, T: Transport, P: Platform> {
    s: &'a Session<'s, T, P>,
    tables: &'a Tables,
    options: &'a LockOptions,
    started: Duration,
    handle: LockHandle,
    /// Whether a write of ours may have given us the row: it reached the server, whatever the
    /// answer (a Keeper error can hide an applied write). Then giving up must end its lease (a
    /// conditional no-op if the row is not ours).
    maybe_ours: bool,
}

impl<T: Transport, P: Platform> KeeperMapContender<'_, '_, T, P> {
    /// Notes a write that may have given us the row.
    fn wrote(&mut self, result: Result<(), Error>) -> Result<(), Error> {
        self.maybe_ours |= reached_server(&result);
        result
    }

    /// Whether the current holder is this contender.
    fn ours(&self, holder: Option<String>) -> bool {
        holder.as_deref() == Some(self.handle.token.as_str())
    }
}

impl<T: Transport, P: Platform> Contender for KeeperMapContender<'_, '_, T, P> {
    fn handle(&self) -> &LockHandle {
        &self.handle
    }

    fn claim(&mut self) -> Result<(), Error> {
        let (id, token) = (&self.handle.id, &self.handle.token);
        let taken = take_over_stale(self.s, self.tables, id, token, self.options.stale_after);
        self.wrote(taken)
    }

    /// Who holds the row; for an id without one, creates it (once per state id, ever) and
    /// looks again.
    fn confirm(&mut self, also: Option<&AlsoRead>) -> Result<Option<Option<Value>>, Error> {
        let id = self.handle.id.clone();
        let (exists, holder, read) = row_and_holder(self.s, self.tables, &id, also)?;
        if self.ours(holder) {
            return Ok(Some(read));
        }
        if exists {
            return Ok(None);
        }
        let token = self.handle.token.clone();
        let created = try_create(self.s, self.tables, &id, &token, self.options.stale_after);
        self.wrote(created)?;
        let (_, holder, read) = row_and_holder(self.s, self.tables, &id, also)?;
        Ok(self.ours(holder).then_some(read))
    }

    fn wait_turn(&mut self) -> Result<(), Error> {
        pause_or_give_up(self.s.platform, &self.handle.id, self.options, self.started)
    }

    fn after_fault(&mut self, e: Error) -> Result<(), Error> {
        Err(not_acquired(e, &self.handle.id))
    }

    fn abandon(&mut self) {
        if self.maybe_ours {
            // Keep the error that ended the acquire; the release repeats until the lease has
            // ended.
            let _ = release(self.s, self.tables, &self.handle);
        }
    }
}

/// Releases a held lock: ends the lease of the row if it still carries our token (a strict
/// conditional update; the row stays, so its Keeper version only grows). Idempotent; repeated
/// until it lands or the lease has certainly ended.
pub fn release<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    handle: &LockHandle,
) -> Result<(), Error> {
    // One deadline for every attempt, conflicts included.
    let until = handle
        .lease_ends()
        .unwrap_or_else(|| s.platform.now() + s.lease);
    let mut conflicts = 0;
    loop {
        let query = Step::Release
            .query(
                "ALTER TABLE {db:Identifier}.{lt:Identifier}
                 UPDATE expires_at = toDateTime64(0, 3)
                 WHERE state_id = {id:String} AND token = {token:String}",
            )
            .param("token", &handle.token)
            .until(until);
        match s.send(&strict(query, tables, &handle.id)) {
            Err(e) if is_conflict(&e) && conflicts < 3 => conflicts += 1,
            Err(e) if is_conflict(&e) => return Err(lost(e, &handle.id)),
            other => return other.map(|_| ()),
        }
    }
}

/// Extends the lease of a held lock: a strict conditional update of our row (our token, at
/// least the fence margin of lease left), confirmed by a read; `locked` otherwise.
pub fn renew<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    handle: &LockHandle,
    options: &LockOptions,
) -> Result<(), Error> {
    let margin = options.fence_margin().as_millis().to_string();
    let query = Step::Renew
        .query(
            "ALTER TABLE {db:Identifier}.{lt:Identifier}
             UPDATE expires_at = now64(3) + toIntervalMillisecond({lease_ms:UInt64})
             WHERE state_id = {id:String} AND token = {token:String}
               AND expires_at > now64(3) + toIntervalMillisecond({margin_ms:UInt64})",
        )
        .param("token", &handle.token)
        .param("lease_ms", options.stale_after.as_millis().to_string())
        .param("margin_ms", margin.clone());
    match s.send(&strict(query, tables, &handle.id)) {
        Ok(_) => {}
        // Someone changed the row: the read below says whether it is still ours.
        Err(e) if is_conflict(&e) => {}
        Err(e) => return Err(e),
    }
    let check = Step::ConfirmRenew
        .query(format!("SELECT {HOLDS}"))
        .param("db", &tables.database)
        .param("lt", &tables.lock)
        .param("id", &handle.id)
        .param("token", &handle.token)
        .param("margin_ms", margin)
        .format("TabSeparated");
    let response = s.send(&check)?.value;
    if String::from_utf8_lossy(&response.body).trim() == "1" {
        handle.lease_ends_by(s.platform.now() + options.stale_after);
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Locked,
            format!(
                "the lock on state id '{}' is no longer held by this holder",
                shorten(&handle.id)
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::common::testing::session;
    use super::super::common::Tried;
    use super::*;
    use crate::client::testing::{ok, operation, param, written, Answering};
    use crate::client::{Client, ConnectionOptions, HttpRequest};
    use crate::platform::testing::FakePlatform;
    use crate::state::tables::{LockEngine, Replication};

    /// Acquires with a write tried first that answers `tried`, the row's holder our token when
    /// `ours`, else someone else; what it did, and the operations sent.
    fn acquire_trying_first(
        tried: Result<Tried, Error>,
        ours: bool,
    ) -> (Result<Acquired, Error>, Vec<String>) {
        let token_seen = std::cell::RefCell::new(String::new());
        let t = Answering::new(|request: &HttpRequest, _| {
            if let Some(token) = param(request, "token") {
                *token_seen.borrow_mut() = token;
            }
            match operation(request).as_str() {
                "lock-holder" => {
                    let holder = if ours {
                        token_seen.borrow().clone()
                    } else {
                        "someone-else".into()
                    };
                    ok(&format!(r#"{{"holder":"{holder}","also":[1,null]}}"#))
                }
                _ => written(0),
            }
        });
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let tables = Tables {
            database: "d".into(),
            state: "s".into(),
            lock: "l".into(),
            lock_engine: LockEngine::KeeperMap,
            replication: Replication::None,
        };
        let options = LockOptions {
            timeout: Duration::ZERO,
            ..LockOptions::default()
        };
        let first = |_: &LockHandle| tried.clone();
        let acquired = acquire_trying(
            &session(&client, &platform, 0),
            &tables,
            "job",
            &options,
            None,
            Some(&first),
        );
        (acquired, t.operations())
    }

    #[test]
    fn a_write_tried_first_confirms_the_takeover_or_leaves_it_to_the_holder_query() {
        let (acquired, ops) = acquire_trying_first(Ok(Tried::Written), false);
        assert_eq!(acquired.unwrap().first, Some(Tried::Written));
        assert_eq!(ops, ["lock-takeover"]);
        let (acquired, ops) = acquire_trying_first(Ok(Tried::NotWritten), true);
        assert_eq!(acquired.unwrap().first, Some(Tried::NotWritten));
        assert_eq!(ops, ["lock-takeover", "lock-holder"]);
        let lost = Error::new(ErrorKind::Uncertain, "lost");
        let (acquired, ops) = acquire_trying_first(Err(lost.clone()), true);
        assert_eq!(acquired.unwrap().first, Some(Tried::Unknown));
        assert_eq!(ops, ["lock-takeover", "lock-holder"]);
        // The lost write may have landed while the takeover held: `uncertain`, after ending
        // the lease the takeover may have taken.
        let (acquired, ops) = acquire_trying_first(Err(lost), false);
        assert_eq!(acquired.unwrap_err().kind, ErrorKind::Uncertain);
        assert_eq!(ops, ["lock-takeover", "lock-holder", "unlock"]);
    }
}
