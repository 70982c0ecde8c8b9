//! Waiting on observable conditions: the one [`PATIENCE`] every suite and the benchmark harness
//! measure their waits against, and the polling loops built on it. Tests wait on conditions;
//! they never sleep and hope.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long anything waits for a condition before it counts as a failure. Generous on purpose:
/// a slow, shared machine makes a passing test slower, never a failing one.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How often the polling loops re-run their probe.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A condition that did not hold in time: what was awaited, for how long, and what was seen last.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}; last seen: {last}")]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    /// How long it was awaited.
    pub timeout: Duration,
    /// The probe's last description of what it saw.
    pub last: String,
}

/// Polls `probe` every [`POLL_INTERVAL`] until it returns `Ok`, and returns that value; after
/// `timeout`, a [`TimedOut`] carrying the probe's last `Err`.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                return Err(TimedOut {
                    what: what.to_string(),
                    timeout,
                    last,
                });
            }
            Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

/// [`poll_until`] for tests: panics with the [`TimedOut`] message, so a failure says why.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll_until(what, timeout, probe)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Polls the yes/no condition `cond` until it holds, panicking with `what` after [`PATIENCE`].
pub async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until(what, PATIENCE, || {
        let holds = cond();
        async move {
            if holds.await {
                Ok(())
            } else {
                Err("not yet".into())
            }
        }
    })
    .await
}

/// Runs `fut` with a deadline of `timeout`, panicking with `what` if it does not finish.
pub async fn within<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {timeout:?}: {what}"),
    }
}

/// Tests that measure time on this 2-core machine (hostile tenants, strangers, fairness,
/// faults) take turns: each holds this while it runs, whatever module it is in.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
