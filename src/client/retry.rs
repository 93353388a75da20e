//! Repeating a request that is safe to repeat: the policy (how often, how long to wait between
//! attempts) and the loop. Which requests are safe to repeat is the caller's knowledge (the
//! state store lists its requests in `state::steps`); this module only repeats what it is
//! given, and keeps track of what the failed attempts may have done.

use std::time::Duration;

use super::error::{Error, ErrorKind};
use crate::platform::Platform;

/// Default number of retries of a state-store request.
pub const DEFAULT_RETRIES: u32 = 5;
/// Pause before the first retry (doubled for each further one).
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How often a failed request is repeated, and how long to wait in between: capped exponential
/// backoff with "equal jitter" (half of each pause fixed, half random), so contenders that
/// failed together do not retry together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after the first (0: never repeat).
    pub retries: u32,
    /// Pause before the first retry.
    pub initial_backoff: Duration,
    /// Longest pause.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::new(DEFAULT_RETRIES)
    }
}

impl RetryPolicy {
    /// `retries` retries with the default backoff.
    pub fn new(retries: u32) -> Self {
        RetryPolicy {
            retries,
            initial_backoff: INITIAL_BACKOFF,
            max_backoff: MAX_BACKOFF,
        }
    }

    /// The pause before retry number `retry` (1-based): [`backoff`] from this policy's
    /// initial pause up to its longest.
    pub fn backoff(&self, retry: u32, random: u64) -> Duration {
        backoff(self.initial_backoff, self.max_backoff, retry, random)
    }
}

/// The one pause schedule of the component and the host (request retries, waits for a lock,
/// lease renewals): before attempt number `attempt` (1-based) after a failure, `initial *
/// 2^(attempt-1)` capped at `max`, of which the upper half is scaled by `random` (any value:
/// "equal jitter", so contenders that failed together do not retry together, and no pause is
/// under half its step). `initial == max` gives a constant interval, jittered alike.
pub fn backoff(initial: Duration, max: Duration, attempt: u32, random: u64) -> Duration {
    let doubling = attempt.saturating_sub(1).min(30);
    let full = initial.saturating_mul(1u32 << doubling).min(max);
    let half = full / 2;
    let jitter_ns = u64::try_from((full - half).as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(if jitter_ns == 0 {
        0
    } else {
        random % (jitter_ns + 1)
    })
}

/// Whether an error of this kind may go away when the same request is repeated unchanged:
/// nothing reached the server (`disconnected`), the server or the link failed on the way
/// (`transient`, `uncertain`), or it asked to slow down (`throttled`). Never `invalid-input`,
/// `misconfigured`, `permanent`, `locked` or `not-found`.
pub fn is_worth_retrying(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Disconnected
            | ErrorKind::Transient
            | ErrorKind::Uncertain
            | ErrorKind::Throttled
    )
}

/// A success after some retries.
#[derive(Debug)]
pub struct Retried<R> {
    /// What the successful attempt returned.
    pub value: R,
    /// Attempts before it that failed.
    pub retries: u32,
    /// Whether a failed attempt's outcome was unknown (`uncertain`): it may have been applied
    /// before the successful one.
    pub after_uncertain: bool,
}

/// Runs `attempt` until it succeeds, fails with an error `retry_if` declines, runs out of
/// `policy.retries`, or the next pause would end after `deadline` (platform time; `None`: no
/// deadline). A failure after an attempt whose outcome was unknown is `uncertain` whatever its
/// own kind (an earlier attempt may have been applied), with the server error of the last one.
pub fn run<R, P: Platform>(
    policy: &RetryPolicy,
    platform: &P,
    deadline: Option<Duration>,
    mut attempt: impl FnMut() -> Result<R, Error>,
    retry_if: impl Fn(&Error) -> bool,
) -> Result<Retried<R>, Error> {
    let mut retries = 0;
    let mut after_uncertain = false;
    loop {
        let error = match attempt() {
            Ok(value) => {
                return Ok(Retried {
                    value,
                    retries,
                    after_uncertain,
                })
            }
            Err(e) => e,
        };
        let may_retry = retries < policy.retries && retry_if(&error);
        let pause = policy.backoff(retries + 1, platform.random_u64());
        let in_time = deadline.is_none_or(|d| platform.now() + pause < d);
        if !(may_retry && in_time) {
            return Err(if after_uncertain && error.kind != ErrorKind::Uncertain {
                Error {
                    kind: ErrorKind::Uncertain,
                    message: super::error::cap(format!(
                        "an earlier attempt's answer was lost, so it may have been applied; the last attempt failed: {}",
                        error.message
                    )),
                    ..error
                }
            } else {
                error
            });
        }
        after_uncertain |= error.kind == ErrorKind::Uncertain;
        platform.sleep(pause);
        retries += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::testing::FakePlatform as FakeClock;
    use std::cell::Cell;

    fn err(kind: ErrorKind) -> Error {
        Error::new(kind, kind.as_str())
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitters_the_upper_half() {
        let p = RetryPolicy::default();
        for (retry, full_ms) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1600), (6, 2000)] {
            let full = Duration::from_millis(full_ms);
            assert_eq!(p.backoff(retry, 0), full / 2, "retry {retry}");
            let most = p.backoff(retry, u64::MAX - 1);
            assert!(most >= full / 2 && most <= full, "retry {retry}: {most:?}");
        }
        assert_eq!(p.backoff(1000, 0), MAX_BACKOFF / 2, "no overflow");
        let zero = RetryPolicy {
            initial_backoff: Duration::ZERO,
            ..p
        };
        assert_eq!(zero.backoff(3, 12345), Duration::ZERO);
        // A constant interval (the lock wait): half to all of it, at every attempt.
        let d = Duration::from_millis(1000);
        assert_eq!(backoff(d, d, 7, 0), d / 2);
        assert_eq!(backoff(d, d, 1, 500_000_000), d);
        assert_eq!(backoff(d, d, 1, 500_000_001), d / 2);
    }

    #[test]
    fn only_failures_that_may_pass_are_worth_retrying() {
        let worth: Vec<_> = ErrorKind::ALL
            .into_iter()
            .filter(|k| is_worth_retrying(*k))
            .collect();
        assert_eq!(
            worth,
            [
                ErrorKind::Disconnected,
                ErrorKind::Transient,
                ErrorKind::Throttled,
                ErrorKind::Uncertain
            ]
        );
    }

    #[test]
    fn retries_until_success_and_reports_an_uncertain_attempt() {
        let clock = FakeClock::default();
        let mut answers = vec![
            Ok(7),
            Err(err(ErrorKind::Disconnected)),
            Err(err(ErrorKind::Uncertain)),
        ];
        let got = run(
            &RetryPolicy::new(5),
            &clock,
            None,
            || answers.pop().unwrap(),
            |e| is_worth_retrying(e.kind),
        )
        .unwrap();
        assert_eq!((got.value, got.retries, got.after_uncertain), (7, 2, true));
        assert_eq!(clock.slept.borrow().len(), 2);
    }

    #[test]
    fn stops_after_the_retries_and_keeps_the_last_error() {
        let clock = FakeClock::default();
        let calls = Cell::new(0);
        let e = run(
            &RetryPolicy::new(3),
            &clock,
            None,
            || -> Result<(), Error> {
                calls.set(calls.get() + 1);
                Err(err(ErrorKind::Transient))
            },
            |e| is_worth_retrying(e.kind),
        )
        .unwrap_err();
        assert_eq!(calls.get(), 4);
        assert_eq!(e.kind, ErrorKind::Transient);
        assert_eq!(e.message, "transient");
    }

    #[test]
    fn a_failure_after_an_uncertain_attempt_is_uncertain() {
        let clock = FakeClock::default();
        let mut answers = vec![
            Err(Error::new(ErrorKind::Permanent, "bad")),
            Err(err(ErrorKind::Uncertain)),
        ];
        let e = run(
            &RetryPolicy::new(5),
            &clock,
            None,
            || -> Result<(), Error> { answers.pop().unwrap() },
            |e| is_worth_retrying(e.kind),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain);
        assert!(e.message.contains("may have been applied"), "{}", e.message);
        assert!(e.message.ends_with("bad"), "{}", e.message);
    }

    #[test]
    fn declined_errors_and_the_deadline_stop_at_once() {
        let clock = FakeClock::default();
        let calls = Cell::new(0);
        let attempt = || -> Result<(), Error> {
            calls.set(calls.get() + 1);
            Err(err(ErrorKind::Locked))
        };
        run(&RetryPolicy::new(5), &clock, None, attempt, |e| {
            is_worth_retrying(e.kind)
        })
        .unwrap_err();
        assert_eq!(calls.get(), 1, "locked is not retried");

        let calls = Cell::new(0);
        let e = run(
            &RetryPolicy::new(u32::MAX),
            &clock,
            Some(Duration::from_secs(3)),
            || -> Result<(), Error> {
                calls.set(calls.get() + 1);
                Err(err(ErrorKind::Disconnected))
            },
            |e| is_worth_retrying(e.kind),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Disconnected);
        assert!(clock.now() < Duration::from_secs(3), "{:?}", clock.now());
        assert!(calls.get() >= 3, "{}", calls.get());
    }
}
