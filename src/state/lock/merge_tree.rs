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

use crate::client::retry;
use crate::client::{Error, Transport};
use crate::platform::Platform;
use crate::state::steps::{Request, Session, Step};
use crate::state::tables::Tables;

use serde_json::Value;

use super::common::{
    acquire_with, execute_fenced, fence, holder_and, not_acquired, pause_or_give_up,
    reached_server, write_settings, Acquired, AlsoRead, Contender, First, LockHandle, LockOptions,
    MAX_STALE_AFTER,
};

const INSERT_ACQUIRE: &str = "INSERT INTO {db:Identifier}.{lt:Identifier} (state_id, token, kind, expires_at)
    SELECT {id:String}, {token:String}, 'acquire', now64(3) + toIntervalMillisecond({lease_ms:UInt64})";

const INSERT_RELEASE: &str = "INSERT INTO {db:Identifier}.{lt:Identifier} (state_id, token, kind, expires_at)
    SELECT {id:String}, {token:String}, 'release', now64(3) + toIntervalMillisecond({keep_ms:UInt64})";

/// The token holding the lock now (a scalar subquery; none when nobody does): the live token
/// (not released, lease not over) with the smallest block number.
pub const WINNER: &str = "SELECT token FROM {db:Identifier}.{lt:Identifier}
    WHERE state_id = {id:String}
    GROUP BY token
    HAVING countIf(kind = 'release') = 0 AND maxIf(expires_at, kind = 'acquire') > now64(3)
    ORDER BY min(_block_number), token
    LIMIT 1";

/// The fence: true while `{token}` holds the lock on `{id}` with at least `{margin_ms}` of its
/// lease left. Needs the parameters `db`, `lt`, `id`, `token`, `margin_ms` ([`super::fence`]).
pub const HOLDS: &str = "(SELECT token FROM {db:Identifier}.{lt:Identifier}
        WHERE state_id = {id:String}
        GROUP BY token
        HAVING countIf(kind = 'release') = 0 AND maxIf(expires_at, kind = 'acquire') > now64(3)
        ORDER BY min(_block_number), token
        LIMIT 1) = {token:String}
    AND (SELECT maxIf(expires_at, kind = 'acquire') > now64(3) + toIntervalMillisecond({margin_ms:UInt64})
        FROM {db:Identifier}.{lt:Identifier}
        WHERE state_id = {id:String} AND token = {token:String}) = 1";

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
    s.send(&write_settings(bind(query, tables, id, token)))
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
        .param("keep_ms", MAX_STALE_AFTER.as_millis().to_string())
        .until(lease_ends);
    s.send(&write_settings(bind(query, tables, id, token)))
        .map(|_| ())
}

fn bind(query: Request, tables: &Tables, id: &str, token: &str) -> Request {
    query
        .param("db", &tables.database)
        .param("lt", &tables.lock)
        .param("id", id)
        .param("token", token)
}

/// The token that holds the lock on `id` now, if any.
fn holder<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
) -> Result<Option<String>, Error> {
    Ok(holder_and(s, tables, id, WINNER, None)?.0)
}

/// Acquires the lock (commit order) and reads `also` in the query that confirms it, trying
/// `first` right after the first acquire row (its fence is the confirmation when it lands);
/// see [`super::acquire_trying`]: a contender withdraws whatever it may have written before it
/// returns an error.
pub fn acquire_trying<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    options: &LockOptions,
    also: Option<&AlsoRead>,
    first: Option<First<'_>>,
) -> Result<Acquired, Error> {
    let mut contender = MergeTreeContender {
        s,
        tables,
        options,
        started: s.platform.now(),
        handle: LockHandle::held_elsewhere(id, ""),
        claimed: false,
        faults: 0,
    };
    acquire_with(&mut contender, s.platform, options.stale_after, also, first)
}

/// A contender on the commit-order lock: each claim is an acquire row with a new token, and
/// every claim that did not win is withdrawn (a release row) before the next.
struct MergeTreeContender<'a, 's, T: Transport, P: Platform> {
    s: &'a Session<'s, T, P>,
    tables: &'a Tables,
    options: &'a LockOptions,
    started: Duration,
    handle: LockHandle,
    /// Whether the current token's acquire row may exist: it reached the server, whatever
    /// failed after it, and it was not withdrawn yet.
    claimed: bool,
    /// Failed attempts (a fault, not someone else holding the lock), each with its own token.
    faults: u32,
}

impl<T: Transport, P: Platform> MergeTreeContender<'_, '_, T, P> {
    /// Withdraws the current token's acquire row if it may exist, for good (a release row
    /// outlives every acquire row of its token); tried once per claim.
    fn withdraw(&mut self) -> Result<(), Error> {
        if !std::mem::take(&mut self.claimed) {
            return Ok(());
        }
        let lease_ends = self.s.platform.now() + self.options.stale_after;
        let (id, token) = (&self.handle.id, &self.handle.token);
        insert_release(self.s, self.tables, id, token, lease_ends).map_err(|e| not_acquired(e, id))
    }
}

impl<T: Transport, P: Platform> Contender for MergeTreeContender<'_, '_, T, P> {
    fn handle(&self) -> &LockHandle {
        &self.handle
    }

    fn claim(&mut self) -> Result<(), Error> {
        let token = self.s.platform.random_uuid();
        self.handle = LockHandle::held_elsewhere(self.handle.id.clone(), token);
        let claim = insert_acquire(
            self.s,
            self.tables,
            &self.handle.id,
            &self.handle.token,
            self.options.stale_after,
        );
        self.claimed = reached_server(&claim);
        claim
    }

    fn confirm(&mut self, also: Option<&AlsoRead>) -> Result<Option<Option<Value>>, Error> {
        let (winner, read) = holder_and(self.s, self.tables, &self.handle.id, WINNER, also)?;
        Ok((winner.as_deref() == Some(self.handle.token.as_str())).then_some(read))
    }

    /// Withdraws, then waits until nobody holds the lock.
    fn wait_turn(&mut self) -> Result<(), Error> {
        self.withdraw()?;
        let id = self.handle.id.as_str();
        loop {
            pause_or_give_up(self.s.platform, id, self.options, self.started)?;
            if holder(self.s, self.tables, id)
                .map_err(|e| not_acquired(e, id))?
                .is_none()
            {
                return Ok(());
            }
        }
    }

    /// Withdraws, then tries again with a new token after a pause, up to the store's retries
    /// and within the lock timeout.
    fn after_fault(&mut self, e: Error) -> Result<(), Error> {
        self.withdraw()?;
        self.faults += 1;
        let id = self.handle.id.as_str();
        if self.faults > self.s.retry.retries
            || !retry::is_worth_retrying(e.kind)
            || !self
                .s
                .pause(self.faults, self.started + self.options.timeout)
        {
            return Err(not_acquired(e, id));
        }
        Ok(())
    }

    fn abandon(&mut self) {
        // Keep the error that ended the acquire.
        let _ = self.withdraw();
    }
}

/// Releases a held lock (idempotent: releasing twice is harmless), repeating the release until
/// it lands or the lease has certainly ended.
pub fn release<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    handle: &LockHandle,
) -> Result<(), Error> {
    let lease_ends = handle
        .lease_ends()
        .unwrap_or_else(|| s.platform.now() + s.lease);
    insert_release(s, tables, &handle.id, &handle.token, lease_ends)
}

/// What a renewal requires: [`HOLDS`].
const RENEW_IF: &str = crate::state::planted::renew_condition(HOLDS);

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
    let query = Step::Renew
        .query(format!(
            "INSERT INTO {{db:Identifier}}.{{lt:Identifier}} (state_id, token, kind, expires_at)
             SELECT {{id:String}}, {{token:String}}, 'acquire',
                    now64(3) + toIntervalMillisecond({{lease_ms:UInt64}})
             WHERE {RENEW_IF}"
        ))
        .param("lease_ms", options.stale_after.as_millis().to_string());
    execute_fenced(s, fence(query, tables, handle, options), handle)?;
    handle.lease_ends_by(s.platform.now() + options.stale_after);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::common::testing::session;
    use super::super::common::Tried;
    use super::*;
    use crate::client::error::TransportFailure;
    use crate::client::testing::{fail, ok, operation, param, written, Answering, Scripted};
    use crate::client::ErrorKind;
    use crate::client::{Client, ConnectionOptions, HttpRequest, HttpResponse};
    use crate::platform::testing::FakePlatform;
    use crate::state::tables::LockEngine;

    fn tables() -> Tables {
        Tables {
            database: "d".into(),
            state: "s".into(),
            lock: "l".into(),
            lock_engine: LockEngine::MergeTree,
            replication: crate::state::tables::Replication::None,
        }
    }

    /// Acquires without reading anything else.
    fn acquire<T: Transport>(
        s: &Session<'_, T, FakePlatform>,
        tables: &Tables,
        id: &str,
        options: &LockOptions,
    ) -> Result<LockHandle, Error> {
        acquire_trying(s, tables, id, options, None, None).map(|a| a.handle)
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
    fn a_release_stops_trying_when_the_known_lease_has_ended() {
        let t = Answering::new(|_: &HttpRequest, _| fail(TransportFailure::Refused));
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        // Configured lease 12 h, but this handle's lease ends 3 s from now.
        let mut s = session(&client, &platform, 0);
        s.lease = MAX_STALE_AFTER;
        let handle = LockHandle::held_elsewhere("job", "tok");
        handle.lease_ends_by(Duration::from_secs(3));
        release(&s, &tables(), &handle).unwrap_err();
        assert!(
            platform.now() <= Duration::from_secs(3),
            "{:?}",
            platform.now()
        );
    }

    /// Acquires with a write tried first that answers `tried` (or fails), the holder query
    /// naming our token when `ours`, else someone else; what it did, and the operations sent.
    fn acquire_trying_first(
        tried: Result<Tried, Error>,
        ours: bool,
    ) -> (Result<Acquired, Error>, Vec<String>, usize) {
        let token_seen = std::cell::RefCell::new(String::new());
        let t = Answering::new(|request: &HttpRequest, _| {
            if let Some(token) = param(request, "token") {
                *token_seen.borrow_mut() = token;
            }
            match operation(request).as_str() {
                "lock-holder" if ours => holder_is(&token_seen.borrow()),
                "lock-holder" => holder_is("someone-else"),
                _ => written(1),
            }
        });
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let options = LockOptions {
            timeout: Duration::ZERO,
            ..LockOptions::default()
        };
        let calls = std::cell::Cell::new(0);
        let first = |handle: &LockHandle| {
            calls.set(calls.get() + 1);
            assert_eq!(
                Some(handle.token.clone()),
                param(&t.sent.borrow()[0], "token")
            );
            tried.clone()
        };
        let acquired = acquire_trying(
            &session(&client, &platform, 0),
            &tables(),
            "job",
            &options,
            None,
            Some(&first),
        );
        (acquired, t.operations(), calls.get())
    }

    #[test]
    fn a_write_tried_first_confirms_the_claim_or_leaves_it_to_the_holder_query() {
        // Written: its fence confirmed the claim; no holder query.
        let (acquired, ops, calls) = acquire_trying_first(Ok(Tried::Written), false);
        let acquired = acquired.unwrap();
        assert_eq!(
            (acquired.first, acquired.read, calls),
            (Some(Tried::Written), None, 1)
        );
        assert_eq!(ops, ["lock"]);
        // Not written: confirmed by the holder query as usual.
        let (acquired, ops, _) = acquire_trying_first(Ok(Tried::NotWritten), true);
        assert_eq!(acquired.unwrap().first, Some(Tried::NotWritten));
        assert_eq!(ops, ["lock", "lock-holder"]);
        let (acquired, ops, _) = acquire_trying_first(Ok(Tried::NotWritten), false);
        assert_eq!(acquired.unwrap_err().kind, ErrorKind::Locked);
        assert_eq!(ops, ["lock", "lock-holder", "unlock"]);
        // A lost answer (uncertain) with the lock ours: held, the caller decides.
        let lost = Error::new(ErrorKind::Uncertain, "lost");
        let (acquired, ops, _) = acquire_trying_first(Err(lost.clone()), true);
        assert_eq!(acquired.unwrap().first, Some(Tried::Unknown));
        assert_eq!(ops, ["lock", "lock-holder"]);
        // A lost answer and someone else holds the lock: the write may have landed while this
        // contender held it, so `uncertain`, after withdrawing; never tried again.
        let (acquired, ops, calls) = acquire_trying_first(Err(lost), false);
        assert_eq!(acquired.unwrap_err().kind, ErrorKind::Uncertain);
        assert_eq!(ops, ["lock", "lock-holder", "unlock"]);
        assert_eq!(calls, 1);
        // A failure that proves nothing was written: withdrawn, tried again without it.
        let refused = Error::new(ErrorKind::Transient, "refused");
        let (acquired, ops, calls) = acquire_trying_first(Err(refused), true);
        assert_eq!(acquired.unwrap_err().kind, ErrorKind::Transient);
        assert_eq!(ops, ["lock", "unlock"]);
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_claim_whose_next_request_never_reaches_the_server_is_still_withdrawn() {
        // The acquire row is written; the holder query is refused (disconnected, retries 0).
        let t = Answering::new(
            |request: &HttpRequest, _| match operation(request).as_str() {
                "lock-holder" => fail(TransportFailure::Refused),
                _ => written(1),
            },
        );
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let e = acquire(
            &session(&client, &platform, 0),
            &tables(),
            "job",
            &LockOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Disconnected, "{e}");
        assert_eq!(t.operations(), ["lock", "lock-holder", "unlock"]);
    }

    #[test]
    fn a_lost_first_write_stays_uncertain_when_the_withdrawal_fails_too() {
        let t = Answering::new(
            |request: &HttpRequest, _| match operation(request).as_str() {
                "lock-holder" => holder_is("someone-else"),
                "unlock" => fail(TransportFailure::Refused),
                _ => written(1),
            },
        );
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let platform = FakePlatform::default();
        let first = |_: &LockHandle| Err(Error::new(ErrorKind::Uncertain, "lost"));
        let e = acquire_trying(
            &session(&client, &platform, 0),
            &tables(),
            "job",
            &LockOptions::default(),
            None,
            Some(&first),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain, "{e}");
    }
}
