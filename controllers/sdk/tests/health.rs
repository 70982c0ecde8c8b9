//! The health endpoint (`Config::health_addr`, `CTRLHUB_HEALTH_ADDR`) against the real manager
//! and devcluster: `/readyz` follows the session (connecting, registered, waiting as outdated,
//! draining), `/healthz` answers 500 while the controller's runtime is stuck and 200 again
//! after, and a port in use fails `run` at once.
//!
//! Build the binaries first: `cargo build --bin ctrlhub --bin devcluster`.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctrlhub_sdk::{Action, CancellationToken, Config, Controller, ReconcileError, Request, Scope};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::{
    Cluster, Manager, ManagerOptions, PATIENCE, config_for, eventually, free_port, http_get,
};
use tokio::task::JoinHandle;

/// Sleeps 3 s on every object, noting that it started.
async fn slow(
    req: Request<ConfigMap>,
    started: Arc<Mutex<bool>>,
) -> Result<Action, ReconcileError> {
    if req.object.is_some() {
        *started.lock().unwrap() = true;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    Ok(Action::done())
}

/// Waits until `path` on `port` answers `code` with a body starting with `body`.
async fn answers(port: u16, path: &str, code: u16, body: &str) -> String {
    eventually(&format!("{path} {code} {body}"), PATIENCE, || async {
        let (got, text) = http_get(port, path).await?;
        (got == code && text.starts_with(body)).then_some(text)
    })
    .await
}

/// A running controller: its health port, whether its slow reconcile started, its shutdown and
/// its task.
struct Probed {
    port: u16,
    started: Arc<Mutex<bool>>,
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), ctrlhub_sdk::Error>>,
}

/// A controller named `probed` with its health endpoint on a free port.
fn start(config: Config, revision: u64, deadline: Duration) -> Probed {
    let port = free_port();
    let mut config = config;
    config.health_addr = Some(format!("127.0.0.1:{port}").parse().unwrap());
    let started: Arc<Mutex<bool>> = Arc::default();
    let shutdown = CancellationToken::new();
    let run = Controller::new("probed")
        .reconciles::<ConfigMap>()
        .namespaces(Scope::Names(vec!["probed".into()]))
        .include_object(true)
        .deadline(deadline)
        .revision(revision)
        .run(config, slow, started.clone(), shutdown.clone());
    Probed {
        port,
        started,
        shutdown,
        run: tokio::spawn(run),
    }
}

#[tokio::test]
async fn readiness_follows_the_session() {
    let cluster = Cluster::start("health").await;
    let grpc_port = free_port();
    let options = ManagerOptions {
        grpc_port: Some(grpc_port),
        ..ManagerOptions::default()
    };
    let addr = format!("http://127.0.0.1:{grpc_port}");

    // No manager yet: live, not ready.
    let old = start(config_for(addr.clone()), 1, Duration::from_secs(30));
    let Probed {
        port: old,
        shutdown: old_shutdown,
        run: old_run,
        ..
    } = old;
    let why = answers(old, "/readyz", 503, "").await;
    assert!(
        why.starts_with("connecting to the manager") || why.starts_with("reconnecting"),
        "{why}"
    );
    assert_eq!(why.lines().count(), 1, "one line: {why:?}");
    answers(old, "/healthz", 200, "ok").await;

    // Registered: ready.
    let manager = Manager::start(&cluster, options).await;
    cluster.namespace("probed").await;
    answers(old, "/readyz", 200, "ok").await;

    // A newer definition replaces it: not ready while it waits as outdated.
    let Probed {
        port: new,
        started,
        shutdown: new_shutdown,
        run: new_run,
    } = start(manager.config(), 2, Duration::from_secs(20));
    answers(new, "/readyz", 200, "ok").await;
    let why = answers(old, "/readyz", 503, "waiting as outdated").await;
    println!("outdated: {why}");
    answers(old, "/healthz", 200, "ok").await;

    // Draining on shutdown while a reconcile still runs: not ready, until it stops.
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "probed");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "slow"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    eventually("the slow reconcile", PATIENCE, || async {
        started.lock().unwrap().then_some(())
    })
    .await;
    new_shutdown.cancel();
    let why = answers(new, "/readyz", 503, "draining").await;
    println!("draining: {why}");
    let stopped = tokio::time::timeout(PATIENCE, new_run).await.unwrap();
    assert!(stopped.unwrap().is_ok());
    assert_eq!(
        http_get(new, "/readyz").await,
        None,
        "the endpoint stops with run"
    );

    old_shutdown.cancel();
    assert!(
        tokio::time::timeout(PATIENCE, old_run)
            .await
            .unwrap()
            .unwrap()
            .is_ok()
    );
}

/// `/healthz` is answered from a thread of its own: 500 while the controller's runtime runs no
/// tick (blocking code holds its only thread), 200 once it runs again.
#[test]
fn liveness_is_500_while_the_runtime_is_stuck() {
    let port = free_port();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut config = Config::new(format!("http://127.0.0.1:{}", free_port()), "dev");
    config.health_addr = Some(format!("127.0.0.1:{port}").parse().unwrap());
    config.stuck_after = Duration::from_secs(1);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    // The probe says when it has seen the live answer; only then is the runtime held.
    let (seen_live, live_seen) = tokio::sync::oneshot::channel::<()>();
    let controller = std::thread::spawn(move || {
        runtime.block_on(async move {
            let run = Controller::new("stuck").reconciles::<ConfigMap>().run(
                config,
                slow,
                Arc::default(),
                stop,
            );
            let stuck = async {
                // Once the probe has seen it live, hold the runtime's only thread for 4 s
                // (four times `stuck_after`).
                let _ = live_seen.await;
                std::thread::sleep(Duration::from_secs(4));
                std::future::pending::<()>().await;
            };
            tokio::select! {
                r = run => r,
                () = stuck => unreachable!(),
            }
        })
    });
    let probe = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    probe.block_on(async {
        answers(port, "/healthz", 200, "ok").await;
        let _ = seen_live.send(());
        let why = answers(port, "/healthz", 500, "stuck").await;
        println!("{why}");
        answers(port, "/healthz", 200, "ok").await;
    });
    shutdown.cancel();
    assert!(controller.join().unwrap().is_ok());
}

#[tokio::test]
async fn a_health_port_in_use_fails_run_at_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = Config::new("http://127.0.0.1:1", "dev");
    config.health_addr = Some(taken.local_addr().unwrap());
    let result = Controller::new("clash").reconciles::<ConfigMap>().run(
        config,
        slow,
        Arc::default(),
        CancellationToken::new(),
    );
    let result = tokio::time::timeout(PATIENCE, result).await.unwrap();
    assert!(
        matches!(result, Err(ctrlhub_sdk::Error::Health { .. })),
        "{result:?}"
    );
}
