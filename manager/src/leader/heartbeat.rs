//! The dispatch runtime's heartbeat: a task on the manager's main runtime beats it a few times a
//! second; leader election, on its own thread, reads how long ago it last beat.
//!
//! Renewing the Lease on its own thread keeps a busy runtime from losing the Lease, but it also
//! let a *stalled* runtime keep it: a leader whose dispatch loops could not run renewed its
//! Lease on time, so no standby took over while every tenant waited. A leader whose heartbeat is
//! older than the stall limit stops renewing (and a standby in that state stops campaigning),
//! and `/healthz` says so whenever it can answer at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When the runtime last ran its heartbeat task. Cheap to clone; every clone is the same beat.
#[derive(Debug, Clone)]
pub(crate) struct Heartbeat {
    start: Instant,
    /// Milliseconds after `start` of the last beat.
    last: Arc<AtomicU64>,
}

/// How often the heartbeat task beats.
pub(crate) const BEAT_EVERY: Duration = Duration::from_millis(250);

impl Heartbeat {
    /// A heartbeat that beat just now.
    pub(crate) fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// A heartbeat that beat at `now` (unit tests drive the clock).
    pub(crate) fn starting_at(now: Instant) -> Self {
        Heartbeat {
            start: now,
            last: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The runtime ran its heartbeat task now.
    pub(crate) fn beat(&self) {
        self.beat_at(Instant::now());
    }

    /// [`Heartbeat::beat`] with the clock given.
    pub(crate) fn beat_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.start).as_millis();
        self.last
            .fetch_max(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// [`Heartbeat::age`] with the clock given.
    pub(crate) fn age_at(&self, now: Instant) -> Duration {
        let last = self.start + Duration::from_millis(self.last.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }

    /// Beat every [`BEAT_EVERY`] on the current runtime until `stop` fires.
    pub(crate) fn spawn(&self, stop: tokio_util::sync::CancellationToken) {
        let beat = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(BEAT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => beat.beat(),
                    _ = stop.cancelled() => return,
                }
            }
        });
    }
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self::new()
    }
}

/// The runtime has not beaten for longer than a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the manager's dispatch runtime has not run for {:.1}s (limit {:.1}s)",
    age.as_secs_f64(),
    limit.as_secs_f64()
)]
pub(crate) struct Stalled {
    /// How long since the last beat.
    pub age: Duration,
    /// The limit.
    pub limit: Duration,
}

/// A heartbeat and the age past which its runtime counts as stalled.
#[derive(Debug, Clone)]
pub(crate) struct Liveness {
    /// The heartbeat.
    pub heartbeat: Heartbeat,
    /// The age past which the runtime counts as stalled.
    pub limit: Duration,
}

impl Liveness {
    /// Stalled, as of `now`?
    pub(crate) fn check_at(&self, now: Instant) -> Result<(), Stalled> {
        let age = self.heartbeat.age_at(now);
        if age > self.limit {
            return Err(Stalled {
                age,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// Stalled, as of now?
    pub(crate) fn check(&self) -> Result<(), Stalled> {
        self.check_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalled_once_the_last_beat_is_older_than_the_limit() {
        let t0 = Instant::now();
        let live = Liveness {
            heartbeat: Heartbeat::starting_at(t0),
            limit: Duration::from_secs(5),
        };
        assert!(live.check_at(t0 + Duration::from_secs(5)).is_ok());
        let e = live
            .check_at(t0 + Duration::from_secs(6))
            .expect_err("six seconds without a beat");
        assert_eq!(e.age, Duration::from_secs(6));
        live.heartbeat.beat_at(t0 + Duration::from_secs(6));
        assert!(live.check_at(t0 + Duration::from_secs(7)).is_ok());
        // A late beat from a clock that went back never moves the beat backwards.
        live.heartbeat.beat_at(t0);
        assert!(live.check_at(t0 + Duration::from_secs(10)).is_ok());
        assert!(e.to_string().contains("6.0s (limit 5.0s)"), "{e}");
    }
}
