//! What a tenant's controllers hold while it waits for delivery, counted against the tenant's
//! queued-bytes limit: EVENTS-mode events and the tombstones of deleted primaries. Memory a
//! tenant can make the manager keep is charged *before* it is kept, where it enters.
//!
//! Each controller holds a [`QueuedBytes`]: its own count and a handle on its tenant's total,
//! which every controller of the tenant shares. A controller that goes away gives its bytes
//! back, however it ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One controller's share of its tenant's queued bytes.
#[derive(Debug)]
pub(crate) struct QueuedBytes {
    tenant: Arc<AtomicU64>,
    own: AtomicU64,
    /// Changes when tenant policies change.
    limit: AtomicU64,
}

impl QueuedBytes {
    /// A controller's count against `tenant`'s total, which may not pass `limit`.
    pub(crate) fn new(tenant: Arc<AtomicU64>, limit: u64) -> Self {
        QueuedBytes {
            tenant,
            own: AtomicU64::new(0),
            limit: AtomicU64::new(limit),
        }
    }

    /// A count of its own tenant, unlimited (unit tests).
    #[cfg(test)]
    pub(crate) fn unlimited() -> Self {
        Self::new(Arc::new(AtomicU64::new(0)), u64::MAX)
    }

    /// Whether `bytes` more would still fit the tenant's limit.
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        self.tenant
            .load(Ordering::Relaxed)
            .saturating_add(bytes as u64)
            <= self.limit()
    }

    /// Count a change of `delta` bytes (negative: given back). Returns whether the tenant is
    /// within its limit afterwards.
    pub(crate) fn add(&self, delta: isize) -> bool {
        let n = delta.unsigned_abs() as u64;
        if delta >= 0 {
            self.own.fetch_add(n, Ordering::Relaxed);
            self.tenant.fetch_add(n, Ordering::Relaxed) + n <= self.limit()
        } else {
            self.own.fetch_sub(n, Ordering::Relaxed);
            self.tenant.fetch_sub(n, Ordering::Relaxed);
            true
        }
    }

    /// Bytes this controller holds.
    pub(crate) fn own(&self) -> u64 {
        self.own.load(Ordering::Relaxed)
    }

    /// The limit it is counted against.
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Count against a new limit from now on (what is held stays held).
    pub(crate) fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }
}

impl Drop for QueuedBytes {
    fn drop(&mut self) {
        self.tenant
            .fetch_sub(self.own.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_of_a_tenant_share_its_limit_and_give_back_what_they_held() {
        let tenant = Arc::new(AtomicU64::new(0));
        let a = QueuedBytes::new(tenant.clone(), 100);
        let b = QueuedBytes::new(tenant.clone(), 100);
        assert!(a.add(60));
        assert!(b.fits(40) && !b.fits(41));
        assert!(!b.add(50), "60 + 50 is past the tenant's 100");
        assert!(b.add(-50));
        assert_eq!(tenant.load(Ordering::Relaxed), 60);
        drop(a);
        assert_eq!(tenant.load(Ordering::Relaxed), 0, "a's 60 given back");
        assert_eq!(b.own(), 0);
    }
}
