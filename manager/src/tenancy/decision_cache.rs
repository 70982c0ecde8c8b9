//! A small expiring map for authentication and authorization decisions.
//!
//! Entries carry their own time to live (an allow is trusted longer than a deny), the map is
//! bounded so a flood of distinct tokens cannot grow memory, and time is passed in so tests
//! drive it with a manual clock.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// An expiring, bounded map.
#[derive(Debug)]
pub(crate) struct TtlCache<K, V> {
    entries: HashMap<K, (V, Instant)>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache holding at most `capacity` entries.
    pub(crate) fn new(capacity: usize) -> Self {
        TtlCache {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The value for `key` if it has not expired at `now`.
    pub(crate) fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(v, _)| v.clone())
    }

    /// Store `value` for `ttl` from `now`. When full, expired entries go first, then the entry
    /// closest to expiry: the cache only saves API calls, so evicting early is always safe.
    pub(crate) fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, expires)| *expires > now);
            if self.entries.len() >= self.capacity {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    #[cfg(test)]
    /// Entries held, expired or not.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn entries_expire_after_their_own_ttl() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(10);
        c.insert("allow", true, 300 * S, t0);
        c.insert("deny", false, 30 * S, t0);
        assert_eq!(c.get(&"allow", t0 + 29 * S), Some(true));
        assert_eq!(c.get(&"deny", t0 + 29 * S), Some(false));
        assert_eq!(
            c.get(&"deny", t0 + 30 * S),
            None,
            "a deny is re-checked after 30 s"
        );
        assert_eq!(c.get(&"allow", t0 + 299 * S), Some(true));
        assert_eq!(c.get(&"allow", t0 + 300 * S), None);
    }

    #[test]
    fn a_full_cache_evicts_expired_then_soonest_and_stays_bounded() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(3);
        c.insert(1, (), S, t0);
        c.insert(2, (), 10 * S, t0);
        c.insert(3, (), 20 * S, t0);
        c.insert(4, (), 20 * S, t0 + 2 * S);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&1, t0), None, "the expired entry made room");
        assert_eq!(
            c.get(&2, t0 + 2 * S),
            Some(()),
            "only the expired entry went"
        );
        c.insert(5, (), 20 * S, t0 + 2 * S);
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.get(&2, t0 + 2 * S),
            None,
            "then the one closest to expiry"
        );
        for k in 100..10_000 {
            c.insert(k, (), 20 * S, t0);
        }
        assert_eq!(c.len(), 3);
    }
}
