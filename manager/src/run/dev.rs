//! `ctrlhub dev`: devcluster, the manager and the memcached demo controller in one command.
//!
//! Everything runs in this process but talks as in production: the manager reaches devcluster
//! over HTTPS with a kubeconfig, and the controller reaches the manager over real gRPC on
//! loopback and writes to devcluster with its own client.

use crate::run::RunArgs;
use anyhow::Context;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Options of `ctrlhub dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// gRPC address of the manager.
    #[arg(long, env = "CTRLHUB_GRPC_ADDR", default_value = "127.0.0.1:9090")]
    pub grpc_addr: SocketAddr,
    /// HTTP address of the manager (/metrics, /status, /healthz).
    #[arg(long, env = "CTRLHUB_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// Address of the embedded API server; port 0 picks a free one.
    #[arg(long, env = "CTRLHUB_API_ADDR", default_value = "127.0.0.1:0")]
    pub api_addr: SocketAddr,
    /// Where the kubeconfig for kubectl is written.
    #[arg(long, env = "CTRLHUB_STATE_DIR", default_value = ".ctrlhub-dev")]
    pub state_dir: PathBuf,
    /// spec.size of the sample Memcached.
    #[arg(long, env = "CTRLHUB_SIZE", default_value_t = 3)]
    pub size: u32,
    /// Exit after the sample reports Available (for scripts and tests) instead of running until
    /// interrupted.
    #[arg(long, env = "CTRLHUB_EXIT_WHEN_READY")]
    pub exit_when_ready: bool,
}

fn say(line: impl AsRef<str>) {
    println!("ctrlhub dev | {}", line.as_ref());
}

fn sample(size: u32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {"name": "memcached-sample", "namespace": "default"},
        "spec": {"size": size},
    })
}

impl DevArgs {
    /// Run everything until `stop` fires (or the sample is ready, with `--exit-when-ready`).
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let (cluster, kubeconfig) = self.start_cluster().await?;
        let manager_stop = stop.child_token();
        let manager = self
            .start_manager(&kubeconfig, manager_stop.clone())
            .await?;
        let controller_stop = stop.child_token();
        // The demo controller runs in this process but is its own service in traces.
        let controller_traces = ctrlhub_otel::init_component("memcached-controller")
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "the controller's traces are not exported");
                ctrlhub_otel::Traces::disabled()
            });
        let controller = self.start_controller(
            &kubeconfig,
            controller_traces.tracer(),
            controller_stop.clone(),
            stop.clone(),
        );
        let client = cluster
            .client()
            .await
            .context("kube client for devcluster")?;
        let memcacheds = self.apply_sample(&client).await?;
        self.print_next_steps(&kubeconfig);
        let ready = self.follow_sample(&client, memcacheds, &stop).await;

        say("shutting down: controller drains, manager releases the lease...");
        controller_stop.cancel();
        let controller_failed = matches!(
            tokio::time::timeout(Duration::from_secs(10), controller).await,
            Ok(Ok(Err(_)))
        );
        controller_traces.shutdown().await;
        manager_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), manager).await;
        cluster.shutdown().await;
        say("stopped");
        if controller_failed {
            anyhow::bail!("the memcached controller stopped on an error (above)");
        }
        if self.exit_when_ready && !ready {
            anyhow::bail!("the sample never became Available");
        }
        Ok(())
    }

    /// Starts devcluster and writes the kubeconfig kubectl and the manager use.
    async fn start_cluster(&self) -> anyhow::Result<(devcluster::DevCluster, PathBuf)> {
        say("starting devcluster (in-memory Kubernetes API server)...");
        let cluster = devcluster::DevCluster::start(devcluster::Options {
            listen: self.api_addr,
            ..Default::default()
        })
        .await
        .context("starting devcluster")?;
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("creating {}", self.state_dir.display()))?;
        let kubeconfig = std::fs::canonicalize(&self.state_dir)
            .unwrap_or(self.state_dir.clone())
            .join("kubeconfig");
        cluster
            .write_kubeconfig(&kubeconfig)
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        say(format!(
            "devcluster ready at {} (kubeconfig: {})",
            cluster.url(),
            kubeconfig.display()
        ));
        Ok((cluster, kubeconfig))
    }

    /// Starts the manager (as `ctrlhub run` with its defaults and a static `dev` token) and waits
    /// until it leads.
    async fn start_manager(
        &self,
        kubeconfig: &Path,
        stop: CancellationToken,
    ) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
        say(format!(
            "starting the manager: gRPC {} , HTTP {}",
            self.grpc_addr, self.http_addr
        ));
        let mut manager = tokio::spawn(self.manager_args(kubeconfig).run(stop));
        wait_for_leader(&format!("http://{}/status", self.http_addr), &mut manager).await?;
        say("manager is the leader and accepts controllers");
        Ok(manager)
    }

    /// `ctrlhub run`'s defaults, pointed at devcluster, with the static token `dev`.
    fn manager_args(&self, kubeconfig: &Path) -> RunArgs {
        let limits = crate::tenancy::Limits::default();
        RunArgs {
            kubeconfig: Some(kubeconfig.to_path_buf()),
            grpc_addr: self.grpc_addr,
            http_addr: self.http_addr,
            probe_addr: None,
            http_tls_cert: None,
            http_tls_key: None,
            watch_namespace: String::new(),
            auth: crate::run::AuthMode::Static,
            token: "dev".into(),
            insecure_static_auth: false,
            audience: "ctrlhub".into(),
            token_cache_ttl: Duration::from_secs(120),
            authz_allow_ttl: Duration::from_secs(300),
            authz_deny_ttl: Duration::from_secs(30),
            secrets_tenants: String::new(),
            max_sessions_per_tenant: limits.sessions,
            max_controllers_per_tenant: limits.controllers,
            max_informers_per_tenant: limits.informers,
            max_cached_bytes_per_tenant: limits.cached_bytes,
            max_registrations_per_second: limits.registrations_per_second,
            max_queued_keys: limits.queued_keys,
            max_in_flight_per_tenant: limits.in_flight,
            min_request_deadline: limits.min_deadline,
            max_request_deadline: limits.max_deadline,
            min_resync_period: limits.min_resync,
            dev_stall_on_sigusr1: None,
            hold_period: None,
            controller_grace: Duration::from_secs(15 * 60),
            first_list_timeout: crate::grpc::FIRST_LIST_TIMEOUT,
            max_concurrent_first_lists: 8,
            tenant_policies: true,
            // Ctrl-C in a terminal should end dev quickly; a demo reconcile is short.
            shutdown_grace: Duration::from_secs(2),
            max_queued_bytes_per_tenant: limits.queued_bytes,
            tenant_limits: Vec::new(),
            tenant_grouping: crate::tenancy::TenantGrouping::default(),
            max_dispatch_seats: crate::dispatch::seats::DEFAULT_SEATS,
            tenant_weights: Vec::new(),
            grpc_tls_cert: None,
            grpc_tls_key: None,
            grpc_client_ca: None,
            max_message_bytes: 1024 * 1024,
            max_connections: 4096,
            max_connections_per_peer: 128,
            handshake_timeout: Duration::from_secs(10),
            connection_idle_timeout: Duration::from_secs(300),
            max_concurrent_streams: 512,
            lease_name: "ctrlhub-leader".into(),
            lease_namespace: "kube-system".into(),
            identity: Some("ctrlhub-dev".into()),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            leader_pod_label: None,
            kube_api_qps: 50.0,
            kube_api_burst: 100,
            mode: crate::run::Mode::Leader,
            ring_name: "ctrlhub".into(),
            member_address: None,
            member_weight: 100,
            handover_drain: Duration::from_secs(5),
        }
    }

    /// Starts the memcached demo controller: it connects over gRPC and installs its CRD. If it
    /// stops on an error (a bad `CTRLHUB_REVISION` in the environment, say), the error is shown
    /// and `failed` ends the whole run, instead of a sample that silently never reconciles.
    fn start_controller(
        &self,
        kubeconfig: &Path,
        tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
        stop: CancellationToken,
        failed: CancellationToken,
    ) -> tokio::task::JoinHandle<anyhow::Result<()>> {
        say("starting the memcached controller (connects over gRPC, installs its CRD)...");
        let args = memcached_controller::Args {
            manager: format!("http://{}", self.grpc_addr),
            token: "dev".into(),
            kubeconfig: Some(kubeconfig.to_path_buf()),
            install_crd: true,
            print_crd: false,
            max_concurrent_reconciles: 4,
            namespaces: Vec::new(),
            token_file: None,
            log_format: ctrlhub_otel::logs::LogFormat::default(),
            tracer,
        };
        tokio::spawn(async move {
            let result = memcached_controller::run(args, stop).await;
            if let Err(e) = &result {
                say(format!("the memcached controller stopped: {e:#}"));
                failed.cancel();
            }
            result
        })
    }

    /// Applies the sample Memcached once the controller's CRD is served.
    async fn apply_sample(&self, client: &kube::Client) -> anyhow::Result<Api<DynamicObject>> {
        let ar = kube::api::ApiResource {
            group: "cache.example.com".into(),
            version: "v1alpha1".into(),
            api_version: "cache.example.com/v1alpha1".into(),
            kind: "Memcached".into(),
            plural: "memcacheds".into(),
        };
        let memcacheds: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
        let applied = async {
            loop {
                let params = PatchParams::apply("ctrlhub-dev");
                let patch = Patch::Apply(sample(self.size));
                match memcacheds.patch("memcached-sample", &params, &patch).await {
                    Ok(_) => return,
                    // The CRD is installed by the controller; wait for it to be served.
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), applied)
            .await
            .context("the Memcached CRD was not served within 60s")?;
        say(format!(
            "applied Memcached default/memcached-sample (spec.size={})",
            self.size
        ));
        Ok(memcacheds)
    }

    fn print_next_steps(&self, kubeconfig: &Path) {
        let kubeconfig = kubeconfig.display();
        say("next steps:");
        say(format!(
            "  kubectl --kubeconfig {kubeconfig} get memcacheds,deployments"
        ));
        say(format!(
            "  kubectl --kubeconfig {kubeconfig} patch memcached memcached-sample --type=merge -p '{{\"spec\":{{\"size\":5}}}}'"
        ));
        say(format!(
            "  your own controller: dial {} (gRPC, plaintext) with metadata `authorization: Bearer dev`",
            self.grpc_addr
        ));
        say(format!(
            "    every SDK (Rust, Python, TypeScript) reads CTRLHUB_ADDR=http://{} CTRLHUB_TOKEN=dev; protocol: docs/protocol.md",
            self.grpc_addr
        ));
        say(format!(
            "  curl http://{}/status    (controllers, queues, informers)",
            self.http_addr
        ));
        say(format!(
            "  curl http://{}/metrics   (Prometheus)",
            self.http_addr
        ));
        say("  Ctrl-C stops everything");
    }

    /// Prints the sample's status as the controller reconciles it, until `stop` (or, with
    /// `--exit-when-ready`, until it is Available). Returns whether it became Available.
    async fn follow_sample(
        &self,
        client: &kube::Client,
        memcacheds: Api<DynamicObject>,
        stop: &CancellationToken,
    ) -> bool {
        let mut events = watcher(memcacheds, watcher::Config::default()).boxed();
        let mut last = String::new();
        let mut ready = false;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return ready,
                ev = events.next() => ev,
            };
            match ev {
                Some(Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => {
                    let whole = serde_json::to_value(&obj).unwrap_or_default();
                    let line = describe(&whole);
                    if line != last {
                        say(format!("memcached-sample: {line}"));
                        last = line;
                    }
                    if is_available(&whole) && !ready {
                        ready = true;
                        self.report_ready(client).await;
                        if self.exit_when_ready {
                            return ready;
                        }
                    }
                }
                Some(Ok(watcher::Event::Delete(_))) => say("memcached-sample deleted"),
                Some(_) => {}
                None => return ready,
            }
        }
    }

    /// Once the sample is Available: its Deployment's size and the manager's status.
    async fn report_ready(&self, client: &kube::Client) {
        let deps: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), "default");
        if let Ok(d) = deps.get("memcached-sample").await {
            let replicas = d.spec.and_then(|s| s.replicas).unwrap_or_default();
            say(format!(
                "Deployment default/memcached-sample has spec.replicas={replicas}"
            ));
        }
        if let Ok(status) = reqwest_status(&format!("http://{}/status", self.http_addr)).await {
            say(format!("manager status: {status}"));
        }
    }
}

fn is_available(obj: &serde_json::Value) -> bool {
    obj.pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Available" && c["status"] == "True")
        })
}

fn describe(obj: &serde_json::Value) -> String {
    let generation = obj
        .pointer("/metadata/generation")
        .and_then(|g| g.as_i64())
        .unwrap_or(0);
    let observed = obj
        .pointer("/status/observedGeneration")
        .and_then(|g| g.as_i64());
    let condition = obj
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
        .map(|c| {
            format!(
                "Available={} ({})",
                c["status"].as_str().unwrap_or("?"),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "no status yet".into());
    match observed {
        Some(o) => format!("generation {generation}, observed {o}: {condition}"),
        None => format!("generation {generation}: {condition}"),
    }
}

/// Waits until the manager's `/status` says it leads; if the manager stops first, its own error
/// says why (a port in use names that port: `binding gRPC 127.0.0.1:50051`).
async fn wait_for_leader(
    url: &str,
    manager: &mut tokio::task::JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    for _ in 0..300 {
        if manager.is_finished() {
            let why = match manager.await {
                Ok(Err(e)) => format!("{e:#}"),
                Ok(Ok(())) => "it exited without an error".to_string(),
                Err(e) => format!("its task failed: {e}"),
            };
            anyhow::bail!(
                "the manager stopped during start-up: {why} (another port: --grpc-addr, --http-addr)"
            );
        }
        if reqwest_status(url)
            .await
            .is_ok_and(|s| s.contains("leading=true"))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the manager did not become leader within 30s")
}

/// A one-line summary of the manager's /status (plain HTTP on loopback, no client crate needed).
async fn reqwest_status(url: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").context("http URL")?;
    let (host, path) = rest.split_once('/').context("URL with a path")?;
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body)?;
    let controllers: Vec<String> = v["controllers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    format!(
                        "{} (sessions={}, dispatched={}, done={}, queued={})",
                        c["name"].as_str().unwrap_or("?"),
                        c["sessions"],
                        c["dispatched"],
                        c["done"],
                        c["queued"]
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(format!(
        "leading={} controllers=[{}] informers={}",
        v["leading"],
        controllers.join(", "),
        v["informers"].as_array().map(Vec::len).unwrap_or(0)
    ))
}

/// On every SIGUSR1, block each worker thread of the current runtime for `stall`: the fault
/// the stall watchdog exists for (a leader whose dispatch runtime cannot run must give up its
/// Lease), injected from outside by the tests.
pub(super) fn stall_on_sigusr1(stall: std::time::Duration) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut signals = signal(SignalKind::user_defined1())?;
    tokio::spawn(async move {
        while signals.recv().await.is_some() {
            let workers = tokio::runtime::Handle::current().metrics().num_workers();
            tracing::warn!(
                ?stall,
                workers,
                "SIGUSR1: stalling every worker of the dispatch runtime (--dev-stall-on-sigusr1)"
            );
            for _ in 0..workers {
                tokio::spawn(async move { std::thread::sleep(stall) });
            }
        }
    });
    Ok(())
}
