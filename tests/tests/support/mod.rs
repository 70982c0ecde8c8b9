//! Harness for the manager's end-to-end suites: devcluster in-process, the real `ctrlhub`
//! binary as a child process, and a raw gRPC "replica" that lets a test decide exactly when and
//! how each reconcile request is answered.

#![allow(dead_code)]

pub mod rbac;

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tonic::Streaming;

/// Generous bound for anything a test waits for; tests wait on conditions, never on the clock.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The workspace's target directory, where `tests/run.sh` builds the binaries first.
pub fn bin(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("debug").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (tests/run.sh does)",
        path.display()
    );
    path
}

/// Lease timings short enough for failover tests to finish quickly (renew deadline below the
/// lease duration, as the manager requires).
pub const FAST_LEASE: [&str; 6] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];

/// A free loopback port (bound and released; good enough on a test machine).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// devcluster plus a kubeconfig file for child processes.
pub struct Cluster {
    /// The running server.
    pub dc: devcluster::DevCluster,
    /// A kube client for the test's own writes.
    pub client: kube::Client,
    /// Kubeconfig path for child processes.
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

/// Start devcluster.
pub async fn cluster() -> Cluster {
    let dc = devcluster::DevCluster::start(devcluster::Options::default())
        .await
        .expect("devcluster starts");
    let client = dc.client().await.expect("kube client");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    dc.write_kubeconfig(&kubeconfig)
        .expect("kubeconfig written");
    Cluster {
        dc,
        client,
        kubeconfig,
        _dir: dir,
    }
}

/// Each manager logs to its own file (cargo test cannot capture a child's stderr); the path is
/// printed so a failing test's output points at it.
fn log_file(identity: &str, port: u16) -> Stdio {
    let path = std::env::temp_dir().join(format!("ctrlhub-test-{identity}-{port}.log"));
    println!("manager {identity} logs to {}", path.display());
    std::fs::File::create(&path)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

/// A `ctrlhub run` child process.
pub struct Manager {
    child: Option<Child>,
    /// gRPC endpoint, e.g. `http://127.0.0.1:PORT`.
    pub grpc: String,
    /// HTTP base URL.
    pub http: String,
    /// Lease identity.
    pub identity: String,
}

impl Manager {
    /// Start a manager; `extra` args are appended (e.g. lease timings, WATCH_NAMESPACE).
    pub async fn start(cluster: &Cluster, identity: &str, extra: &[&str]) -> Manager {
        Self::start_with_env(cluster, identity, extra, &[]).await
    }

    /// [`Manager::start`] with extra environment variables (e.g. `OTEL_*`). Trace export is off
    /// unless `env` turns it on, whatever the test process's own environment says.
    pub async fn start_with_env(
        cluster: &Cluster,
        identity: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Manager {
        let grpc_port = free_port();
        let http_port = free_port();
        let mut cmd = Command::new(bin("ctrlhub"));
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args([
                "--grpc-addr",
                &format!("127.0.0.1:{grpc_port}"),
                "--http-addr",
                &format!("127.0.0.1:{http_port}"),
            ])
            .args(["--token", "dev", "--identity", identity])
            .args(extra)
            .env_remove("WATCH_NAMESPACE")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .envs(env.iter().copied())
            .env("RUST_LOG", "info,ctrlhub=debug")
            .stdout(Stdio::null())
            .stderr(log_file(identity, http_port))
            .kill_on_drop(true);
        let child = cmd.spawn().expect("ctrlhub starts");
        let m = Manager {
            child: Some(child),
            grpc: format!("http://127.0.0.1:{grpc_port}"),
            http: format!("http://127.0.0.1:{http_port}"),
            identity: identity.to_string(),
        };
        let http = reqwest::Client::new();
        let url = format!("{}/healthz", m.http);
        wait_until("manager /healthz", || {
            let http = http.clone();
            let url = url.clone();
            async move {
                http.get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
        m
    }

    /// `/status` as JSON.
    pub async fn status(&self) -> serde_json::Value {
        reqwest::get(format!("{}/status", self.http))
            .await
            .expect("status reachable")
            .json()
            .await
            .expect("status is JSON")
    }

    /// The value of one series of `/metrics`, named with its labels as the exposition writes
    /// them (sorted), e.g. `ctrlhub_sessions{controller="c",tenant="dev"}`; 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.http))
            .await
            .expect("metrics reachable")
            .text()
            .await
            .expect("metrics text");
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Wait until this manager leads.
    pub async fn wait_leading(&self) {
        wait_until("manager leads", || async {
            self.status().await["leading"] == serde_json::json!(true)
        })
        .await;
    }

    /// SIGTERM and wait for exit (graceful: releases the lease).
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            let _ = tokio::time::timeout(PATIENCE, child.wait()).await;
        }
    }

    /// Send `signal` (a `kill -SIGNAL` name such as "STOP" or "CONT") to the manager process.
    pub fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.as_ref().and_then(|c| c.id()) {
            let _ = std::process::Command::new("kill")
                .args([format!("-{signal}"), pid.to_string()])
                .status();
        }
    }

    /// SIGKILL (crash: the lease must expire).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// Poll `cond` until it holds, panicking with `what` after [`PATIENCE`].
pub async fn wait_until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "timed out after {PATIENCE:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A ConfigMap controller registration with sensible test defaults.
pub fn register_configmaps(name: &str, credits: u32) -> pb::Register {
    pb::Register {
        controller_name: name.to_string(),
        mode: pb::register::Mode::Reconcile as i32,
        primary: Some(pb::ResourceType {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: String::new(),
        }),
        max_concurrent_reconciles: 64,
        max_in_flight: credits,
        include_object: true,
        ..Default::default()
    }
}

/// Seconds as a protobuf Duration.
pub fn secs(s: f64) -> prost_types::Duration {
    prost_types::Duration::try_from(Duration::from_secs_f64(s)).expect("in range")
}

/// One controller replica speaking the raw protocol.
pub struct Replica {
    tx: mpsc::Sender<pb::ControllerMessage>,
    rx: Streaming<pb::ManagerMessage>,
    /// From Registered.
    pub session_id: String,
    /// A client for Get/List.
    pub client: ControllerManagerClient<tonic::transport::Channel>,
}

/// Why a replica could not register.
pub type ConnectError = tonic::Status;

/// A request carrying `authorization` metadata as given (None: none at all).
pub fn with_authorization<T>(msg: T, authorization: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(value) = authorization {
        req.metadata_mut()
            .insert("authorization", value.parse().expect("valid header value"));
    }
    req
}

impl Replica {
    /// Connect and register with the static `dev` token; Err carries the manager's status.
    pub async fn connect(endpoint: &str, register: pb::Register) -> Result<Replica, ConnectError> {
        Self::connect_with(endpoint, register, Some("Bearer dev")).await
    }

    /// Connect and register sending `authorization` metadata as given (None: no metadata).
    pub async fn connect_with(
        endpoint: &str,
        register: pb::Register,
        authorization: Option<&str>,
    ) -> Result<Replica, ConnectError> {
        Self::connect_with_metadata(endpoint, register, authorization, &[]).await
    }

    /// As [`Replica::connect_with`], plus extra metadata (e.g. headers trying to spoof a tenant).
    pub async fn connect_with_metadata(
        endpoint: &str,
        register: pb::Register,
        authorization: Option<&str>,
        extra: &[(&'static str, &str)],
    ) -> Result<Replica, ConnectError> {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .expect("valid endpoint")
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        Self::connect_over(channel, register, authorization, extra).await
    }

    /// Register over an already connected `channel` (e.g. one speaking TLS).
    pub async fn connect_over(
        channel: tonic::transport::Channel,
        register: pb::Register,
        authorization: Option<&str>,
        extra: &[(&'static str, &str)],
    ) -> Result<Replica, ConnectError> {
        let mut client = ControllerManagerClient::new(channel);
        let (tx, rx) = mpsc::channel(1024);
        tx.send(pb::ControllerMessage {
            message: Some(pb::controller_message::Message::Register(Box::new(
                register,
            ))),
        })
        .await
        .expect("queue register");
        let mut request = with_authorization(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            authorization,
        );
        for (name, value) in extra {
            request
                .metadata_mut()
                .insert(*name, value.parse().expect("ascii metadata"));
        }
        let mut stream = client.connect(request).await?.into_inner();
        let first = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no Registered"))??
            .ok_or_else(|| tonic::Status::cancelled("stream ended before Registered"))?;
        match first.message {
            Some(pb::manager_message::Message::Registered(r)) => Ok(Replica {
                tx,
                rx: stream,
                session_id: r.session_id,
                client,
            }),
            other => Err(tonic::Status::internal(format!(
                "expected Registered, got {other:?}"
            ))),
        }
    }

    /// The next reconcile request, or None if none arrives within `within` (or the stream ends).
    pub async fn next(&mut self, within: Duration) -> Option<pb::ReconcileRequest> {
        loop {
            match tokio::time::timeout(within, self.rx.message()).await {
                Ok(Ok(Some(pb::ManagerMessage {
                    message: Some(pb::manager_message::Message::Reconcile(r)),
                }))) => return Some(r),
                Ok(Ok(Some(_))) => continue,
                _ => return None,
            }
        }
    }

    /// The next EVENTS-mode delivery, or None if none arrives within `within`.
    pub async fn next_event(&mut self, within: Duration) -> Option<pb::Event> {
        loop {
            match tokio::time::timeout(within, self.rx.message()).await {
                Ok(Ok(Some(pb::ManagerMessage {
                    message: Some(pb::manager_message::Message::Event(e)),
                }))) => return Some(e),
                Ok(Ok(Some(_))) => continue,
                _ => return None,
            }
        }
    }

    /// How the session ended, if it ends within `within`: the Revoked code, or the stream's
    /// final status. Reconcile requests arriving meanwhile are ignored.
    pub async fn ended(&mut self, within: Duration) -> Option<tonic::Status> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.rx.message()).await {
                Ok(Ok(Some(pb::ManagerMessage {
                    message: Some(pb::manager_message::Message::Revoked(r)),
                }))) => return Some(tonic::Status::new(tonic::Code::from(r.code), r.message)),
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) => return Some(tonic::Status::ok("stream closed")),
                Ok(Err(status)) => return Some(status),
                Err(_) => return None,
            }
        }
    }

    /// Acknowledge an EVENTS-mode delivery.
    pub async fn ack(&self, id: &str) {
        let msg = pb::ControllerMessage {
            message: Some(pb::controller_message::Message::EventAck(pb::EventAck {
                id: id.to_string(),
            })),
        };
        let _ = self.tx.send(msg).await;
    }

    /// The next request, failing the test if none arrives within [`PATIENCE`].
    pub async fn expect(&mut self) -> pb::ReconcileRequest {
        self.next(PATIENCE).await.expect("a reconcile request")
    }

    /// Answer a request.
    pub async fn reply(&self, id: &str, outcome: pb::reconcile_result::Outcome) {
        let msg = pb::ControllerMessage {
            message: Some(pb::controller_message::Message::Result(
                pb::ReconcileResult {
                    id: id.to_string(),
                    outcome: Some(outcome),
                },
            )),
        };
        // A closed stream just means the session is gone; the test notices through its assertions.
        let _ = self.tx.send(msg).await;
    }

    /// Answer Done.
    pub async fn done(&self, id: &str) {
        self.reply(
            id,
            pb::reconcile_result::Outcome::Done(pb::reconcile_result::Done {}),
        )
        .await;
    }
}

/// `namespace/name` of a request.
pub fn key(r: &pb::ReconcileRequest) -> String {
    r.key
        .as_ref()
        .map(|k| format!("{}/{}", k.namespace, k.name))
        .unwrap_or_default()
}

/// Create or update a ConfigMap with `data`.
pub async fn put_configmap(client: &kube::Client, ns: &str, name: &str, data: &[(&str, &str)]) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data});
    api.patch(
        name,
        &PatchParams::apply("tests").force(),
        &Patch::Apply(&cm),
    )
    .await
    .expect("configmap applied");
}

/// Create a namespace (optionally labelled).
pub async fn namespace(client: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<Namespace> = Api::all(client.clone());
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
    api.patch(
        name,
        &PatchParams::apply("tests").force(),
        &Patch::Apply(&ns),
    )
    .await
    .expect("namespace applied");
}

/// Whether the manager serving HTTP at `http` says it leads (false if it does not answer
/// within a second): how the test proxies play the leader-selecting Service.
pub async fn is_leading(http: &str) -> bool {
    let leading = async {
        let s: serde_json::Value = reqwest::get(format!("{http}/status"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        Some(s["leading"] == serde_json::json!(true))
    };
    tokio::time::timeout(Duration::from_secs(1), leading)
        .await
        .ok()
        .flatten()
        == Some(true)
}
