//! The advisory lock on a state id, and the dispatch between its two engines: the commit-order
//! lock on a plain MergeTree ([`merge_tree`], one server) and the Keeper-backed lock on a
//! KeeperMap table ([`keeper_map`], clusters and Cloud); what both share is in [`common`].
//!
//! Imports go one way: this module uses `merge_tree`, `keeper_map` and `common`; `merge_tree`
//! and `keeper_map` use `common` (never each other or this module); all of them use only
//! `state::{ids, tables, steps}`, which use no other module of the store; `state` and `schema`
//! (for the KeeperMap table's DDL) use the lock, never the other way.

pub mod common;
pub mod keeper_map;
pub mod merge_tree;

use serde_json::Value;

use crate::client::{Error, Transport};
use crate::platform::Platform;
use crate::state::steps::Session;
use crate::state::tables::Tables;

pub(crate) use crate::state::ids::shorten;
pub use crate::state::tables::LockEngine;
pub use common::{
    execute_fenced, fence, write_settings, Acquired, AlsoRead, First, LockHandle, LockOptions,
    Tried, MAX_STALE_AFTER,
};

/// The fence condition of the store's lock engine ([`merge_tree::HOLDS`] or
/// [`keeper_map::HOLDS`]).
pub fn holds(tables: &Tables) -> &'static str {
    crate::state::planted::fence_condition(match tables.lock_engine {
        LockEngine::MergeTree => merge_tree::HOLDS,
        LockEngine::KeeperMap => keeper_map::HOLDS,
    })
}

/// The token that holds the lock on `id` now, if any (for the integration tests).
#[cfg(feature = "test-util")]
pub fn holder<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
) -> Result<Option<String>, Error> {
    let winner = match tables.lock_engine {
        LockEngine::MergeTree => merge_tree::WINNER,
        LockEngine::KeeperMap => keeper_map::WINNER,
    };
    Ok(common::holder_and(s, tables, id, winner, None)?.0)
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
    acquire_trying(s, tables, id, options, also, None).map(|a| (a.handle, a.read))
}

/// [`acquire_and_read`], trying the write `first` right after the lock's first claim, before
/// the claim is confirmed: fenced by the contender's handle, it lands only if the claim made
/// this contender the holder, and then it is the confirmation (one query less: nothing is
/// read). Otherwise the claim is confirmed as usual and `also` read. `first` is tried once.
///
/// As [`acquire_and_read`] on failure, with one exception: when the answer to `first` was
/// lost and this contender turns out not to hold the lock, the error is `uncertain` (the write
/// may have landed while it held it).
pub fn acquire_trying<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    id: &str,
    options: &LockOptions,
    also: Option<&AlsoRead>,
    first: Option<First<'_>>,
) -> Result<Acquired, Error> {
    match tables.lock_engine {
        LockEngine::MergeTree => merge_tree::acquire_trying(s, tables, id, options, also, first),
        LockEngine::KeeperMap => keeper_map::acquire_trying(s, tables, id, options, also, first),
    }
}

/// Releases a held lock (idempotent: releasing twice is harmless), repeating the release until
/// it lands or the lease has certainly ended.
pub fn release<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    handle: &LockHandle,
) -> Result<(), Error> {
    match tables.lock_engine {
        LockEngine::MergeTree => merge_tree::release(s, tables, handle),
        LockEngine::KeeperMap => keeper_map::release(s, tables, handle),
    }
}

/// Extends the lease of a held lock by a full stale window, only while the token holds with at
/// least the fence margin of its lease left; `locked` otherwise (released, lease over or about
/// to be, or taken by someone else). A renewal never brings an ended lease back.
pub fn renew<T: Transport, P: Platform>(
    s: &Session<'_, T, P>,
    tables: &Tables,
    handle: &LockHandle,
    options: &LockOptions,
) -> Result<(), Error> {
    match tables.lock_engine {
        LockEngine::MergeTree => merge_tree::renew(s, tables, handle, options),
        LockEngine::KeeperMap => keeper_map::renew(s, tables, handle, options),
    }
}
