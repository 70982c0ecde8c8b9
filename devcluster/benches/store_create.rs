//! The server-side cost of one create, without HTTP, TLS or a client: `Store::create` of small
//! ConfigMaps (what the 100k-object benchmarks push) and of Deployments (the kind with the most
//! validation), timed in CPU time of the creating thread so that other work on the machine
//! does not count.
//!
//! ```text
//! cargo bench -p devcluster --bench store_create
//! ```
//!
//! Output: per kind, the median over rounds of CPU nanoseconds per create, then one line
//! `BENCH_JSON {...}`.

use devcluster::storage::{Store, Write, WriteOptions};
use serde_json::{Value, json};

/// Objects created per round, and rounds per kind (the median round is reported).
const PER_ROUND: usize = 20_000;
const ROUNDS: usize = 7;

/// CPU time this thread has used, in nanoseconds (first field of schedstat).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn config_map(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("cm-{i}"), "labels": {"app": "bench", "shard": format!("{}", i % 16)}},
        "data": {"key": format!("value-{i}"), "other": "x"}})
}

fn deployment(i: usize) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("web-{i}"), "labels": {"app": "web"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web", "i": format!("{i}")}},
            "template": {"metadata": {"labels": {"app": "web", "i": format!("{i}")}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                    "ports": [{"containerPort": 80, "name": "http"}],
                    "env": [{"name": "MODE", "value": "bench"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}}}]}}}})
}

/// Median CPU nanoseconds per create of `make(i)` objects of `plural` in fresh namespaces.
fn measure(group: &str, plural: &str, make: fn(usize) -> Value) -> f64 {
    let mut per_create = Vec::new();
    for round in 0..ROUNDS {
        let store = Store::new(10_000);
        let opts = WriteOptions::new("bench");
        let mut st = store.lock();
        let ns_info = st
            .registry
            .get("", "v1", "namespaces")
            .cloned()
            .expect("namespaces");
        let info = st.registry.get(group, "v1", plural).cloned().expect("kind");
        let ns = format!("bench-{round}");
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        st.create(&Write::create(&ns_info, "", &opts), namespace)
            .expect("namespace");
        let objects: Vec<Value> = (0..PER_ROUND).map(make).collect();
        let start = thread_cpu_ns();
        for obj in objects {
            st.create(&Write::create(&info, &ns, &opts), obj)
                .expect("create");
        }
        per_create.push((thread_cpu_ns() - start) as f64 / PER_ROUND as f64);
    }
    per_create.sort_by(f64::total_cmp);
    per_create[ROUNDS / 2]
}

fn main() {
    let cm = measure("", "configmaps", config_map);
    println!("ConfigMap create: {cm:.0} ns CPU (median of {ROUNDS} rounds of {PER_ROUND})");
    let deploy = measure("apps", "deployments", deployment);
    println!("Deployment create: {deploy:.0} ns CPU (median of {ROUNDS} rounds of {PER_ROUND})");
    println!(
        "BENCH_JSON {}",
        json!({"configmap_create_cpu_ns": cm, "deployment_create_cpu_ns": deploy, "per_round": PER_ROUND, "rounds": ROUNDS})
    );
}
