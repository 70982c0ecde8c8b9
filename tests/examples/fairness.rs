//! The fair-dispatch scenario from the multi-tenancy issue: tenant A floods N keys while tenant B
//! changes one object; B's latency from update to delivery (median and 99th percentile) with and
//! without A's flood.
//!
//! `cargo run --release -p ctrlhub-tests --example fairness -- [keys] [b_updates]`
//! (needs `cargo build --workspace --bins` first; the manager binary is target/debug's unless
//! CARGO_TARGET_DIR says otherwise). Two real tenants: ServiceAccounts authenticated by
//! TokenReview, authorized by RBAC. This is a measurement, not a test: it asserts nothing.

#[path = "../tests/support/mod.rs"]
mod support;

use ctrlhub_proto::v1 as pb;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use std::time::{Duration, Instant};
use support::*;

async fn tenant(c: &Cluster, ns: &str) -> anyhow::Result<String> {
    namespace(&c.client, ns, &[]).await;
    let sas: Api<ServiceAccount> = Api::namespaced(c.client.clone(), ns);
    let sa = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ctl", "namespace": ns}});
    sas.patch(
        "ctl",
        &PatchParams::apply("bench").force(),
        &Patch::Apply(&sa),
    )
    .await?;
    let rbac = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            kind,
        ))
    };
    let role = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "ctl", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]});
    let binding = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "ctl", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ctl"},
        "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": ns}]});
    for (kind, obj) in [("Role", role), ("RoleBinding", binding)] {
        let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), ns, &rbac(kind));
        api.patch(
            "ctl",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&obj),
        )
        .await?;
    }
    let token =
        c.dc.issue_token(ns, "ctl", &["ctrlhub"], Duration::from_secs(3600))?;
    Ok(format!("Bearer {token}"))
}

fn scoped(name: &str, ns: &str, credits: u32) -> pb::Register {
    let mut r = register_configmaps(name, credits);
    r.namespaces = Some(pb::NamespaceScope {
        scope: Some(pb::namespace_scope::Scope::Names(
            pb::namespace_scope::Names {
                names: vec![ns.to_string()],
            },
        )),
    });
    r
}

/// B updates its object `updates` times, each time waiting for the request that carries it.
async fn b_latencies(c: &Cluster, b: &mut Replica, updates: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(updates);
    for i in 0..updates {
        let value = format!("{i}");
        let t0 = Instant::now();
        put_configmap(&c.client, "tenant-b", "live", &[("v", &value)]).await;
        loop {
            let r = b.expect().await;
            b.done(&r.id).await;
            let seen: serde_json::Value = match &r.object {
                Some(pb::reconcile_request::Object::ObjectJson(j)) => {
                    serde_json::from_slice(j).unwrap_or_default()
                }
                _ => serde_json::Value::Null,
            };
            if seen["data"]["v"] == serde_json::json!(value) {
                out.push(t0.elapsed());
                break;
            }
        }
    }
    out
}

fn summary(label: &str, mut d: Vec<Duration>) -> String {
    d.sort();
    let q = |p: f64| d[((d.len() as f64 - 1.0) * p).round() as usize];
    format!(
        "{label:<28} n={:<4} median {:>8.2} ms   p99 {:>8.2} ms   max {:>8.2} ms",
        d.len(),
        q(0.5).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        d.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let keys: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let updates: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(200);
    let c = cluster().await;
    let m = Manager::start(&c, "fairness", &["--auth", "kubernetes"]).await;
    m.wait_leading().await;
    let a_auth = tenant(&c, "tenant-a").await?;
    let b_auth = tenant(&c, "tenant-b").await?;
    put_configmap(&c.client, "tenant-b", "live", &[("v", "start")]).await;

    eprintln!("creating {keys} ConfigMaps in tenant-a (progress every 10%)...");
    let created = Instant::now();
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let client = c.client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (chunk..keys).step_by(8) {
                put_configmap(&client, "tenant-a", &format!("cm-{i:06}"), &[("v", "0")]).await;
                if chunk == 0 && i % (keys / 10).max(1) < 8 {
                    eprintln!("  {i}/{keys}");
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    eprintln!("created in {:.1?}", created.elapsed());

    let mut b = Replica::connect_with(&m.grpc, scoped("live", "tenant-b", 4), Some(&b_auth))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let first = b.expect().await;
    b.done(&first.id).await;
    let quiet = b_latencies(&c, &mut b, updates).await;

    // A registers over its N objects: the initial list puts N keys in its queue at once, and
    // three replicas drain it as fast as they answer.
    let flood_start = Instant::now();
    let mut a_replicas = Vec::new();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    for _ in 0..3 {
        let mut r = Replica::connect_with(&m.grpc, scoped("flood", "tenant-a", 64), Some(&a_auth))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let tx = done_tx.clone();
        a_replicas.push(tokio::spawn(async move {
            while let Some(req) = r.next(Duration::from_secs(5)).await {
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
    // Measure B while A's backlog is non-empty.
    let mut flooded = Vec::new();
    loop {
        flooded.extend(b_latencies(&c, &mut b, 10).await);
        let status = m.status().await;
        let a_queued = status["controllers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == "flood")
            .map(|c| c["queued"].as_u64().unwrap_or(0))
            .sum::<u64>();
        if a_queued == 0 || flooded.len() >= updates * 5 {
            break;
        }
    }
    let measured_during = flood_start.elapsed();
    for r in a_replicas {
        r.await?;
    }
    let a_done = counter.await?;
    println!("fair dispatch: tenant A floods {keys} keys, tenant B updates one object");
    println!("{}", summary("B without A's flood", quiet));
    println!("{}", summary("B during A's flood", flooded));
    println!(
        "A reconciled {a_done} keys; B was measured for {:.1?} of A's backlog",
        measured_during
    );
    Ok(())
}
