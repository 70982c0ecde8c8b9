//! One attempt of a key at a time in this process (tests/conformance/README.md, rule 5.11): a
//! request for a key whose earlier attempt still runs, on this session or an ended one, waits
//! for it before it starts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, OwnedMutexGuard};

use crate::ObjectKey;

/// The keys whose attempts run (or wait to run) in this process, and how many handlers run.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    keys: Mutex<HashMap<ObjectKey, Arc<tokio::sync::Mutex<()>>>>,
    running: Mutex<usize>,
    stopped: Notify,
}

/// Holds `key` for one attempt; dropping it lets the key's next attempt start.
pub(crate) struct KeyGuard {
    attempts: Arc<Attempts>,
    key: ObjectKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        // Release first, so that our own reference is gone when the entry is looked at.
        drop(self.guard.take());
        let mut keys = lock(&self.attempts.keys);
        if keys
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            keys.remove(&self.key);
        }
    }
}

/// Counts a running handler until dropped.
pub(crate) struct HandlerGuard(Arc<Attempts>);

impl Drop for HandlerGuard {
    fn drop(&mut self) {
        let mut running = lock(&self.0.running);
        *running = running.saturating_sub(1);
        if *running == 0 {
            self.0.stopped.notify_waiters();
        }
    }
}

impl Attempts {
    /// Waits until no other attempt of `key` runs in this process, then holds it.
    pub(crate) async fn lock(self: &Arc<Self>, key: &ObjectKey) -> KeyGuard {
        let mutex = lock(&self.keys).entry(key.clone()).or_default().clone();
        let guard = mutex.lock_owned().await;
        KeyGuard {
            attempts: self.clone(),
            key: key.clone(),
            guard: Some(guard),
        }
    }

    /// A handler of any session runs until the guard is dropped.
    pub(crate) fn handler(self: &Arc<Self>) -> HandlerGuard {
        *lock(&self.running) += 1;
        HandlerGuard(self.clone())
    }

    /// How many handlers of any session run now.
    pub(crate) fn running(&self) -> usize {
        *lock(&self.running)
    }

    /// Resolves once no handler of any session runs.
    pub(crate) async fn all_stopped(&self) {
        loop {
            let notified = self.stopped.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.running() == 0 {
                return;
            }
            notified.await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_key_waits_for_its_earlier_attempt() {
        let attempts = Arc::new(Attempts::default());
        let a = ObjectKey::new("ns", "a");
        let first = attempts.lock(&a).await;
        // Another key is not held up.
        let other = tokio::time::timeout(
            Duration::from_secs(5),
            attempts.lock(&ObjectKey::new("ns", "b")),
        )
        .await;
        assert!(other.is_ok());
        drop(other);
        let second = attempts.lock(&a);
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), second.as_mut())
                .await
                .is_err(),
            "the second attempt must wait"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), second).await;
        assert!(second.is_ok());
        drop(second);
        assert!(
            lock(&attempts.keys).is_empty(),
            "entries go with their last holder"
        );
    }

    #[tokio::test]
    async fn all_stopped_waits_for_every_handler() {
        let attempts = Arc::new(Attempts::default());
        let h1 = attempts.handler();
        let h2 = attempts.handler();
        assert_eq!(attempts.running(), 2);
        let waiter = tokio::spawn({
            let attempts = attempts.clone();
            async move { attempts.all_stopped().await }
        });
        drop(h1);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(h2);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .is_ok()
        );
    }
}
