//! What one run measures: its sizes ([`Plan`]) and its figures, per ring size ([`Steady`]), per
//! membership change ([`Change`]) and in all ([`Figures`]).

use super::costs::Memory;
use std::time::Duration;

/// Sizes of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Controllers (units).
    pub controllers: usize,
    /// Replicas per controller.
    pub replicas: usize,
    /// Widgets per controller namespace.
    pub objects: usize,
    /// Updates per second, over all namespaces, while CPU per reconcile is measured (split
    /// evenly, rounded down per namespace: 400 over 30 namespaces is 13/s each, 390/s).
    pub rate: u32,
    /// How long the updates run at each N.
    pub load: Duration,
    /// Updates per second during the handovers.
    pub handover_rate: u32,
    /// The idle window at each N.
    pub idle: Duration,
    /// Connects per routing figure (direct, and through a redirect).
    pub connects: usize,
    /// `owner()` evaluations per HRW figure over 3 members (a thirtieth over 100).
    pub hrw_evals: usize,
}

impl Plan {
    /// The full run with `controllers` controllers.
    pub fn full(controllers: usize) -> Plan {
        Plan {
            controllers,
            replicas: 2,
            objects: 1_000,
            rate: 400,
            load: Duration::from_secs(25),
            handover_rate: 60,
            idle: Duration::from_secs(10),
            connects: 50,
            hrw_evals: 3_000_000,
        }
    }

    /// A run of seconds per phase with `controllers` controllers (`--quick`, the smoke test).
    pub fn quick(controllers: usize) -> Plan {
        Plan {
            controllers,
            replicas: 2,
            objects: 20,
            rate: 100,
            load: Duration::from_secs(3),
            handover_rate: 20,
            idle: Duration::from_secs(2),
            connects: 4,
            hrw_evals: 30_000,
        }
    }
}

/// One ring size, settled.
#[derive(Debug, Clone)]
pub struct Steady {
    /// Per member: identity, units its `/status` owns, and under load (Δ CPU seconds,
    /// Δ reconciles), then idle CPU-ms/s.
    pub members: Vec<(String, usize, (f64, f64), f64)>,
    /// Whether every unit is owned where `hrw::owner` says.
    pub matches: bool,
    /// Lease writes (create, update, patch) per second per member, idle.
    pub lease_writes: f64,
    /// Lease reads (get, list) per second per member, idle.
    pub lease_reads: f64,
    /// Mean JSON size of a member Lease (bytes).
    pub lease_bytes: usize,
    /// Reconciles per second over all members while the updates ran.
    pub reconciles_per_s: f64,
}

impl Steady {
    /// CPU-ms per 1,000 reconciles summed over the members.
    pub fn cpu_per_1k(&self) -> f64 {
        let (cpu, rec) = self
            .members
            .iter()
            .fold((0.0, 0.0), |(c, r), m| (c + m.2.0, r + m.2.1));
        if rec > 0.0 { cpu * 1e6 / rec } else { 0.0 }
    }

    pub(super) fn json(&self) -> serde_json::Value {
        let members: Vec<_> = self.members.iter().map(|(id, units, (cpu, rec), idle)| {
            serde_json::json!({"identity": id, "units": units, "loadCpuSeconds": cpu, "loadReconciles": rec,
                "cpuMsPer1000Reconciles": if *rec > 0.0 { Some(cpu * 1e6 / rec) } else { None },
                "idleCpuMsPerSecond": idle})
        }).collect();
        serde_json::json!({"n": self.members.len(), "matchesHrw": self.matches, "members": members,
            "cpuMsPer1000Reconciles": self.cpu_per_1k(), "leaseWritesPerSecondPerMember": self.lease_writes,
            "leaseReadsPerSecondPerMember": self.lease_reads, "leaseBytes": self.lease_bytes, "reconcilesPerSecond": self.reconciles_per_s})
    }
}

/// One membership change.
#[derive(Debug, Clone, Default)]
pub struct Change {
    /// Units whose owner changed.
    pub moved: usize,
    /// Units the function moves.
    pub expected: usize,
    /// Moved units the function does not move, plus units it moves that did not.
    pub collateral: usize,
    /// Per moved unit: the seal (empty for a crash).
    pub seal: Vec<Duration>,
    /// Per moved unit: seal end (the `Revoked`) → first dispatch at the successor; for a
    /// crash, the kill → first dispatch there.
    pub to_dispatch: Vec<Duration>,
}

impl Change {
    pub(super) fn json(&self) -> serde_json::Value {
        let secs = |v: &[Duration]| v.iter().map(Duration::as_secs_f64).collect::<Vec<_>>();
        serde_json::json!({"moved": self.moved, "expected": self.expected, "collateral": self.collateral,
            "sealSeconds": secs(&self.seal), "toFirstDispatchSeconds": secs(&self.to_dispatch)})
    }
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Figures {
    /// N = 1, 2, 3.
    pub steady: Vec<Steady>,
    /// 2→3.
    pub join: Change,
    /// 3→2 by SIGTERM.
    pub leave: Change,
    /// 3→2 by SIGKILL.
    pub crash: Change,
    /// Dispatches of a key in flight at another replica, over the whole run.
    pub overlaps: u64,
    /// Requests dispatched over the whole run.
    pub dispatched: u64,
    /// Connect → first request: direct, and through one redirect.
    pub routing: (Vec<Duration>, Vec<Duration>),
    /// Memory rings.
    pub memory: Vec<Memory>,
    /// (members, ns per `owner()` evaluation).
    pub hrw: Vec<(usize, f64)>,
}
