//! The membership changes (a join, a SIGTERM, a SIGKILL) and the routing measurement, each
//! timed per unit from the replicas' log and checked against the assignment function.

use super::bed::{Bed, Load};
use super::figures::Change;
use super::replicas::{self, Spec};
use super::ring::{self, addr, expected};
use crate::env::Manager;
use anyhow::{Result, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The namespace of the routing phase's controllers.
pub(super) const ROUTE_NS: &str = "so-route";

/// Moved, expected and collateral counts between two ownership maps.
fn compare(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    want: &BTreeSet<String>,
) -> Change {
    let moved: BTreeSet<String> = after
        .iter()
        .filter(|(n, o)| before.get(*n) != Some(o))
        .map(|(n, _)| n.clone())
        .collect();
    Change {
        moved: moved.len(),
        expected: want.len(),
        collateral: moved.symmetric_difference(want).count(),
        ..Default::default()
    }
}

/// 2→3: a member joins; seals from the old owners' `/status`.
pub(super) async fn join(bed: &mut Bed, identity: &str) -> Result<Change> {
    eprintln!("scale-out: join 2→3");
    let before = bed.owners().await;
    let load = Load::start(
        &bed.c,
        &bed.namespaces,
        bed.plan.objects,
        bed.plan.handover_rate,
    );
    let t0 = Instant::now();
    bed.join(identity).await?;
    let joiner = addr(&bed.members[bed.members.len() - 1]);
    let after = bed.owners().await;
    let want: BTreeSet<String> = after
        .iter()
        .filter(|(_, o)| **o == identity)
        .map(|(n, _)| n.clone())
        .collect();
    let joined = ctrlhub_tests::poll_until(
        "the joiner dispatching its units",
        ctrlhub_tests::PATIENCE,
        || async {
            let l = bed.log.lock();
            let left = want
                .iter()
                .filter(|u| l.first_dispatch_at(u, t0, |m| m == joiner).is_none())
                .count();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} not yet"))
            }
        },
    );
    joined.await?;
    load.stop().await;
    let mut change = compare(&before, &after, &want);
    for name in &want {
        let Some(old) = bed
            .members
            .iter()
            .find(|m| before.get(name) == Some(&m.identity))
        else {
            continue;
        };
        if let Some(s) = ring::seal_seconds(&old.status().await, name) {
            change.seal.push(Duration::from_secs_f64(s));
        }
        let l = bed.log.lock();
        if let Some(rev) = l.revoked_at(name, &addr(old), t0)
            && let Some(first) = l.first_dispatch_at(name, rev, |m| m == joiner)
        {
            change.to_dispatch.push(first - rev);
        }
    }
    Ok(change)
}

/// 3→2: the first member leaves by SIGTERM.
pub(super) async fn leave(bed: &mut Bed) -> Result<Change> {
    eprintln!("scale-out: graceful leave 3→2");
    let before = bed.owners().await;
    let mut leaver = bed.members.remove(0);
    let from = addr(&leaver);
    let want: BTreeSet<String> = before
        .iter()
        .filter(|(_, o)| **o == leaver.identity)
        .map(|(n, _)| n.clone())
        .collect();
    let load = Load::start(
        &bed.c,
        &bed.namespaces,
        bed.plan.objects,
        bed.plan.handover_rate,
    );
    let t0 = Instant::now();
    leaver.signal("TERM");
    bed.serve_members();
    bed.wait_dispatched_elsewhere(&want, &from, t0).await?;
    if !leaver.exited(ctrlhub_tests::PATIENCE).await {
        bail!("the leaving member did not exit");
    }
    bed.settle().await?;
    load.stop().await;
    let mut change = compare(&before, &bed.owners().await, &want);
    let l = bed.log.lock();
    for name in &want {
        if let Some(rev) = l.revoked_at(name, &from, t0) {
            change.seal.push(rev - t0);
            if let Some(first) = l.first_dispatch_at(name, rev, |m| m != from) {
                change.to_dispatch.push(first - rev);
            }
        }
    }
    Ok(change)
}

/// 3→2: the first member is SIGKILLed.
pub(super) async fn crash(bed: &mut Bed) -> Result<Change> {
    eprintln!("scale-out: crash 3→2");
    let before = bed.owners().await;
    let mut dead = bed.members.remove(0);
    let from = addr(&dead);
    let want: BTreeSet<String> = before
        .iter()
        .filter(|(_, o)| **o == dead.identity)
        .map(|(n, _)| n.clone())
        .collect();
    let load = Load::start(
        &bed.c,
        &bed.namespaces,
        bed.plan.objects,
        bed.plan.handover_rate,
    );
    let t0 = Instant::now();
    dead.kill().await;
    bed.serve_members();
    bed.wait_dispatched_elsewhere(&want, &from, t0).await?;
    bed.settle().await?;
    load.stop().await;
    let mut change = compare(&before, &bed.owners().await, &want);
    let l = bed.log.lock();
    change.to_dispatch = want
        .iter()
        .filter_map(|n| l.first_dispatch_at(n, t0, |m| m != from))
        .map(|at| at - t0)
        .collect();
    Ok(change)
}

/// Connect → first request at N = 3, direct to the owner and through one redirect, each for
/// fresh controllers on a namespace every member already caches.
pub(super) async fn routing(bed: &Bed) -> Result<(Vec<Duration>, Vec<Duration>)> {
    eprintln!("scale-out: routing");
    let refs = bed.refs();
    let spec = |name: String| Spec {
        name,
        namespace: Some(ROUTE_NS.into()),
        predicate: None,
    };
    // One controller per member on the namespace: its informer is warm everywhere.
    let mut warm = BTreeMap::new();
    for m in &refs {
        let name = (0..).map(|i| format!("so-warm-{i}")).find(|n| {
            !warm.contains_key(n)
                && expected("ctrlhub", std::slice::from_ref(n), &refs)[n] == m.identity
        });
        if let Some(n) = name {
            warm.insert(n, m.identity.clone());
        }
    }
    let tasks: Vec<_> = warm
        .keys()
        .enumerate()
        .map(|(i, n)| replicas::spawn(bed.log.clone(), spec(n.clone()), i))
        .collect();
    ring::wait_owned(&refs, &warm).await?;
    let (mut direct, mut redirected) = (Vec::new(), Vec::new());
    for i in 0..bed.plan.connects {
        // One pair a second: each pair is two new registrations, and a member admits a tenant's
        // new registrations at 2/s after a burst of 10 (the default limits), which 100 connects
        // in a row would exceed.
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Alternating which goes first, so neither always finds the other's leftovers.
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for redirect in order {
            let name = format!("so-route-{i}-{}", if redirect { "r" } else { "d" });
            let owner = &expected("ctrlhub", std::slice::from_ref(&name), &refs)[&name];
            let others: Vec<&&Manager> = refs.iter().filter(|m| &m.identity != owner).collect();
            let first = if redirect {
                addr(others[i % others.len()])
            } else {
                bed.members
                    .iter()
                    .find(|m| &m.identity == owner)
                    .map(addr)
                    .unwrap_or_default()
            };
            let (took, hops) = replicas::time_to_first_request(&first, &spec(name.clone())).await?;
            if hops != u32::from(redirect) {
                bail!(
                    "{name}: {hops} redirects (expected {})",
                    u32::from(redirect)
                );
            }
            if redirect {
                redirected.push(took)
            } else {
                direct.push(took)
            }
        }
    }
    for t in tasks {
        t.abort();
    }
    Ok((direct, redirected))
}
