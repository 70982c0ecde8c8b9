//! Scale-out: ring members (`ctrlhub run --mode ring`) sharing the registered controllers,
//! measured with N = 1, 2 and 3 members in one run and one process layout on devcluster
//! (design: `scale-out.md` §6.2). 30 controllers (`--controllers`) of 2 raw replicas each, one
//! namespace of Widgets per controller, replicas in the harness' process that follow redirects
//! and `UNIT_MOVED` by hand, and the bench's fast leases (3 s lease, 2 s renew deadline, 500 ms
//! retry).
//!
//! The run: 1 member, then 2, then a third joins (2→3), the first member leaves by SIGTERM
//! (3→2), a fourth joins and one is SIGKILLed (3→2). At each N, with the ring settled: the units
//! each member's `/status` owns against `ctrlhub::members::hrw::owner`; idle CPU-ms/s and Lease
//! requests per member; CPU-ms per 1,000 reconciles per member under steady updates spread over
//! every controller. Across each move: the units moved against the function's set (collateral
//! moves must be 0), per moved unit the seal and seal → first dispatch at the successor (join:
//! seal from the old owner's `/status` moves; leave: SIGTERM → `Revoked` at the replica), and
//! kill → first dispatch for the crash; every dispatch of a key still in flight at another
//! replica is counted (must be 0). At N = 3: Connect → Registered → first request direct and
//! through one redirect. Then fresh rings for memory (configs D and S, N = 1 and 3), and the
//! assignment function's cost over 3 and 100 members.

mod bed;
mod changes;
pub mod costs;
pub mod figures;
pub mod replicas;
pub mod ring;
mod table;

use crate::env::Cluster;
use crate::report::Outcome;
use anyhow::Result;
use bed::Bed;
use costs::{Config, Memory};
pub use figures::{Change, Figures, Plan, Steady};
use replicas::{Shared, Spec};
use std::time::Duration;

/// devcluster with `plan.objects` Widgets in each controller's namespace (and 5 for the routing
/// phase), the first member, and every controller's replicas registered and owned.
async fn start(plan: &Plan) -> Result<Bed> {
    let c = Cluster::start().await?;
    let names: Vec<String> = (0..plan.controllers)
        .map(|i| format!("so-c{i:02}"))
        .collect();
    let namespaces: Vec<String> = (0..plan.controllers)
        .map(|i| format!("so-{i:02}"))
        .collect();
    eprintln!(
        "scale-out: {} controllers × {} Widgets",
        plan.controllers, plan.objects
    );
    for ns in &namespaces {
        c.create_widgets(ns, plan.objects, 64).await?;
    }
    c.create_widgets(changes::ROUTE_NS, 5, 8).await?;
    let mut bed = Bed {
        c,
        plan: plan.clone(),
        names,
        namespaces,
        members: Vec::new(),
        log: Shared::default(),
        tasks: Vec::new(),
    };
    bed.add_member("so-1").await?;
    for (i, name) in bed.names.iter().enumerate() {
        for r in 0..plan.replicas {
            let spec = Spec {
                name: name.clone(),
                namespace: Some(bed.namespaces[i].clone()),
                predicate: None,
            };
            bed.tasks
                .push(replicas::spawn(bed.log.clone(), spec, i + r));
        }
    }
    bed.settle().await?;
    Ok(bed)
}

/// N = 1, 2, the join, N = 3 and routing, the SIGTERM, a fourth member, the SIGKILL.
async fn ring_phases(bed: &mut Bed) -> Result<Figures> {
    let mut steady = vec![bed.steady().await?];
    bed.join("so-2").await?;
    steady.push(bed.steady().await?);
    let join = changes::join(bed, "so-3").await?;
    bed.quiet().await?;
    steady.push(bed.steady().await?);
    let routing = changes::routing(bed).await?;
    let leave = changes::leave(bed).await?;
    bed.join("so-4").await?;
    bed.quiet().await?;
    let crash = changes::crash(bed).await?;
    bed.quiet().await?;
    for t in bed.tasks.drain(..) {
        t.abort();
    }
    for m in &mut bed.members {
        m.kill().await;
    }
    let l = bed.log.lock();
    Ok(Figures {
        steady,
        join,
        leave,
        crash,
        overlaps: l.overlaps,
        dispatched: l.dispatched,
        routing,
        memory: Vec::new(),
        hrw: Vec::new(),
    })
}

/// Runs the whole scenario at `plan`'s sizes.
pub async fn measure(plan: &Plan) -> Result<Figures> {
    let mut bed = start(plan).await?;
    let mut f = ring_phases(&mut bed).await?;
    let total = plan.controllers * plan.objects + 5;
    for config in [Config::Disjoint, Config::Shared] {
        for n in [1, 3] {
            eprintln!("scale-out: memory, config {}, N = {n}", config.letter());
            let sizes = (plan.objects, total);
            let m = costs::memory(&bed.c, config, n, &bed.names, &bed.namespaces, sizes).await?;
            f.memory.push(m);
        }
    }
    let evals = plan.hrw_evals;
    f.hrw = tokio::task::spawn_blocking(move || {
        vec![
            (3, costs::hrw_ns(3, evals)),
            (100, costs::hrw_ns(100, evals / 30)),
        ]
    })
    .await?;
    Ok(f)
}

/// Runs the scenario with `plan` and reports it.
pub async fn run(plan: &Plan) -> Result<Outcome> {
    let f = measure(plan).await?;
    let rows = table::rows(&f);
    let ms = |v: &[Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
    let json = serde_json::json!({
        "controllers": plan.controllers, "replicas": plan.replicas, "objectsPerController": plan.objects,
        "updatesPerSecond": plan.rate, "loadSeconds": plan.load.as_secs_f64(), "idleSeconds": plan.idle.as_secs_f64(),
        "leaseSeconds": ring::LEASE.as_secs(), "renewDeadlineSeconds": 2, "retryPeriodMs": 500,
        "steady": f.steady.iter().map(Steady::json).collect::<Vec<_>>(),
        "join": f.join.json(), "leave": f.leave.json(), "crash": f.crash.json(),
        "concurrentDuplicates": f.overlaps, "dispatched": f.dispatched,
        "routing": {"directMs": ms(&f.routing.0), "redirectMs": ms(&f.routing.1)},
        "memory": f.memory.iter().map(Memory::json).collect::<Vec<_>>(),
        "hrw": f.hrw.iter().map(|(n, ns)| serde_json::json!({"members": n, "nsPerEvaluation": ns})).collect::<Vec<_>>(),
    });
    Ok(Outcome {
        scenario: "scale-out".into(),
        rows,
        json,
    })
}
