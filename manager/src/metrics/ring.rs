//! Ring mode's series: members, units by state, moves, handover times, units waiting for a
//! peer's release, what each peer last published, and redirects. A manager in leader mode
//! exports them too, at 0, so a dashboard shows one shape for both modes.

use super::{counter, fgauge, gauge, histogram};
use prometheus::{GaugeVec, HistogramVec, IntCounterVec, IntGaugeVec, Registry};
use std::time::Duration;

/// Handover buckets: a graceful move is sub-second to the drain timeout (5 s), a crash the
/// lease (15 s) and more.
const HANDOVER_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0];

/// The ring's series.
pub(crate) struct RingMetrics {
    members: IntGaugeVec,
    units: IntGaugeVec,
    moves: IntCounterVec,
    handover: HistogramVec,
    waiting: IntGaugeVec,
    peer_age: GaugeVec,
    peer_units: IntGaugeVec,
    redirects: IntCounterVec,
    exempt: IntCounterVec,
}

impl RingMetrics {
    /// Registers the series in `r`.
    pub(super) fn register(r: &Registry) -> Self {
        let m = RingMetrics {
            members: gauge(
                r,
                "ctrlhub_ring_members",
                "Live members in this member's view of the ring, itself included (ring mode; 0 in leader mode).",
                &[],
            ),
            units: gauge(
                r,
                "ctrlhub_ring_units",
                "Controllers (units) on this member by state: owned (dispatching), acquiring (attached, waiting for the previous owner's release), sealing (moving away).",
                &["state"],
            ),
            moves: counter(
                r,
                "ctrlhub_ring_unit_moves_total",
                "Units that moved to this member (in) or away from it (out).",
                &["direction"],
            ),
            handover: histogram(
                r,
                "ctrlhub_ring_handover_seconds",
                "Handover phases: seal (old owner: drain start to released) and acquire (new owner: first attach to dispatch allowed).",
                &["phase"],
                HANDOVER_BUCKETS.to_vec(),
            ),
            waiting: gauge(
                r,
                "ctrlhub_ring_units_waiting_release",
                "Units attached here whose previous owner has not released them for longer than the lease duration.",
                &[],
            ),
            peer_age: fgauge(
                r,
                "ctrlhub_ring_peer_renew_age_seconds",
                "Seconds since this member saw the peer's member Lease renewed.",
                &["peer"],
            ),
            peer_units: gauge(
                r,
                "ctrlhub_ring_peer_units",
                "Units the peer last published that it owns.",
                &["peer"],
            ),
            redirects: counter(
                r,
                "ctrlhub_ring_redirects_total",
                "Sessions answered with another member's address (the owner of their controller).",
                &["tenant"],
            ),
            exempt: counter(
                r,
                "ctrlhub_admission_exempt_moves_total",
                "Moved controllers admitted over a tenant limit: a unit that moved is never refused by this member's limits.",
                &["tenant"],
            ),
        };
        for state in ["owned", "acquiring", "sealing"] {
            m.units.with_label_values(&[state]).set(0);
        }
        for direction in ["in", "out"] {
            m.moves.with_label_values(&[direction]);
        }
        for phase in ["seal", "acquire"] {
            m.handover.with_label_values(&[phase]);
        }
        m.members.with_label_values::<&str>(&[]).set(0);
        m.waiting.with_label_values::<&str>(&[]).set(0);
        m
    }

    /// The members in the view and the units by state.
    pub(crate) fn set_shape(
        &self,
        members: usize,
        (owned, acquiring, sealing): (usize, usize, usize),
        waiting: usize,
    ) {
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.members.with_label_values::<&str>(&[]).set(n(members));
        self.units.with_label_values(&["owned"]).set(n(owned));
        self.units
            .with_label_values(&["acquiring"])
            .set(n(acquiring));
        self.units.with_label_values(&["sealing"]).set(n(sealing));
        self.waiting.with_label_values::<&str>(&[]).set(n(waiting));
    }

    /// A peer as last seen; `None` removes its series (its Lease is gone).
    pub(crate) fn set_peer(&self, peer: &str, seen: Option<(Duration, u32)>) {
        match seen {
            Some((age, units)) => {
                self.peer_age
                    .with_label_values(&[peer])
                    .set(age.as_secs_f64());
                self.peer_units
                    .with_label_values(&[peer])
                    .set(i64::from(units));
            }
            None => {
                let _ = self.peer_age.remove_label_values(&[peer]);
                let _ = self.peer_units.remove_label_values(&[peer]);
            }
        }
    }

    /// A unit moved in or out, its phase having taken `took`.
    pub(crate) fn moved(&self, direction: &str, phase: &str, took: Duration) {
        self.moves.with_label_values(&[direction]).inc();
        self.handover
            .with_label_values(&[phase])
            .observe(took.as_secs_f64());
    }

    /// A session of `tenant` was sent to another member.
    pub(crate) fn redirected(&self, tenant: &str) {
        self.redirects.with_label_values(&[tenant]).inc();
    }

    /// A moved unit of `tenant` was admitted over a limit.
    pub(crate) fn exempted(&self, tenant: &str) {
        self.exempt.with_label_values(&[tenant]).inc();
    }
}
