//! What readiness knows about the manager's link to the API server: whether the API server
//! answers at all ([`ApiReachability`], a cheap request on a timer) and whether the election's
//! Lease round trips succeed ([`LeaseHealth`], recorded by the elector after every attempt).
//!
//! Both are read from memory: a kubelet probe never becomes an API request, and never waits on
//! one, so `/readyz` answers at once even while the API server hangs.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the API server is asked for its version.
pub(crate) const API_PROBE_EVERY: Duration = Duration::from_secs(5);
/// How long one such request may take before the API server counts as unreachable.
pub(crate) const API_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// A probe result older than this means the probing task itself has not run (a stalled
/// runtime): the last answer is no longer evidence of anything.
const API_PROBE_STALE: Duration = Duration::from_secs(15);

/// One recorded outcome: when, and the error if it failed.
#[derive(Debug, Clone)]
struct Outcome {
    at: Instant,
    error: Option<String>,
    /// When the current run of failures began (None while succeeding).
    failing_since: Option<Instant>,
}

/// The latest outcome of something retried on a timer, shared between the task that retries
/// it and the probe that reports it.
#[derive(Debug, Clone, Default)]
struct Latest(Arc<Mutex<Option<Outcome>>>);

impl Latest {
    fn record(&self, result: Result<(), String>, now: Instant) {
        let mut latest = self.0.lock();
        let failing_since = match (&result, latest.as_ref()) {
            (Ok(()), _) => None,
            (Err(_), Some(prev)) => prev.failing_since.or(Some(now)),
            (Err(_), None) => Some(now),
        };
        *latest = Some(Outcome {
            at: now,
            error: result.err(),
            failing_since,
        });
    }

    /// The latest outcome as a check: its error, with how long it has been failing.
    fn check(&self, now: Instant, pending: &str) -> Result<(), String> {
        let latest = self.0.lock();
        let Some(o) = latest.as_ref() else {
            return Err(pending.to_string());
        };
        match (&o.error, o.failing_since) {
            (None, _) => Ok(()),
            (Some(e), Some(since)) => Err(format!(
                "{e} (failing for {:.0}s)",
                now.saturating_duration_since(since).as_secs_f64()
            )),
            (Some(e), None) => Err(e.clone()),
        }
    }

    fn age(&self, now: Instant) -> Option<Duration> {
        self.0
            .lock()
            .as_ref()
            .map(|o| now.saturating_duration_since(o.at))
    }
}

/// Whether the election's latest Lease round trip succeeded: the leader renewed, or a standby
/// read the Lease (and, once it expired, contended for it). A failure is what the API server
/// answered (403 without the Lease RBAC, 503, a timeout), so `/readyz?verbose` says why.
#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseHealth(Latest);

impl LeaseHealth {
    /// The election's latest attempt got its answer.
    pub(crate) fn succeeded(&self) {
        self.0.record(Ok(()), Instant::now());
    }

    /// The election's latest attempt failed with `why`.
    pub(crate) fn failed(&self, why: &str) {
        self.0.record(Err(why.to_string()), Instant::now());
    }

    /// Ok while the latest attempt succeeded.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.0
            .check(Instant::now(), "no Lease round trip has finished yet")
    }
}

/// Whether the API server answers: `GET /version` (allowed to everyone, authenticated or not,
/// by Kubernetes' `system:public-info-viewer`) every [`API_PROBE_EVERY`], bounded by
/// [`API_PROBE_TIMEOUT`].
#[derive(Debug, Clone, Default)]
pub(crate) struct ApiReachability(Latest);

impl ApiReachability {
    /// Probes the API server through `client` on the current runtime until `stop` fires.
    pub(crate) fn spawn(client: kube::Client, stop: CancellationToken) -> Self {
        let reach = ApiReachability::default();
        let latest = reach.0.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(API_PROBE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.cancelled() => return,
                }
                let answer = tokio::time::timeout(API_PROBE_TIMEOUT, client.apiserver_version());
                let result = match answer.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("GET /version: {e}")),
                    Err(_) => Err(format!(
                        "GET /version: no answer within {}s",
                        API_PROBE_TIMEOUT.as_secs()
                    )),
                };
                latest.record(result, Instant::now());
            }
        });
        reach
    }

    /// Ok while the latest request was answered, and it is recent.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), String> {
        if let Some(age) = self.0.age(now)
            && age > API_PROBE_STALE
        {
            return Err(format!(
                "the API server has not been asked for {:.0}s (the probing task does not run)",
                age.as_secs_f64()
            ));
        }
        self.0.check(now, "the API server has not answered yet")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_reports_the_latest_outcome_and_how_long_it_has_failed() {
        let t0 = Instant::now();
        let l = Latest::default();
        assert_eq!(l.check(t0, "pending"), Err("pending".into()));
        l.record(Ok(()), t0);
        assert_eq!(l.check(t0, "pending"), Ok(()));
        l.record(Err("403 forbidden".into()), t0 + Duration::from_secs(1));
        l.record(Err("403 forbidden".into()), t0 + Duration::from_secs(3));
        assert_eq!(
            l.check(t0 + Duration::from_secs(4), "pending"),
            Err("403 forbidden (failing for 3s)".into())
        );
        l.record(Ok(()), t0 + Duration::from_secs(5));
        assert_eq!(l.check(t0 + Duration::from_secs(5), "pending"), Ok(()));
    }

    #[test]
    fn a_stale_api_probe_is_no_evidence() {
        let reach = ApiReachability::default();
        let t0 = Instant::now();
        reach.0.record(Ok(()), t0);
        assert!(reach.check_at(t0 + Duration::from_secs(1)).is_ok());
        let stale = reach.check_at(t0 + API_PROBE_STALE + Duration::from_secs(1));
        assert!(stale.is_err_and(|e| e.contains("has not been asked")));
    }
}
