//! Memory per cached object: the manager's resident memory growth per Widget against the
//! Widget's JSON size for a full-object informer (a controller's primary kind), and against its
//! metadata's for a metadata-only one (an owned kind: the PartialObjectMetadata JSON a client
//! reads of it), at each size. A fresh manager per measurement: its RSS
//! once leading and idle is the baseline, the RSS once its informer holds every object is the
//! figure. The controllers register with a predicate no object passes, so no work queue grows
//! and only the cache is measured.

use super::LOAD_PATIENCE;
use crate::env::{Cluster, Manager, widget_type};
use crate::report::{Outcome, Row, Verdict};
use anyhow::Result;
use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::poll_until;
use ctrlhub_tests::replica::{Replica, register};

/// A predicate no Widget passes (label `bench.ctrlhub.io/never` exists on none).
pub(crate) fn never() -> pb::Predicate {
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
    let base = crate::env::settled_rss(&[m.process.pid()]).await;
    let reg = if metadata_only {
        // Primary: ConfigMaps of the (ConfigMap-free) namespace; Widgets are owned and asked
        // for as metadata only (owned kinds are cached in full unless every entry asks: with
        // `false` here this flavour measured a second full informer).
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
            metadata_only: true,
        }];
        r
    } else {
        let mut r = register("mem", widget_type(), 1, Some(ns));
        r.predicate = Some(never());
        r
    };
    let _replica = Replica::connect(&m.grpc, reg)
        .await
        .map_err(|e| anyhow::anyhow!("register: {e}"))?;
    poll_until(
        "the informer to hold every object",
        LOAD_PATIENCE,
        || async {
            match m.informer_objects().await {
                held if held >= n as u64 => Ok(()),
                held => Err(format!("{held} of {n} objects")),
            }
        },
    )
    .await?;
    // Once the initial list's transient buffers are freed.
    let loaded = crate::env::settled_rss(&[m.process.pid()]).await;
    let mut m = m;
    m.stop().await;
    Ok((base, loaded))
}

/// Run at each of `sizes`.
pub async fn run(sizes: &[usize]) -> Result<Outcome> {
    let c = Cluster::start().await?;
    let mut rows = Vec::new();
    let mut figures = Vec::new();
    // (objects, full growth, metadata-only growth) of the previous size: the marginal cost.
    let mut previous: Option<(usize, u64, u64)> = None;
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
        // What a metadata-only read returns: apiVersion, kind and metadata.
        let meta_json = serde_json::to_vec(&serde_json::json!({
            "apiVersion": stripped["apiVersion"], "kind": stripped["kind"],
            "metadata": stripped["metadata"],
        }))?
        .len();
        let (fb, fl) = one(&c, &ns, n, false).await?;
        let (mb, ml) = one(&c, &ns, n, true).await?;
        let full = fl.saturating_sub(fb) as f64 / n as f64;
        let meta = ml.saturating_sub(mb) as f64 / n as f64;
        let growth = (fl.saturating_sub(fb), ml.saturating_sub(mb));
        if let Some((pn, pfull, pmeta)) = previous
            && n > pn
        {
            // What each further object costs, without the fixed costs of an informer (its
            // watch, buffers, allocator arenas) that dominate a small cache.
            let span = (n - pn) as f64;
            let full_marginal = growth.0.saturating_sub(pfull) as f64 / span;
            let meta_marginal = growth.1.saturating_sub(pmeta) as f64 / span;
            rows.push(Row::new(
                "memory",
                &format!("full informer, each object from {pn} to {n} (B/object)"),
                format!(
                    "{full_marginal:.0} ({:.2}× JSON {json} B)",
                    full_marginal / json as f64
                ),
                "",
                "≤ 1.5× JSON",
                Verdict::of(full_marginal <= 1.5 * json as f64),
            ));
            rows.push(Row::new(
                "memory",
                &format!("metadata-only, each object from {pn} to {n} (B/object)"),
                format!(
                    "{meta_marginal:.0} ({:.2}× metadata JSON {meta_json} B)",
                    meta_marginal / meta_json as f64
                ),
                "",
                "≤ 1.5× metadata JSON",
                Verdict::of(meta_marginal <= 1.5 * meta_json as f64),
            ));
            figures.push(serde_json::json!({"marginalFrom": pn, "marginalTo": n,
                "fullBytesPerObject": full_marginal, "metadataOnlyBytesPerObject": meta_marginal}));
        }
        previous = Some((n, growth.0, growth.1));
        eprintln!(
            "  {n}: full {full:.0} B/object, metadata-only {meta:.0} B/object, JSON {json} B, metadata JSON {meta_json} B"
        );
        rows.push(Row::new(
            "memory",
            &format!("full informer, {n} objects (B/object)"),
            format!("{full:.0} ({:.2}× JSON {json} B)", full / json as f64),
            "",
            "≤ 1.5× JSON",
            Verdict::of(full <= 1.5 * json as f64),
        ));
        rows.push(Row::new(
            "memory",
            &format!("metadata-only, {n} objects (B/object)"),
            format!(
                "{meta:.0} ({:.2}× metadata JSON {meta_json} B)",
                meta / meta_json as f64
            ),
            "",
            "≤ 1.5× metadata JSON",
            Verdict::of(meta <= 1.5 * meta_json as f64),
        ));
        figures.push(serde_json::json!({"objects": n, "jsonBytes": json, "jsonBytesWithManagedFields": served,
            "metadataJsonBytes": meta_json,
            "full": {"baselineRssBytes": fb, "loadedRssBytes": fl, "bytesPerObject": full},
            "metadataOnly": {"baselineRssBytes": mb, "loadedRssBytes": ml, "bytesPerObject": meta}}));
    }
    Ok(Outcome {
        scenario: "memory".into(),
        rows,
        json: serde_json::json!(figures),
    })
}
