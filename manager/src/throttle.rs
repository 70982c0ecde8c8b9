//! Throttles for what tenants can make the manager do repeatedly: log lines ([`LogEvery`]) and
//! calls to the API server on their behalf ([`TokenBucket`]). Plain data with the clock passed
//! in, so they are tested without a runtime.
//!
//! Owns: nothing shared. May call: nothing.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Lets one log line through per period and counts the ones it holds back, so a tenant that
/// misses a thousand deadlines a second costs one line every period (the counts go to metrics).
#[derive(Debug)]
pub struct LogEvery {
    period: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl LogEvery {
    /// At most one line per `period`.
    pub fn new(period: Duration) -> Self {
        LogEvery {
            period,
            last: None,
            held_back: 0,
        }
    }

    /// Whether to log now; if so, how many lines were held back since the last one.
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.period)
        {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }
}

/// A token bucket: `burst` calls at once, then `per_second` on average.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_second: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(burst: u32, per_second: f64, now: Instant) -> Self {
        TokenBucket {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_second,
            at: now,
        }
    }

    /// Take one token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        if self.has_token(now) {
            self.tokens -= 1.0;
            return true;
        }
        false
    }

    /// Whether a token is there (refilling first), without taking it.
    pub fn has_token(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.tokens >= 1.0
    }

    /// Whether the bucket is full again as of `now` (an idle peer's bucket can be forgotten).
    pub fn is_full(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens + elapsed * self.per_second >= self.burst
    }
}

/// Failed authentications per peer address: each failure takes a token, and a peer without one
/// is refused before its token is even looked at, so junk tokens from one address cannot turn
/// into a TokenReview each. Peers that authenticate never spend anything.
pub struct PeerThrottle {
    burst: u32,
    per_second: f64,
    peers: Mutex<HashMap<IpAddr, TokenBucket>>,
}

/// Peers remembered before idle (full) buckets are forgotten.
const PEERS_BEFORE_PRUNE: usize = 4096;

impl PeerThrottle {
    /// `burst` failures at once, then `per_second`, per peer.
    pub fn new(burst: u32, per_second: f64) -> Self {
        PeerThrottle {
            burst,
            per_second,
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `peer` may try to authenticate now.
    pub fn may_try(&self, peer: IpAddr, now: Instant) -> bool {
        self.peers
            .lock()
            .get_mut(&peer)
            .is_none_or(|b| b.has_token(now))
    }

    /// `peer` failed to authenticate.
    pub fn failed(&self, peer: IpAddr, now: Instant) {
        let mut peers = self.peers.lock();
        if peers.len() >= PEERS_BEFORE_PRUNE {
            peers.retain(|_, b| !b.is_full(now));
        }
        peers
            .entry(peer)
            .or_insert_with(|| TokenBucket::new(self.burst, self.per_second, now))
            .take(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_and_the_rest_counted() {
        let t0 = Instant::now();
        let mut log = LogEvery::new(Duration::from_secs(10));
        assert_eq!(log.hit(t0), Some(0));
        for i in 1..=999 {
            assert_eq!(log.hit(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(log.hit(t0 + Duration::from_secs(10)), Some(999));
        assert_eq!(log.hit(t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn a_peer_that_keeps_failing_is_refused_and_others_are_not() {
        let t0 = Instant::now();
        let throttle = PeerThrottle::new(3, 1.0);
        let bad: IpAddr = [10, 0, 0, 1].into();
        let good: IpAddr = [10, 0, 0, 2].into();
        let mut tried = 0;
        for _ in 0..1000 {
            if throttle.may_try(bad, t0) {
                tried += 1;
                throttle.failed(bad, t0);
            }
        }
        assert_eq!(tried, 3, "a thousand junk tokens made {tried} attempts");
        assert!(throttle.may_try(good, t0));
        assert!(
            throttle.may_try(bad, t0 + Duration::from_secs(1)),
            "refills"
        );
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(5, 2.0, t0);
        assert_eq!((0..100).filter(|_| b.take(t0)).count(), 5);
        assert!(!b.take(t0 + Duration::from_millis(400)));
        assert!(b.take(t0 + Duration::from_millis(500)));
        let later = t0 + Duration::from_secs(60);
        assert!(b.is_full(later));
        assert_eq!(
            (0..100).filter(|_| b.take(later)).count(),
            5,
            "never more than the burst"
        );
    }
}
