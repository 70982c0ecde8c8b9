//! Throughput: N new Widgets, a no-op reconciler, time until every object was reconciled once.
//! (a) ctrlhub, one controller of 3 replicas (separate `bench-sdk-controller` processes) over
//! gRPC; (b) an in-process `kube::runtime::Controller` with concurrency 16 on the same
//! devcluster; (c) a kopf operator (PyPI, `bench/kopf/operator.py`) as a reference, with the
//! no-op `@kopf.on.event` handler and with kopf's usual `@kopf.on.create` (which writes an
//! annotation back per object). "live": the controller runs while the objects are created
//! (timed from the first create); "backlog": the objects exist before the controller starts
//! (timed from its start — for kopf, from starting the Python process). (d) The TypeScript SDK
//! (`bench/typescript/controller.mjs`, see [`crate::contenders::typescript_sdk`]): 3 Node.js replicas of 16, on
//! a manager of its own, the same runs.

use super::LOAD_PATIENCE;
use crate::contenders::kopf::{Kopf, KopfMode, kopf_operator};
use crate::contenders::typescript_sdk::TypeScript;
use crate::contenders::{Run, kube_runtime};
use crate::env::{Cluster, Collector, Manager, Proc, sdk_controllers, wait_sessions, widget};
use crate::report::{Outcome, Row, Verdict};
use anyhow::{Context, Result, bail};
use ctrlhub_tests::PATIENCE;
use kube::api::PostParams;
use std::path::Path;
use std::time::{Duration, Instant};

/// Concurrent creates of the load generator.
const CREATE_CONCURRENCY: usize = 32;

/// Which side runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side<'a> {
    Ctrlhub,
    Kube,
    TypeScript(&'a TypeScript),
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
    side: Side<'_>,
    c: &Cluster,
    m: &Manager,
    ns: &str,
    col_tx: &tokio::sync::mpsc::UnboundedSender<crate::env::Reconciled>,
) -> Result<Running> {
    Ok(match side {
        Side::Ctrlhub => Running::Ctrlhub(sdk_controllers(m, ns, ns, 3, 16, col_tx)?),
        // Its own client, as an in-process controller in its own binary would have.
        Side::Kube => Running::Kube(kube_runtime::spawn(
            c.dc.client().await?,
            ns,
            16,
            col_tx.clone(),
        )),
        Side::TypeScript(ts) => Running::Ctrlhub(crate::contenders::typescript_sdk::controllers(
            ts, m, ns, ns, 3, 16, col_tx,
        )?),
    })
}

async fn live(side: Side<'_>, c: &Cluster, m: &Manager, ns: &str, n: usize) -> Result<Run> {
    c.namespace(ns).await?;
    let (col, tx) = Collector::new();
    let running = start_side(side, c, m, ns, &tx).await?;
    match side {
        Side::Ctrlhub | Side::TypeScript(_) => wait_sessions(m, ns, 3).await?,
        // The watch is open once the initial (empty) list is done; give it a moment.
        Side::Kube => tokio::time::sleep(Duration::from_millis(500)).await,
    }
    let start = Instant::now();
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let last = col.wait_distinct(n, LOAD_PATIENCE).await?;
    running.stop().await;
    Ok(Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    })
}

async fn backlog(side: Side<'_>, c: &Cluster, m: &Manager, ns: &str, n: usize) -> Result<Run> {
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let (col, tx) = Collector::new();
    let start = Instant::now();
    let running = start_side(side, c, m, ns, &tx).await?;
    let last = col.wait_distinct(n, LOAD_PATIENCE).await?;
    running.stop().await;
    Ok(Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    })
}

/// The TypeScript SDK's live and backlog runs, on a manager of its own.
async fn measure_typescript_on(c: &Cluster, ts: &TypeScript, n: usize) -> Result<(Run, Run)> {
    let m = Manager::start(c, "throughput-ts", &[]).await?;
    m.wait_leading().await?;
    let live = live(Side::TypeScript(ts), c, &m, "tp-ts-live", n).await?;
    eprintln!("  typescript live    {:>6.0} obj/s", live.rate());
    let backlog = backlog(Side::TypeScript(ts), c, &m, "tp-ts-backlog", n).await?;
    eprintln!("  typescript backlog {:>6.0} obj/s", backlog.rate());
    Ok((live, backlog))
}

/// Name of the object the kopf live run creates before the clock starts: its report shows that
/// kopf has listed the namespace and is watching (kopf offers no other readiness signal).
const KOPF_SENTINEL: &str = "kopf-ready";

/// How long kopf may take to start: twice [`PATIENCE`], because its first start on a machine
/// shared with builders imports kopf and aiohttp cold (about 1 s when idle, far more when not).
const KOPF_STARTUP: Duration = PATIENCE.saturating_mul(2);

/// Wait until `n` distinct keys were reported, failing early (with the log) when kopf exits.
async fn wait_kopf(
    col: &Collector,
    proc: &mut Proc,
    log: &Path,
    n: usize,
    timeout: Duration,
) -> Result<Instant> {
    let start = Instant::now();
    loop {
        let (count, last) = col.with(|t| (t.distinct.len(), t.last_new));
        if count >= n {
            return Ok(last.unwrap_or_else(Instant::now));
        }
        if let Some(status) = proc.try_wait()? {
            bail!(
                "kopf exited with {status} after {count} of {n} objects (log: {})",
                log.display()
            );
        }
        if start.elapsed() > timeout {
            bail!(
                "kopf reconciled only {count} of {n} objects after {timeout:?} (log: {})",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn kopf_live(c: &Cluster, k: &Kopf, mode: KopfMode, ns: &str, n: usize) -> Result<Run> {
    c.namespace(ns).await?;
    let sentinel = serde_json::from_value(widget(ns, KOPF_SENTINEL))?;
    c.widgets(ns)
        .create(&PostParams::default(), &sentinel)
        .await
        .context("creating the kopf readiness object")?;
    let (col, tx) = Collector::new();
    let (mut proc, log) = kopf_operator(k, c, ns, mode, &tx)?;
    wait_kopf(&col, &mut proc, &log, 1, KOPF_STARTUP).await?;
    let start = Instant::now();
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let last = wait_kopf(&col, &mut proc, &log, n + 1, LOAD_PATIENCE).await?;
    proc.stop().await;
    Ok(Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    })
}

async fn kopf_backlog(c: &Cluster, k: &Kopf, mode: KopfMode, ns: &str, n: usize) -> Result<Run> {
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let (col, tx) = Collector::new();
    let start = Instant::now();
    let (mut proc, log) = kopf_operator(k, c, ns, mode, &tx)?;
    let last = wait_kopf(&col, &mut proc, &log, n, LOAD_PATIENCE).await?;
    proc.stop().await;
    Ok(Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    })
}

/// Figures of ctrlhub and kube-rs.
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

/// Figures of the kopf operator in one mode.
#[derive(Debug, Clone, Copy)]
pub struct KopfFigures {
    /// Which handler ran.
    pub mode: KopfMode,
    /// Live.
    pub live: Run,
    /// Backlog.
    pub backlog: Run,
}

impl KopfFigures {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"handler": self.mode.decorator(), "live": self.live.json(),
            "backlog": self.backlog.json()})
    }
}

/// Measure ctrlhub and kube-rs with `n` objects per run, on a devcluster of their own.
pub async fn measure(n: usize) -> Result<Figures> {
    let c = Cluster::start().await?;
    measure_on(&c, n).await
}

async fn measure_on(c: &Cluster, n: usize) -> Result<Figures> {
    let m = Manager::start(c, "throughput", &[]).await?;
    m.wait_leading().await?;
    eprintln!("throughput: {n} objects per run");
    let ctrlhub_live = live(Side::Ctrlhub, c, &m, "tp-ctrlhub-live", n).await?;
    eprintln!("  ctrlhub live  {:>8.0} obj/s", ctrlhub_live.rate());
    let kube_live = live(Side::Kube, c, &m, "tp-kube-live", n).await?;
    eprintln!("  kube-rs live  {:>8.0} obj/s", kube_live.rate());
    let ctrlhub_backlog = backlog(Side::Ctrlhub, c, &m, "tp-ctrlhub-backlog", n).await?;
    eprintln!("  ctrlhub backlog {:>6.0} obj/s", ctrlhub_backlog.rate());
    let kube_backlog = backlog(Side::Kube, c, &m, "tp-kube-backlog", n).await?;
    eprintln!("  kube-rs backlog {:>6.0} obj/s", kube_backlog.rate());
    Ok(Figures {
        ctrlhub_live,
        kube_live,
        ctrlhub_backlog,
        kube_backlog,
    })
}

/// Measure the kopf operator in `mode` with `n` objects per run, on a devcluster of its own;
/// installs kopf first if needed (see [`crate::contenders::kopf`]).
pub async fn measure_kopf(n: usize, mode: KopfMode) -> Result<KopfFigures> {
    let k = crate::contenders::kopf::kopf().await?;
    let c = Cluster::start().await?;
    measure_kopf_on(&c, &k, n, mode).await
}

async fn measure_kopf_on(c: &Cluster, k: &Kopf, n: usize, mode: KopfMode) -> Result<KopfFigures> {
    let name = mode.name();
    let live = kopf_live(c, k, mode, &format!("tp-kopf-{name}-live"), n).await?;
    eprintln!("  kopf {name:<6} live    {:>6.0} obj/s", live.rate());
    let backlog = kopf_backlog(c, k, mode, &format!("tp-kopf-{name}-backlog"), n).await?;
    eprintln!("  kopf {name:<6} backlog {:>6.0} obj/s", backlog.rate());
    Ok(KopfFigures {
        mode,
        live,
        backlog,
    })
}

/// "1234 (8.10 s)": objects per second and the seconds they took.
fn cell(run: &Run) -> String {
    format!("{:.0} ({:.2} s)", run.rate(), run.elapsed.as_secs_f64())
}

/// The scenario: measure and tabulate. `with_kopf` adds the kopf reference (both handlers),
/// installing kopf into `<target>/bench/kopf-venv` on first use; `with_typescript` adds the
/// TypeScript SDK (built with npm first).
pub async fn run(n: usize, with_kopf: bool, with_typescript: bool) -> Result<Outcome> {
    // Install before anything is timed, so pip's and npm's work cannot overlap a measurement.
    let k = if with_kopf {
        Some(crate::contenders::kopf::kopf().await?)
    } else {
        None
    };
    // The Python SDK runs beside kopf (it needs the same python3 and PyPI); installed untimed.
    let py = if with_kopf {
        Some(crate::contenders::python_sdk::install().await?)
    } else {
        None
    };
    let ts = if with_typescript {
        Some(crate::contenders::typescript_sdk::typescript().await?)
    } else {
        None
    };
    let c = Cluster::start().await?;
    let f = measure_on(&c, n).await?;
    let mut kopf = Vec::new();
    if let Some(k) = &k {
        eprintln!("throughput: kopf {} (reference)", k.version);
        for mode in [KopfMode::Event, KopfMode::Create] {
            kopf.push(measure_kopf_on(&c, k, n, mode).await?);
        }
    }
    let python = match &py {
        Some(sdk) => {
            eprintln!("throughput: Python SDK (controllers/python-sdk)");
            Some(crate::contenders::python_sdk::measure(&c, sdk, n).await?)
        }
        None => None,
    };
    let typescript = match &ts {
        Some(ts) => {
            eprintln!("throughput: TypeScript SDK on Node.js {}", ts.version);
            Some(measure_typescript_on(&c, ts, n).await?)
        }
        None => None,
    };
    let live_ratio = f.ctrlhub_live.rate() / f.kube_live.rate();
    let backlog_ratio = f.ctrlhub_backlog.rate() / f.kube_backlog.rate();
    let event = kopf.iter().find(|k| k.mode == KopfMode::Event);
    let reference =
        |pick: fn(&KopfFigures) -> &Run| event.map(|k| cell(pick(k))).unwrap_or_default();
    let mut rows = vec![
        Row::info(
            "throughput",
            &format!("live, {n} objects: obj/s (s)"),
            cell(&f.ctrlhub_live),
            cell(&f.kube_live),
        )
        .with_reference(reference(|k| &k.live)),
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
            &format!("backlog, {n} objects: obj/s (s)"),
            cell(&f.ctrlhub_backlog),
            cell(&f.kube_backlog),
        )
        .with_reference(reference(|k| &k.backlog)),
        Row::new(
            "throughput",
            "backlog ratio a/b",
            format!("{backlog_ratio:.2}"),
            "",
            "≥ 1.0",
            Verdict::of(backlog_ratio >= 1.0),
        ),
    ];
    if let Some(e) = event {
        rows.push(Row::info(
            "throughput",
            "live ratio a/c (c: kopf.on.event)",
            format!("{:.2}", f.ctrlhub_live.rate() / e.live.rate()),
            "",
        ));
        rows.push(Row::info(
            "throughput",
            "backlog ratio a/c (c: kopf.on.event)",
            format!("{:.2}", f.ctrlhub_backlog.rate() / e.backlog.rate()),
            "",
        ));
    }
    for k in kopf.iter().filter(|k| k.mode == KopfMode::Create) {
        rows.push(
            Row::info("throughput", "live, kopf.on.create: obj/s (s)", "", "")
                .with_reference(cell(&k.live)),
        );
        rows.push(
            Row::info("throughput", "backlog, kopf.on.create: obj/s (s)", "", "")
                .with_reference(cell(&k.backlog)),
        );
    }
    let kopf_event = event.map(|e| (&e.live, &e.backlog));
    if let Some(p) = &python {
        rows.extend(crate::contenders::python_sdk::rows(p, kopf_event));
    }
    if let Some((ts_live, ts_backlog)) = &typescript {
        rows.push(Row::info(
            "throughput",
            &format!("live, {n} objects, TypeScript SDK: obj/s (s)"),
            cell(ts_live),
            "",
        ));
        rows.push(Row::info(
            "throughput",
            &format!("backlog, {n} objects, TypeScript SDK: obj/s (s)"),
            cell(ts_backlog),
            "",
        ));
        rows.push(Row::info(
            "throughput",
            "live / backlog ratio TypeScript SDK / Rust SDK",
            format!(
                "{:.2} / {:.2}",
                ts_live.rate() / f.ctrlhub_live.rate(),
                ts_backlog.rate() / f.ctrlhub_backlog.rate()
            ),
            "",
        ));
        if let Some(e) = event {
            rows.push(Row::info(
                "throughput",
                "live / backlog ratio TypeScript SDK / kopf.on.event",
                format!(
                    "{:.2} / {:.2}",
                    ts_live.rate() / e.live.rate(),
                    ts_backlog.rate() / e.backlog.rate()
                ),
                "",
            ));
        }
    }
    let mut json = serde_json::json!({
        "objects": n,
        "ctrlhub": {"replicas": 3, "concurrencyPerReplica": 16, "live": f.ctrlhub_live.json(), "backlog": f.ctrlhub_backlog.json()},
        "kubeRs": {"concurrency": 16, "live": f.kube_live.json(), "backlog": f.kube_backlog.json()},
        "liveRatio": live_ratio, "backlogRatio": backlog_ratio,
    });
    if let (Some(k), Some(e)) = (&k, event) {
        let mut handlers = serde_json::Map::new();
        for kf in &kopf {
            handlers.insert(kf.mode.name().into(), kf.json());
        }
        json["kopf"] = serde_json::json!({"version": k.version, "standalone": true,
            "handlers": handlers});
        json["liveRatioKopfEvent"] = serde_json::json!(f.ctrlhub_live.rate() / e.live.rate());
        json["backlogRatioKopfEvent"] =
            serde_json::json!(f.ctrlhub_backlog.rate() / e.backlog.rate());
    }
    if let Some(p) = &python {
        json["pythonSdk"] = crate::contenders::python_sdk::json(p, kopf_event);
    }
    if let (Some(ts), Some((ts_live, ts_backlog))) = (&ts, &typescript) {
        json["typescriptSdk"] = serde_json::json!({"node": ts.version, "replicas": 3,
            "concurrencyPerReplica": 16, "live": ts_live.json(), "backlog": ts_backlog.json()});
    }
    Ok(Outcome {
        scenario: "throughput".into(),
        rows,
        json,
    })
}
