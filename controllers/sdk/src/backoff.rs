//! Reconnect backoff: exponential with jitter, reset whenever a session registers.

use std::time::Duration;

use rand::Rng;

/// Exponential reconnect backoff with "equal jitter": the n-th consecutive
/// failure waits a random duration in `[d/2, d]` where
/// `d = min(initial * 2^(n-1), max)`.
///
/// A session that registered (the manager answered `Registered`) resets the
/// sequence, however short it was: during a rolling update of the manager
/// two leader changes follow within seconds, and each must cost one short
/// wait, not a growing one. Only failures to register in a row back off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (before jitter).
    pub initial: Duration,
    /// Upper bound of the delay.
    pub max: Duration,
    /// A session at least this long resets the backoff even when it never
    /// registered (a connection that stays up waiting for `Registered` while
    /// the manager lists its caches). A session that registers resets it
    /// anyway.
    pub reset_after: Duration,
    failures: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(
            Duration::from_millis(100),
            Duration::from_secs(10),
            Duration::from_secs(30),
        )
    }
}

impl Backoff {
    /// A backoff from `initial` doubling to `max`, reset by a session that
    /// registers or lasts `reset_after`.
    pub fn new(initial: Duration, max: Duration, reset_after: Duration) -> Self {
        Self {
            initial,
            max,
            reset_after,
            failures: 0,
        }
    }

    /// Consecutive failures recorded so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The un-jittered delay after `failures` consecutive failures (≥ 1).
    pub fn base_delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << exp)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// Records the end of a session that lasted `lasted` and whether it
    /// `registered`, and returns how long to wait before reconnecting.
    pub fn next_delay(
        &mut self,
        lasted: Duration,
        registered: bool,
        rng: &mut impl Rng,
    ) -> Duration {
        if registered || lasted >= self.reset_after {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        let d = self.base_delay(self.failures);
        let half = d / 2;
        let jitter_nanos = u64::try_from((d - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(rng.random_range(0..=jitter_nanos))
    }

    /// Forgets past failures.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

// The bounds of each attempt and the reset by a registered session are cases of
// tests/conformance/helpers.json (`crate::shared_cases`); these cover Rust's own API.
#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn base_sequence_doubles_to_max() {
        let b = Backoff::default();
        let ms: Vec<u128> = (1..=10).map(|n| b.base_delay(n).as_millis()).collect();
        assert_eq!(
            ms,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
        );
        assert_eq!(b.base_delay(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_within_half_to_full() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut b = Backoff::default();
        for n in 1..=20u32 {
            let d = b.next_delay(Duration::ZERO, false, &mut rng);
            let base = b.base_delay(n);
            assert!(d >= base / 2 && d <= base, "attempt {n}: {d:?} vs {base:?}");
        }
        assert_eq!(b.failures(), 20);
    }

    #[test]
    fn long_session_resets() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut b = Backoff::default();
        for _ in 0..5 {
            b.next_delay(Duration::from_secs(1), false, &mut rng);
        }
        assert_eq!(b.failures(), 5);
        let d = b.next_delay(Duration::from_secs(31), false, &mut rng);
        assert_eq!(b.failures(), 1);
        assert!(d <= Duration::from_millis(100));
    }
}
