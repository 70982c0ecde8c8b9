//! Warm start: what the shared cache is worth to a controller that starts on a kind the manager
//! already caches. N Widgets exist; a manager runs controller A on them (3
//! `bench-sdk-controller` replicas of 16), and A has reconciled every object once, so the
//! manager's informer holds them all. Then controller B (another name, the same kind, namespace
//! and options, so the same informer) starts: timed from spawning B's processes until B has
//! reconciled every object once. Peer: an in-process `kube::runtime::Controller` (concurrency
//! 16) starting cold on the same objects, timed from its start: it lists every object, then
//! reconciles each. The devcluster list requests for Widgets during B's start are counted too: 0
//! is what "served from the shared cache" means.

use super::LOAD_PATIENCE;
use crate::contenders::kube_runtime;
use crate::env::{Cluster, Collector, Manager, PLURAL, Proc, sdk_controllers};
use crate::report::{Outcome, Row, Verdict};
use anyhow::Result;
use std::time::{Duration, Instant};

/// Namespace of the objects.
const NS: &str = "warm";
/// Concurrent creates while preparing the objects (untimed).
const CREATE_CONCURRENCY: usize = 64;
/// The goal: B's warm start at most this fraction of the peer's cold start.
pub const GOAL: f64 = 0.2;

/// The figures at one size.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Objects.
    pub objects: usize,
    /// Controller A's start on the cold manager (the informer's list included): context.
    pub first: Duration,
    /// Controller B's start on the warm manager: spawn to every object reconciled once.
    pub warm: Duration,
    /// The in-process kube-rs Controller's cold start: start to every object reconciled once.
    pub cold: Duration,
    /// Widget list requests devcluster served while B started (0 with a shared cache).
    pub warm_lists: u64,
}

impl Figures {
    /// Warm start over the peer's cold start.
    pub fn ratio(&self) -> f64 {
        self.warm.as_secs_f64() / self.cold.as_secs_f64().max(1e-9)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"objects": self.objects, "firstControllerSeconds": self.first.as_secs_f64(),
            "warmSeconds": self.warm.as_secs_f64(), "kubeRsColdSeconds": self.cold.as_secs_f64(),
            "listRequestsDuringWarmStart": self.warm_lists, "ratio": self.ratio()})
    }
}

fn widget_lists(c: &Cluster) -> u64 {
    c.dc.stats().request_count("list", PLURAL)
}

/// Start 3 replicas of controller `name` on the Widgets; returns them and the instant every
/// object was reconciled once by them.
async fn start_controller(m: &Manager, name: &str, n: usize) -> Result<(Vec<Proc>, Instant)> {
    let (col, tx) = Collector::new();
    let procs = sdk_controllers(m, name, NS, 3, 16, &tx)?;
    let last = col.wait_distinct(n, LOAD_PATIENCE).await?;
    Ok((procs, last))
}

/// ctrlhub: A on a cold manager, then B on the warm one. Returns (A's start, B's start, lists
/// during B's start).
async fn ctrlhub_side(c: &Cluster, n: usize) -> Result<(Duration, Duration, u64)> {
    let mut m = Manager::start(c, "warm-start", &[]).await?;
    m.wait_leading().await?;
    let start = Instant::now();
    let (mut a, a_done) = start_controller(&m, "warm-a", n).await?;
    let lists = widget_lists(c);
    let start_b = Instant::now();
    let (mut b, b_done) = start_controller(&m, "warm-b", n).await?;
    let warm_lists = widget_lists(c) - lists;
    for p in a.iter_mut().chain(b.iter_mut()) {
        p.stop().await;
    }
    m.stop().await;
    Ok((
        a_done.duration_since(start),
        b_done.duration_since(start_b),
        warm_lists,
    ))
}

/// The peer: kube-rs' Controller in process, cold (its own client, list and watch).
async fn kube_cold(c: &Cluster, n: usize) -> Result<Duration> {
    let (col, tx) = Collector::new();
    let start = Instant::now();
    let task = kube_runtime::spawn(c.dc.client().await?, NS, 16, tx);
    let last = col.wait_distinct(n, LOAD_PATIENCE).await;
    task.abort();
    Ok(last?.duration_since(start))
}

/// Measure both sides with `n` objects, on a devcluster of their own.
pub async fn measure(n: usize) -> Result<Figures> {
    let c = Cluster::start().await?;
    c.create_widgets(NS, n, CREATE_CONCURRENCY).await?;
    eprintln!("warm start: {n} objects");
    let (first, warm, warm_lists) = ctrlhub_side(&c, n).await?;
    eprintln!(
        "  ctrlhub A (cold manager) {:>7.2} s, B (warm) {:>7.2} s",
        first.as_secs_f64(),
        warm.as_secs_f64()
    );
    let cold = kube_cold(&c, n).await?;
    eprintln!("  kube-rs cold             {:>7.2} s", cold.as_secs_f64());
    Ok(Figures {
        objects: n,
        first,
        warm,
        cold,
        warm_lists,
    })
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The rows of one size.
pub fn rows(f: &Figures) -> Vec<Row> {
    let n = f.objects;
    vec![
        Row::info(
            "warm start",
            &format!("{n} objects: B on a warm manager / kube-rs cold"),
            secs(f.warm),
            secs(f.cold),
        ),
        Row::new(
            "warm start",
            "  ratio warm / cold",
            format!("{:.2}", f.ratio()),
            "",
            &format!("≤ {GOAL}"),
            Verdict::of(f.ratio() <= GOAL),
        ),
        Row::info(
            "warm start",
            "  A on a cold manager; list requests during B's start",
            format!("{}; {}", secs(f.first), f.warm_lists),
            "",
        ),
    ]
}

/// The scenario at each of `sizes`.
pub async fn run(sizes: &[usize]) -> Result<Outcome> {
    let mut figures = Vec::new();
    for &n in sizes {
        figures.push(measure(n).await?);
    }
    Ok(Outcome {
        scenario: "warmStart".into(),
        rows: figures.iter().flat_map(rows).collect(),
        json: serde_json::json!({"controllerReplicas": 3, "concurrencyPerReplica": 16,
            "kubeRsConcurrency": 16, "sizes": figures.iter().map(Figures::json).collect::<Vec<_>>()}),
    })
}
