//! Ring mode's wiring: the member Lease's thread, the task that hands moving controllers over,
//! and a graceful leave on shutdown.

use crate::dispatch::controllers::{ControllerTable, Gates};
use crate::leader::LeaderState;
use crate::leader::health::LeaseHealth;
use crate::leader::heartbeat::Liveness;
use crate::members::hrw::Unit;
use crate::members::keeper::Keeper;
use crate::members::{Ring, RingConfig};
use crate::metrics::Metrics;
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

impl Gates for Ring {
    fn gate(&self, group: &str, name: &str) -> watch::Receiver<bool> {
        Ring::gate(self, &Unit::new(group, name))
    }
}

/// The running member: its ring handle, and what leader mode's consumers watch (Lease held,
/// and a state naming this member while it holds it).
pub(super) struct Member {
    pub ring: Arc<Ring>,
    pub election: super::Election,
}

/// Starts the member Lease on a thread of its own, with its own runtime and connection to the
/// API server, like leader election.
pub(super) fn start(
    config: (kube::Config, RingConfig),
    liveness: Liveness,
    metrics: &Arc<Metrics>,
    health: LeaseHealth,
) -> anyhow::Result<Member> {
    let (kube_config, ring_config) = config;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the member-Lease runtime")?;
    let client = {
        let _inside = runtime.enter();
        crate::kubeclient::build(kube_config, &metrics.api, None)
            .context("building the member-Lease client")?
    };
    let identity = ring_config.identity.clone();
    let api = kube::Api::namespaced(client, &ring_config.namespace);
    let ring = Ring::new(ring_config, metrics.clone());
    let keeper = Keeper {
        ring: ring.clone(),
        api,
        liveness,
        health,
    };
    let stop = CancellationToken::new();
    let (done, finished) = tokio::sync::oneshot::channel();
    let run = keeper.run(stop.clone());
    std::thread::Builder::new()
        .name("member-lease".into())
        .spawn(move || {
            runtime.block_on(run);
            let _ = done.send(());
        })
        .context("starting the member-Lease thread")?;
    let leading = ring.held();
    let state = follow_held(leading.clone(), identity);
    Ok(Member {
        ring,
        election: super::Election {
            leading,
            state,
            stop,
            finished,
        },
    })
}

/// The leadership state leader mode's consumers read (status, probes, Registered), kept in
/// step with the member Lease: "leading" is "holding it", and the holder is this member.
fn follow_held(mut held: watch::Receiver<bool>, identity: String) -> watch::Receiver<LeaderState> {
    let (tx, rx) = watch::channel(LeaderState::default());
    tokio::spawn(async move {
        loop {
            let now = *held.borrow_and_update();
            tx.send_replace(LeaderState {
                leading: now,
                holder: now.then(|| identity.clone()),
            });
            if held.changed().await.is_err() {
                return;
            }
        }
    });
    rx
}

/// After every member-Lease round: seal each controller the ring now gives another member
/// (each on its own task, so one slow drain holds no other), and tell the ring when it is gone.
pub(super) fn follow_ring(
    controllers: Arc<ControllerTable>,
    ring: Arc<Ring>,
    stop: CancellationToken,
) {
    let mut rounds = ring.rounds();
    tokio::spawn(async move {
        loop {
            let present: Vec<_> = controllers
                .all()
                .into_iter()
                .map(|c| (Unit::new(&c.group, &c.id.name), c))
                .collect();
            let units: Vec<Unit> = present.iter().map(|(u, _)| u.clone()).collect();
            let held = *ring.held().borrow();
            for (unit, next) in ring.to_seal(&units) {
                let Some((_, controller)) = present.iter().find(|(u, _)| *u == unit) else {
                    continue;
                };
                // A member that lost its Lease stops at once: its successors may start as soon
                // as its Lease expires. One shutting down gives attempts already out the
                // shutdown grace, as leader mode does; a move, the handover drain.
                let drain = if !held {
                    Duration::ZERO
                } else if ring.is_leaving() {
                    ring.config().leave_drain
                } else {
                    ring.config().drain
                };
                let (controllers, ring, controller) =
                    (controllers.clone(), ring.clone(), controller.clone());
                tracing::info!(%unit, to = ?next, ?drain, "sealing a controller that another member owns now");
                tokio::spawn(async move {
                    controllers.seal(&controller, drain).await;
                    ring.released(&unit, next.map(|n| n.0));
                });
            }
            tokio::select! {
                r = rounds.changed() => if r.is_err() { return },
                _ = stop.cancelled() => return,
            }
        }
    });
}

/// Shutting down a member: publish "leaving" (the others take its units and its sessions are
/// sent to them), hand every controller over, and wait until none is left here, at most
/// `limit`. The member Lease is deleted after, when the keeper stops.
pub(super) async fn leave(ring: &Ring, controllers: &ControllerTable, limit: Duration) {
    ring.leave();
    tracing::info!("leaving the ring: handing every controller over to the other members");
    let deadline = tokio::time::Instant::now() + limit;
    while !controllers.all().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = controllers.all().len();
    if left > 0 {
        tracing::warn!(
            left,
            "controllers not handed over in time: their sessions are revoked and the others take them when this member's Lease is gone"
        );
    }
}
