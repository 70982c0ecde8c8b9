//! The real `ctrlhub` binary as a child process: how it is launched, its HTTP endpoints
//! (`/healthz`, `/status`, `/metrics`), leadership, and its end (SIGTERM, SIGKILL, signals).

use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

use crate::cluster::Cluster;
use crate::process::{ChildProcess, bin, try_free_port};
use crate::wait::{PATIENCE, TimedOut, poll_until};

/// Lease timings short enough for failover to finish quickly (renew deadline below the lease
/// duration, as the manager requires): 3 s lease, 2 s renew deadline, 500 ms retry.
pub const FAST_LEASE: [&str; 6] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];

/// How a manager is launched: which binary, where it logs, and its environment.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The `ctrlhub` binary.
    pub binary: PathBuf,
    /// Where the manager's log file goes (`<dir>/ctrlhub-<identity>-<port>.log`).
    pub log_dir: PathBuf,
    /// The manager's `RUST_LOG`.
    pub rust_log: String,
    /// The static bearer token it accepts (`--token`), if any.
    pub token: Option<String>,
    /// Extra environment variables (e.g. `OTEL_*`).
    pub env: Vec<(String, String)>,
}

impl Launch {
    /// The suites' launch: `target/debug/ctrlhub`, debug logs in the temporary directory,
    /// static token `dev`.
    pub fn for_tests() -> Launch {
        Launch {
            binary: bin("ctrlhub"),
            log_dir: std::env::temp_dir(),
            rust_log: "info,ctrlhub=debug".into(),
            token: Some("dev".into()),
            env: Vec::new(),
        }
    }

    /// The `ctrlhub run` command for `identity` with `kubeconfig` on the given ports.
    fn command(&self, kubeconfig: &Path, identity: &str, ports: (u16, u16)) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--grpc-addr")
            .arg(format!("127.0.0.1:{}", ports.0))
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", ports.1))
            .args(self.token.iter().flat_map(|t| ["--token", t.as_str()]))
            .args(["--identity", identity])
            // Only what the caller asks for: not the namespace or trace export of whoever runs us.
            .env_remove("CTRLHUB_WATCH_NAMESPACE")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", &self.rust_log)
            .stdout(Stdio::null());
        cmd
    }
}

/// A `ctrlhub run` child process.
pub struct Manager {
    /// The process.
    pub process: ChildProcess,
    /// gRPC endpoint, e.g. `http://127.0.0.1:PORT`.
    pub grpc: String,
    /// HTTP base URL: `https://` when the manager runs `--auth kubernetes`.
    pub http: String,
    /// Reads the HTTP port: trusts the manager's self-signed certificate and, under Kubernetes
    /// auth, sends [`Manager::http_token`].
    pub http_client: reqwest::Client,
    /// The bearer token the HTTP port is read with under Kubernetes auth: the cluster's admin,
    /// whose `system:masters` group has every grant (the operator's view).
    pub http_token: Option<String>,
    /// Lease identity.
    pub identity: String,
    /// The manager's log file (cargo test cannot capture a child's stderr).
    pub log: PathBuf,
}

/// How a manager's start ended.
enum Started {
    Healthy,
    /// Another process bound one of its ports first.
    PortTaken,
}

impl Manager {
    /// Launches a manager as `launch` says with `extra` args appended (e.g. lease timings,
    /// `--auth`); returns once `/healthz` answers, or an error after [`PATIENCE`].
    pub async fn launch(
        cluster: &Cluster,
        identity: &str,
        extra: &[&str],
        launch: &Launch,
    ) -> Result<Manager> {
        Self::launch_with_kubeconfig(cluster, &cluster.kubeconfig, identity, extra, launch).await
    }

    /// [`Manager::launch`] reaching the API server as `kubeconfig` says (another identity, or
    /// through a proxy) instead of with the cluster's admin kubeconfig.
    pub async fn launch_with_kubeconfig(
        cluster: &Cluster,
        kubeconfig: &Path,
        identity: &str,
        extra: &[&str],
        launch: &Launch,
    ) -> Result<Manager> {
        // A free port may be taken by another suite's process before the manager binds it
        // (the suites run side by side): the manager then says so and exits, and it starts
        // again on other ports.
        let mut tries = 3;
        loop {
            let m = Self::spawn(cluster, kubeconfig, identity, extra, launch)?;
            match m.healthy().await {
                Ok(Started::Healthy) => return Ok(m),
                Ok(Started::PortTaken) if tries > 1 => tries -= 1,
                outcome => {
                    let e = match outcome {
                        Err(e) => anyhow::Error::from(e),
                        Ok(_) => anyhow::anyhow!("its ports were taken {} times", 3),
                    };
                    return Err(e.context(format!("manager log: {}", m.log.display())));
                }
            }
        }
    }

    /// Spawns a manager on two free ports (not yet known to answer).
    fn spawn(
        cluster: &Cluster,
        kubeconfig: &Path,
        identity: &str,
        extra: &[&str],
        launch: &Launch,
    ) -> Result<Manager> {
        let ports = (try_free_port()?, try_free_port()?);
        let log = launch
            .log_dir
            .join(format!("ctrlhub-{identity}-{}.log", ports.1));
        let mut cmd = launch.command(kubeconfig, identity, ports);
        cmd.args(extra);
        let secured = kubernetes_auth(extra);
        Ok(Manager {
            process: ChildProcess::spawn(&mut cmd, &log)?,
            grpc: format!("http://127.0.0.1:{}", ports.0),
            http: format!(
                "{}://127.0.0.1:{}",
                if secured { "https" } else { "http" },
                ports.1
            ),
            http_client: self_signed_client()?,
            http_token: secured.then(|| admin_token(cluster)).transpose()?,
            identity: identity.to_string(),
            log,
        })
    }

    /// Waits until `/healthz` answers with success, or the manager says a port of its was
    /// taken (it exits then).
    async fn healthy(&self) -> Result<Started, TimedOut> {
        let http = &self.http_client;
        let url = format!("{}/healthz", self.http);
        poll_until("manager /healthz", PATIENCE, || async {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if log.contains("Address already in use") {
                return Ok(Started::PortTaken);
            }
            match http.get(&url).send().await {
                Ok(r) if r.status().is_success() => Ok(Started::Healthy),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }

    /// Start a manager for a test; `extra` args are appended (e.g. lease timings, --watch-namespace).
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
        let mut launch = Launch::for_tests();
        launch.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let m = Self::launch(cluster, identity, extra, &launch)
            .await
            .unwrap_or_else(|e| panic!("manager {identity} starts: {e:#}"));
        println!("manager {identity} logs to {}", m.log.display());
        m
    }

    /// A GET of `path` on the HTTP port, with [`Manager::http_token`] when there is one.
    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let req = self.http_client.get(format!("{}{path}", self.http));
        match &self.http_token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// `/status` as JSON.
    pub async fn try_status(&self) -> Result<Value> {
        let status = self.get("/status").send().await?.error_for_status()?;
        Ok(status.json().await?)
    }

    /// `/status` as JSON, panicking when the manager does not answer.
    pub async fn status(&self) -> Value {
        self.try_status().await.expect("status reachable as JSON")
    }

    /// The `/metrics` exposition text.
    pub async fn try_metrics(&self) -> Result<String> {
        let metrics = self.get("/metrics").send().await?.error_for_status()?;
        Ok(metrics.text().await?)
    }

    /// The value of one series of `/metrics`, named with its labels as the exposition writes
    /// them (sorted), e.g. `ctrlhub_sessions{controller="c",tenant="dev"}`; 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.try_metrics().await.expect("metrics reachable");
        metric_value(&text, series).unwrap_or(0.0)
    }

    /// Whether this manager says it leads (false if it does not answer within a second).
    pub async fn leading(&self) -> bool {
        let leading = async {
            self.try_status()
                .await
                .ok()
                .map(|s| s["leading"] == json!(true))
        };
        tokio::time::timeout(Duration::from_secs(1), leading)
            .await
            .ok()
            .flatten()
            == Some(true)
    }

    /// Waits until this manager leads, or an error after [`PATIENCE`].
    pub async fn try_wait_leading(&self) -> Result<(), TimedOut> {
        let what = format!("manager {} leads", self.identity);
        poll_until(&what, PATIENCE, || async {
            self.leading()
                .await
                .then_some(())
                .ok_or("not leading".into())
        })
        .await
    }

    /// Wait until this manager leads, panicking after [`PATIENCE`].
    pub async fn wait_leading(&self) {
        self.try_wait_leading()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// SIGTERM and wait for exit (graceful: releases the lease).
    pub async fn stop(&mut self) {
        self.process.stop().await;
    }

    /// Send `signal` (a `kill -SIGNAL` name such as "STOP" or "CONT") to the manager process.
    pub fn signal(&self, signal: &str) {
        self.process.signal(signal);
    }

    /// Waits up to `within` for the process to exit on its own (after a signal); whether it did.
    pub async fn exited(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if matches!(self.process.try_wait(), Ok(Some(_))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// SIGKILL (crash: the lease must expire).
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }
}

/// Whether `ctrlhub run` arguments choose `--auth kubernetes` (whose HTTP port is HTTPS and
/// needs a token).
fn kubernetes_auth(extra: &[&str]) -> bool {
    extra.windows(2).any(|w| w == ["--auth", "kubernetes"]) || extra.contains(&"--auth=kubernetes")
}

/// An HTTP client that trusts the self-signed certificate a manager makes for itself under
/// Kubernetes auth (as Prometheus' `insecure_skip_verify` does for controller-runtime's).
pub fn self_signed_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()?)
}

/// The static admin token of the cluster's kubeconfig.
pub fn admin_token(cluster: &Cluster) -> Result<String> {
    cluster
        .dc
        .kubeconfig_yaml()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .map(|t| t.trim().to_string())
        .context("the cluster's kubeconfig has a token")
}

/// The value of `series` (name and labels as exposed) in the Prometheus exposition `text`.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether the manager serving HTTP at `http` says it leads (false if it does not answer
/// within a second): how the test proxies play the leader-selecting Service.
pub async fn is_leading(http: &str) -> bool {
    let leading = async {
        let s: Value = reqwest::get(format!("{http}/status"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        Some(s["leading"] == json!(true))
    };
    tokio::time::timeout(Duration::from_secs(1), leading)
        .await
        .ok()
        .flatten()
        == Some(true)
}
