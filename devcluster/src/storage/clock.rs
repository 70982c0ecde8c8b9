//! The store's clock: the machine's in production, one that moves only when told in tests, so
//! timestamps and the age of continue tokens can be checked without waiting.

use std::time::Instant;

/// Where the store reads the time: the machine's clocks, unless a test stopped it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Clock {
    /// The monotonic and wall-clock time a stopped clock reads; None follows the machine.
    stopped: Option<(Instant, jiff::Timestamp)>,
}

impl Clock {
    /// A clock that reads `wall` until [`Clock::advance`] moves it.
    #[cfg(test)]
    pub(crate) fn stopped_at(wall: jiff::Timestamp) -> Self {
        Clock {
            stopped: Some((Instant::now(), wall)),
        }
    }

    /// Moves a stopped clock forward (the machine's moves by itself).
    #[cfg(test)]
    pub(crate) fn advance(&mut self, by: std::time::Duration) {
        if let Some((instant, wall)) = &mut self.stopped {
            *instant += by;
            *wall = wall.checked_add(by).unwrap_or(*wall);
        }
    }

    /// The monotonic time, for ages.
    pub(crate) fn instant(&self) -> Instant {
        self.stopped
            .map_or_else(Instant::now, |(instant, _)| instant)
    }

    /// The time as Kubernetes writes `metav1.Time` (RFC 3339, seconds).
    pub(crate) fn timestamp(&self) -> String {
        let wall = self
            .stopped
            .map_or_else(jiff::Timestamp::now, |(_, wall)| wall);
        wall.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_stopped_clock_moves_only_when_told() {
        let mut clock = Clock::stopped_at(jiff::Timestamp::UNIX_EPOCH);
        let before = clock.instant();
        assert_eq!(clock.timestamp(), "1970-01-01T00:00:00Z");
        assert_eq!(clock.instant(), before);
        clock.advance(Duration::from_secs(61));
        assert_eq!(clock.timestamp(), "1970-01-01T00:01:01Z");
        assert_eq!(clock.instant() - before, Duration::from_secs(61));
    }
}
