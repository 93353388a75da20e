//! The planted bugs (docs/verification.md): one function per fault point. Each
//! `planted-bug-*` cargo feature turns one of them into its bug; off (every build but
//! `scripts/planted-bugs`' one per feature), each returns what the protocol passes it and
//! compiles away. The protocol calls the fault point and has no `cfg` of its own, so the code
//! read when following an operation is the code that runs.

use serde_json::Value;

use crate::client::Error;

/// The fence condition writes under a lock carry. `planted-bug-no-fence`: none (`1 = 1`).
pub fn fence_condition(holds: &'static str) -> &'static str {
    if cfg!(feature = "planted-bug-no-fence") {
        "1 = 1"
    } else {
        holds
    }
}

/// What a merge-tree renewal requires. `planted-bug-renew-ignores-expiry`: only that the token
/// was not released, so a renewal after the lease ended brings the token back.
pub const fn renew_condition(holds: &'static str) -> &'static str {
    if cfg!(feature = "planted-bug-renew-ignores-expiry") {
        "(SELECT countIf(kind = 'release') FROM {db:Identifier}.{lt:Identifier}
            WHERE state_id = {id:String} AND token = {token:String}) = 0 AND {margin_ms:UInt64} >= 0"
    } else {
        holds
    }
}

/// The `WITH` clause and the condition of `update`'s write ahead that it is still based on the
/// stored state. `planted-bug-write-ahead-unchecked`: no check (the base's parameters are still
/// used, so the statement binds the same parameters).
pub fn write_ahead_check(
    with: &'static str,
    unchanged: &'static str,
) -> (&'static str, &'static str) {
    if cfg!(feature = "planted-bug-write-ahead-unchecked") {
        (
            "",
            " AND {b_row:UInt8} + {b_pn:UInt8} + {b_cn:UInt8} + length({b_p:String} || {b_c:String}) >= 0",
        )
    } else {
        (with, unchanged)
    }
}

/// `update`'s read of the stored state before it takes the lock: `None` (no such read) but
/// with `planted-bug-update-reads-outside-lock`, which reads it now with `read` (in the form
/// the lock's confirming query returns it) and merges into that instead of what the lock's
/// query read.
pub fn read_before_lock(
    read: impl FnOnce() -> Result<Option<Value>, Error>,
) -> Result<Option<Option<Value>>, Error> {
    if cfg!(feature = "planted-bug-update-reads-outside-lock") {
        read().map(Some)
    } else {
        Ok(None)
    }
}
