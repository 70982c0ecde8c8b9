//! Reconnecting, against real managers (`target/debug/ctrlhub run`) and devcluster:
//!
//! - the reconnect backoff resets whenever a session registers: two leader changes in a row
//!   (a normal two-pod rollout of the manager, within seconds) each reconnect after the first
//!   backoff step, not after a growing one (issue 25, item 4);
//! - a manager that shuts down refuses new sessions with UNAVAILABLE: the SDK says it is
//!   reconnecting, never that it was rejected.
//!
//! Both read the SDK's own log lines (captured in-process as JSON). Build the binaries first:
//! `cargo build --bin ctrlhub --bin devcluster`.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctrlhub_sdk::{
    Action, Backoff, CancellationToken, Config, Controller, ReconcileError, Request, Scope,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::{
    Cluster, Manager, ManagerOptions, PATIENCE, SwitchProxy, TOKEN, captured_logs, eventually,
};

/// What a line says.
fn message(line: &Value) -> String {
    line["fields"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn idle(_: Request<ConfigMap>, _: Arc<()>) -> Result<Action, ReconcileError> {
    Ok(Action::done())
}

#[tokio::test]
async fn two_leader_changes_in_a_row_each_reconnect_after_the_first_backoff_step() {
    let logs = captured_logs();
    let cluster = Cluster::start("reconnect-backoff").await;
    // Two managers that both lead (each its own Lease), and the Service in front: a leader
    // change is the proxy pointing at the other one and cutting the open connection.
    let options = |identity: &str, lease: &'static str| ManagerOptions {
        identity: identity.into(),
        lease_name: Some(lease),
        ..ManagerOptions::default()
    };
    let a = Manager::start(&cluster, options("mgr-a", "lease-a")).await;
    let b = Manager::start(&cluster, options("mgr-b", "lease-b")).await;
    let proxy = SwitchProxy::start(a.grpc_port).await;

    // A first step of 1 s (500 ms to 1 s with jitter); the second would be 1 s to 2 s.
    let step = Duration::from_secs(1);
    let mut config = Config::new(proxy.addr(), TOKEN);
    config.reconnect = Backoff::new(step, Duration::from_secs(30), Duration::from_secs(300));
    let registered: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = registered.clone();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("backoff")
            .reconciles::<ConfigMap>()
            .namespaces(Scope::Names(vec!["default".into()]))
            .on_registered(move |_| seen.lock().unwrap().push(Instant::now()))
            .run(config, idle, Arc::new(()), shutdown.clone()),
    );
    let sessions = || registered.lock().unwrap().clone();
    eventually("the first session", PATIENCE, || async {
        (sessions().len() == 1).then_some(())
    })
    .await;

    let mut gaps = Vec::new();
    for (n, to) in [(2, b.grpc_port), (3, a.grpc_port)] {
        let cut = Instant::now();
        proxy.switch(to);
        eventually("the session after a leader change", PATIENCE, || async {
            (sessions().len() == n).then_some(())
        })
        .await;
        gaps.push(sessions()[n - 1] - cut);
    }
    println!("reconnected after {gaps:?}");

    let reconnects: Vec<Value> = logs
        .of("backoff")
        .into_iter()
        .filter(|l| message(l).contains("reconnecting in"))
        .collect();
    assert_eq!(reconnects.len(), 2, "{reconnects:#?}");
    for line in &reconnects {
        assert_eq!(
            line["fields"]["failures"], 1,
            "each leader change is a first failure: {line}"
        );
        let delay = line["fields"]["delay_ms"].as_u64().unwrap();
        assert!(
            delay <= step.as_millis() as u64,
            "waited within the first step: {line}"
        );
        assert_eq!(
            line["level"], "INFO",
            "a leader change is no warning: {line}"
        );
    }
    // The second reconnect came as quickly as the first (both within one step, plus the
    // registration itself on a loaded machine).
    assert!(gaps[1] < step + Duration::from_secs(5), "{gaps:?}");

    shutdown.cancel();
    tokio::time::timeout(PATIENCE, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Holds one attempt for 6 s, so that the manager stays in its shutdown grace meanwhile.
async fn hold(
    req: Request<ConfigMap>,
    started: Arc<Mutex<bool>>,
) -> Result<Action, ReconcileError> {
    if req.object.is_some() {
        *started.lock().unwrap() = true;
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    Ok(Action::done())
}

#[tokio::test]
async fn a_manager_shutting_down_is_reconnecting_never_a_rejection() {
    let logs = captured_logs();
    let cluster = Cluster::start("reconnect-shutdown").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    cluster.namespace("held").await;
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "held");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "slow"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let started: Arc<Mutex<bool>> = Arc::default();
    let shutdown = CancellationToken::new();
    let holder = tokio::spawn(
        Controller::new("holder")
            .reconciles::<ConfigMap>()
            .namespaces(Scope::Names(vec!["held".into()]))
            .include_object(true)
            .run(manager.config(), hold, started.clone(), shutdown.clone()),
    );
    eventually("the held attempt", PATIENCE, || async {
        started.lock().unwrap().then_some(())
    })
    .await;

    // SIGTERM: the manager takes no new session while the held attempt finishes.
    manager.process.signal("TERM");
    eventually("the manager to shut down", PATIENCE, || async {
        let log = std::fs::read_to_string(&manager.process.log).unwrap_or_default();
        log.contains("shutting down: nothing new goes out")
            .then_some(())
    })
    .await;
    let late = tokio::spawn(
        Controller::new("late")
            .reconciles::<ConfigMap>()
            .namespaces(Scope::Names(vec!["held".into()]))
            .run(manager.config(), idle, Arc::new(()), shutdown.clone()),
    );
    let refused = eventually("the late controller to be refused", PATIENCE, || async {
        logs.of("late").into_iter().find(|l| {
            let m = message(l);
            m.contains("reconnecting in") && m.contains("shutting down")
        })
    })
    .await;
    println!("{refused}");
    let said: Vec<String> = logs.of("late").iter().map(message).collect();
    assert!(
        said.iter().all(|m| !m.to_lowercase().contains("rejected")),
        "a manager shutting down is no rejection: {said:#?}"
    );
    shutdown.cancel();
    for run in [holder, late] {
        assert!(tokio::time::timeout(PATIENCE, run).await.unwrap().is_ok());
    }
}
