//! Every request the state store and its lock send, named and classified in one place, and the
//! [`Session`] that sends them with retries.
//!
//! A request is made only by [`Step::query`], which returns a [`Request`]: the query and its
//! step. [`Session::send`] is the only way to send one, and it repeats it as the step says
//! ([`Step::repeat`]), stopping at once on an answer the step names final
//! ([`Step::is_final`]); a call site only gives what the step's rule needs: whether a lost
//! answer may be repeated, which depends on whose lock a write runs under
//! ([`Request::lost_answer_is_final`]), and the end of the lease a release keeps trying until
//! ([`Request::until`]).
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

use crate::client::error_codes::{BAD_ARGUMENTS, KEEPER_EXCEPTION, NO_ZOOKEEPER};
use crate::client::retry::{self, Retried, RetryPolicy};
use crate::client::{Client, Error, ErrorKind, ExternalTable, Query, Response, Transport};
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
    /// `CREATE ... IF NOT EXISTS` of the KeeperMap lock table: a server without KeeperMap (or
    /// without Keeper) says so at once. Logged as `create-schema`, as the other DDL.
    CreateKeeperMapTable,
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
    /// Merge-tree: the `acquire` row that makes a contender, never repeated with its token.
    Acquire,
    /// Keeper-map: the creation of the id's row (once per id, ever), whose repeat fails with
    /// "node exists" and the next read decides. Logged as `lock`, as the merge-tree claim.
    CreateLockRow,
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
            Step::CreateSchema | Step::CreateKeeperMapTable => "create-schema",
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
            Step::Acquire | Step::CreateLockRow => "lock",
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
                | Step::CreateLockRow
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

    /// Whether `e` is an answer that ends the step's repeats at once, whatever its kind: one a
    /// repeat would only meet again, whose meaning the caller reads. Keeper's "the key exists"
    /// for the creation of a lock row (someone created it: the next read decides); a
    /// strict-mode conflict for the conditional updates of a KeeperMap row (someone changed
    /// it); a server without KeeperMap, or without Keeper, for the KeeperMap table's DDL (the
    /// configuration will not change between attempts; the `auto` lock engine then falls back
    /// at once). Other DDL is repeated on the same errors: on a cluster a Replicated table's
    /// `NO_ZOOKEEPER` can be a Keeper reconnecting.
    pub fn is_final(self, e: &Error) -> bool {
        match self {
            Step::CreateLockRow => is_node_exists(e),
            Step::TakeOver | Step::Renew | Step::Release => is_conflict(e),
            Step::CreateKeeperMapTable => is_keeper_map_disabled(e),
            _ => false,
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

    /// A request of this step (its name, read or write). The reads whose answer grows with the
    /// store (`ids`, `get-all`: listing and exporting every state) ask for it compressed.
    pub fn query(self, sql: impl Into<String>) -> Request {
        let query = match self {
            Step::Ids | Step::GetAll => Query::read(self.name(), sql).compressed_answer(),
            _ if self.writes() => Query::write(self.name(), sql),
            _ => Query::read(self.name(), sql),
        };
        Request {
            step: self,
            query,
            lost_answer_is_final: false,
            until: None,
        }
    }
}

/// Whether an error is Keeper's "the key exists" (a strict insert lost the race).
pub fn is_node_exists(e: &Error) -> bool {
    e.server
        .as_ref()
        .is_some_and(|s| s.code == KEEPER_EXCEPTION)
        && e.message.contains("Node exists")
}

/// Whether an error is a strict-mode conflict (someone changed the KeeperMap row meanwhile).
pub fn is_conflict(e: &Error) -> bool {
    e.server
        .as_ref()
        .is_some_and(|s| s.code == KEEPER_EXCEPTION)
        && (e.message.contains("Bad version") || e.message.contains("No node"))
}

/// The server refuses KeeperMap tables (no `keeper_map_path_prefix`, or no Keeper at all).
pub fn is_keeper_map_disabled(e: &Error) -> bool {
    e.server
        .as_ref()
        .is_some_and(|s| s.code == BAD_ARGUMENTS || s.code == NO_ZOOKEEPER)
        && (e.message.contains("KeeperMap is disabled")
            || e.message.contains("keeper_map_path_prefix")
            || e.message.contains("ZooKeeper"))
}

/// One request: a query and its step, made by [`Step::query`] and sent by [`Session::send`],
/// which repeats it as the step says. The query is built through the methods below, which
/// keep the step.
#[derive(Clone, Debug)]
#[must_use = "a request does nothing until a session sends it"]
pub struct Request {
    step: Step,
    query: Query,
    lost_answer_is_final: bool,
    until: Option<Duration>,
}

impl Request {
    /// Its step.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Its query.
    pub fn query(&self) -> &Query {
        &self.query
    }

    /// With a typed parameter ([`Query::param`]).
    pub fn param(self, name: &str, value: impl Into<String>) -> Self {
        self.map(|q| q.param(name, value))
    }

    /// With a setting ([`Query::setting`]).
    pub fn setting(self, name: &str, value: impl Into<String>) -> Self {
        self.map(|q| q.setting(name, value))
    }

    /// With an output format ([`Query::format`]).
    pub fn format(self, format: &str) -> Self {
        self.map(|q| q.format(format))
    }

    /// With INSERT data ([`Query::data`]).
    pub fn data(self, data: Vec<u8>) -> Self {
        self.map(|q| q.data(data))
    }

    /// With an external table ([`Query::external`]).
    pub fn external(self, table: ExternalTable) -> Self {
        self.map(|q| q.external(table))
    }

    fn map(mut self, f: impl FnOnce(Query) -> Query) -> Self {
        self.query = f(self.query);
        self
    }

    /// If `yes`, an attempt whose answer was lost (`uncertain`) is not repeated, whatever the
    /// step allows: for a write whose first attempt could land late, after a later write of
    /// the same caller, and undo it (an unfenced `set`; a write under a lock the caller keeps
    /// across writes). Under the call's own lock, released when it returns, a late attempt is
    /// fenced out by then, and the answer may be repeated.
    pub fn lost_answer_is_final(mut self, yes: bool) -> Self {
        self.lost_answer_is_final = yes;
        self
    }

    /// For a [`Repeat::UntilLeaseEnds`] step: the end of the lease (platform time), after
    /// which no attempt starts. Without it, a lease from when it is sent.
    pub fn until(mut self, lease_ends: Duration) -> Self {
        debug_assert_eq!(self.step.repeat(), Repeat::UntilLeaseEnds);
        self.until = Some(lease_ends);
        self
    }

    /// Whether a failed attempt is repeated (within the step's bounds).
    fn worth_repeating(&self, e: &Error) -> bool {
        retry::is_worth_retrying(e.kind)
            && !self.step.is_final(e)
            && !(self.lost_answer_is_final && e.kind == ErrorKind::Uncertain)
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

    /// Sends `request`, repeating it as its step says ([`Step::repeat`]) while the error is
    /// worth retrying and not final ([`Step::is_final`], [`Request::lost_answer_is_final`]):
    /// up to the store's retries; never, for a step repeated only with a new token; or
    /// whatever the retries, until the next attempt would start after the end of the lease.
    pub fn send(&self, request: &Request) -> Result<Retried<Response>, Error> {
        let (policy, until) = match request.step.repeat() {
            Repeat::Retries => (self.policy(), None),
            Repeat::WithNewToken => (
                RetryPolicy {
                    retries: 0,
                    ..self.policy()
                },
                None,
            ),
            Repeat::UntilLeaseEnds => (
                RetryPolicy {
                    retries: u32::MAX,
                    ..self.policy()
                },
                Some(
                    request
                        .until
                        .unwrap_or_else(|| self.platform.now() + self.lease),
                ),
            ),
        };
        let query = self.consistent(request.step, &request.query);
        retry::run(
            &policy,
            self.platform,
            until,
            || self.client.execute(&query),
            |e| request.worth_repeating(e),
        )
    }

    /// [`Session::send`], keeping only the answer.
    pub fn execute(&self, request: &Request) -> Result<Response, Error> {
        self.send(request).map(|r| r.value)
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
        CreateKeeperMapTable,
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
        CreateLockRow,
        TakeOver,
        Holder,
        Release,
        Renew,
        ConfirmRenew,
    );

    #[test]
    fn names_are_distinct() {
        // The two engines' claims are logged alike (`lock`): no store sends both; and the
        // KeeperMap table's DDL as the other DDL.
        let alike = [Step::CreateLockRow, Step::CreateKeeperMapTable];
        let mut names: Vec<_> = ALL
            .iter()
            .filter(|s| !alike.contains(s))
            .map(|s| s.name())
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len() - alike.len());
        assert_eq!(Step::CreateLockRow.name(), Step::Acquire.name());
        assert_eq!(Step::CreateKeeperMapTable.name(), Step::CreateSchema.name());
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
                Step::CreateKeeperMapTable,
                Step::VerifySchema,
                Step::Acquire,
                Step::CreateLockRow,
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

    mod sending {
        use super::*;
        use crate::client::error::TransportFailure;
        use crate::client::testing::{fail, server_error, written, Scripted};
        use crate::client::{ConnectionOptions, HttpResponse};
        use crate::platform::testing::FakePlatform;

        /// Sends `request` with 2 retries and a lease of 10 s through a transport that answers
        /// `answers` in turn; the result and the number of requests sent.
        fn send(
            request: Request,
            answers: Vec<Result<HttpResponse, crate::client::error::TransportError>>,
        ) -> (Result<Retried<Response>, Error>, usize) {
            let t = Scripted::new(answers);
            let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
            let platform = FakePlatform::default();
            let session = Session {
                client: &client,
                platform: &platform,
                retry: RetryPolicy::new(2),
                lease: Duration::from_secs(10),
                replication: Replication::None,
            };
            let result = session.send(&request);
            let sent = t.sent.borrow().len();
            (result, sent)
        }

        fn failures(
            n: usize,
            failure: TransportFailure,
        ) -> Vec<Result<HttpResponse, crate::client::error::TransportError>> {
            (0..n).map(|_| fail(failure.clone())).collect()
        }

        #[test]
        fn a_step_is_repeated_as_its_repeat_says() {
            // Retries: up to the store's retries (2), then the error.
            let (result, sent) = send(
                Step::Set.query("INSERT"),
                failures(5, TransportFailure::Refused),
            );
            assert_eq!(
                (result.unwrap_err().kind, sent),
                (ErrorKind::Disconnected, 3)
            );
            // With a new token only: sent once.
            let (result, sent) = send(
                Step::Acquire.query("INSERT"),
                failures(5, TransportFailure::Refused),
            );
            assert_eq!((result.is_err(), sent), (true, 1));
            // Until the lease ends: past the retries, and stops once the lease is over (pauses
            // are at most a tenth of the 10 s lease).
            let mut answers = failures(6, TransportFailure::Refused);
            answers.push(written(1));
            let (result, sent) = send(Step::Release.query("INSERT"), answers);
            assert_eq!((result.unwrap().retries, sent), (6, 7));
            let (result, sent) = send(
                Step::Release
                    .query("INSERT")
                    .until(Duration::from_millis(1)),
                failures(5, TransportFailure::Refused),
            );
            assert_eq!((result.is_err(), sent), (true, 1));
            let (result, sent) = send(
                Step::Release.query("INSERT"),
                failures(500, TransportFailure::Refused),
            );
            assert!(result.is_err());
            assert!(
                (11..500).contains(&sent),
                "{sent} attempts within the lease"
            );
        }

        #[test]
        fn final_answers_end_the_repeats() {
            let node_exists = || server_error(KEEPER_EXCEPTION, "Node exists");
            let (result, sent) = send(Step::CreateLockRow.query("INSERT"), vec![node_exists()]);
            assert!(is_node_exists(&result.unwrap_err()));
            assert_eq!(sent, 1);
            // The same answer to a step it is not final for is repeated (Keeper errors are
            // transient).
            let (result, sent) = send(
                Step::Set.query("INSERT"),
                vec![node_exists(), node_exists(), written(1)],
            );
            assert_eq!((result.is_ok(), sent), (true, 3));
            let conflict = || server_error(KEEPER_EXCEPTION, "Bad version");
            for step in [Step::TakeOver, Step::Renew, Step::Release] {
                let (result, sent) = send(step.query("ALTER"), vec![conflict()]);
                assert!(is_conflict(&result.unwrap_err()), "{step:?}");
                assert_eq!(sent, 1, "{step:?}");
            }
            let no_keeper = || server_error(NO_ZOOKEEPER, "Cannot get ZooKeeper");
            let (result, sent) = send(
                Step::CreateKeeperMapTable.query("CREATE"),
                vec![no_keeper()],
            );
            assert!(is_keeper_map_disabled(&result.unwrap_err()));
            assert_eq!(sent, 1);
            // Other DDL: repeated (a Replicated table's Keeper may be reconnecting).
            let (result, sent) = send(
                Step::CreateSchema.query("CREATE"),
                vec![no_keeper(), written(0)],
            );
            assert_eq!((result.is_ok(), sent), (true, 2));
        }

        #[test]
        fn a_lost_answer_ends_the_repeats_where_the_request_says_so() {
            let lost = || failures(1, TransportFailure::Timeout).remove(0);
            let (result, sent) = send(Step::Set.query("INSERT"), vec![lost(), written(1)]);
            assert_eq!((result.unwrap().after_uncertain, sent), (true, 2));
            let (result, sent) = send(
                Step::Set.query("INSERT").lost_answer_is_final(true),
                vec![lost(), written(1)],
            );
            assert_eq!((result.unwrap_err().kind, sent), (ErrorKind::Uncertain, 1));
            // Nothing reached the server: repeated all the same.
            let (result, sent) = send(
                Step::Set.query("INSERT").lost_answer_is_final(true),
                vec![fail(TransportFailure::Refused), written(1)],
            );
            assert_eq!((result.is_ok(), sent), (true, 2));
        }
    }

    #[test]
    fn writes_are_classified_as_writes() {
        for &step in ALL {
            let request = step.query("SELECT 1");
            assert_eq!(request.step(), step);
            let q = request.query();
            assert_eq!(
                q.operation == crate::client::error::Operation::Write,
                step.writes(),
                "{step:?}"
            );
            assert_eq!(q.name, step.name());
        }
        assert!(Step::Acquire.writes() && !Step::Holder.writes());
    }
}
