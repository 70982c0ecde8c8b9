//! The member Lease: renewed with client-go's rules (decide on locally observed time, write
//! with resourceVersion preconditions, stop dispatching when a renewal has not succeeded within
//! the renew deadline), carrying what peers need to know in its annotations, written only as
//! part of a renewal so that publishing a view is atomic with proving liveness. After each
//! write the ring's Leases are listed (a consistent read, not a cache), so every dispatch
//! decision rests on a read made after this member's own claims were published.
//!
//! Runs on its own thread with its own runtime and API connection, like leader election: a
//! busy main runtime cannot delay a renewal, and a stalled one stops it (the heartbeat).

use super::view::{Record, State, decode_view, encode_view};
use super::{Ring, state_of};
use crate::leader::health::LeaseHealth;
use crate::leader::heartbeat::Liveness;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The label every member Lease of a ring carries (value: the ring's name).
pub(crate) const RING_LABEL: &str = "ctrlhub.io/ring";
const ADDRESS: &str = "ctrlhub.io/address";
const WEIGHT: &str = "ctrlhub.io/weight";
const STATE: &str = "ctrlhub.io/state";
const VIEW: &str = "ctrlhub.io/view";
const UNITS: &str = "ctrlhub.io/units";
const HELD: &str = "ctrlhub.io/held";
const INCARNATION: &str = "ctrlhub.io/incarnation";

/// How often the peers are read while a controller here waits for a peer's release.
const ACQUIRE_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
enum KeepError {
    #[error("member Lease request failed: {0}")]
    Api(#[from] kube::Error),
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
    #[error("{0}: not renewing, so that the other members take this member's units")]
    Stalled(#[from] crate::leader::heartbeat::Stalled),
    #[error(
        "member Lease {0} is held by another process (incarnation {1}) that has not let it expire yet; waiting"
    )]
    Taken(String, String),
}

/// The keeper's own memory between rounds.
struct Mine {
    /// This member's Lease as last read or written.
    lease: Option<Lease>,
    /// Another incarnation's Lease, and when its resourceVersion was seen to change.
    foreign: Option<(String, Instant)>,
    last_renew: Option<Instant>,
}

/// Keeps this member's Lease and reads the others' until `stop` fires; then deletes it (all
/// claims released at once).
pub(crate) struct Keeper {
    /// The ring handle it reports to.
    pub ring: Arc<Ring>,
    /// Its own client (built on its thread's runtime).
    pub api: Api<Lease>,
    /// The dispatch runtime's heartbeat.
    pub liveness: Liveness,
    /// Readiness' record of Lease round trips.
    pub health: LeaseHealth,
}

impl Keeper {
    /// Renew, list, report; every retry period or when a seal finished.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut mine = Mine {
            lease: None,
            foreign: None,
            last_renew: None,
        };
        let cfg = self.ring.config.clone();
        loop {
            let budget = match mine.last_renew {
                Some(at) => cfg.renew_deadline.saturating_sub(at.elapsed()),
                None => cfg.renew_deadline,
            }
            .max(Duration::from_millis(100));
            let round = tokio::time::timeout(budget, self.round(&mut mine));
            let result = tokio::select! {
                r = round => r.unwrap_or(Err(KeepError::Timeout(budget))),
                _ = stop.cancelled() => break,
            };
            match &result {
                Ok(()) => self.health.succeeded(),
                Err(e) => {
                    self.health.failed(&e.to_string());
                    tracing::warn!(error = %e, "member Lease round failed");
                }
            }
            let held = mine
                .last_renew
                .is_some_and(|at| at.elapsed() < cfg.renew_deadline);
            self.set_held(held);
            self.ring.refresh();
            if !self.until_next_renewal(cfg.retry_period, &stop).await {
                break;
            }
        }
        if self.ring.is_leaving() && mine.last_renew.is_some() {
            // One more renewal, then a retry period for every peer to list it: the units handed
            // over are still listed as held in it, so their new owners admit them as moved.
            let _ = tokio::time::timeout(cfg.retry_period, self.round(&mut mine)).await;
            tokio::time::sleep(cfg.retry_period).await;
        }
        self.set_held(false);
        self.ring.refresh();
        match tokio::time::timeout(Duration::from_secs(2), self.delete(&mine)).await {
            Ok(Ok(())) => tracing::info!("member Lease deleted: every unit released"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not delete the member Lease"),
            Err(_) => tracing::warn!("deleting the member Lease timed out"),
        }
    }

    /// Waits a retry period, or less when a seal finished (publish now). Meanwhile, while a
    /// controller here waits for a peer's release, reads the peers every [`ACQUIRE_POLL`], so
    /// a release is seen within that rather than within a retry period; reading needs no
    /// renewal, and this member's own claims were published before. False once `stop` fired.
    async fn until_next_renewal(&self, retry: Duration, stop: &CancellationToken) -> bool {
        let renew_at = tokio::time::Instant::now() + retry;
        loop {
            let poll = tokio::time::Instant::now() + ACQUIRE_POLL;
            let wake = if self.ring.acquiring() {
                poll.min(renew_at)
            } else {
                renew_at
            };
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.ring.publish_now.notified() => return true,
                // A controller started waiting: look again at once.
                _ = self.ring.poll_now.notified() => {}
                _ = stop.cancelled() => return false,
            }
            if tokio::time::Instant::now() >= renew_at {
                return true;
            }
            let read = tokio::time::timeout(ACQUIRE_POLL * 10, self.read_peers()).await;
            if matches!(read, Ok(Ok(()))) {
                self.ring.refresh();
            }
        }
    }

    fn set_held(&self, held: bool) {
        self.ring.known.lock().held = held;
        let was = self.ring.held.send_replace(held);
        if was != held {
            tracing::info!(held, identity = %self.ring.config.identity, "member Lease");
        }
    }

    /// One renewal (publishing what R1 allows), then one read of every member Lease.
    async fn round(&self, mine: &mut Mine) -> Result<(), KeepError> {
        self.liveness.check()?;
        let published = self.ring.publishable();
        self.renew(mine, &published).await?;
        mine.last_renew = Some(Instant::now());
        self.ring.published(published);
        let first = !self.ring.known.lock().read;
        self.read_peers().await?;
        if first {
            // Publish the view the peers give at once, not a retry period later.
            self.ring.known.lock().read = true;
            self.ring.publish_now.notify_one();
        }
        Ok(())
    }

    /// Write this member's Lease (create, renew in place, or take over an expired one).
    async fn renew(&self, mine: &mut Mine, view: &[super::Member]) -> Result<(), KeepError> {
        let name = self.ring.config.lease_name();
        let current = match mine.lease.take() {
            Some(l) => Some(l),
            None => self.api.get_opt(&name).await?,
        };
        let Some(current) = current else {
            let created = self
                .api
                .create(&PostParams::default(), &self.desired(None, view))
                .await?;
            mine.lease = Some(created);
            return Ok(());
        };
        self.check_foreign(mine, &current)?;
        match self
            .api
            .replace(
                &name,
                &PostParams::default(),
                &self.desired(Some(&current), view),
            )
            .await
        {
            Ok(updated) => {
                mine.lease = Some(updated);
                Ok(())
            }
            // Written meanwhile: read it again next round.
            Err(kube::Error::Api(s)) if s.code == 409 => Err(KeepError::Api(kube::Error::Api(s))),
            Err(e) => Err(e.into()),
        }
    }

    /// Another process with this identity wrote the Lease (a restart before the old one's
    /// Lease expired, or a misconfiguration): wait until it has not changed for its duration,
    /// by this process's clock, before taking it over.
    fn check_foreign(&self, mine: &mut Mine, current: &Lease) -> Result<(), KeepError> {
        let theirs = annotation(current, INCARNATION).unwrap_or_default();
        if theirs == self.ring.incarnation {
            mine.foreign = None;
            return Ok(());
        }
        let rv = current
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let seen = match &mine.foreign {
            Some((old, at)) if *old == rv => *at,
            _ => Instant::now(),
        };
        mine.foreign = Some((rv, seen));
        let duration = lease_duration(current);
        if seen.elapsed() > duration {
            return Ok(());
        }
        Err(KeepError::Taken(self.ring.config.lease_name(), theirs))
    }

    fn desired(&self, current: Option<&Lease>, view: &[super::Member]) -> Lease {
        let cfg = &self.ring.config;
        let now = MicroTime(jiff::Timestamp::now());
        let leaving = self.ring.known.lock().leaving;
        let units = self.ring.gates.lock().len();
        let mut annotations = current
            .and_then(|l| l.metadata.annotations.clone())
            .unwrap_or_default();
        let mut put = |k: &str, v: String| {
            annotations.insert(k.to_string(), v);
        };
        put(ADDRESS, cfg.address.clone());
        put(WEIGHT, cfg.weight.to_string());
        put(STATE, state_of(leaving).as_str().to_string());
        put(VIEW, encode_view(view));
        put(UNITS, units.to_string());
        put(HELD, self.ring.held_fingerprints());
        put(INCARNATION, self.ring.incarnation.clone());
        let mut labels = current
            .and_then(|l| l.metadata.labels.clone())
            .unwrap_or_default();
        labels.insert(RING_LABEL.to_string(), cfg.ring.clone());
        let spec = current.and_then(|l| l.spec.clone()).unwrap_or_default();
        Lease {
            metadata: ObjectMeta {
                name: Some(cfg.lease_name()),
                namespace: Some(cfg.namespace.clone()),
                resource_version: current.and_then(|l| l.metadata.resource_version.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..current.map(|l| l.metadata.clone()).unwrap_or_default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(15),
                ),
                acquire_time: spec.acquire_time.clone().or_else(|| Some(now.clone())),
                renew_time: Some(now),
                ..spec
            }),
        }
    }

    /// Every member Lease of the ring but this member's own, into the ring's peers.
    async fn read_peers(&self) -> Result<(), KeepError> {
        let cfg = &self.ring.config;
        let selector = format!("{RING_LABEL}={}", cfg.ring);
        let list = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let records: Vec<Record> = list
            .items
            .iter()
            .filter_map(record)
            .filter(|r| r.identity != cfg.identity)
            .collect();
        let gone: Vec<String> = {
            let known = self.ring.known.lock();
            known
                .peers
                .all()
                .map(|p| p.record.identity.clone())
                .filter(|id| !records.iter().any(|r| r.identity == *id))
                .collect()
        };
        for id in gone {
            self.ring.metrics.ring.set_peer(&id, None);
        }
        self.ring
            .known
            .lock()
            .peers
            .observe(records, Instant::now());
        Ok(())
    }

    async fn delete(&self, mine: &Mine) -> Result<(), kube::Error> {
        if mine.lease.is_none() && mine.last_renew.is_none() {
            return Ok(());
        }
        match self
            .api
            .delete(&self.ring.config.lease_name(), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn annotation(lease: &Lease, key: &str) -> Option<String> {
    lease.metadata.annotations.as_ref()?.get(key).cloned()
}

fn lease_duration(lease: &Lease) -> Duration {
    let secs = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(15)
        .max(1);
    Duration::from_secs(u64::try_from(secs).unwrap_or(15))
}

/// A peer's record from its Lease; None for a Lease with no holder (released) or no name.
fn record(lease: &Lease) -> Option<Record> {
    let identity = lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())?;
    let empty = BTreeMap::new();
    let a = lease.metadata.annotations.as_ref().unwrap_or(&empty);
    let get = |k: &str| a.get(k).cloned().unwrap_or_default();
    Some(Record {
        address: get(ADDRESS),
        weight: get(WEIGHT).parse().unwrap_or(0),
        state: State::parse(&get(STATE)),
        view: decode_view(&get(VIEW)),
        units: get(UNITS).parse().unwrap_or(0),
        held: get(HELD)
            .split(',')
            .filter_map(|f| u64::from_str_radix(f, 16).ok())
            .collect(),
        incarnation: get(INCARNATION),
        resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
        lease_duration: lease_duration(lease),
        identity,
    })
}
