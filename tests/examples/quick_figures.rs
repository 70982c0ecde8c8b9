//! Quick figures for the manager: reconciles per second through one controller with three
//! replicas on devcluster, and API watches with five controllers on one kind.
//!
//! `cargo run -p ctrlhub-tests --example quick_figures [--release] -- [objects]`
//! (needs `cargo build --workspace --bins` first; measures the binary in target/debug unless
//! CTRLHUB_BIN points elsewhere). This is a measurement, not a test: it asserts nothing.

use ctrlhub_tests::*;
use std::time::Instant;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let objects: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let c = start_cluster().await;
    let m = Manager::start(&c, "bench", &[]).await;
    m.wait_leading().await;
    eprintln!("creating {objects} ConfigMaps...");
    let created = Instant::now();
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let client = c.client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (chunk..objects).step_by(8) {
                put_configmap(&client, "default", &format!("cm-{i:06}"), &[("v", "0")]).await;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    eprintln!("created in {:?}", created.elapsed());

    let rss_before = rss(&m).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let start = Instant::now();
    let mut replicas = Vec::new();
    for n in 0..3 {
        let mut r = Replica::connect(&m.grpc, register_configmaps("throughput", 16))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let tx = tx.clone();
        replicas.push(tokio::spawn(async move {
            while let Some(req) = r.next(std::time::Duration::from_secs(3)).await {
                r.done(&req.id).await;
                let _ = tx.send(n);
            }
        }));
    }
    drop(tx);
    let mut per_replica = [0usize; 3];
    let mut total = 0;
    while total < objects {
        match rx.recv().await {
            Some(n) => {
                per_replica[n] += 1;
                total += 1;
            }
            None => break,
        }
    }
    let took = start.elapsed();
    println!(
        "throughput: {total} reconciles through 1 controller x 3 replicas in {took:.2?} = {:.0}/s (per replica {per_replica:?})",
        total as f64 / took.as_secs_f64()
    );

    // The manager gives freed heap back right after a backlog drains: read it once settled.
    let mut rss_after = rss(&m).await;
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let now = rss(&m).await;
        if now >= rss_after {
            break;
        }
        rss_after = now;
    }
    let json = serde_json::to_vec(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm-000000", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000",
            "resourceVersion": "123456", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "data": {"v": "0"}}))?
    .len();
    println!(
        "memory: manager RSS {:.1} MiB before the informer, {:.1} MiB with {objects} objects cached = {:.0} B/object (JSON about {json} B)",
        rss_before / 1048576.0,
        rss_after / 1048576.0,
        (rss_after - rss_before) / objects as f64
    );

    let before = c.dc.stats().request_count("watch", "configmaps");
    let mut held = Vec::new();
    for n in 0..5 {
        held.push(
            Replica::connect(&m.grpc, register_configmaps(&format!("watcher-{n}"), 1))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
    }
    for r in held.iter_mut() {
        let _ = r.expect().await;
    }
    let watches = c.dc.stats().request_count("watch", "configmaps") - before;
    println!(
        "shared caches: 5 more controllers on ConfigMaps opened {watches} new API watches (total watch requests served: {})",
        c.dc.stats().request_count("watch", "configmaps")
    );
    Ok(())
}

/// The manager's resident memory, from its own process metrics.
async fn rss(m: &Manager) -> f64 {
    let text = reqwest::get(format!("{}/metrics", m.http))
        .await
        .and_then(|r| r.error_for_status())
        .map(|r| r.text());
    let text = match text {
        Ok(t) => t.await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    text.lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}
