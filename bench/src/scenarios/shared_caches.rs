//! Shared caches: 10 controllers watching one kind with N Widgets. ctrlhub (the manager plus 10
//! thin `bench-sdk-controller` processes) versus 10 independent `bench-kube-controller`
//! processes. Figures: list and watch requests devcluster served for Widgets, watches open, and
//! the total resident memory of all processes once every controller has reconciled every object.

use super::LOAD_PATIENCE;
use crate::env::{Cluster, Collector, Manager, PLURAL, Proc, kube_controllers, sdk_controllers};
use crate::report::{Outcome, Row, Verdict, mib};
use anyhow::Result;
use std::time::Duration;

/// API traffic and memory of one side.
struct Side {
    lists: u64,
    watches: u64,
    watches_open: usize,
    rss: u64,
    rss_manager: u64,
}

impl Side {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"listRequests": self.lists, "watchRequests": self.watches,
            "watchesOpen": self.watches_open, "rssBytes": self.rss, "managerRssBytes": self.rss_manager})
    }
}

/// Wait for every collector to have seen `n` keys, let things settle, then measure.
async fn measure(
    c: &Cluster,
    cols: &[Collector],
    n: usize,
    procs: &[Proc],
    manager: Option<&Manager>,
    before: (u64, u64),
) -> Result<Side> {
    for col in cols {
        col.wait_distinct(n, LOAD_PATIENCE).await?;
    }
    // Resident memory once the initial lists' buffers are freed; the settling also leaves time
    // for a late watch re-open to show in the counts.
    let rss_manager = match manager {
        Some(m) => crate::env::settled_rss(&[m.process.pid()]).await,
        None => 0,
    };
    let pids: Vec<u32> = procs.iter().map(|p| p.pid()).collect();
    let rss_procs = crate::env::settled_rss(&pids).await;
    let stats = c.dc.stats();
    Ok(Side {
        lists: stats.request_count("list", PLURAL) - before.0,
        watches: stats.request_count("watch", PLURAL) - before.1,
        watches_open: stats.watches_open(),
        rss: rss_manager + rss_procs,
        rss_manager,
    })
}

fn counts(c: &Cluster) -> (u64, u64) {
    let s = c.dc.stats();
    (
        s.request_count("list", PLURAL),
        s.request_count("watch", PLURAL),
    )
}

/// Run with `controllers` controllers over `n` objects.
pub async fn run(n: usize, controllers: usize) -> Result<Outcome> {
    let c = Cluster::start().await?;
    let ns = "shared";
    eprintln!("shared caches: {controllers} controllers on {n} objects");
    c.create_widgets(ns, n, 64).await?;

    // ctrlhub: one manager, `controllers` controllers of one replica each.
    let before = counts(&c);
    let watches_before = c.dc.stats().watches_open();
    let m = Manager::start(&c, "shared", &[]).await?;
    m.wait_leading().await?;
    let mut cols = Vec::new();
    let mut procs = Vec::new();
    for i in 0..controllers {
        let (col, tx) = Collector::new();
        procs.extend(sdk_controllers(&m, &format!("shared-{i}"), ns, 1, 16, &tx)?);
        cols.push(col);
    }
    let mut a = measure(&c, &cols, n, &procs, Some(&m), before).await?;
    a.watches_open = a.watches_open.saturating_sub(watches_before);
    for p in procs.iter_mut() {
        p.stop().await;
    }
    let mut m = m;
    m.stop().await;
    eprintln!(
        "  ctrlhub: {} lists, {} watches, {} MiB",
        a.lists,
        a.watches,
        a.rss >> 20
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    // kube-rs: independent processes, each with its own list/watch and cache.
    let before = counts(&c);
    let watches_before = c.dc.stats().watches_open();
    let mut cols = Vec::new();
    let mut procs = Vec::new();
    for _ in 0..controllers {
        let (col, tx) = Collector::new();
        procs.extend(kube_controllers(&c, ns, 1, &tx)?);
        cols.push(col);
    }
    let mut b = measure(&c, &cols, n, &procs, None, before).await?;
    b.watches_open = b.watches_open.saturating_sub(watches_before);
    for p in procs.iter_mut() {
        p.kill().await;
    }
    eprintln!(
        "  kube-rs: {} lists, {} watches, {} MiB",
        b.lists,
        b.watches,
        b.rss >> 20
    );

    let rows = vec![
        Row::new(
            "shared caches",
            &format!("API watches, {controllers} controllers × {n} objects"),
            a.watches.to_string(),
            b.watches.to_string(),
            "1 instead of 10",
            Verdict::of(a.watches <= 1 && a.watches_open <= 1),
        ),
        Row::info(
            "shared caches",
            "list requests (pages)",
            a.lists.to_string(),
            b.lists.to_string(),
        ),
        Row::new(
            "shared caches",
            "total RSS of all processes",
            mib(a.rss),
            mib(b.rss),
            "≤ half",
            Verdict::of(a.rss * 2 <= b.rss),
        ),
        Row::info(
            "shared caches",
            "  of which the manager",
            mib(a.rss_manager),
            "",
        ),
    ];
    Ok(Outcome {
        scenario: "sharedCaches".into(),
        rows,
        json: serde_json::json!({"objects": n, "controllers": controllers, "ctrlhub": a.json(), "kubeRs": b.json()}),
    })
}
