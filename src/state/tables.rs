//! The store's tables and the lock engine in use, as every module of the store is given them.
//! Uses no other module of the store.

use crate::client::Error;

/// Names of the store's tables, and the lock engine in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    /// Database.
    pub database: String,
    /// State table.
    pub state: String,
    /// Lock table.
    pub lock: String,
    /// The lock table's engine.
    pub lock_engine: LockEngine,
    /// How the state table is replicated (its engine, read at open).
    pub replication: Replication,
}

/// How the state table is replicated, read from its engine at open; decides the consistency
/// settings its statements carry ([`super::steps::Session`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Replication {
    /// A plain ReplacingMergeTree on one server: every statement sees every acknowledged write.
    #[default]
    None,
    /// ReplicatedReplacingMergeTree (self-managed clusters, Replicated databases): writes are
    /// quorum inserts, reads ask for sequential consistency.
    Replicated,
    /// SharedReplacingMergeTree (ClickHouse Cloud): reads ask for sequential consistency.
    Shared,
}

impl Replication {
    /// The replication of a table with this `engine_full` (as `system.tables` prints it).
    pub fn of_engine(engine_full: &str) -> Replication {
        if engine_full.starts_with("Replicated") {
            Replication::Replicated
        } else if engine_full.starts_with("Shared") {
            Replication::Shared
        } else {
            Replication::None
        }
    }
}

/// The lock implementation a store uses (decided at open, see [`LockEngineChoice`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockEngine {
    /// The commit-order lock on a plain MergeTree ([`super::lock::merge_tree`]): one server
    /// only.
    MergeTree,
    /// The Keeper-backed lock on a KeeperMap table ([`super::lock::keeper_map`]): clusters and
    /// Cloud.
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
                crate::text::escaped(other)
            ))),
        }
    }
}
