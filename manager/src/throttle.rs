//! Throttles for what tenants and strangers can make the manager do repeatedly: log lines
//! ([`LogEvery`]), calls to the API server on their behalf ([`TokenBucket`], [`PeerThrottle`]),
//! and things held at once ([`Slots`]: connections, pending Connect streams, reviews in flight).
//! Plain data with the clock passed in, so they are tested without a runtime.
//!
//! Owns: nothing shared. May call: nothing.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lets one log line through per period and counts the ones it holds back, so a tenant that
/// misses a thousand deadlines a second costs one line every period (the counts go to metrics).
#[derive(Debug)]
pub(crate) struct LogEvery {
    period: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl LogEvery {
    /// At most one line per `period`.
    pub(crate) fn new(period: Duration) -> Self {
        LogEvery {
            period,
            last: None,
            held_back: 0,
        }
    }

    /// Whether to log now; if so, how many lines were held back since the last one.
    pub(crate) fn hit(&mut self, now: Instant) -> Option<u64> {
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
pub(crate) struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_second: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn new(burst: u32, per_second: f64, now: Instant) -> Self {
        TokenBucket {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_second,
            at: now,
        }
    }

    /// Take one token if there is one.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        if self.has_token(now) {
            self.tokens -= 1.0;
            return true;
        }
        false
    }

    /// Take `n` tokens if there are that many; none otherwise.
    pub(crate) fn take_n(&mut self, n: u32, now: Instant) -> bool {
        self.has_token(now);
        if self.tokens >= f64::from(n) {
            self.tokens -= f64::from(n);
            return true;
        }
        false
    }

    /// Whether a token is there (refilling first), without taking it.
    pub(crate) fn has_token(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.tokens >= 1.0
    }

    /// Gives back one token taken earlier (never above the burst).
    pub(crate) fn refund(&mut self, now: Instant) {
        self.has_token(now);
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    /// Whether the bucket is full again as of `now` (an idle peer's bucket can be forgotten).
    pub(crate) fn is_full(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens + elapsed * self.per_second >= self.burst
    }
}

/// Where a call comes from, for per-peer bounds: the IPv4 address, or the /64 of an IPv6 one (a
/// single host commonly holds a whole /64, so counting its addresses one by one would let it
/// have 2^64 buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PeerKey(IpAddr);

impl From<IpAddr> for PeerKey {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => PeerKey(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => PeerKey(IpAddr::V4(v4)),
                None => {
                    let s = v6.segments();
                    PeerKey(IpAddr::V6(std::net::Ipv6Addr::new(
                        s[0], s[1], s[2], s[3], 0, 0, 0, 0,
                    )))
                }
            },
        }
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
            v4 => write!(f, "{v4}"),
        }
    }
}

/// Which bound of a [`Slots`] was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Full {
    /// The key already holds its share.
    #[error("the per-key bound is reached")]
    Key,
    /// Every slot is taken.
    #[error("the total bound is reached")]
    Total,
}

/// Counted slots: at most `per_key` held by one key and `total` by all, each released when its
/// [`Slot`] is dropped. Connections per peer, Connect streams waiting for their Register per
/// tenant and TokenReviews in flight per peer are all bounded with one.
#[derive(Debug)]
pub(crate) struct Slots<K: Eq + Hash + Clone> {
    per_key: usize,
    total: usize,
    held: Mutex<(usize, HashMap<K, usize>)>,
}

impl<K: Eq + Hash + Clone> Slots<K> {
    /// At most `per_key` slots per key and `total` in all.
    pub(crate) fn new(per_key: usize, total: usize) -> Arc<Self> {
        Arc::new(Slots {
            per_key,
            total,
            held: Mutex::new((0, HashMap::new())),
        })
    }

    /// Takes a slot for `key`, or says which bound is reached. The map only holds keys with a
    /// slot, so it is bounded by `total`.
    pub(crate) fn take(self: &Arc<Self>, key: K) -> Result<Slot<K>, Full> {
        let mut held = self.held.lock();
        if held.0 >= self.total {
            return Err(Full::Total);
        }
        let mine = held.1.entry(key.clone()).or_insert(0);
        if *mine >= self.per_key {
            return Err(Full::Key);
        }
        *mine += 1;
        held.0 += 1;
        Ok(Slot {
            slots: self.clone(),
            key,
        })
    }

    /// Slots held in all.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.lock().0
    }

    /// The per-key bound.
    pub(crate) fn per_key(&self) -> usize {
        self.per_key
    }

    /// The total bound.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    fn release(&self, key: &K) {
        let mut held = self.held.lock();
        held.0 = held.0.saturating_sub(1);
        if let Some(mine) = held.1.get_mut(key) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                held.1.remove(key);
            }
        }
    }
}

/// One slot of a [`Slots`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot<K: Eq + Hash + Clone> {
    slots: Arc<Slots<K>>,
    key: K,
}

impl<K: Eq + Hash + Clone> Drop for Slot<K> {
    fn drop(&mut self) {
        self.slots.release(&self.key);
    }
}

/// Why an authentication was refused before its token was looked at (the caller is told
/// [`Throttled::message`], which names its address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Throttled {
    /// The peer spent its failed-authentication budget.
    #[error("too many failed authentications from this address")]
    Failures,
    /// The peer already has as many reviews in flight as it may.
    #[error("too many authentications in flight from this address")]
    PeerInFlight,
    /// The manager already has as many reviews in flight as it allows.
    #[error("too many authentications in flight")]
    TotalInFlight,
}

impl Throttled {
    /// The metrics label (bounded).
    pub(crate) fn label(self) -> &'static str {
        match self {
            Throttled::Failures => "failures",
            Throttled::PeerInFlight => "peer_in_flight",
            Throttled::TotalInFlight => "total_in_flight",
        }
    }

    /// What the caller is told: what happened and what to do.
    pub(crate) fn message(self, peer: Option<IpAddr>) -> String {
        let from = peer.map_or_else(
            || "this address".to_string(),
            |ip| PeerKey::from(ip).to_string(),
        );
        match self {
            Throttled::Failures => format!(
                "too many failed authentications from {from}; wait a few seconds, then retry with a valid token"
            ),
            Throttled::PeerInFlight => format!(
                "too many authentications in flight from {from}; retry with backoff (a token already accepted is answered from the cache without waiting)"
            ),
            Throttled::TotalInFlight => {
                "too many authentications in flight; retry with backoff".into()
            }
        }
    }
}

/// Authentications that cost a review (a token not in the cache), per peer address: each one
/// reserves a token of the peer's bucket *before* the review and gets it back only when the
/// token is accepted, and reviews in flight are capped per peer and overall. So however many
/// junk tokens a peer sends at once, it costs at most `burst` reviews, then `per_second`, and
/// never more than `in_flight` API calls (and their connections) at a time. Peers that
/// authenticate never spend anything.
pub(crate) struct PeerThrottle {
    burst: u32,
    per_second: f64,
    peers: Mutex<HashMap<PeerKey, TokenBucket>>,
    in_flight: Arc<Slots<PeerKey>>,
}

/// Peers remembered before idle (full) buckets are forgotten.
const PEERS_BEFORE_PRUNE: usize = 4096;

/// A reserved authentication attempt: holds its in-flight slot until dropped; its token is
/// spent unless [`Reservation::succeeded`] gives it back.
pub(crate) struct Reservation<'a> {
    throttle: &'a PeerThrottle,
    peer: Option<PeerKey>,
    _slot: Slot<PeerKey>,
}

impl Reservation<'_> {
    /// The token was accepted: the attempt costs the peer nothing.
    pub(crate) fn succeeded(self, now: Instant) {
        if let Some(peer) = self.peer
            && let Some(bucket) = self.throttle.peers.lock().get_mut(&peer)
        {
            bucket.refund(now);
        }
    }
}

/// The key under which a request without a peer address (not over TCP) is counted.
const NO_PEER: PeerKey = PeerKey(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));

impl PeerThrottle {
    /// `burst` failures at once, then `per_second`, per peer; at most `peer_in_flight` reviews
    /// in flight per peer and `total_in_flight` in all.
    pub(crate) fn new(
        burst: u32,
        per_second: f64,
        peer_in_flight: usize,
        total_in_flight: usize,
    ) -> Self {
        PeerThrottle {
            burst,
            per_second,
            peers: Mutex::new(HashMap::new()),
            in_flight: Slots::new(peer_in_flight, total_in_flight),
        }
    }

    /// Reserves one review for `peer`: a token of its bucket and an in-flight slot, or why not.
    pub(crate) fn reserve(
        &self,
        peer: Option<IpAddr>,
        now: Instant,
    ) -> Result<Reservation<'_>, Throttled> {
        let key = peer.map(PeerKey::from);
        let slot = self
            .in_flight
            .take(key.unwrap_or(NO_PEER))
            .map_err(|full| match full {
                Full::Key => Throttled::PeerInFlight,
                Full::Total => Throttled::TotalInFlight,
            })?;
        if let Some(key) = key {
            let mut peers = self.peers.lock();
            if peers.len() >= PEERS_BEFORE_PRUNE {
                peers.retain(|_, b| !b.is_full(now));
            }
            let bucket = peers
                .entry(key)
                .or_insert_with(|| TokenBucket::new(self.burst, self.per_second, now));
            if !bucket.take(now) {
                return Err(Throttled::Failures);
            }
        }
        Ok(Reservation {
            throttle: self,
            peer: key,
            _slot: slot,
        })
    }

    /// Reviews in flight right now.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.held()
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
        let throttle = PeerThrottle::new(3, 1.0, 100, 100);
        let bad: IpAddr = [10, 0, 0, 1].into();
        let good: IpAddr = [10, 0, 0, 2].into();
        let mut tried = 0;
        for _ in 0..1000 {
            if throttle.reserve(Some(bad), t0).is_ok() {
                tried += 1;
            }
        }
        assert_eq!(tried, 3, "a thousand junk tokens made {tried} attempts");
        assert!(throttle.reserve(Some(good), t0).is_ok());
        assert!(
            throttle
                .reserve(Some(bad), t0 + Duration::from_secs(1))
                .is_ok(),
            "refills"
        );
    }

    #[test]
    fn concurrent_attempts_reserve_before_they_review() {
        // Every attempt is still in flight (its review not answered) when the next one comes:
        // the bucket is spent up front, so the 21st is refused however many run at once.
        let t0 = Instant::now();
        let throttle = PeerThrottle::new(20, 1.0, 1000, 1000);
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        let mut held = Vec::new();
        let mut refused = Vec::new();
        for _ in 0..900 {
            match throttle.reserve(peer, t0) {
                Ok(r) => held.push(r),
                Err(t) => refused.push(t),
            }
        }
        assert_eq!(
            held.len(),
            20,
            "900 concurrent attempts reserved {}",
            held.len()
        );
        assert!(refused.iter().all(|t| *t == Throttled::Failures));
        drop(held);
        // Ten seconds later: ten more, never the burst again at once.
        let later = t0 + Duration::from_secs(10);
        let n = (0..900)
            .filter_map(|_| throttle.reserve(peer, later).ok())
            .count();
        assert_eq!(n, 10);
    }

    #[test]
    fn an_accepted_token_gets_its_reservation_back() {
        let t0 = Instant::now();
        let throttle = PeerThrottle::new(2, 0.0, 10, 10);
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        for _ in 0..100 {
            throttle
                .reserve(peer, t0)
                .expect("a peer whose tokens are accepted never runs out")
                .succeeded(t0);
        }
        drop(throttle.reserve(peer, t0));
        drop(throttle.reserve(peer, t0));
        assert_eq!(throttle.reserve(peer, t0).err(), Some(Throttled::Failures));
    }

    #[test]
    fn reviews_in_flight_are_capped_per_peer_and_overall() {
        let t0 = Instant::now();
        let throttle = PeerThrottle::new(1000, 1.0, 2, 3);
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        let c = Some(IpAddr::from([10, 0, 0, 3]));
        let a1 = throttle.reserve(a, t0).expect("first");
        let _a2 = throttle.reserve(a, t0).expect("second");
        assert_eq!(throttle.reserve(a, t0).err(), Some(Throttled::PeerInFlight));
        let _b1 = throttle.reserve(b, t0).expect("another peer");
        assert_eq!(
            throttle.reserve(c, t0).err(),
            Some(Throttled::TotalInFlight)
        );
        assert_eq!(throttle.in_flight(), 3);
        drop(a1);
        assert!(
            throttle.reserve(c, t0).is_ok(),
            "a finished review frees its slot"
        );
    }

    #[test]
    fn ipv6_peers_are_counted_by_their_64() {
        let a: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("ip");
        let c: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        assert_eq!(PeerKey::from(a), PeerKey::from(b));
        assert_ne!(PeerKey::from(a), PeerKey::from(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert_eq!(
            PeerKey::from(mapped),
            PeerKey::from(IpAddr::from([10, 0, 0, 1]))
        );
        assert_eq!(PeerKey::from(a).to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn slots_bound_each_key_and_the_total_and_come_back_when_dropped() {
        let slots = Slots::new(2, 3);
        let a1 = slots.take("a").expect("a1");
        let a2 = slots.take("a").expect("a2");
        assert_eq!(slots.take("a").err(), Some(Full::Key));
        let b1 = slots.take("b").expect("b1");
        assert_eq!(slots.take("c").err(), Some(Full::Total));
        assert_eq!(slots.held(), 3);
        drop((a1, a2, b1));
        assert_eq!(slots.held(), 0);
        assert!(
            slots.held.lock().1.is_empty(),
            "no key is remembered without a slot"
        );
        let _c = slots.take("c").expect("room again");
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
