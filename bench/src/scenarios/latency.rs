//! Latency: steady timestamp updates (500/s by default) over 1,000 Widgets; each reconcile
//! reads the load generator's timestamp from the object at its start (one wall clock: every
//! process runs on this machine). ctrlhub (3 replicas over gRPC) versus the in-process kube-rs
//! controller, one after the other under the same load.

use super::LOAD_PATIENCE;
use crate::contenders::kube_runtime;
use crate::env::{Cluster, Collector, Manager, load, sdk_controllers};
use crate::report::{Outcome, Row, Verdict, ms, percentiles};
use anyhow::Result;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const OBJECTS: usize = 1000;

/// Latency samples of one side.
struct Side {
    median: Duration,
    p99: Duration,
    max: Duration,
    samples: usize,
    writes: u64,
    errors: u64,
}

impl Side {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"medianMs": self.median.as_secs_f64() * 1e3, "p99Ms": self.p99.as_secs_f64() * 1e3,
            "maxMs": self.max.as_secs_f64() * 1e3, "samples": self.samples, "writes": self.writes, "writeErrors": self.errors})
    }
}

async fn under_load(c: &Cluster, ns: &str, col: &Collector, rate: u32, secs: u64) -> Result<Side> {
    col.wait_distinct(OBJECTS, LOAD_PATIENCE).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    col.with(|t| t.recording = true);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let loader = {
        let (stop, sent, errors) = (stop.clone(), sent.clone(), errors.clone());
        let client = c.client.clone();
        let ns = ns.to_string();
        tokio::spawn(async move { load(&client, &ns, OBJECTS, rate, stop, sent, errors).await })
    };
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    loader.await?;
    // The last writes' reconciles.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut lat = col.with(|t| {
        t.recording = false;
        std::mem::take(&mut t.latencies)
    });
    let (median, p99, max) = percentiles(&mut lat);
    Ok(Side {
        median,
        p99,
        max,
        samples: lat.len(),
        writes: sent.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
    })
}

/// Run `rate` updates/s for `secs` seconds against each side.
pub async fn run(rate: u32, secs: u64) -> Result<Outcome> {
    let c = Cluster::start().await?;
    let m = Manager::start(&c, "latency", &[]).await?;
    m.wait_leading().await?;
    eprintln!("latency: {rate} updates/s for {secs} s over {OBJECTS} objects");
    c.create_widgets("lat-ctrlhub", OBJECTS, 32).await?;
    c.create_widgets("lat-kube", OBJECTS, 32).await?;

    let (col, tx) = Collector::new();
    let mut procs = sdk_controllers(&m, "lat", "lat-ctrlhub", 3, 16, &tx)?;
    let a = under_load(&c, "lat-ctrlhub", &col, rate, secs).await?;
    for p in procs.iter_mut() {
        p.stop().await;
    }
    eprintln!(
        "  ctrlhub  median {} p99 {} max {} ({} samples)",
        ms(a.median),
        ms(a.p99),
        ms(a.max),
        a.samples
    );

    let (col, tx) = Collector::new();
    let h = kube_runtime::spawn(c.dc.client().await?, "lat-kube", 16, tx);
    let b = under_load(&c, "lat-kube", &col, rate, secs).await?;
    h.abort();
    eprintln!(
        "  kube-rs  median {} p99 {} max {} ({} samples)",
        ms(b.median),
        ms(b.p99),
        ms(b.max),
        b.samples
    );

    let added_median = a.median.as_secs_f64() - b.median.as_secs_f64();
    let added_p99 = a.p99.as_secs_f64() - b.p99.as_secs_f64();
    let rows = vec![
        Row::new(
            "latency",
            &format!("median, {rate}/s for {secs} s"),
            ms(a.median),
            ms(b.median),
            "added ≤ 1 ms",
            Verdict::of(added_median <= 0.001),
        ),
        Row::new(
            "latency",
            "p99",
            ms(a.p99),
            ms(b.p99),
            "added ≤ 5 ms",
            Verdict::of(added_p99 <= 0.005),
        ),
        Row::info("latency", "max", ms(a.max), ms(b.max)),
    ];
    Ok(Outcome {
        scenario: "latency".into(),
        rows,
        json: serde_json::json!({"rate": rate, "seconds": secs, "objects": OBJECTS,
            "ctrlhub": a.json(), "kubeRs": b.json(),
            "addedMedianMs": added_median * 1e3, "addedP99Ms": added_p99 * 1e3}),
    })
}
