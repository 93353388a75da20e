//! What the core needs from its runtime besides HTTP: a monotonic clock, sleeping, and
//! randomness (lock tokens, retry jitter). WASI provides them in the component
//! ([`wasi::WasiPlatform`]); unit tests use `std_platform::StdPlatform`.

use std::time::Duration;

/// Clock, sleep and randomness.
pub trait Platform {
    /// Monotonic time since an arbitrary origin.
    fn now(&self) -> Duration;
    /// Wall-clock time since the Unix epoch (what a record's `_sdc_received_at` says; never
    /// used to order or time anything). Only the Singer target reads it (`command`).
    #[cfg_attr(not(feature = "command"), allow(dead_code))]
    fn wall_clock(&self) -> Duration;
    /// Blocks for `duration`.
    fn sleep(&self, duration: Duration);
    /// A random 64-bit value (need not be cryptographic).
    fn random_u64(&self) -> u64;

    /// A random version-4 UUID in the usual text form.
    fn random_uuid(&self) -> String {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.random_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.random_u64().to_le_bytes());
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let hex = crate::hex::hex(&bytes);
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

impl<P: Platform + ?Sized> Platform for &P {
    fn now(&self) -> Duration {
        (**self).now()
    }
    fn wall_clock(&self) -> Duration {
        (**self).wall_clock()
    }
    fn sleep(&self, duration: Duration) {
        (**self).sleep(duration)
    }
    fn random_u64(&self) -> u64 {
        (**self).random_u64()
    }
}

/// The platform of the component: wasi:clocks and wasi:random.
#[cfg(target_arch = "wasm32")]
pub mod wasi {
    use super::Platform;
    use std::time::Duration;
    use wasip2::clocks::monotonic_clock;

    /// wasi:clocks/monotonic-clock and wasi:random/random.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct WasiPlatform;

    impl Platform for WasiPlatform {
        fn now(&self) -> Duration {
            Duration::from_nanos(monotonic_clock::now())
        }
        fn wall_clock(&self) -> Duration {
            let now = wasip2::clocks::wall_clock::now();
            Duration::new(now.seconds, now.nanoseconds)
        }
        fn sleep(&self, duration: Duration) {
            let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
            monotonic_clock::subscribe_duration(nanos).block();
        }
        fn random_u64(&self) -> u64 {
            wasip2::random::random::get_random_u64()
        }
    }
}

/// The native platform (unit tests, and integration tests that drive the core over a native
/// transport): std's clock and a seeded generator.
#[cfg(not(target_arch = "wasm32"))]
pub mod std_platform {
    use super::Platform;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    /// `std::time` and a xorshift generator seeded from the clock and the address of a local.
    #[derive(Debug)]
    pub struct StdPlatform {
        origin: Instant,
        state: AtomicU64,
    }

    impl Default for StdPlatform {
        fn default() -> Self {
            let local = 0u8;
            let seed = (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1))
                ^ (&local as *const u8 as u64).rotate_left(32);
            StdPlatform {
                origin: Instant::now(),
                state: AtomicU64::new(seed | 1),
            }
        }
    }

    impl Platform for StdPlatform {
        fn now(&self) -> Duration {
            self.origin.elapsed()
        }
        fn wall_clock(&self) -> Duration {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
        }
        fn sleep(&self, duration: Duration) {
            std::thread::sleep(duration)
        }
        fn random_u64(&self) -> u64 {
            let mut x = self.state.load(Ordering::Relaxed);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.state.store(x, Ordering::Relaxed);
            x
        }
    }
}

/// A platform for unit tests: a clock that moves only when slept on (so backoff costs no time),
/// and a counter for randomness (so tokens differ and runs repeat).
#[cfg(any(test, feature = "test-util"))]
pub mod testing {
    use super::Platform;
    use std::cell::{Cell, RefCell};
    use std::time::Duration;

    /// Fake clock, counting "random" values, and a record of every sleep.
    #[derive(Default)]
    pub struct FakePlatform {
        /// The clock.
        pub now: Cell<Duration>,
        /// Every sleep, in order.
        pub slept: RefCell<Vec<Duration>>,
        /// The last "random" value given.
        pub counter: Cell<u64>,
    }

    impl Platform for FakePlatform {
        fn now(&self) -> Duration {
            self.now.get()
        }
        /// 2026-01-01T00:00:00Z plus the fake clock.
        fn wall_clock(&self) -> Duration {
            Duration::from_secs(1_767_225_600) + self.now.get()
        }
        fn sleep(&self, d: Duration) {
            self.now.set(self.now.get() + d);
            self.slept.borrow_mut().push(d);
        }
        fn random_u64(&self) -> u64 {
            self.counter.set(self.counter.get() + 1);
            self.counter.get()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::std_platform::StdPlatform;
    use super::Platform;

    #[test]
    fn uuids_are_version_4_and_distinct() {
        let p = StdPlatform::default();
        let a = p.random_uuid();
        let b = p.random_uuid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
