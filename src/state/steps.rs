//! Every request the state store and its lock send, named and classified in one place, and the
//! [`Session`] that sends them with retries.
//!
//! Each request is safe to repeat by construction: reads; DDL with `IF NOT EXISTS`; writes
//! that carry the same values and the same lock token on every attempt, so a repeat either
//! finds its work done or does it (an acquire row with the same token keeps its first place;
//! a release or withdrawal of a token is final; a renewal or a fenced write only applies while
//! the token holds). What differs is how long a step keeps trying ([`Repeat`]), and what a
//! failed attempt means for the next ones: a fenced write that is fenced out after an attempt
//! whose answer was lost is `uncertain`, not `locked` (the lost attempt may have landed).

use std::time::Duration;

use crate::client::retry::{self, Retried, RetryPolicy};
use crate::client::{Client, Error, Query, Response, Transport};
use crate::platform::Platform;

/// How long a step keeps trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// Up to the store's retries (`retries`, default [`retry::DEFAULT_RETRIES`]).
    Retries,
    /// Until it succeeds or the lease of its lock has certainly ended, whatever the store's
    /// retries: a release or a withdrawal that is given up early leaves a lock that blocks
    /// everyone until the stale window ends.
    UntilLeaseEnds,
}

/// One kind of request; its name is the `x-component-operation` header the host logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `CREATE ... IF NOT EXISTS` of the database and tables.
    CreateSchema,
    /// Reads of `system.tables` / `system.columns` that check the layout.
    VerifySchema,
    /// Reading one state.
    Get,
    /// Listing ids.
    Ids,
    /// Reading many states.
    GetAll,
    /// Counting an id's rows around a delete.
    CountRows,
    /// Overwriting states (unfenced, or fenced by a held lock): the same rows again on repeat.
    Set,
    /// A fenced lightweight DELETE of one id: a repeat deletes nothing more.
    Delete,
    /// The snapshot of `clear-all` (count and newest `updated_at`).
    ClearAllSnapshot,
    /// `clear-all`'s DELETE up to the snapshot: the same bound on repeat.
    ClearAll,
    /// The row that makes a contender (merge-tree: an `acquire` row; keeper-map: the creation
    /// of the id's row). A repeat with the same token keeps the first one's place, or (keeper)
    /// fails with "node exists" and the next read decides.
    Acquire,
    /// Keeper-map: taking over a row whose lease ended (conditional; a repeat finds it ours).
    TakeOver,
    /// Who holds the lock (and, for `update`, the stored state in the same query).
    Holder,
    /// A `release` of a token: by the holder, or a contender withdrawing.
    Release,
    /// Extending the lease (conditional on still holding it).
    Renew,
    /// Keeper-map: the read that confirms a renewal.
    ConfirmRenew,
}

impl Step {
    /// The operation name sent in the `x-component-operation` header.
    pub fn name(self) -> &'static str {
        match self {
            Step::CreateSchema => "create-schema",
            Step::VerifySchema => "verify-schema",
            Step::Get => "get",
            Step::Ids => "ids",
            Step::GetAll => "get-all",
            Step::CountRows => "count",
            Step::Set => "set",
            Step::Delete => "delete",
            Step::ClearAllSnapshot => "clear-all-snapshot",
            Step::ClearAll => "clear-all",
            Step::Acquire => "lock",
            Step::TakeOver => "lock-takeover",
            Step::Holder => "lock-holder",
            Step::Release => "unlock",
            Step::Renew => "renew",
            Step::ConfirmRenew => "renew-check",
        }
    }

    /// Whether the request may change data (an interrupted one is then `uncertain`).
    pub fn writes(self) -> bool {
        matches!(
            self,
            Step::Set
                | Step::Delete
                | Step::ClearAll
                | Step::Acquire
                | Step::TakeOver
                | Step::Release
                | Step::Renew
        )
    }

    /// How long the step keeps trying.
    pub fn repeat(self) -> Repeat {
        match self {
            Step::Release => Repeat::UntilLeaseEnds,
            _ => Repeat::Retries,
        }
    }

    /// A query for this step (its name, read or write).
    pub fn query(self, sql: impl Into<String>) -> Query {
        if self.writes() {
            Query::write(self.name(), sql)
        } else {
            Query::read(self.name(), sql)
        }
    }
}

/// The client, the platform (clock, sleep, randomness for the backoff) and the retry policy:
/// what every step needs to be sent.
pub struct Session<'a, T: Transport, P: Platform> {
    /// The client.
    pub client: &'a Client<T>,
    /// Clock, sleep, randomness.
    pub platform: &'a P,
    /// Retries of [`Repeat::Retries`] steps.
    pub retry: RetryPolicy,
    /// The lease: how long [`Repeat::UntilLeaseEnds`] steps keep trying; a tenth of it is the
    /// longest pause between attempts.
    pub lease: Duration,
}

impl<T: Transport, P: Platform> Session<'_, T, P> {
    /// Sends a query built by [`Step::query`], repeating it as its step allows while the error
    /// is worth retrying.
    pub fn send(&self, step: Step, query: &Query) -> Result<Retried<Response>, Error> {
        self.send_unless(step, query, |_| false)
    }

    /// As [`Session::send`], but an error `stop` accepts is returned at once (e.g. a Keeper
    /// conflict that a repeat would only meet again).
    pub fn send_unless(
        &self,
        step: Step,
        query: &Query,
        stop: impl Fn(&Error) -> bool,
    ) -> Result<Retried<Response>, Error> {
        debug_assert_eq!(query.name, step.name());
        // A pause never takes more than a tenth of the lease: a renewal or a write under the
        // lock must still find the lease when the outage is over.
        let retry = RetryPolicy {
            max_backoff: self.retry.max_backoff.min(self.lease / 10),
            ..self.retry
        };
        let (policy, deadline) = match step.repeat() {
            Repeat::Retries => (retry, None),
            // The lease was set by a request sent before now, so it ends before now + lease.
            Repeat::UntilLeaseEnds => (
                RetryPolicy {
                    retries: u32::MAX,
                    ..retry
                },
                Some(self.platform.now() + self.lease),
            ),
        };
        retry::run(
            &policy,
            self.platform,
            deadline,
            || self.client.execute(query),
            |e| retry::is_worth_retrying(e.kind) && !stop(e),
        )
    }

    /// [`Session::send`], keeping only the answer.
    pub fn execute(&self, step: Step, query: &Query) -> Result<Response, Error> {
        self.send(step, query).map(|r| r.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Step; 16] = [
        Step::CreateSchema,
        Step::VerifySchema,
        Step::Get,
        Step::Ids,
        Step::GetAll,
        Step::CountRows,
        Step::Set,
        Step::Delete,
        Step::ClearAllSnapshot,
        Step::ClearAll,
        Step::Acquire,
        Step::TakeOver,
        Step::Holder,
        Step::Release,
        Step::Renew,
        Step::ConfirmRenew,
    ];

    #[test]
    fn names_are_distinct() {
        let mut names: Vec<_> = ALL.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }

    #[test]
    fn only_releases_outlast_the_retries() {
        for step in ALL {
            let want = if step == Step::Release {
                Repeat::UntilLeaseEnds
            } else {
                Repeat::Retries
            };
            assert_eq!(step.repeat(), want, "{step:?}");
        }
    }

    #[test]
    fn writes_are_classified_as_writes() {
        for step in ALL {
            let q = step.query("SELECT 1");
            assert_eq!(
                q.operation == crate::client::Operation::Write,
                step.writes(),
                "{step:?}"
            );
            assert_eq!(q.name, step.name());
        }
        assert!(Step::Acquire.writes() && !Step::Holder.writes());
    }
}
