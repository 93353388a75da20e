//! What a store last wrote or read of a few state ids, exactly as the server returns it: the
//! base an `update` computes its write from before its lock is confirmed (one query less).
//!
//! Only a hint. The write that uses it checks on the server, in the same statement as its
//! fence, that the stored state is still this one (or already the result), so a stale entry
//! costs a request, never an update: see [`super::StateStore::update`]. An id whose entry
//! turned out stale is not used again until a read under the lock shows that nobody else wrote
//! it since this store's last write (two stores taking turns on one id pay the plain path, not
//! the plain path plus a wasted write each time).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// A state as stored: `None` when the id has no row, else the texts of its two parts
/// (`partial_state`, `completed_state`; `None`: NULL).
pub type Stored = Option<[Option<String>; 2]>;

/// Ids kept (the oldest entry goes first).
const CAPACITY: usize = 16;

/// States larger than this (both parts' texts) are not kept: the write that checks them would
/// not fit in a request target with the new state (see `MAX_FENCED_URL_BYTES`).
const MAX_BYTES: usize = 16 * 1024;

struct Entry {
    id: String,
    stored: Stored,
    /// Whether `update` computes from this entry before its lock is confirmed.
    trusted: bool,
}

/// The entries of one store (a store may be shared between threads natively).
#[derive(Default)]
pub struct Known {
    entries: Mutex<VecDeque<Entry>>,
}

fn size(stored: &Stored) -> usize {
    stored
        .iter()
        .flatten()
        .flatten()
        .map(String::len)
        .sum::<usize>()
}

impl Known {
    fn entries(&self) -> MutexGuard<'_, VecDeque<Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stored state of `id` to compute an `update` from before its lock is confirmed:
    /// known, and not found stale since.
    pub fn base(&self, id: &str) -> Option<Stored> {
        let entries = self.entries();
        let entry = entries.iter().find(|e| e.id == id)?;
        entry.trusted.then(|| entry.stored.clone())
    }

    /// `id` holds `stored` now (this store wrote it, or read it): kept, trusted as before
    /// (new entries are trusted).
    pub fn record(&self, id: &str, stored: Stored) {
        self.put(id, stored, |old| old.trusted);
    }

    /// `id` holds `stored`, as read under its lock: trusted again if that is what this store
    /// knew (nobody else wrote it since), not trusted if it is not.
    pub fn record_read(&self, id: &str, stored: Stored) {
        let same = stored.clone();
        self.put(id, stored, move |old| old.stored == same);
    }

    /// Keeps `stored` for `id`, trusted as `trusted` says of the entry it replaces (new
    /// entries are trusted).
    fn put(&self, id: &str, stored: Stored, trusted: impl FnOnce(&Entry) -> bool) {
        let mut entries = self.entries();
        let trusted = match entries.iter().position(|e| e.id == id) {
            Some(i) => entries.remove(i).is_none_or(|e| trusted(&e)),
            None => true,
        };
        if size(&stored) > MAX_BYTES {
            return;
        }
        if entries.len() >= CAPACITY {
            entries.pop_front();
        }
        entries.push_back(Entry {
            id: id.to_string(),
            stored,
            trusted,
        });
    }

    /// What `id` holds is not known (a write of it failed, or it was deleted).
    pub fn forget(&self, id: &str) {
        self.entries().retain(|e| e.id != id);
    }

    /// Nothing is known (`clear-all`).
    pub fn clear(&self) {
        self.entries().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(p: &str) -> Stored {
        Some([Some(p.to_string()), None])
    }

    #[test]
    fn a_stale_entry_is_distrusted_until_a_read_under_the_lock_matches_it() {
        let known = Known::default();
        assert_eq!(known.base("a"), None);
        known.record("a", parts("1"));
        assert_eq!(known.base("a"), Some(parts("1")));
        // Someone else wrote: the read differs, distrusted; our write keeps it so.
        known.record_read("a", parts("2"));
        assert_eq!(known.base("a"), None);
        known.record("a", parts("3"));
        assert_eq!(known.base("a"), None);
        // Nobody wrote since our write: trusted again.
        known.record_read("a", parts("3"));
        assert_eq!(known.base("a"), Some(parts("3")));
        known.forget("a");
        assert_eq!(known.base("a"), None);
        known.record("b", None);
        assert_eq!(known.base("b"), Some(None));
        known.clear();
        assert_eq!(known.base("b"), None);
    }

    #[test]
    fn it_keeps_the_newest_ids_and_no_large_states() {
        let known = Known::default();
        for n in 0..=CAPACITY {
            known.record(&n.to_string(), parts("x"));
        }
        assert_eq!(known.base("0"), None);
        assert_eq!(known.base(&CAPACITY.to_string()), Some(parts("x")));
        known.record("big", parts(&"x".repeat(MAX_BYTES + 1)));
        assert_eq!(known.base("big"), None);
        // A large write replaces what was known of the id.
        known.record("1", parts(&"x".repeat(MAX_BYTES + 1)));
        assert_eq!(known.base("1"), None);
    }
}
