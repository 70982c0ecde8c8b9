//! Memory per cached object: the manager's resident memory growth per Widget against the
//! Widget's JSON size, for a full-object informer (a controller's primary kind) and a
//! metadata-only one (an owned kind), at each size. A fresh manager per measurement: its RSS
//! once leading and idle is the baseline, the RSS once its informer holds every object is the
//! figure. The controllers register with a predicate no object passes, so no work queue grows
//! and only the cache is measured.

use super::PATIENCE;
use crate::env::{Cluster, Manager, widget_type};
use crate::replica::{Replica, register};
use crate::report::{Outcome, Row, Verdict};
use anyhow::{Result, bail};
use ctrlhub_proto::v1 as pb;
use std::time::{Duration, Instant};

/// A predicate no Widget passes (label `bench.ctrlhub.io/never` exists on none).
fn never() -> pb::Predicate {
    pb::Predicate {
        predicate: Some(pb::predicate::Predicate::LabelSelector(pb::LabelSelector {
            match_labels: [("bench.ctrlhub.io/never".to_string(), "true".to_string())].into(),
            match_expressions: vec![],
        })),
    }
}

/// Measure one informer flavour over the `n` Widgets of `ns`; returns (baseline, loaded) RSS.
async fn one(c: &Cluster, ns: &str, n: usize, metadata_only: bool) -> Result<(u64, u64)> {
    let flavour = if metadata_only { "meta" } else { "full" };
    let m = Manager::start(c, &format!("mem-{flavour}-{n}"), &[]).await?;
    m.wait_leading().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let base = m.rss();
    let reg = if metadata_only {
        // Primary: ConfigMaps of the (ConfigMap-free) namespace; Widgets are owned, hence cached
        // metadata-only.
        let mut r = register(
            "mem",
            pb::ResourceType {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
            },
            1,
            Some(ns),
        );
        r.owns = vec![pb::OwnedResource {
            resource: Some(widget_type()),
            controller_only: true,
            predicate: Some(never()),
        }];
        r
    } else {
        let mut r = register("mem", widget_type(), 1, Some(ns));
        r.predicate = Some(never());
        r
    };
    let _replica = Replica::connect(&m.grpc, reg, "Bearer dev")
        .await
        .map_err(|e| anyhow::anyhow!("register: {e}"))?;
    let start = Instant::now();
    while m.informer_objects().await < n as u64 {
        if start.elapsed() > PATIENCE {
            bail!(
                "informer holds {} of {n} objects",
                m.informer_objects().await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the initial list's transient buffers be freed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let loaded = m.rss();
    let mut m = m;
    m.proc.stop().await;
    Ok((base, loaded))
}

/// Run at each of `sizes`.
pub async fn run(sizes: &[usize]) -> Result<Outcome> {
    let c = Cluster::start().await?;
    let mut rows = Vec::new();
    let mut figures = Vec::new();
    for &n in sizes {
        let ns = format!("mem-{n}");
        eprintln!("memory: creating {n} objects");
        c.create_widgets(&ns, n, 64).await?;
        // The JSON size as served, and without managedFields (which the manager strips).
        let obj: serde_json::Value =
            serde_json::to_value(c.widgets(&ns).get(&crate::env::widget_name(0)).await?)?;
        let served = serde_json::to_vec(&obj)?.len();
        let mut stripped = obj.clone();
        if let Some(meta) = stripped["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
        let json = serde_json::to_vec(&stripped)?.len();
        let (fb, fl) = one(&c, &ns, n, false).await?;
        let (mb, ml) = one(&c, &ns, n, true).await?;
        let full = fl.saturating_sub(fb) as f64 / n as f64;
        let meta = ml.saturating_sub(mb) as f64 / n as f64;
        eprintln!(
            "  {n}: full {full:.0} B/object, metadata-only {meta:.0} B/object, JSON {json} B"
        );
        rows.push(Row::new(
            "memory",
            &format!("full informer, {n} objects (B/object)"),
            format!("{full:.0} ({:.1}× JSON {json} B)", full / json as f64),
            "",
            "≤ 1.5× JSON",
            Verdict::of(full <= 1.5 * json as f64),
        ));
        rows.push(Row::info(
            "memory",
            &format!("metadata-only, {n} objects (B/object)"),
            format!("{meta:.0}"),
            "",
        ));
        figures.push(serde_json::json!({"objects": n, "jsonBytes": json, "jsonBytesWithManagedFields": served,
            "full": {"baselineRssBytes": fb, "loadedRssBytes": fl, "bytesPerObject": full},
            "metadataOnly": {"baselineRssBytes": mb, "loadedRssBytes": ml, "bytesPerObject": meta}}));
    }
    Ok(Outcome {
        scenario: "memory".into(),
        rows,
        json: serde_json::json!(figures),
    })
}
