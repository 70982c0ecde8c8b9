//! Throughput: N new Widgets, a no-op reconciler, time until every object was reconciled once.
//! (a) ctrlhub, one controller of 3 replicas (separate `bench-sdk-controller` processes) over
//! gRPC; (b) an in-process `kube::runtime::Controller` with concurrency 16 on the same
//! devcluster. "live": the controller runs while the objects are created (timed from the first
//! create); "backlog": the objects exist before the controller starts (timed from its start).

use super::PATIENCE;
use crate::env::{Cluster, Collector, Manager, sdk_controllers};
use crate::kubert;
use crate::report::{Outcome, Row, Verdict};
use anyhow::{Result, bail};
use std::time::{Duration, Instant};

/// Concurrent creates of the load generator.
const CREATE_CONCURRENCY: usize = 32;

/// One measured run.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Objects reconciled (distinct keys).
    pub objects: usize,
    /// Until the last object's first reconcile.
    pub elapsed: Duration,
    /// How long creating the objects took (live runs: the load generator's own pace).
    pub create: Duration,
}

impl Run {
    /// Objects per second.
    pub fn rate(&self) -> f64 {
        self.objects as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"objects": self.objects, "seconds": self.elapsed.as_secs_f64(),
            "objectsPerSecond": self.rate(), "createSeconds": self.create.as_secs_f64()})
    }
}

/// Which side runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    Ctrlhub,
    Kube,
}

/// A running controller of either side; dropping it stops it.
enum Running {
    Ctrlhub(Vec<crate::env::Proc>),
    Kube(tokio::task::JoinHandle<()>),
}

impl Running {
    async fn stop(self) {
        match self {
            Running::Ctrlhub(mut procs) => {
                for p in procs.iter_mut() {
                    p.stop().await;
                }
            }
            Running::Kube(h) => h.abort(),
        }
    }
}

async fn start_side(
    side: Side,
    c: &Cluster,
    m: &Manager,
    ns: &str,
    col_tx: &tokio::sync::mpsc::UnboundedSender<crate::env::Reconciled>,
) -> Result<Running> {
    Ok(match side {
        Side::Ctrlhub => Running::Ctrlhub(sdk_controllers(m, ns, ns, 3, 16, col_tx)?),
        // Its own client, as an in-process controller in its own binary would have.
        Side::Kube => Running::Kube(kubert::spawn(c.dc.client().await?, ns, 16, col_tx.clone())),
    })
}

/// Wait until the ctrlhub controller `name` has `sessions` sessions.
async fn wait_sessions(m: &Manager, name: &str, sessions: u64) -> Result<()> {
    let start = Instant::now();
    loop {
        let status = m.status().await;
        let n: u64 = status["controllers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == name)
            .map(|c| c["sessions"].as_u64().unwrap_or(0))
            .sum();
        if n >= sessions {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("controller {name} has {n} of {sessions} sessions after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn live(side: Side, c: &Cluster, m: &Manager, ns: &str, n: usize) -> Result<Run> {
    c.namespace(ns).await?;
    let (col, tx) = Collector::new();
    let running = start_side(side, c, m, ns, &tx).await?;
    match side {
        Side::Ctrlhub => wait_sessions(m, ns, 3).await?,
        // The watch is open once the initial (empty) list is done; give it a moment.
        Side::Kube => tokio::time::sleep(Duration::from_millis(500)).await,
    }
    let start = Instant::now();
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let last = col.wait_distinct(n, PATIENCE).await?;
    running.stop().await;
    Ok(Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    })
}

async fn backlog(side: Side, c: &Cluster, m: &Manager, ns: &str, n: usize) -> Result<Run> {
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let (col, tx) = Collector::new();
    let start = Instant::now();
    let running = start_side(side, c, m, ns, &tx).await?;
    let last = col.wait_distinct(n, PATIENCE).await?;
    running.stop().await;
    Ok(Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    })
}

/// Figures of the whole scenario.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// ctrlhub, live.
    pub ctrlhub_live: Run,
    /// kube-rs, live.
    pub kube_live: Run,
    /// ctrlhub, backlog.
    pub ctrlhub_backlog: Run,
    /// kube-rs, backlog.
    pub kube_backlog: Run,
}

/// Measure with `n` objects per run.
pub async fn measure(n: usize) -> Result<Figures> {
    let c = Cluster::start().await?;
    let m = Manager::start(&c, "throughput", &[]).await?;
    m.wait_leading().await?;
    eprintln!("throughput: {n} objects per run");
    let ctrlhub_live = live(Side::Ctrlhub, &c, &m, "tp-ctrlhub-live", n).await?;
    eprintln!("  ctrlhub live  {:>8.0} obj/s", ctrlhub_live.rate());
    let kube_live = live(Side::Kube, &c, &m, "tp-kube-live", n).await?;
    eprintln!("  kube-rs live  {:>8.0} obj/s", kube_live.rate());
    let ctrlhub_backlog = backlog(Side::Ctrlhub, &c, &m, "tp-ctrlhub-backlog", n).await?;
    eprintln!("  ctrlhub backlog {:>6.0} obj/s", ctrlhub_backlog.rate());
    let kube_backlog = backlog(Side::Kube, &c, &m, "tp-kube-backlog", n).await?;
    eprintln!("  kube-rs backlog {:>6.0} obj/s", kube_backlog.rate());
    Ok(Figures {
        ctrlhub_live,
        kube_live,
        ctrlhub_backlog,
        kube_backlog,
    })
}

/// The scenario: measure and tabulate.
pub async fn run(n: usize) -> Result<Outcome> {
    let f = measure(n).await?;
    let live_ratio = f.ctrlhub_live.rate() / f.kube_live.rate();
    let backlog_ratio = f.ctrlhub_backlog.rate() / f.kube_backlog.rate();
    let rows = vec![
        Row::info(
            "throughput",
            &format!("live, {n} objects (obj/s)"),
            format!("{:.0}", f.ctrlhub_live.rate()),
            format!("{:.0}", f.kube_live.rate()),
        ),
        Row::new(
            "throughput",
            "live ratio a/b",
            format!("{live_ratio:.2}"),
            "",
            "≥ 1.0",
            Verdict::of(live_ratio >= 1.0),
        ),
        Row::info(
            "throughput",
            &format!("backlog, {n} objects (obj/s)"),
            format!("{:.0}", f.ctrlhub_backlog.rate()),
            format!("{:.0}", f.kube_backlog.rate()),
        ),
        Row::new(
            "throughput",
            "backlog ratio a/b",
            format!("{backlog_ratio:.2}"),
            "",
            "≥ 1.0",
            Verdict::of(backlog_ratio >= 1.0),
        ),
    ];
    Ok(Outcome {
        scenario: "throughput".into(),
        rows,
        json: serde_json::json!({
            "objects": n,
            "ctrlhub": {"replicas": 3, "concurrencyPerReplica": 16, "live": f.ctrlhub_live.json(), "backlog": f.ctrlhub_backlog.json()},
            "kubeRs": {"concurrency": 16, "live": f.kube_live.json(), "backlog": f.kube_backlog.json()},
            "liveRatio": live_ratio, "backlogRatio": backlog_ratio,
        }),
    })
}
