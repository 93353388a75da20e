//! Every request the state store and its lock send, named and classified in one place, and the
//! [`Session`] that sends them with retries.
//!
//! Each request can be repeated, in the way its [`Repeat`] says: reads; DDL with `IF NOT
//! EXISTS`; writes that carry the same values and the same lock token on every attempt, so a
//! repeat either finds its work done or does it (a release or withdrawal of a token is final;
//! a renewal or a fenced write only applies while the token holds). Two exceptions: the
//! merge-tree acquire row is never repeated with the same token (a repeat landing after the
//! first row's lease ended would revive the token at its old place, ahead of a holder that came
//! meanwhile): the lock withdraws it and tries again with a new token; and a write whose answer
//! was lost is not repeated where a late-landing first attempt could overwrite a later write of
//! the same caller (an unfenced `set`, writes through a held lock): those surface `uncertain`.
//! A fenced write that is fenced out after an attempt whose answer was lost is `uncertain`, not
//! `locked` (the lost attempt may have landed).

use std::borrow::Cow;
use std::time::Duration;

use crate::client::retry::{self, Retried, RetryPolicy};
use crate::client::{Client, Error, Query, Response, Transport};
use crate::platform::Platform;

use super::tables::Replication;

/// How a step is repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// Up to the store's retries (`retries`, default [`retry::DEFAULT_RETRIES`]).
    Retries,
    /// Never as the same request: the lock withdraws the row and tries again with a new token
    /// (up to the store's retries).
    WithNewToken,
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
    /// `update`'s fenced write computed before the lock was confirmed: written only if the
    /// stored state is the one it was computed from, or already its result (so a repeat
    /// writes the same row again).
    SetUnlessChanged,
    /// A fenced lightweight DELETE of one id: a repeat deletes nothing more.
    Delete,
    /// The snapshot of `clear-all` (count and newest `updated_at`).
    ClearAllSnapshot,
    /// `clear-all`'s DELETE up to the snapshot: the same bound on repeat.
    ClearAll,
    /// The row that makes a contender (merge-tree: an `acquire` row, never repeated with its
    /// token; keeper-map: the creation of the id's row, whose repeat fails with "node exists"
    /// and the next read decides).
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
            Step::SetUnlessChanged => "set-unless-changed",
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
                | Step::SetUnlessChanged
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
            Step::Acquire => Repeat::WithNewToken,
            _ => Repeat::Retries,
        }
    }

    /// The settings this step's statement carries on a state table replicated so, after the
    /// connection's (they override a caller's value of the same setting):
    /// - every read of the state table (and the lock's holder query, which reads the stored
    ///   state for `update`) asks for `select_sequential_consistency = 1`: on
    ///   ReplicatedMergeTree a replica that lacks the last quorum write refuses the read
    ///   (REPLICA_IS_NOT_IN_QUORUM, transient: retried) instead of answering stale; on
    ///   SharedMergeTree the replica syncs its parts with Keeper before reading;
    /// - on ReplicatedMergeTree, every INSERT into the state table is a quorum insert of a
    ///   majority (`insert_quorum = 'auto'`) in sequence (`insert_quorum_parallel = 0`, which
    ///   sequential consistency needs); SharedMergeTree inserts are acknowledged once in shared
    ///   storage and Keeper, and take no quorum setting;
    /// - `update`'s write computed before its lock was confirmed reads the stored state in
    ///   its condition: it is both;
    /// - deletes wait for every replica (`lightweight_deletes_sync = 2`, the server default,
    ///   which a profile may have changed).
    ///
    /// A single server's plain table needs none of them.
    pub fn consistency(self, replication: Replication) -> &'static [(&'static str, &'static str)] {
        const READ: &[(&str, &str)] = &[("select_sequential_consistency", "1")];
        const QUORUM: &[(&str, &str)] =
            &[("insert_quorum", "auto"), ("insert_quorum_parallel", "0")];
        const DELETE: &[(&str, &str)] = &[("lightweight_deletes_sync", "2")];
        const READ_AND_QUORUM: &[(&str, &str)] = &[
            ("select_sequential_consistency", "1"),
            ("insert_quorum", "auto"),
            ("insert_quorum_parallel", "0"),
        ];
        match (replication, self) {
            (Replication::None, _) => &[],
            (
                _,
                Step::Get
                | Step::Ids
                | Step::GetAll
                | Step::CountRows
                | Step::ClearAllSnapshot
                | Step::Holder,
            ) => READ,
            (Replication::Replicated, Step::Set) => QUORUM,
            (Replication::Replicated, Step::SetUnlessChanged) => READ_AND_QUORUM,
            (_, Step::SetUnlessChanged) => READ,
            (_, Step::Delete | Step::ClearAll) => DELETE,
            _ => &[],
        }
    }

    /// A query for this step (its name, read or write). The reads whose answer grows with the
    /// store (`ids`, `get-all`: listing and exporting every state) ask for it compressed.
    pub fn query(self, sql: impl Into<String>) -> Query {
        match self {
            Step::Ids | Step::GetAll => Query::read(self.name(), sql).compressed_answer(),
            _ if self.writes() => Query::write(self.name(), sql),
            _ => Query::read(self.name(), sql),
        }
    }
}

/// The client, the platform (clock, sleep, randomness for the backoff), the retry policy and
/// the state table's replication: what every step needs to be sent.
pub struct Session<'a, T: Transport, P: Platform> {
    /// The client.
    pub client: &'a Client<T>,
    /// Clock, sleep, randomness.
    pub platform: &'a P,
    /// Retries of [`Repeat::Retries`] steps.
    pub retry: RetryPolicy,
    /// The lease (a tenth of it is the longest pause between attempts; a release whose
    /// handle does not know its lease end keeps trying this long).
    pub lease: Duration,
    /// How the state table is replicated: each step's statement gets its
    /// [`Step::consistency`] settings.
    pub replication: Replication,
}

impl<T: Transport, P: Platform> Session<'_, T, P> {
    /// `query` with the consistency settings of `step` on this store's state table (the same
    /// query, not a copy, where there are none).
    fn consistent<'q>(&self, step: Step, query: &'q Query) -> Cow<'q, Query> {
        let settings = step.consistency(self.replication);
        if settings.is_empty() {
            return Cow::Borrowed(query);
        }
        let mut query = query.clone();
        for (name, value) in settings {
            query = query.setting(name, *value);
        }
        Cow::Owned(query)
    }

    /// The store's policy, its pauses never longer than a tenth of the lease (a renewal or a
    /// write under the lock must still find the lease when an outage is over).
    fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_backoff: self.retry.max_backoff.min(self.lease / 10),
            ..self.retry
        }
    }

    /// Sends a query built by [`Step::query`], repeating it up to the store's retries while
    /// the error is worth retrying.
    pub fn send(&self, step: Step, query: &Query) -> Result<Retried<Response>, Error> {
        self.send_unless(step, query, |_| false)
    }

    /// As [`Session::send`], but an error `stop` accepts is returned at once (e.g. a Keeper
    /// conflict that a repeat would only meet again, or a lost answer that must not be
    /// repeated).
    pub fn send_unless(
        &self,
        step: Step,
        query: &Query,
        stop: impl Fn(&Error) -> bool,
    ) -> Result<Retried<Response>, Error> {
        debug_assert_eq!(query.name, step.name());
        let query = self.consistent(step, query);
        retry::run(
            &self.policy(),
            self.platform,
            None,
            || self.client.execute(&query),
            |e| retry::is_worth_retrying(e.kind) && !stop(e),
        )
    }

    /// Sends it once (the caller decides what a failure means).
    pub fn send_once(&self, step: Step, query: &Query) -> Result<Response, Error> {
        debug_assert_eq!(query.name, step.name());
        self.client.execute(&self.consistent(step, query))
    }

    /// Sends it, repeating it whatever the store's retries say until it succeeds, `stop`
    /// accepts the error, or the next attempt would start after `until` (platform time: the
    /// end of a lease).
    pub fn send_until(
        &self,
        step: Step,
        query: &Query,
        until: Duration,
        stop: impl Fn(&Error) -> bool,
    ) -> Result<Retried<Response>, Error> {
        debug_assert_eq!(query.name, step.name());
        let policy = RetryPolicy {
            retries: u32::MAX,
            ..self.policy()
        };
        let query = self.consistent(step, query);
        retry::run(
            &policy,
            self.platform,
            Some(until),
            || self.client.execute(&query),
            |e| retry::is_worth_retrying(e.kind) && !stop(e),
        )
    }

    /// [`Session::send`], keeping only the answer.
    pub fn execute(&self, step: Step, query: &Query) -> Result<Response, Error> {
        self.send(step, query).map(|r| r.value)
    }

    /// Pauses before retry number `retry` of a step the caller repeats itself; `false` (and no
    /// pause) if the pause would end after `deadline` (platform time).
    pub fn pause(&self, retry: u32, deadline: Duration) -> bool {
        let pause = self.policy().backoff(retry, self.platform.random_u64());
        if self.platform.now() + pause >= deadline {
            return false;
        }
        self.platform.sleep(pause);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lists every step as `ALL`; the match over exactly the listed steps does not compile
    /// when a variant is missing, so the list cannot go stale.
    macro_rules! every_step {
        ($($step:ident),* $(,)?) => {
            const ALL: &[Step] = &[$(Step::$step),*];
            #[allow(dead_code)]
            fn listed(step: Step) {
                match step {
                    $(Step::$step)|* => {}
                }
            }
        };
    }
    every_step!(
        CreateSchema,
        VerifySchema,
        Get,
        Ids,
        GetAll,
        CountRows,
        Set,
        SetUnlessChanged,
        Delete,
        ClearAllSnapshot,
        ClearAll,
        Acquire,
        TakeOver,
        Holder,
        Release,
        Renew,
        ConfirmRenew,
    );

    #[test]
    fn names_are_distinct() {
        let mut names: Vec<_> = ALL.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }

    #[test]
    fn releases_outlast_the_retries_and_acquires_change_token() {
        assert_eq!(Step::Release.repeat(), Repeat::UntilLeaseEnds);
        assert_eq!(Step::Acquire.repeat(), Repeat::WithNewToken);
        let retried = ALL.iter().filter(|s| s.repeat() == Repeat::Retries).count();
        assert_eq!(retried, ALL.len() - 2);
    }

    #[test]
    fn consistency_settings_follow_the_state_tables_replication() {
        let settings = |r, step: Step| step.consistency(r).to_vec();
        for &step in ALL {
            assert!(settings(Replication::None, step).is_empty(), "{step:?}");
        }
        for r in [Replication::Replicated, Replication::Shared] {
            for step in [
                Step::Get,
                Step::Ids,
                Step::GetAll,
                Step::CountRows,
                Step::ClearAllSnapshot,
                Step::Holder,
            ] {
                assert_eq!(
                    settings(r, step),
                    [("select_sequential_consistency", "1")],
                    "{step:?}"
                );
            }
            for step in [Step::Delete, Step::ClearAll] {
                assert_eq!(
                    settings(r, step),
                    [("lightweight_deletes_sync", "2")],
                    "{step:?}"
                );
            }
            // The lock's own rows live in KeeperMap (or a plain MergeTree): no setting.
            for step in [
                Step::CreateSchema,
                Step::VerifySchema,
                Step::Acquire,
                Step::TakeOver,
                Step::Release,
                Step::Renew,
                Step::ConfirmRenew,
            ] {
                assert!(settings(r, step).is_empty(), "{step:?}");
            }
        }
        assert_eq!(
            settings(Replication::Replicated, Step::Set),
            [("insert_quorum", "auto"), ("insert_quorum_parallel", "0")]
        );
        assert!(settings(Replication::Shared, Step::Set).is_empty());
        // update's conditional write reads the stored state in its INSERT ... SELECT: the
        // read asks for sequential consistency on both engines, the quorum only on Replicated.
        assert_eq!(
            settings(Replication::Replicated, Step::SetUnlessChanged),
            [
                ("select_sequential_consistency", "1"),
                ("insert_quorum", "auto"),
                ("insert_quorum_parallel", "0")
            ]
        );
        assert_eq!(
            settings(Replication::Shared, Step::SetUnlessChanged),
            [("select_sequential_consistency", "1")]
        );
        assert_eq!(
            Replication::of_engine(
                "ReplicatedReplacingMergeTree('/p', 'r', updated_at) ORDER BY state_id"
            ),
            Replication::Replicated
        );
        assert_eq!(
            Replication::of_engine(
                "SharedReplacingMergeTree('/p', 'r', updated_at) ORDER BY state_id"
            ),
            Replication::Shared
        );
        assert_eq!(
            Replication::of_engine("ReplacingMergeTree(updated_at) ORDER BY state_id"),
            Replication::None
        );
    }

    #[test]
    fn writes_are_classified_as_writes() {
        for &step in ALL {
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
