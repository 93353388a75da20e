//! What one instance of the component may use: guest memory, time per call, and (enforced by
//! the connection pool) bytes per response and requests in flight. The embedding API takes a
//! [`Limits`] ([`crate::Runtime::with_limits`]); the CLI has a flag for each.

use std::time::{Duration, Instant};

/// Default most guest memory: 1 GiB.
pub(crate) const DEFAULT_MAX_MEMORY_BYTES: usize = 1 << 30;
/// Default most bytes read from one response: 256 MiB (room for `state export` of a large
/// store).
pub(crate) const DEFAULT_MAX_RESPONSE_BYTES: u64 = 256 << 20;
/// Default most outgoing requests in flight per instance.
pub(crate) const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 16;
/// How often the engine's epoch advances: a running call yields to other tasks and checks its
/// deadline this often.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(50);

/// Per-instance limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most linear memory the guest may grow to, in bytes; a growth past it is refused
    /// (`memory.grow` answers -1): a fallible reservation fails cleanly, anything else ends
    /// the call.
    pub max_memory_bytes: usize,
    /// Longest one call into the component may take (`None`: no limit). Past it, outgoing
    /// requests fail at once and running guest code traps: the call ends with a runner
    /// failure naming the deadline, and the instance must not be used again.
    pub call_timeout: Option<Duration>,
    /// Most bytes read from one HTTP response body; a longer answer fails the request.
    pub max_response_bytes: u64,
    /// Most outgoing requests of the instance in flight at once; more wait.
    pub max_concurrent_requests: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            call_timeout: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
        }
    }
}

/// The error a call ends with when it outlives [`Limits::call_timeout`].
#[derive(Debug, thiserror::Error)]
#[error("the call did not finish within its deadline of {:.1} s (--call-timeout-seconds); the instance was stopped", .0.as_secs_f64())]
pub struct CallDeadlineExceeded(pub Duration);

/// What a call that trapped after its memory could not grow is told (the guest could not
/// allocate: Rust's allocation-failure path aborts).
#[derive(Debug, thiserror::Error)]
#[error("the component ran out of memory: it needed more than its limit of {} MiB (--max-memory-mib, CLICKHOUSE_MAX_MEMORY_MIB)", .0 >> 20)]
pub struct MemoryLimitExceeded(pub usize);

/// The guest's memory limit. A growth past it is refused, not trapped: `memory.grow` answers
/// -1, so the guest's fallible reservations (a decoded answer, a response body) fail with a
/// clean error; the refusal is remembered, so that a trap that follows it (an infallible
/// allocation aborting) is reported as [`MemoryLimitExceeded`] rather than a bare trap.
#[derive(Debug)]
pub(crate) struct GuestMemory {
    /// Most bytes of linear memory.
    pub limit: usize,
    /// Whether a growth was refused during the current call.
    pub refused: bool,
}

impl wasmtime::ResourceLimiter for GuestMemory {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.refused = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

/// The deadline of the call in progress, if it has one.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CallDeadline {
    /// When the call must end.
    pub at: Option<Instant>,
    /// The limit it was derived from (for the message).
    pub limit: Duration,
}

impl CallDeadline {
    /// A deadline `limit` from now (none without a limit).
    pub fn starting_now(limit: Option<Duration>) -> CallDeadline {
        match limit {
            Some(limit) => CallDeadline {
                at: Some(Instant::now() + limit),
                limit,
            },
            None => CallDeadline::default(),
        }
    }

    /// Whether it has passed.
    pub fn passed(&self) -> bool {
        self.at.is_some_and(|at| Instant::now() >= at)
    }
}

/// Advances `engine`'s epoch every [`EPOCH_TICK`] on a thread of its own, until the engine is
/// dropped.
pub(crate) fn start_epoch_ticker(engine: &wasmtime::Engine) {
    let weak = engine.weak();
    let _ = std::thread::Builder::new()
        .name("clickhouse-component-epoch".into())
        .spawn(move || loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_pass_only_with_a_limit() {
        assert!(!CallDeadline::starting_now(None).passed());
        assert!(CallDeadline::starting_now(Some(Duration::ZERO)).passed());
        assert!(!CallDeadline::starting_now(Some(Duration::from_secs(60))).passed());
        let message = CallDeadlineExceeded(Duration::from_millis(1500)).to_string();
        assert!(message.contains("1.5 s"), "{message}");
    }
}
