//! Lease-based leader election following client-go's algorithm: decide on locally observed time
//! (never compare clocks across machines), write with resourceVersion preconditions, step down
//! when a renew has not succeeded within the renew deadline — which is shorter than the lease, so
//! the old leader stops dispatching before anyone else may take over — and release on shutdown
//! so a successor starts within about a retry period.
//!
//! A leader whose dispatch runtime has stalled ([`heartbeat`]) stops renewing, so a standby
//! takes over instead of every tenant waiting behind a leader that holds its Lease and does
//! nothing.
//!
//! Owns: the Lease, the leadership state every other part watches, and the runtime heartbeat.
//! May call: the Kubernetes client, and `metrics` (leader transitions). It runs on its own
//! thread and shares no lock with dispatch.

pub(crate) mod health;
pub(crate) mod heartbeat;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Leader-election settings (reference: 15 s lease, 10 s renew deadline, 2 s retry).
#[derive(Debug, Clone)]
pub(crate) struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This manager's identity (pod name or host + random suffix).
    pub identity: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// Interval between attempts.
    pub retry_period: Duration,
}

/// What this manager knows about leadership.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LeaderState {
    /// Whether this manager holds the lease.
    pub leading: bool,
    /// The holder as last observed.
    pub holder: Option<String>,
}

#[derive(Debug, thiserror::Error)]
enum LeaseError {
    #[error("lease request failed: {0}")]
    Api(#[from] kube::Error),
    #[error(
        "no answer from the API server to the lease request within {0:?} (the API server is slow or unreachable)"
    )]
    Timeout(Duration),
    #[error("{0}: not renewing, so that a standby takes over")]
    Stalled(#[from] heartbeat::Stalled),
}

struct Observed {
    holder: Option<String>,
    resource_version: Option<String>,
    at: Instant,
    duration: Duration,
    /// The Lease as last read or written: while this manager holds it, a renewal writes over
    /// it at once (one round trip, as client-go's fast path), reading it again only on a
    /// conflict.
    lease: Option<Lease>,
}

/// The elector: run it, and read leadership from its channels.
pub(crate) struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    state: watch::Sender<LeaderState>,
    leading: watch::Sender<bool>,
    /// The dispatch runtime's heartbeat: no Lease is taken or renewed while it is stalled.
    liveness: Option<heartbeat::Liveness>,
    /// Counts the times this replica becomes leader.
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// Where each attempt's outcome is recorded for `/readyz`.
    health: Option<health::LeaseHealth>,
}

impl Elector {
    /// An elector for the Lease in `config`.
    pub(crate) fn new(client: kube::Client, config: LeaderConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        let (state, _) = watch::channel(LeaderState::default());
        let (leading, _) = watch::channel(false);
        Elector {
            api,
            config,
            state,
            leading,
            liveness: None,
            metrics: None,
            health: None,
        }
    }

    /// Count each time this replica becomes leader in `ctrlhub_leader_transitions_total`.
    pub(crate) fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        metrics.preinitialise_leader(&self.config.name);
        self.metrics = Some(metrics);
        self
    }

    /// Neither take nor renew the Lease while `liveness` says the dispatch runtime is stalled.
    pub(crate) fn with_liveness(mut self, liveness: heartbeat::Liveness) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// Record every attempt's outcome in `health`, so readiness says when this manager can
    /// neither hold nor contend for its Lease.
    pub(crate) fn with_health(mut self, health: health::LeaseHealth) -> Self {
        self.health = Some(health);
        self
    }

    /// One attempt, unless the dispatch runtime is stalled: leading a runtime that cannot
    /// dispatch would hold every tenant's work.
    async fn attempt(
        &self,
        observed: &mut Option<Observed>,
        leading: bool,
    ) -> Result<bool, LeaseError> {
        if let Some(live) = &self.liveness {
            live.check()?;
        }
        if leading && let Some(renewed) = self.renew_in_place(observed).await? {
            return Ok(renewed);
        }
        self.try_acquire_or_renew(observed).await
    }

    /// The leader's renewal in one round trip: write over the Lease as last seen. None when
    /// there is nothing to write over or someone else wrote it meanwhile (then read it again).
    async fn renew_in_place(
        &self,
        observed: &mut Option<Observed>,
    ) -> Result<Option<bool>, LeaseError> {
        let Some(current) = observed.as_ref().and_then(|o| o.lease.clone()) else {
            return Ok(None);
        };
        let lease = self.desired(Some(&current));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                *observed = Some(self.mine(updated));
                Ok(Some(true))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// What this manager knows once it has written the Lease.
    fn mine(&self, updated: Lease) -> Observed {
        Observed {
            holder: Some(self.config.identity.clone()),
            resource_version: updated.metadata.resource_version.clone(),
            at: Instant::now(),
            duration: self.config.lease_duration,
            lease: Some(updated),
        }
    }

    /// Leadership as a boolean, for dispatch loops.
    pub(crate) fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Leadership with the observed holder, for status and UNAVAILABLE hints.
    pub(crate) fn state(&self) -> watch::Receiver<LeaderState> {
        self.state.subscribe()
    }

    fn publish(&self, leading: bool, holder: Option<String>) {
        self.state.send_if_modified(|s| {
            let next = LeaderState {
                leading,
                holder: holder.clone(),
            };
            let changed = *s != next;
            *s = next;
            changed
        });
        let became_leader = self.leading.send_if_modified(|l| {
            let changed = *l != leading;
            *l = leading;
            changed
        }) && leading;
        if became_leader && let Some(m) = &self.metrics {
            m.leader_transition(&self.config.name);
        }
    }

    /// Campaign, lead and release until `stop` fires.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut observed: Option<Observed> = None;
        let mut last_renew: Option<Instant> = None;
        loop {
            let leading = *self.leading.borrow();
            // As client-go's components do: the leader's renewal has what is left of its renew
            // deadline, a candidate's attempt the whole renew deadline (a slow API server must
            // not keep every replica from taking an expired Lease).
            let budget = match (leading, last_renew) {
                (true, Some(at)) => self.config.renew_deadline.saturating_sub(at.elapsed()),
                _ => self.config.renew_deadline,
            }
            .max(Duration::from_millis(100));
            let attempt = tokio::time::timeout(budget, self.attempt(&mut observed, leading));
            let result = tokio::select! {
                r = attempt => r.unwrap_or(Err(LeaseError::Timeout(budget))),
                _ = stop.cancelled() => break,
            };
            if let Some(h) = &self.health {
                match &result {
                    Ok(_) => h.succeeded(),
                    Err(e) => h.failed(&e.to_string()),
                }
            }
            match result {
                Ok(true) => {
                    if !leading {
                        tracing::info!(identity = %self.config.identity, lease = %format!("{}/{}", self.config.namespace, self.config.name), "became leader");
                    }
                    last_renew = Some(Instant::now());
                    self.publish(true, Some(self.config.identity.clone()));
                }
                Ok(false) => {
                    if leading {
                        tracing::warn!("lost the lease to another holder; stepping down");
                    }
                    last_renew = None;
                    self.publish(false, observed.as_ref().and_then(|o| o.holder.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease attempt failed");
                    if leading
                        && last_renew.is_none_or(|at| at.elapsed() >= self.config.renew_deadline)
                    {
                        tracing::warn!(
                            "could not renew within the renew deadline; stepping down before the lease can expire elsewhere"
                        );
                        last_renew = None;
                        self.publish(false, None);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_period) => {}
                _ = stop.cancelled() => break,
            }
        }
        if *self.leading.borrow() {
            self.publish(false, None);
            match tokio::time::timeout(Duration::from_secs(2), self.release()).await {
                Ok(Ok(())) => tracing::info!("released the lease"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not release the lease"),
                Err(_) => tracing::warn!("releasing the lease timed out"),
            }
        }
    }

    fn desired(&self, current: Option<&Lease>) -> Lease {
        let now = MicroTime(jiff::Timestamp::now());
        let spec = current.and_then(|l| l.spec.clone()).unwrap_or_default();
        let was_mine = spec.holder_identity.as_deref() == Some(self.config.identity.as_str());
        let transitions = spec.lease_transitions.unwrap_or(0);
        Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                resource_version: current.and_then(|l| l.metadata.resource_version.clone()),
                ..current.map(|l| l.metadata.clone()).unwrap_or_default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(15),
                ),
                acquire_time: if was_mine {
                    spec.acquire_time.clone()
                } else {
                    Some(now.clone())
                },
                renew_time: Some(now),
                lease_transitions: Some(if was_mine || current.is_none() {
                    transitions
                } else {
                    transitions + 1
                }),
                ..spec
            }),
        }
    }

    async fn try_acquire_or_renew(
        &self,
        observed: &mut Option<Observed>,
    ) -> Result<bool, LeaseError> {
        let current = self.api.get_opt(&self.config.name).await?;
        let Some(current) = current else {
            let lease = self.desired(None);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let rv = current.metadata.resource_version.clone();
        // Expiry is judged by when *we* saw the record change, never by the renewTime written with
        // another machine's clock.
        let changed = observed.as_ref().is_none_or(|o| o.resource_version != rv);
        if changed {
            let secs = spec.lease_duration_seconds.unwrap_or(15).max(1);
            *observed = Some(Observed {
                holder: holder.clone(),
                resource_version: rv,
                at: Instant::now(),
                duration: Duration::from_secs(u64::try_from(secs).unwrap_or(15)),
                lease: Some(current.clone()),
            });
        }
        let mine = holder.as_deref() == Some(self.config.identity.as_str());
        let expired = observed
            .as_ref()
            .is_some_and(|o| o.at.elapsed() > o.duration);
        if !mine && holder.is_some() && !expired {
            return Ok(false);
        }
        let lease = self.desired(Some(&current));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                *observed = Some(self.mine(updated));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn release(&self) -> Result<(), LeaseError> {
        let Some(current) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let mut lease = current.clone();
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..spec
        });
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}
