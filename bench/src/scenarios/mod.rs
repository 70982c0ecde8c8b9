//! The scenarios. Each starts its own devcluster (so one scenario's objects and watches do not
//! load the next), runs ctrlhub and its peer one after the other on it, and returns its rows.

pub mod failover;
pub mod fairness;
pub mod hostile;
pub mod latency;
pub mod loopback;
pub mod memory;
pub mod scale_out;
pub mod shared_caches;
pub mod soak;
pub mod throughput;
pub mod warm_start;

use std::time::Duration;

/// How long a wait on a scenario's whole load (every object reconciled, listed or cached) may
/// take before it is reported as a failure: five times the suites' [`ctrlhub_tests::PATIENCE`],
/// because a full-size scenario waits on 100,000 objects where a test waits on a handful.
pub const LOAD_PATIENCE: Duration = ctrlhub_tests::PATIENCE.saturating_mul(5);

/// Sizes for a full run or a `--quick` one.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Small sizes for a quick look (and the smoke test).
    pub quick: bool,
}

impl Sizes {
    /// `full` normally, `quick` with `--quick`.
    pub fn pick<T>(self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}
