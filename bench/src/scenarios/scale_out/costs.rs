//! What a ring costs besides handovers: the resident memory of each member for 30 controllers on
//! disjoint namespaces (config D) and on one shared, cluster-wide kind (config S), with 1 and
//! with 3 members; and the CPU of the assignment function itself.

use super::replicas::{self, Log, Shared, Spec};
use super::ring::{self, addr, expected};
use crate::env::{Cluster, Manager, settled_rss};
use anyhow::Result;
use ctrlhub::members::hrw::{Member, Unit, owner};
use ctrlhub_tests::poll_until;
use std::time::Instant;

/// How the controllers of a memory ring watch Widgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Config {
    /// Each controller on its own namespace: one informer per controller.
    Disjoint,
    /// Every controller on Widgets in every namespace: one informer per member holding any.
    Shared,
}

impl Config {
    /// `D` or `S` (the design's names).
    pub fn letter(self) -> &'static str {
        match self {
            Config::Disjoint => "D",
            Config::Shared => "S",
        }
    }
}

/// One memory ring's figures.
#[derive(Debug, Clone)]
pub struct Memory {
    /// D or S.
    pub config: Config,
    /// Members in the ring.
    pub members: usize,
    /// Per member: (units it owns, settled RSS before any controller, settled RSS after).
    pub per_member: Vec<(usize, u64, u64)>,
    /// Per member, when its RSS was read: (informers running, objects they hold).
    pub held: Vec<(usize, u64)>,
}

impl Memory {
    /// JSON figures.
    pub fn json(&self) -> serde_json::Value {
        let per: Vec<_> = self
            .per_member
            .iter()
            .zip(&self.held)
            .map(|((u, b, r), (i, o))| serde_json::json!({"units": u, "baselineRssBytes": b, "rssBytes": r, "informers": i, "objects": o}))
            .collect();
        serde_json::json!({"config": self.config.letter(), "members": self.members, "perMember": per})
    }
}

/// Settled RSS of each member of a fresh ring of `n`, before and after `names` register with a
/// predicate no Widget passes (so only caches grow, as in the memory scenario), each on the
/// namespace of the same index (D) or on every namespace (S). `objects` Widgets exist per
/// namespace, `total` in all.
pub async fn memory(
    c: &Cluster,
    config: Config,
    n: usize,
    names: &[String],
    namespaces: &[String],
    (objects, total): (usize, usize),
) -> Result<Memory> {
    let ring_name = format!("mem-{}{n}", config.letter().to_lowercase());
    let mut members = Vec::new();
    for i in 0..n {
        members.push(ring::member(c, &format!("{ring_name}-{i}"), &ring_name).await?);
    }
    let refs: Vec<&Manager> = members.iter().collect();
    ring::settled(&refs).await?;
    let mut baselines = Vec::new();
    for m in &members {
        baselines.push(settled_rss(&[m.process.pid()]).await);
    }
    let log: Shared = Log::serving(members.iter().map(addr).collect());
    let tasks: Vec<_> = names
        .iter()
        .zip(namespaces)
        .enumerate()
        .map(|(i, (name, ns))| {
            let spec = Spec {
                name: name.clone(),
                namespace: (config == Config::Disjoint).then(|| ns.clone()),
                predicate: Some(super::super::memory::never()),
            };
            replicas::spawn(log.clone(), spec, i)
        })
        .collect();
    let want = expected(&ring_name, names, &refs);
    ring::wait_owned(&refs, &want).await?;
    let (mut per_member, mut held) = (Vec::new(), Vec::new());
    for (m, base) in members.iter().zip(baselines) {
        let units = want.values().filter(|o| **o == m.identity).count();
        let objects_held = match config {
            Config::Disjoint => units * objects,
            Config::Shared if units > 0 => total,
            Config::Shared => 0,
        };
        let what = format!("{} to cache {objects_held} Widgets", m.identity);
        poll_until(&what, super::super::LOAD_PATIENCE, || async {
            match m.informer_objects().await {
                held if held >= objects_held as u64 => Ok(()),
                held => Err(format!("{held} held")),
            }
        })
        .await?;
        per_member.push((units, base, settled_rss(&[m.process.pid()]).await));
        let informers = m.status().await["informers"].as_array().map_or(0, Vec::len);
        held.push((informers, m.informer_objects().await));
    }
    for t in tasks {
        t.abort();
    }
    // Killed, not stopped: a graceful stop would hand every unit to the others first.
    for m in &mut members {
        m.kill().await;
    }
    Ok(Memory {
        config,
        members: n,
        per_member,
        held,
    })
}

/// Nanoseconds per `owner()` evaluation over `members` members (weight 100 each), averaged over
/// `evals` evaluations cycling through 1,000 units.
pub fn hrw_ns(members: usize, evals: usize) -> f64 {
    let ms: Vec<Member> = (0..members)
        .map(|i| Member {
            identity: format!("ctrlhub-{i}"),
            weight: 100,
        })
        .collect();
    let units: Vec<Unit> = (0..1000)
        .map(|i| Unit::new(&format!("team-{}", i % 17), &format!("controller-{i}")))
        .collect();
    let start = Instant::now();
    let mut picked = 0usize;
    for i in 0..evals {
        let unit = std::hint::black_box(&units[i % units.len()]);
        if let Some(m) = owner("ctrlhub", unit, &ms) {
            picked += m.identity.len();
        }
    }
    std::hint::black_box(picked);
    start.elapsed().as_nanos() as f64 / evals.max(1) as f64
}
