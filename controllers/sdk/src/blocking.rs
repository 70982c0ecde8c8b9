//! Blocking work inside a reconcile, which cancellation cannot interrupt: [`blocking`] runs it
//! on tokio's blocking pool and tells the SDK, so that a cancelled reconcile counts as running
//! until that work has ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::ReconcileError;

tokio::task_local! {
    /// The blocking work of the reconcile this task runs.
    static SHIELDS: Shields;
}

/// The blocking work one reconcile started and that has not ended yet.
#[derive(Clone, Debug, Default)]
pub(crate) struct Shields(Arc<ShieldState>);

#[derive(Debug, Default)]
struct ShieldState {
    count: AtomicUsize,
    idle: Notify,
}

/// Marks blocking work as running until dropped (on the blocking thread, when it ends).
struct ShieldGuard(Shields);

impl Drop for ShieldGuard {
    fn drop(&mut self) {
        if self.0.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.0.idle.notify_waiters();
        }
    }
}

impl Shields {
    /// Runs `fut` with these shields as the ones [`blocking`] registers with.
    pub(crate) async fn scope<F: Future>(&self, fut: F) -> F::Output {
        SHIELDS.scope(self.clone(), fut).await
    }

    fn guard(&self) -> ShieldGuard {
        self.0.count.fetch_add(1, Ordering::AcqRel);
        ShieldGuard(self.clone())
    }

    /// Whether no blocking work of the reconcile runs.
    pub(crate) fn is_idle(&self) -> bool {
        self.0.count.load(Ordering::Acquire) == 0
    }

    /// Resolves once no blocking work of the reconcile runs.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_idle() {
                return;
            }
            notified.await;
        }
    }
}

/// Runs blocking `work` (file or network I/O through a synchronous library, a long
/// computation) on tokio's blocking pool and waits for it.
///
/// Cancellation cannot interrupt blocking code. Called from a reconcile, the SDK knows it runs:
/// when the reconcile is cancelled (at its deadline, or when its session ends), the SDK drops
/// the reconcile only once `work` has returned, sends its result then (the manager keeps the
/// key until it arrives), and starts no other attempt of the key in this process before. Use it
/// instead of `tokio::task::spawn_blocking`, which the SDK cannot see. Blocking work that
/// outlives the session's hold makes the process exit (see the crate docs, "Exclusive
/// attempts"): keep it short, or check [`Request::cancelled`](crate::Request::cancelled) in it.
///
/// A panic in `work` is returned as a retryable error. Outside a reconcile it just runs `work`
/// on the blocking pool.
pub async fn blocking<T, F>(work: F) -> Result<T, ReconcileError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let guard = SHIELDS.try_with(Shields::guard).ok();
    let handle = tokio::task::spawn_blocking(move || {
        let _running = guard;
        work()
    });
    handle
        .await
        .map_err(|e| ReconcileError::retry(format!("blocking work failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn blocking_work_is_counted_until_it_ends() {
        let shields = Shields::default();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let work = tokio::spawn({
            let shields = shields.clone();
            async move {
                shields
                    .scope(blocking(move || {
                        let _ = started_tx.send(());
                        let _ = release_rx.recv();
                        7
                    }))
                    .await
            }
        });
        let started = tokio::task::spawn_blocking(move || started_rx.recv()).await;
        assert!(matches!(started, Ok(Ok(()))));
        assert!(!shields.is_idle());
        // Dropping the future that awaits it does not end the blocking work.
        work.abort();
        assert!(!shields.is_idle());
        let _ = release_tx.send(());
        assert!(
            tokio::time::timeout(Duration::from_secs(5), shields.idle())
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn outside_a_reconcile_it_just_runs() {
        assert!(matches!(blocking(|| 1 + 1).await, Ok(2)));
        let panicked = blocking(|| -> u8 { panic!("boom") }).await;
        assert!(matches!(panicked, Err(ReconcileError::Retry { .. })));
    }
}
