//! Per-key retry timing, part of what a controller registers.

use std::time::Duration;

/// Per-key exponential backoff for failed reconciles.
///
/// The n-th consecutive error (counting from zero) waits `base * 2^n`, capped at `max`, like
/// client-go's `ItemExponentialFailureRateLimiter`; a success forgets the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first error.
    pub base: Duration,
    /// Upper bound, so a long-broken key is still retried now and then.
    pub max: Duration,
}

impl Default for Backoff {
    /// controller-runtime's defaults (5 ms doubling to 1000 s) so operators see familiar timing.
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        }
    }
}

impl Backoff {
    /// The delay to apply after an error when `failures` earlier consecutive errors happened.
    ///
    /// Saturates instead of overflowing so that a key failing for days stays at `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        if failures >= 32 {
            return self.max;
        }
        self.base
            .checked_mul(1u32 << failures)
            .map_or(self.max, |d| d.min(self.max))
    }
}
