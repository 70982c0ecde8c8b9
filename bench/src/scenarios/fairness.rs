//! Fair dispatch between tenants: tenant A floods N keys while tenant B changes one object; B's
//! latency from update to delivery (median and 99th percentile) with and without A's flood. Two
//! real tenants: ServiceAccounts authenticated by TokenReview and authorized by RBAC
//! (`--auth kubernetes`). The manager runs with fewer dispatch seats than A's replicas have
//! credits, so A's backlog keeps every seat taken and each seat B gets is one the weighted fair
//! queue gave it ahead of A.

use super::LOAD_PATIENCE;
use crate::env::{Cluster, Manager};
use crate::report::{Outcome, Row, ms, percentiles};
use anyhow::{Result, anyhow};
use ctrlhub_tests::objects::{apply, configmap_object};
use ctrlhub_tests::rbac::{configmap_reader, service_account_object};
use ctrlhub_tests::replica::configmaps;
use ctrlhub_tests::replica::{Replica, object, register};
use ctrlhub_tests::{metric_value, poll_until};
use futures::StreamExt;
use std::time::{Duration, Instant};

/// ConfigMap `ns/name` with `data.v` = `v`.
async fn put_configmap(client: &kube::Client, ns: &str, name: &str, v: &str) -> Result<()> {
    apply(client, &configmap_object(ns, name, &[("v", v)])).await
}

/// A tenant: namespace, ServiceAccount `ctl` allowed to list and watch ConfigMaps there, and a
/// bearer token for it.
async fn tenant(c: &Cluster, ns: &str) -> Result<String> {
    c.namespace(ns).await?;
    apply(&c.client, &service_account_object(ns, "ctl")).await?;
    for obj in configmap_reader(ns, "ctl", Some(ns)) {
        apply(&c.client, &obj).await?;
    }
    let token =
        c.dc.issue_token(ns, "ctl", &["ctrlhub"], Duration::from_secs(3600))?;
    Ok(format!("Bearer {token}"))
}

/// B updates its object `updates` times, each time waiting for the request that carries it.
async fn b_latencies(c: &Cluster, b: &mut Replica, updates: usize) -> Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(updates);
    for _ in 0..updates {
        let value = crate::env::now_micros().to_string();
        let t0 = Instant::now();
        put_configmap(&c.client, "tenant-b", "live", &value).await?;
        loop {
            let r = b
                .next(LOAD_PATIENCE)
                .await
                .ok_or_else(|| anyhow!("tenant B got no request"))?;
            b.done(&r.id).await;
            if object(&r)["data"]["v"] == serde_json::json!(value) {
                out.push(t0.elapsed());
                break;
            }
        }
    }
    Ok(out)
}

/// Dispatch seats of the manager under test: well under A's 3 × 64 credits.
const SEATS: usize = 32;

/// `ctrlhub_dispatch_seat_waits_total` and `_grants_total` of `tenant`, from `/metrics`.
async fn seat_counts(m: &Manager, tenant: &str) -> (u64, u64) {
    let text = m.try_metrics().await.unwrap_or_default();
    let read = |name: &str| {
        let series = format!("{name}{{tenant=\"{tenant}\"}}");
        metric_value(&text, &series).map_or(0, |v| v as u64)
    };
    (
        read("ctrlhub_dispatch_seat_waits_total"),
        read("ctrlhub_dispatch_seat_grants_total"),
    )
}

/// Run with A flooding `keys` keys; B measures `updates` updates without the flood.
pub async fn run(keys: usize, updates: usize) -> Result<Outcome> {
    let c = Cluster::start().await?;
    let seats = SEATS.to_string();
    let m = Manager::start(
        &c,
        "fairness",
        &["--auth", "kubernetes", "--max-dispatch-seats", &seats],
    )
    .await?;
    m.wait_leading().await?;
    let a_auth = tenant(&c, "tenant-a").await?;
    let b_auth = tenant(&c, "tenant-b").await?;
    put_configmap(&c.client, "tenant-b", "live", "start").await?;

    eprintln!("fairness: creating {keys} ConfigMaps in tenant-a");
    let created = Instant::now();
    let results: Vec<Result<()>> = futures::stream::iter(0..keys)
        .map(|i| {
            let client = c.client.clone();
            async move { put_configmap(&client, "tenant-a", &format!("cm-{i:06}"), "0").await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    eprintln!("  created in {:.1?}", created.elapsed());

    let mut b = Replica::connect_with(
        &m.grpc,
        register("live", configmaps(), 4, Some("tenant-b")),
        Some(&b_auth),
    )
    .await
    .map_err(|e| anyhow!("tenant B: {e}"))?;
    let first = b
        .next(LOAD_PATIENCE)
        .await
        .ok_or_else(|| anyhow!("tenant B got no first request"))?;
    b.done(&first.id).await;
    let quiet = b_latencies(&c, &mut b, updates).await?;

    // A registers over its N objects: the initial list puts N keys in its queue at once, and
    // three replicas drain it as fast as they answer.
    let flood_start = Instant::now();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut a_replicas = Vec::new();
    for _ in 0..3 {
        let mut r = Replica::connect_with(
            &m.grpc,
            register("flood", configmaps(), 64, Some("tenant-a")),
            Some(&a_auth),
        )
        .await
        .map_err(|e| anyhow!("tenant A: {e}"))?;
        let tx = done_tx.clone();
        a_replicas.push(tokio::spawn(async move {
            // Generous idle timeout: the manager lists A's N objects before the first request.
            while let Some(req) = r.next(Duration::from_secs(30)).await {
                r.done(&req.id).await;
                let _ = tx.send(());
            }
        }));
    }
    drop(done_tx);
    let counter = tokio::spawn(async move {
        let mut n = 0usize;
        while done_rx.recv().await.is_some() {
            n += 1;
        }
        n
    });
    // The flood starts once A's initial list is in its queue (at 100k objects that takes
    // seconds); measuring before would measure an idle manager.
    let a_queued = || async {
        let status = m.status().await;
        status["controllers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == "flood")
            .map(|c| c["queued"].as_u64().unwrap_or(0) + c["dispatched"].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let half = (keys as u64 / 2).max(1);
    poll_until(
        "tenant A's flood to reach half of its keys",
        LOAD_PATIENCE,
        || async {
            match a_queued().await {
                queued if queued >= half => Ok(()),
                queued => Err(format!("{queued} of {keys} keys queued or dispatched")),
            }
        },
    )
    .await?;
    // Measure B while A's backlog is non-empty.
    let mut flooded = Vec::new();
    loop {
        flooded.extend(b_latencies(&c, &mut b, 10).await?);
        let status = m.status().await;
        let a_queued: u64 = status["controllers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == "flood")
            .map(|c| c["queued"].as_u64().unwrap_or(0))
            .sum();
        if a_queued == 0 || flooded.len() >= updates * 5 {
            break;
        }
    }
    let measured_during = flood_start.elapsed();
    let tenant_a = "system:serviceaccounts:tenant-a";
    let tenant_b = "system:serviceaccounts:tenant-b";
    let (a_waits, a_grants) = seat_counts(&m, tenant_a).await;
    let (b_waits, b_grants) = seat_counts(&m, tenant_b).await;
    for r in a_replicas {
        r.await?;
    }
    let a_done = counter.await?;
    let (q50, q99, qmax) = percentiles(&mut quiet.clone());
    let (f50, f99, fmax) = percentiles(&mut flooded.clone());
    eprintln!(
        "  B quiet median {} p99 {}; during A's flood median {} p99 {} (n={}); A reconciled {a_done}; \
         seats {SEATS}: A waited for {a_waits} of {a_grants} grants, B for {b_waits} of {b_grants}",
        ms(q50),
        ms(q99),
        ms(f50),
        ms(f99),
        flooded.len()
    );
    let rows = vec![
        Row::info(
            "fairness",
            "B update→delivery without flood, median/p99",
            format!("{}/{}", ms(q50), ms(q99)),
            "",
        ),
        // The issue sets no goal for fairness; the two rows are read side by side.
        Row::info(
            "fairness",
            &format!("B during A's flood of {keys} keys, median/p99"),
            format!("{}/{}", ms(f50), ms(f99)),
            "",
        ),
        Row::info(
            "fairness",
            &format!("seat grants that waited ({SEATS} seats), A / B"),
            format!("{a_waits} of {a_grants} / {b_waits} of {b_grants}"),
            "",
        ),
    ];
    Ok(Outcome {
        scenario: "fairness".into(),
        rows,
        json: serde_json::json!({"keys": keys, "updates": updates,
            "quiet": {"medianMs": q50.as_secs_f64() * 1e3, "p99Ms": q99.as_secs_f64() * 1e3, "maxMs": qmax.as_secs_f64() * 1e3, "samples": quiet.len()},
            "flooded": {"medianMs": f50.as_secs_f64() * 1e3, "p99Ms": f99.as_secs_f64() * 1e3, "maxMs": fmax.as_secs_f64() * 1e3, "samples": flooded.len()},
            "aReconciled": a_done, "measuredDuringFloodSeconds": measured_during.as_secs_f64(),
            "seats": SEATS, "seatWaits": {"a": a_waits, "b": b_waits}, "seatGrants": {"a": a_grants, "b": b_grants}}),
    })
}
