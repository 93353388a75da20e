//! What both lock engines share: the timing ([`LockOptions`] and its limits), the handle of a
//! held lock, the settings of every lock write, the fenced write, the holder query (given the
//! engine's winner query) and the wait between attempts. Uses no other module of the lock.

use std::time::Duration;

use crate::client::error::tenths;

use serde_json::Value;

use crate::client::response::json_rows;
use crate::client::{Error, ErrorKind, Transport};
use crate::platform::Platform;
use crate::state::ids::shorten;
use crate::state::steps::{Request, Session, Step};
use crate::state::tables::Tables;

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

/// Binds the parameters of the fence condition ([`super::holds`]) for `handle`.
pub fn fence(
    query: Request,
    tables: &Tables,
    handle: &LockHandle,
    options: &LockOptions,
) -> Request {
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
pub fn write_settings(query: Request) -> Request {
    query
        .setting("async_insert", "0")
        .setting("insert_deduplication_token", "")
}

/// Runs a fenced write (repeated as its step and [`Request::lost_answer_is_final`] allow);
/// `locked` when the fence let nothing through, `uncertain` when it let nothing through after
/// an attempt whose answer was lost (that attempt may have landed before the lock was lost).
pub fn execute_fenced<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    request: Request,
    handle: &LockHandle,
) -> Result<(), Error> {
    let step = request.step();
    let sent = s.send(&write_settings(request))?;
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

/// What a write tried right after the lock's first claim, before the claim was confirmed
/// ([`super::acquire_trying`]), did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tried {
    /// It was applied: its fence proved that this contender holds the lock.
    Written,
    /// Its fence or its own condition let nothing through: the lock is confirmed as usual.
    NotWritten,
    /// Its answer was lost, so it may have been applied: the lock is confirmed as usual, and
    /// the acquire fails `uncertain` if this contender turns out not to hold it.
    Unknown,
}

/// A write to try right after the lock's first claim (merge-tree: the acquire row; keeper-map:
/// the takeover), fenced by the contender's handle: it lands only if the claim made this
/// contender the holder, and saves the query that confirms the claim when it does.
pub type First<'a> = &'a dyn Fn(&LockHandle) -> Result<Tried, Error>;

/// A lock acquired by [`super::acquire_trying`].
#[derive(Debug)]
pub struct Acquired {
    /// The held lock.
    pub handle: LockHandle,
    /// `also`, read in the query that confirmed the lock (None when nothing was asked, or when
    /// `first` was written: then nothing was read).
    pub read: Option<Value>,
    /// What `first` did (None: it was not tried).
    pub first: Option<Tried>,
}

/// Runs `first` for the contender `handle`: a lost answer (`uncertain`) is [`Tried::Unknown`].
pub(super) fn tried_first(first: First<'_>, handle: &LockHandle) -> Result<Tried, Error> {
    match first(handle) {
        Err(e) if e.kind == ErrorKind::Uncertain => Ok(Tried::Unknown),
        other => other,
    }
}

/// Whether a lock write reached the server, whatever its answer: then it may have been
/// applied, and a contender that gives up must undo it.
pub(super) fn reached_server(result: &Result<(), Error>) -> bool {
    result
        .as_ref()
        .map_or_else(|e| e.kind != ErrorKind::Disconnected, |()| true)
}

/// What a lock engine supplies to the one acquire algorithm ([`acquire_with`]): its claim, its
/// reading of who holds the lock, and what it does when someone else holds it, after a fault,
/// and before the acquire fails.
pub(super) trait Contender {
    /// The handle of the current claim.
    fn handle(&self) -> &LockHandle;
    /// Sends the claim.
    fn claim(&mut self) -> Result<(), Error>;
    /// Whether the claim made this contender the holder: `Some` (with `also`, read in the
    /// same query) if it did.
    fn confirm(&mut self, also: Option<&AlsoRead>) -> Result<Option<Option<Value>>, Error>;
    /// Someone else holds the lock: waits for a turn to claim again; an error ends the acquire.
    fn wait_turn(&mut self) -> Result<(), Error>;
    /// An attempt failed with `e`: `Ok` to claim again, or the error that ends the acquire.
    fn after_fault(&mut self, e: Error) -> Result<(), Error>;
    /// Ends whatever this contender may hold, before the acquire fails.
    fn abandon(&mut self);
}

/// The acquire of both engines ([`super::acquire_trying`]): claim; try `first` right after the
/// first claim (its fence is the confirmation when it lands), else confirm the claim; held,
/// or the engine waits for a turn or handles the fault, and claims again. A contender whose
/// `first` was lost and that does not hold the lock fails `uncertain`. Whatever ends the
/// acquire without the lock, the engine first abandons what the contender may hold.
pub(super) fn acquire_with<C: Contender, P: Platform>(
    contender: &mut C,
    platform: &P,
    stale_after: Duration,
    also: Option<&AlsoRead>,
    first: Option<First<'_>>,
) -> Result<Acquired, Error> {
    let mut first = first;
    let mut tried = None;
    loop {
        let attempt = contender.claim().and_then(|()| {
            if let Some(first) = first.take() {
                // The claim was sent before now: its lease has certainly ended a lease from now.
                let handle = contender.handle();
                handle.lease_ends_by(platform.now() + stale_after);
                let result = tried_first(first, handle)?;
                tried = Some(result);
                if result == Tried::Written {
                    // Its fence proved that this contender holds the lock; nothing was read.
                    return Ok(Some(None));
                }
            }
            contender.confirm(also)
        });
        let ended = match attempt {
            Ok(Some(read)) => {
                let handle = contender.handle();
                handle.lease_ends_by(platform.now() + stale_after);
                return Ok(Acquired {
                    handle: handle.clone(),
                    read,
                    first: tried,
                });
            }
            // The write tried first may have landed: whatever else happened, nothing is known.
            _ if tried == Some(Tried::Unknown) => Err(first_unknown(&contender.handle().id)),
            Ok(None) => contender.wait_turn(),
            Err(e) => contender.after_fault(e),
        };
        if let Err(e) = ended {
            contender.abandon();
            return Err(e);
        }
    }
}

/// A contender whose first write's answer was lost and that does not hold the lock: the write
/// may have landed while it held it (a lease can end within one attempt), so nothing is known.
pub(super) fn first_unknown(id: &str) -> Error {
    Error::new(
        ErrorKind::Uncertain,
        format!(
            "the answer to the write under the lock on state id '{}' was lost, and the lock is no longer held by this caller: the write may have been applied",
            shorten(id)
        ),
    )
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

/// The holder, by the engine's `winner` query (a scalar subquery naming the token that holds
/// the lock on `{id}`, `''` or NULL when nobody does), and the value of `also` read in the same
/// query.
pub(crate) fn holder_and<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    winner: &str,
    also: Option<&AlsoRead>,
) -> Result<(Option<String>, Option<Value>), Error> {
    let extra = also.map_or("NULL".to_string(), |a| a.expression.clone());
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
    let response = s.send(&query)?.value;
    // The answer's one row; any other shape is an error, never a default.
    let mut rows = json_rows(&response.body, "the lock query")?;
    let (Some(mut row), None) = (rows.pop(), rows.pop()) else {
        return Err(Error::new(
            ErrorKind::Permanent,
            "unexpected answer to the lock query: not one row",
        ));
    };
    let token = row.optional_text("holder")?.unwrap_or_default();
    let also_value = row.value("also")?;
    row.all_taken()?;
    Ok((
        (!token.is_empty()).then_some(token),
        also.map(|_| also_value),
    ))
}

/// An error met while acquiring, after this contender withdrew whatever it may have written:
/// nothing was applied, so an unknown outcome of a lock write is no longer `uncertain`.
pub(super) fn not_acquired(e: Error, id: &str) -> Error {
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
                "state id '{}' is locked by another holder (waited {} s; the lock timeout is {} s)",
                shorten(id),
                tenths(now - started),
                tenths(options.timeout)
            ),
        ));
    }
    let pause =
        crate::client::retry::backoff(options.retry, options.retry, 1, platform.random_u64());
    platform.sleep(pause.min(deadline - now));
    Ok(())
}

#[cfg(test)]
pub(super) mod testing {
    use crate::client::retry::RetryPolicy;
    use crate::client::{Client, Transport};
    use crate::platform::testing::FakePlatform;
    use crate::state::steps::Session;

    use super::DEFAULT_STALE_AFTER;

    /// A session of the lock tests: `retries` retries, the default lease.
    pub fn session<'a, T: Transport>(
        client: &'a Client<T>,
        platform: &'a FakePlatform,
        retries: u32,
    ) -> Session<'a, T, FakePlatform> {
        Session {
            client,
            platform,
            retry: RetryPolicy::new(retries),
            lease: DEFAULT_STALE_AFTER,
            replication: crate::state::tables::Replication::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::session;
    use super::*;
    use crate::client::error::TransportFailure;
    use crate::client::testing::{fail, written, Scripted};
    use crate::client::{Client, ConnectionOptions};
    use crate::platform::testing::FakePlatform;

    #[test]
    fn a_fenced_write_fenced_out_after_a_lost_answer_is_uncertain() {
        let handle = LockHandle::held_elsewhere("job", "tok");
        let platform = FakePlatform::default();
        let t = Scripted::new(vec![fail(TransportFailure::Timeout), written(0)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let e = execute_fenced(
            &session(&client, &platform, 3),
            Step::Set.query("INSERT"),
            &handle,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain, "{e}");

        let t = Scripted::new(vec![written(0)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let e = execute_fenced(
            &session(&client, &platform, 3),
            Step::Set.query("INSERT"),
            &handle,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Locked, "{e}");

        let t = Scripted::new(vec![fail(TransportFailure::Reset), written(1)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        execute_fenced(
            &session(&client, &platform, 3),
            Step::Set.query("INSERT"),
            &handle,
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
            Step::Set.query("INSERT").lost_answer_is_final(true),
            &handle,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain, "{e}");
        assert_eq!(t.sent.borrow().len(), 1);
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
