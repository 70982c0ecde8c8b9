//! `ctrlhub run`: command-line options and all the wiring in one place — client, caches,
//! leader election, controllers, gRPC and HTTP servers, and one shutdown token passed to all.

#[cfg(feature = "dev")]
pub mod dev;
mod ring;

use crate::dispatch::controllers::{ControllerTable, Gates, Leading, Sharing};
use crate::dispatch::dispatcher::RevokeReason;
use crate::dispatch::seats::{SeatPool, Weights};
use crate::grpc::{Service, ServiceState};
use crate::http::access::Gate;
use crate::http::probes::Probes;
use crate::http::tls::{self, CertSource};
use crate::http::{self, HttpState};
use crate::informer::Cache;
use crate::leader::health::{ApiReachability, LeaseHealth};
use crate::leader::heartbeat::{self, Heartbeat, Liveness};
use crate::leader::{Elector, LeaderConfig, LeaderState};
use crate::metrics::Metrics;
use crate::tenancy::accessreview::{AccessReviewAuthorizer, DecisionTtl};
use crate::tenancy::tokenreview::TokenReviewAuthenticator;
use crate::tenancy::{AllowAll, Limits, StaticTokens, TenantLimits};
use anyhow::Context;
use ctrlhub_proto::v1::controller_manager_server::ControllerManagerServer;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Options of `ctrlhub run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig to use; in-cluster configuration (or $KUBECONFIG) when omitted.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// gRPC listen address for controllers.
    #[arg(long, env = "CTRLHUB_GRPC_ADDR", default_value = "0.0.0.0:9090")]
    pub grpc_addr: SocketAddr,
    /// HTTP listen address for the status page (/ and /status), /metrics, the probes (/livez,
    /// /readyz, /healthz) and /debug/pprof/profile. With `--auth kubernetes` it serves HTTPS and
    /// every path but the probes and /login needs a bearer token or a login's session cookie
    /// (TokenReview, then SubjectAccessReview of `get` on the path).
    #[arg(long, env = "CTRLHUB_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// Plain-HTTP listen address for the kubelet's probes alone: /livez, /readyz (with named
    /// checks: `?verbose`) and /healthz, no token, nothing else. Unset: no probe port (the
    /// HTTP port serves the probes either way). deploy/ sets 0.0.0.0:8081.
    #[arg(long, env = "CTRLHUB_PROBE_ADDR")]
    pub probe_addr: Option<SocketAddr>,
    /// PEM certificate (chain) the HTTP port presents, re-read when the file changes; with
    /// `--auth kubernetes` and no certificate, a self-signed one is made at start.
    #[arg(long, env = "CTRLHUB_HTTP_TLS_CERT", requires = "http_tls_key")]
    pub http_tls_cert: Option<PathBuf>,
    /// PEM private key of `--http-tls-cert`.
    #[arg(long, env = "CTRLHUB_HTTP_TLS_KEY", requires = "http_tls_cert")]
    pub http_tls_key: Option<PathBuf>,
    /// Comma-separated namespaces every registration is confined to; empty = all namespaces.
    #[arg(long, env = "CTRLHUB_WATCH_NAMESPACE", default_value = "")]
    pub watch_namespace: String,
    /// How controllers are authenticated and authorized: `static` (one shared --token, tenant
    /// `dev`, everything allowed; for `ctrlhub dev` and tests) or `kubernetes` (ServiceAccount
    /// tokens verified by TokenReview, RBAC checked by SubjectAccessReview).
    #[arg(long, env = "CTRLHUB_AUTH", value_enum, default_value = "static")]
    pub auth: AuthMode,
    /// Static bearer token controllers must present with `--auth static` (a value set in the
    /// environment is never shown).
    #[arg(
        long,
        env = "CTRLHUB_TOKEN",
        default_value = "dev",
        hide_env_values = true
    )]
    pub token: String,
    /// Allow `--auth static` on an address other than loopback. Static auth lets anyone with
    /// the token register as tenant `dev` and read whatever the manager can, and leaves the
    /// HTTP port open; off a developer's machine use `--auth kubernetes`.
    #[arg(long, env = "CTRLHUB_INSECURE_STATIC_AUTH")]
    pub insecure_static_auth: bool,
    /// The audience controllers' ServiceAccount tokens must carry (`--auth kubernetes`).
    #[arg(long, env = "CTRLHUB_AUDIENCE", default_value = "ctrlhub")]
    pub audience: String,
    /// How long a TokenReview decision is reused; live sessions' tokens are authenticated
    /// again this often (and at their expiry), ending sessions whose tokens lapsed.
    #[arg(long, env = "CTRLHUB_TOKEN_CACHE_TTL", default_value = "2m", value_parser = humantime::parse_duration)]
    pub token_cache_ttl: Duration,
    /// How long an RBAC allow is reused; live registrations are re-checked this often.
    #[arg(long, env = "CTRLHUB_AUTHZ_ALLOW_TTL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub authz_allow_ttl: Duration,
    /// How long an RBAC deny is reused.
    #[arg(long, env = "CTRLHUB_AUTHZ_DENY_TTL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub authz_deny_ttl: Duration,
    /// Comma-separated tenants (full usernames, e.g.
    /// `system:serviceaccount:team-a:vault-sync`) that may register Secrets; RBAC must allow
    /// them too.
    #[arg(long, env = "CTRLHUB_SECRETS_TENANTS", default_value = "")]
    pub secrets_tenants: String,
    /// Default limit: sessions (controller replicas) per tenant.
    #[arg(long, env = "CTRLHUB_MAX_SESSIONS_PER_TENANT", default_value_t = Limits::default().sessions)]
    pub max_sessions_per_tenant: usize,
    /// Default limit: controllers (registrations) per tenant.
    #[arg(long, env = "CTRLHUB_MAX_CONTROLLERS_PER_TENANT", default_value_t = Limits::default().controllers)]
    pub max_controllers_per_tenant: usize,
    /// Default limit: distinct informers (watches and caches) per tenant.
    #[arg(long, env = "CTRLHUB_MAX_INFORMERS_PER_TENANT", default_value_t = Limits::default().informers)]
    pub max_informers_per_tenant: usize,
    /// Default limit: bytes of cached objects a tenant's controllers make the manager hold
    /// (each informer they use counted in full).
    #[arg(long, env = "CTRLHUB_MAX_CACHED_BYTES_PER_TENANT", default_value_t = Limits::default().cached_bytes)]
    pub max_cached_bytes_per_tenant: u64,
    /// Default limit: new registrations per second per tenant (after a burst of five times as
    /// many, at least 5); replicas joining a running controller are not counted. 0 = unlimited.
    #[arg(long, env = "CTRLHUB_MAX_REGISTRATIONS_PER_SECOND", default_value_t = Limits::default().registrations_per_second)]
    pub max_registrations_per_second: u64,
    /// Default limit: keys one controller may hold queued before it is revoked.
    #[arg(long, env = "CTRLHUB_MAX_QUEUED_KEYS", default_value_t = Limits::default().queued_keys)]
    pub max_queued_keys: usize,
    /// Default limit: requests in flight (sum of session credits) per tenant.
    #[arg(long, env = "CTRLHUB_MAX_IN_FLIGHT_PER_TENANT", default_value_t = Limits::default().in_flight)]
    pub max_in_flight_per_tenant: u64,
    /// What a tenant is for limits, weights and dispatch seats: `namespace` (all ServiceAccounts
    /// of a namespace together, as `system:serviceaccounts:<namespace>`; other users alone) or
    /// `identity` (every username alone). Controllers are always named per identity.
    #[arg(
        long,
        env = "CTRLHUB_TENANT_GROUPING",
        value_enum,
        default_value = "namespace"
    )]
    pub tenant_grouping: crate::tenancy::TenantGrouping,
    /// Default bound: the shortest request deadline a registration may ask for.
    #[arg(long, env = "CTRLHUB_MIN_REQUEST_DEADLINE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub min_request_deadline: Duration,
    /// Default bound: the longest request deadline a registration may ask for (how long a
    /// controller that never answers keeps what it was handed).
    #[arg(long, env = "CTRLHUB_MAX_REQUEST_DEADLINE", default_value = "15m", value_parser = humantime::parse_duration)]
    pub max_request_deadline: Duration,
    /// Default bound: the shortest resync period a registration may ask for (each resync
    /// re-delivers every key of the controller).
    #[arg(long, env = "CTRLHUB_MIN_RESYNC_PERIOD", default_value = "10s", value_parser = humantime::parse_duration)]
    pub min_resync_period: Duration,
    /// Default limit: bytes a tenant's controllers may hold in EVENTS-mode events and tombstones
    /// waiting for delivery.
    #[arg(long, env = "CTRLHUB_MAX_QUEUED_BYTES_PER_TENANT", default_value_t = Limits::default().queued_bytes)]
    pub max_queued_bytes_per_tenant: u64,
    /// Per-tenant override, repeatable: TENANT/LIMIT=N with LIMIT one of sessions, controllers,
    /// queued-keys, queued-bytes, in-flight, informers, cached-bytes, registrations-per-second;
    /// or TENANT/LIMIT=DURATION with LIMIT min-deadline, max-deadline or min-resync.
    #[arg(
        long = "tenant-limit",
        env = "CTRLHUB_TENANT_LIMIT",
        value_delimiter = ','
    )]
    pub tenant_limits: Vec<String>,
    /// Requests the manager keeps in flight across all tenants (dispatch seats); when all are
    /// taken, freed seats go to tenants by weighted fair queueing. 0 = unlimited (no fairness
    /// between tenants).
    #[arg(long, env = "CTRLHUB_MAX_DISPATCH_SEATS", default_value_t = crate::dispatch::seats::DEFAULT_SEATS)]
    pub max_dispatch_seats: usize,
    /// A tenant's weight in the fair sharing of dispatch seats, repeatable: TENANT=N (1 to
    /// 1000; every other tenant weighs 1).
    #[arg(
        long = "tenant-weight",
        env = "CTRLHUB_TENANT_WEIGHT",
        value_delimiter = ','
    )]
    pub tenant_weights: Vec<String>,
    /// PEM certificate (chain) the gRPC server presents: serve TLS instead of plaintext HTTP/2.
    #[arg(long, env = "CTRLHUB_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of `--grpc-tls-cert`.
    #[arg(long, env = "CTRLHUB_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// PEM CA bundle for mutual TLS: every controller must present a client certificate signed
    /// by it, or its connection fails in the handshake before any gRPC call (the bearer token
    /// still names the tenant). Needs `--grpc-tls-cert`.
    #[arg(long, env = "CTRLHUB_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
    pub grpc_client_ca: Option<PathBuf>,
    /// Largest gRPC message the manager accepts from a controller, in bytes (a Register must
    /// also be at most 64 KiB).
    #[arg(long, env = "CTRLHUB_MAX_MESSAGE_BYTES", default_value_t = 1024 * 1024)]
    pub max_message_bytes: usize,
    /// Connections the gRPC and HTTP ports may hold together (the HTTP port keeps a quarter of
    /// them, at most 256, so the probes always get in). At start the soft open-file limit is
    /// raised to the hard one, and this is lowered to fit below it with room for the API
    /// connections; a connection over a cap is closed as soon as it is accepted.
    #[arg(long, env = "CTRLHUB_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Connections one peer address (IPv4 address or IPv6 /64) may hold on each port; never
    /// more than a quarter of the port's cap, so one address cannot fill it.
    #[arg(long, env = "CTRLHUB_MAX_CONNECTIONS_PER_PEER", default_value_t = 128)]
    pub max_connections_per_peer: usize,
    /// How long a new connection may stay silent before its first bytes (HTTP/2 preface, TLS
    /// ClientHello), and how long its TLS handshake and, on the HTTP port, its first request
    /// and each request's headers may take.
    #[arg(long, env = "CTRLHUB_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,
    /// How long a connection may stay open with no call in progress on it (a controller's
    /// Connect stream keeps its connection; an idle one is closed and reconnects when needed).
    #[arg(long, env = "CTRLHUB_CONNECTION_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub connection_idle_timeout: Duration,
    /// Concurrent HTTP/2 streams (calls) per gRPC connection; more wait in the client. Above
    /// the per-tenant session limit, so one connection can carry all of a tenant's sessions.
    #[arg(long, env = "CTRLHUB_MAX_CONCURRENT_STREAMS", default_value_t = 512)]
    pub max_concurrent_streams: u32,
    /// Name of the leader-election Lease.
    #[arg(long, env = "CTRLHUB_LEASE_NAME", default_value = "ctrlhub-leader")]
    pub lease_name: String,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "CTRLHUB_LEASE_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease; pod name (or a random one) by default.
    #[arg(long, env = "CTRLHUB_IDENTITY")]
    pub identity: Option<String>,
    /// How long a lease is valid after its last renewal.
    #[arg(long, env = "CTRLHUB_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops dispatching.
    #[arg(long, env = "CTRLHUB_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub renew_deadline: Duration,
    /// Interval between election attempts.
    #[arg(long, env = "CTRLHUB_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub retry_period: Duration,
    /// How long a key whose attempt may still run on a replica stays with it after that
    /// replica's exclusive session is gone (counted from the manager's last heartbeat answer);
    /// the replica stops every handler within it. Default: the lease duration less the renew
    /// deadline, so a replica of a leader that lost its Lease has stopped before a successor can
    /// take over; it may not be longer.
    #[arg(long, env = "CTRLHUB_HOLD_PERIOD", value_parser = humantime::parse_duration)]
    pub hold_period: Option<Duration>,
    /// How long a controller whose last session ended stays registered, with its queue still
    /// counting, its metric series and its entry on the status page ("no sessions since"), so a
    /// dead controller is seen and alerted on; a replica registering meanwhile takes it up
    /// where it was. 0 removes it at once.
    #[arg(long, env = "CTRLHUB_CONTROLLER_GRACE", default_value = "15m", value_parser = humantime::parse_duration)]
    pub controller_grace: Duration,
    /// How long a registration waits for the first lists of all the caches it reads before it
    /// is refused with UNAVAILABLE (controller-runtime's cache sync timeout is 2 minutes too).
    #[arg(long, env = "CTRLHUB_FIRST_LIST_TIMEOUT", default_value = "2m", value_parser = humantime::parse_duration)]
    pub first_list_timeout: Duration,
    /// Watch TenantPolicy objects (ctrlhub.io/v1alpha1, deploy/base/tenantpolicy-crd.yaml) for
    /// per-tenant limits and weights, applied without a restart over the flags' values; `false`
    /// takes limits and weights from the flags only.
    #[arg(long, env = "CTRLHUB_TENANT_POLICIES", default_value_t = true, action = clap::ArgAction::Set)]
    pub tenant_policies: bool,
    /// Registrations that may list new caches at once, across tenants (a tenant's own lists
    /// go one registration at a time): after a failover every controller registers again, and
    /// this paces the relist, tenants served in turn.
    #[arg(long, env = "CTRLHUB_MAX_CONCURRENT_FIRST_LISTS", default_value_t = 8)]
    pub max_concurrent_first_lists: usize,
    /// On SIGTERM, how long the manager keeps its sessions open for the attempts already out to
    /// report their results (nothing new is handed out meanwhile) before it ends them and hands
    /// over. With the hold period it must fit in the pod's terminationGracePeriodSeconds (30 s
    /// in deploy/).
    #[arg(long, env = "CTRLHUB_SHUTDOWN_GRACE", default_value = "15s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// Fault injection for tests, in the `dev` build only: on SIGUSR1, block every worker thread
    /// of the dispatch runtime for this long, as a loop that never yields would.
    #[cfg(feature = "dev")]
    #[arg(long, env = "CTRLHUB_DEV_STALL_ON_SIGUSR1", hide = true, value_parser = humantime::parse_duration)]
    pub dev_stall_on_sigusr1: Option<Duration>,
    /// Requests a second the manager's Kubernetes client sends after its burst (lists, watches,
    /// reviews, discovery; leader election has its own client and is not limited); 0 = no
    /// limit. Higher than controller-runtime's 20 because one manager lists and watches for
    /// every tenant: a new leader's relist of 50 tenants' informers is hundreds of requests.
    #[arg(long, env = "CTRLHUB_KUBE_API_QPS", default_value_t = 50.0)]
    pub kube_api_qps: f64,
    /// Requests the manager's Kubernetes client may send at once before `--kube-api-qps`
    /// applies (client-go's burst); a watch takes one when it starts and holds none while it
    /// runs.
    #[arg(long, env = "CTRLHUB_KUBE_API_BURST", default_value_t = 100)]
    pub kube_api_burst: u32,
    /// Label the leader sets to "true" on its own pod (named by --identity, in
    /// --lease-namespace) so a Service selecting it routes controllers to the leader; unset
    /// disables pod labelling (dev, tests).
    #[arg(long, env = "CTRLHUB_LEADER_POD_LABEL")]
    pub leader_pod_label: Option<String>,
    /// `leader`: the Lease holder does every controller's work and the other replicas wait.
    /// `ring`: every replica is an active member and each controller is owned by one of them
    /// (rendezvous hashing over the members' Leases); a session reaching another member is sent
    /// to the owner.
    #[arg(long, env = "CTRLHUB_MODE", value_enum, default_value_t = Mode::Leader)]
    pub mode: Mode,
    /// Ring mode: the ring's name (the label `ctrlhub.io/ring` on every member Lease).
    #[arg(long, env = "CTRLHUB_RING_NAME", default_value = "ctrlhub")]
    pub ring_name: String,
    /// Ring mode: where other members send this member's sessions (host:port); the gRPC
    /// listen address by default. In a cluster: the pod's stable DNS name
    /// (`$(POD_NAME).ctrlhub-members.$(POD_NAMESPACE).svc:9090`).
    #[arg(long, env = "CTRLHUB_MEMBER_ADDRESS")]
    pub member_address: Option<String>,
    /// Ring mode: this member's share of controllers, relative to the others' weights.
    #[arg(long, env = "CTRLHUB_MEMBER_WEIGHT", default_value_t = 100)]
    pub member_weight: u32,
    /// Ring mode: how long a controller moving to another member may take to finish the
    /// attempts already out before they are abandoned (re-done by the new owner).
    #[arg(long, env = "CTRLHUB_HANDOVER_DRAIN", default_value = "5s", value_parser = humantime::parse_duration)]
    pub handover_drain: Duration,
}

/// How replicas share the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// One leader does every controller's work; the others are standbys.
    Leader,
    /// Every replica is an active member owning a share of the controllers.
    Ring,
}

/// How controllers are authenticated and authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// One shared static token; everything allowed.
    Static,
    /// TokenReview + SubjectAccessReview.
    Kubernetes,
}

/// The leader's own-pod label, which the controllers' Service selects.
struct PodLabel {
    pods: kube::Api<k8s_openapi::api::core::v1::Pod>,
    pod: String,
    label: String,
}

impl PodLabel {
    /// Set the label to "true" while leading and remove it otherwise; failures are logged, not
    /// fatal (the lease, not the label, decides who dispatches). A new leader also strips the
    /// label from every other pod: a leader that crashed (SIGKILL, OOM) never removed its own,
    /// and the Service would route controllers to a standby too.
    async fn set(&self, leading: bool) {
        self.patch(&self.pod, leading).await;
        if leading {
            self.strip_others().await;
        }
    }

    /// Removes a label this pod may still carry from a container that ran before this one (a
    /// restart in the same pod): called at start, before campaigning.
    async fn clear_stale(&self) {
        self.patch(&self.pod, false).await;
    }

    /// Removes the label from every other pod that carries it.
    async fn strip_others(&self) {
        let selector = format!("{}=true", self.label);
        let listed = self
            .pods
            .list_metadata(&kube::api::ListParams::default().labels(&selector))
            .await;
        let pods = match listed {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(label = %self.label, error = %e, "could not list pods carrying the leader label; a crashed leader's pod may keep it");
                return;
            }
        };
        for pod in pods {
            let name = pod.metadata.name.unwrap_or_default();
            if name != self.pod && !name.is_empty() {
                tracing::info!(pod = %name, label = %self.label, "removing the leader label from a pod that no longer leads");
                self.patch(&name, false).await;
            }
        }
    }

    async fn patch(&self, pod: &str, leading: bool) {
        let value = if leading {
            serde_json::json!("true")
        } else {
            serde_json::Value::Null
        };
        let patch = serde_json::json!({"metadata": {"labels": {self.label.as_str(): value}}});
        match self
            .pods
            .patch(
                pod,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(pod = %pod, label = %self.label, leading, "leader pod label updated")
            }
            Err(e) => {
                tracing::warn!(pod = %pod, label = %self.label, error = %e, "could not update the leader pod label")
            }
        }
    }
}

impl RunArgs {
    fn ceiling(&self) -> Option<Vec<String>> {
        let list: Vec<String> = self
            .watch_namespace
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        (!list.is_empty()).then_some(list)
    }

    /// The gRPC server's TLS settings from the PEM files (None: plaintext).
    fn grpc_tls(&self) -> anyhow::Result<Option<tonic::transport::ServerTlsConfig>> {
        let (Some(cert), Some(key)) = (&self.grpc_tls_cert, &self.grpc_tls_key) else {
            return Ok(None);
        };
        let read = |what: &str, path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))
        };
        let mut tls = tonic::transport::ServerTlsConfig::new().identity(
            tonic::transport::Identity::from_pem(
                read("--grpc-tls-cert", cert)?,
                read("--grpc-tls-key", key)?,
            ),
        );
        if let Some(ca) = &self.grpc_client_ca {
            tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(read(
                "--grpc-client-ca",
                ca,
            )?));
        }
        Ok(Some(tls))
    }

    /// The manager's Kubernetes client: observed in `metrics`, limited to the QPS and burst
    /// of the flags (see `kubeclient`).
    async fn client(&self, metrics: &Metrics) -> anyhow::Result<kube::Client> {
        let config = self.kube_config().await?;
        let qps = crate::kubeclient::Qps {
            qps: self.kube_api_qps,
            burst: self.kube_api_burst,
        };
        crate::kubeclient::build(config, &metrics.api, Some(qps))
            .context("building the Kubernetes client")
    }

    async fn kube_config(&self) -> anyhow::Result<kube::Config> {
        Ok(match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(
                    kc,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .context("loading kubeconfig")?
            }
            None => kube::Config::infer()
                .await
                .context("no kubeconfig given and no in-cluster configuration found")?,
        })
    }

    /// Run the manager until `stop` fires: then drain sessions, release the lease and return.
    ///
    /// The wiring, in order: checked configuration (timings, tenant sharing) → client → leader election → caches, metrics and the controller
    /// table → leadership follower → gRPC service → listeners → servers → wait → shutdown.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        self.check_timings()?;
        let (sharing, policy_base) = self.sharing()?;
        self.check_static_auth()?;
        self.log_ceiling();
        let metrics = Arc::new(Metrics::new());
        let client = self.client(&metrics).await?;
        let identity = self
            .identity
            .clone()
            .unwrap_or_else(|| format!("ctrlhub-{}", &uuid::Uuid::new_v4().to_string()[..8]));
        let liveness = self.liveness();
        // Beats until the shutdown is over, not only until it starts: a member leaving the
        // ring renews its Lease while it hands its controllers over.
        let lifetime = CancellationToken::new();
        let _end = lifetime.clone().drop_guard();
        liveness.heartbeat.spawn(lifetime.clone());
        #[cfg(feature = "dev")]
        if let Some(stall) = self.dev_stall_on_sigusr1 {
            dev::stall_on_sigusr1(stall)?;
        }
        let pod_label = self.pod_label(&client, &identity);
        if let Some(p) = &pod_label {
            // Before campaigning: a standby must not carry a label left by a crashed container.
            p.clear_stale().await;
        }
        let lease_health = LeaseHealth::default();
        let (election, member) = match self.mode {
            Mode::Leader => {
                let election = self.start_election(
                    self.kube_config().await?,
                    &identity,
                    liveness.clone(),
                    &metrics,
                    lease_health.clone(),
                )?;
                (election, None)
            }
            Mode::Ring => {
                let config = (self.kube_config().await?, self.ring_config(&identity));
                let m = ring::start(config, liveness.clone(), &metrics, lease_health.clone())?;
                (m.election, Some(m.ring))
            }
        };
        let gates: Arc<dyn Gates> = match &member {
            Some(ring) => ring.clone(),
            None => Arc::new(Leading(election.leading.clone())),
        };
        let cache = Cache::new(client.clone());
        let seats = sharing.seat_pool.clone();
        let controllers = ControllerTable::new(
            cache.clone(),
            self.ceiling(),
            (election.leading.clone(), gates),
            stop.child_token(),
            metrics.clone(),
            sharing,
        );
        sweep_sessionless(controllers.clone(), stop.clone());
        if self.tenant_policies {
            let applier = crate::policy::watch::Applier {
                client: client.clone(),
                controllers: controllers.clone(),
                seats,
                base: policy_base,
                leading: election.leading.clone(),
            };
            crate::policy::watch::spawn(applier, stop.child_token());
        }
        match &member {
            Some(ring) => ring::follow_ring(controllers.clone(), ring.clone(), lifetime.clone()),
            None => follow_leadership(
                controllers.clone(),
                election.leading.clone(),
                stop.clone(),
                pod_label.clone(),
            ),
        }
        let service = self.service(
            &controllers,
            &client,
            (&election.state, member.clone()),
            &metrics,
            &identity,
        );
        let ports = self.ports(&metrics);
        let grpc_listener = bind("gRPC", self.grpc_addr).await?;
        let http_listener = bind("HTTP", self.http_addr).await?;
        tracing::info!(grpc = %grpc_listener.local_addr()?, http = %http_listener.local_addr()?, identity = %identity, "ctrlhub manager listening");
        let (health, health_service) = tonic_health::server::health_reporter();
        crate::grpc::health::follow_leadership(health, election.leading.clone(), stop.clone());
        let grpc = self.serve_grpc(grpc_listener, service, health_service, &ports)?;
        let http_tls = self.http_tls(&identity)?;
        let probes = Arc::new(Probes {
            liveness,
            leader: election.state.clone(),
            api: Some(ApiReachability::spawn(client.clone(), stop.child_token())),
            lease: Some(lease_health),
        });
        if let Some(addr) = self.probe_addr {
            serve_probes(bind("probe", addr).await?, &probes, ports.probe, &stop);
        }
        let http_state = HttpState {
            controllers: controllers.clone(),
            cache: cache.clone(),
            leader: election.state.clone(),
            identity,
            metrics: metrics.clone(),
            lease_name: self.lease_name.clone(),
            gate: self.http_gate(&client, &metrics).with_metrics(metrics),
            settings: crate::http::status_page::Settings {
                static_auth: self.auth == AuthMode::Static,
                ceiling: self.ceiling(),
            },
            probes,
            ring: member.clone(),
        };
        let http = serve_http(
            http_listener,
            http_state,
            http_tls,
            ports.http,
            stop.clone(),
        );

        stop.cancelled().await;
        if let Some(ring) = &member {
            ring::leave(
                ring,
                &controllers,
                self.shutdown_grace + self.hold() + LEAVE_MARGIN,
            )
            .await;
        }
        let handover = Handover {
            grace: self.shutdown_grace,
            pod_label: pod_label.as_deref(),
            election,
        };
        shut_down(&controllers, grpc, handover, http).await;
        Ok(())
    }

    /// Raises the open-file limit and sizes both ports' connection caps below it; the rules
    /// each port's connections live by.
    fn ports(&self, metrics: &Arc<Metrics>) -> Ports {
        use crate::net::fd;
        let soft = match fd::raise() {
            Ok(limit) => {
                tracing::info!(
                    started = limit.started,
                    soft = limit.soft,
                    hard = limit.hard,
                    "open-file limit: soft limit raised to the hard limit"
                );
                limit.soft
            }
            Err(e) => {
                let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |l| l.0);
                tracing::warn!(error = %e, soft, "could not raise the open-file limit; sizing connection caps below the current one");
                soft
            }
        };
        let budget = fd::connection_budget(soft, self.max_connections);
        if budget < self.max_connections {
            tracing::warn!(
                max_connections = self.max_connections,
                budget,
                open_file_limit = soft,
                "--max-connections lowered to fit below the open-file limit (raise the hard limit to allow more)"
            );
        }
        let (grpc_total, http_total) = fd::split(budget);
        let port = |name: &'static str, total: usize, first_call: Option<Duration>| PortNet {
            caps: crate::throttle::Slots::new(
                fd::per_peer(total, self.max_connections_per_peer),
                total,
            ),
            state: crate::net::conn::PortState {
                rules: Arc::new(crate::net::PortRules {
                    port: name,
                    first_bytes: self.handshake_timeout,
                    first_call,
                    idle: self.connection_idle_timeout,
                }),
                registry: Arc::default(),
                metrics: metrics.clone(),
            },
        };
        // gRPC channels connect ahead of their first call, so only the idle timeout applies
        // to them after the preface; HTTP clients ask at once.
        let ports = Ports {
            grpc: port("grpc", grpc_total, None),
            http: port("http", http_total, Some(self.handshake_timeout)),
            probe: port("probe", PROBE_CONNECTIONS, Some(self.handshake_timeout)),
        };
        tracing::info!(
            grpc = grpc_total,
            grpc_per_peer = ports.grpc.caps.per_key(),
            http = http_total,
            http_per_peer = ports.http.caps.per_key(),
            handshake_timeout = ?self.handshake_timeout,
            idle_timeout = ?self.connection_idle_timeout,
            "connection caps"
        );
        ports
    }

    /// Static auth trusts whoever has the token: refused off loopback unless asked for by name,
    /// and a warning whenever it runs.
    fn check_static_auth(&self) -> anyhow::Result<()> {
        if self.auth != AuthMode::Static {
            return Ok(());
        }
        let exposed: Vec<String> = [
            ("--grpc-addr", self.grpc_addr),
            ("--http-addr", self.http_addr),
        ]
        .into_iter()
        .filter(|(_, addr)| !addr.ip().is_loopback())
        .map(|(flag, addr)| format!("{flag} {addr}"))
        .collect();
        if !exposed.is_empty() && !self.insecure_static_auth {
            anyhow::bail!(
                "--auth static (the default) on {}: anyone who reaches these ports with the token \
                 would be allowed everything. Use --auth kubernetes in a cluster, listen on \
                 127.0.0.1, or pass --insecure-static-auth (CTRLHUB_INSECURE_STATIC_AUTH=true) to \
                 accept that",
                exposed.join(" and ")
            );
        }
        // Which ports are off loopback, when any are (a field only then: an empty `exposed=`
        // said nothing).
        let warning = "static token authentication: every controller presenting the token is \
                       tenant dev and allowed everything, and the HTTP port is open; for \
                       development only (use --auth kubernetes)";
        if exposed.is_empty() {
            tracing::warn!(listening = "loopback only", "{warning}");
        } else {
            tracing::warn!(exposed = %exposed.join(", "), "{warning}");
        }
        Ok(())
    }

    /// Says at start what every registration will be narrowed to, so that a cluster-wide
    /// registration confined by the ceiling is not a surprise.
    fn log_ceiling(&self) {
        match self.ceiling() {
            Some(names) => tracing::info!(
                namespaces = %names.join(","),
                "namespace ceiling (--watch-namespace): every registration, all-namespaces ones \
                 included, is confined to these namespaces"
            ),
            None => {
                tracing::info!("namespace ceiling: none (registrations may watch all namespaces)")
            }
        }
    }

    /// The leader must stop dispatching before its lease can expire elsewhere.
    fn check_timings(&self) -> anyhow::Result<()> {
        if self.renew_deadline >= self.lease_duration {
            anyhow::bail!(
                "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?})",
                self.renew_deadline,
                self.lease_duration
            );
        }
        let most = self.lease_duration - self.renew_deadline;
        if self.hold() > most {
            anyhow::bail!(
                "--hold-period ({:?}) may be at most --lease-duration less --renew-deadline ({most:?}): a replica of a leader that lost its Lease must have stopped before a successor can take over",
                self.hold()
            );
        }
        if self.hold() < Duration::from_millis(500) {
            anyhow::bail!(
                "--hold-period ({:?}) must be at least 500ms: replicas answer heartbeats every fifth of it",
                self.hold()
            );
        }
        Ok(())
    }

    /// `--hold-period`, or the lease duration less the renew deadline.
    fn hold(&self) -> Duration {
        self.hold_period
            .unwrap_or(self.lease_duration.saturating_sub(self.renew_deadline))
    }

    /// The dispatch runtime's heartbeat, stalled past half the renew deadline: a leader whose
    /// runtime stalls stops renewing well before it would step down, so a standby can take
    /// over by the lease's expiry.
    fn liveness(&self) -> Liveness {
        Liveness {
            heartbeat: Heartbeat::new(),
            limit: (self.renew_deadline / 2).max(heartbeat::BEAT_EVERY * 4),
        }
    }

    /// Starts the Lease election on a thread of its own, with its own runtime and its own
    /// connection to the API server: nothing tenants make the main runtime do (fan-out of a
    /// huge registration, a flood of connections) can delay a renewal until the Lease is lost,
    /// but it gives the Lease up when that runtime stalls (`liveness`).
    fn start_election(
        &self,
        config: kube::Config,
        identity: &str,
        liveness: Liveness,
        metrics: &Arc<Metrics>,
        health: LeaseHealth,
    ) -> anyhow::Result<Election> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the leader-election runtime")?;
        // The client's connection tasks are spawned where it is built: on this runtime.
        let client = {
            let _inside = runtime.enter();
            crate::kubeclient::build(config, &metrics.api, None)
                .context("building the leader-election client")?
        };
        let elector = Elector::new(
            client,
            LeaderConfig {
                namespace: self.lease_namespace.clone(),
                name: self.lease_name.clone(),
                identity: identity.to_string(),
                lease_duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            },
        )
        .with_liveness(liveness)
        .with_metrics(metrics.clone())
        .with_health(health);
        let stop = CancellationToken::new();
        let (done, finished) = tokio::sync::oneshot::channel();
        let (leading, state) = (elector.leading(), elector.state());
        let run = elector.run(stop.clone());
        std::thread::Builder::new()
            .name("leader-election".into())
            .spawn(move || {
                runtime.block_on(run);
                let _ = done.send(());
            })
            .context("starting the leader-election thread")?;
        Ok(Election {
            leading,
            state,
            stop,
            finished,
        })
    }

    /// Ring mode's settings.
    fn ring_config(&self, identity: &str) -> crate::members::RingConfig {
        crate::members::RingConfig {
            ring: self.ring_name.clone(),
            namespace: self.lease_namespace.clone(),
            identity: identity.to_string(),
            address: self
                .member_address
                .clone()
                .unwrap_or_else(|| self.grpc_addr.to_string()),
            weight: self.member_weight,
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            drain: self.handover_drain,
            leave_drain: self.shutdown_grace,
        }
    }

    /// The leader's pod label, when `--leader-pod-label` asks the Service to follow the leader.
    fn pod_label(&self, client: &kube::Client, identity: &str) -> Option<Arc<PodLabel>> {
        self.leader_pod_label.clone().map(|label| {
            Arc::new(PodLabel {
                pods: kube::Api::namespaced(client.clone(), &self.lease_namespace),
                pod: identity.to_string(),
                label,
            })
        })
    }

    /// How tenants share the manager, from the flags: limits, seats and grouping. Checked
    /// before anything starts, so a configuration mistake is the first thing an operator sees.
    /// How tenants share the manager, and the flags' limits and weights tenant policies are
    /// applied over.
    fn sharing(&self) -> anyhow::Result<(Sharing, crate::policy::Base)> {
        let limits = TenantLimits::new(Limits {
            sessions: self.max_sessions_per_tenant,
            controllers: self.max_controllers_per_tenant,
            queued_keys: self.max_queued_keys,
            in_flight: self.max_in_flight_per_tenant,
            informers: self.max_informers_per_tenant,
            cached_bytes: self.max_cached_bytes_per_tenant,
            registrations_per_second: self.max_registrations_per_second,
            min_deadline: self.min_request_deadline,
            max_deadline: self.max_request_deadline,
            min_resync: self.min_resync_period,
            queued_bytes: self.max_queued_bytes_per_tenant,
        })
        .with_overrides(self.tenant_limits.iter().map(String::as_str))?;
        let weights = Weights::parse(1, self.tenant_weights.iter().map(String::as_str))?;
        for (tenant, flag) in limits
            .named()
            .map(|t| (t, "--tenant-limit"))
            .chain(weights.named().map(|t| (t, "--tenant-weight")))
        {
            self.tenant_grouping
                .check_configured(tenant, flag)
                .map_err(anyhow::Error::msg)?;
        }
        let base = crate::policy::Base {
            limits: limits.clone(),
            weights: weights.clone(),
            grouping: self.tenant_grouping,
        };
        let sharing = Sharing {
            limits,
            seat_pool: SeatPool::new(self.max_dispatch_seats, weights),
            grouping: self.tenant_grouping,
            hold: self.hold(),
            grace: self.controller_grace,
            first_lists: self.max_concurrent_first_lists,
        };
        Ok((sharing, base))
    }

    /// The gRPC service with the authenticator and authorizer `--auth` selects.
    fn service(
        &self,
        controllers: &Arc<ControllerTable>,
        client: &kube::Client,
        (leader, ring): (
            &watch::Receiver<LeaderState>,
            Option<Arc<crate::members::Ring>>,
        ),
        metrics: &Arc<Metrics>,
        identity: &str,
    ) -> Service {
        let state = match self.auth {
            AuthMode::Static => ServiceState::new(
                controllers.clone(),
                client.clone(),
                Arc::new(StaticTokens::new([(self.token.clone(), "dev".to_string())])),
                Arc::new(AllowAll),
                leader.clone(),
                metrics.clone(),
            ),
            AuthMode::Kubernetes => ServiceState::new(
                controllers.clone(),
                client.clone(),
                Arc::new(
                    TokenReviewAuthenticator::new(
                        client.clone(),
                        self.audience.clone(),
                        self.token_cache_ttl,
                    )
                    .with_metrics(metrics.auth.reviewer("token", "grpc")),
                ),
                Arc::new(
                    self.access_review(client)
                        .with_metrics(metrics.auth.reviewer("access", "grpc")),
                ),
                leader.clone(),
                metrics.clone(),
            )
            .with_rbac(self.authz_allow_ttl)
            .with_token_recheck(self.token_cache_ttl),
        };
        let state = match ring {
            Some(ring) => state.with_ring(ring),
            None => state,
        };
        Service(Arc::new(
            state
                .with_identity(identity)
                .with_first_list_timeout(self.first_list_timeout),
        ))
    }

    /// Who may read the HTTP port: anyone with static auth; with Kubernetes auth, callers whose
    /// API-server token TokenReview accepts, seeing what SubjectAccessReview grants them.
    fn http_gate(&self, client: &kube::Client, metrics: &Metrics) -> Gate {
        match self.auth {
            AuthMode::Static => Gate::Open,
            AuthMode::Kubernetes => Gate::kubernetes(
                Arc::new(
                    TokenReviewAuthenticator::for_api_audience(
                        client.clone(),
                        self.token_cache_ttl,
                    )
                    .with_metrics(metrics.auth.reviewer("token", "http")),
                ),
                Arc::new(
                    self.access_review(client)
                        .with_metrics(metrics.auth.reviewer("access", "http")),
                ),
                self.tenant_grouping,
            ),
        }
    }

    /// HTTPS for the HTTP port: from the certificate files, else self-signed under Kubernetes
    /// auth (tokens must not cross the network in the clear); plain HTTP otherwise.
    fn http_tls(&self, identity: &str) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
        let source = match (&self.http_tls_cert, &self.http_tls_key, self.auth) {
            (Some(cert), Some(key), _) => CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            (_, _, AuthMode::Kubernetes) => CertSource::SelfSigned(vec![identity.to_string()]),
            _ => return Ok(None),
        };
        Ok(Some(tls::acceptor(&source)?))
    }

    /// RBAC through SubjectAccessReview, with the tenants allowed to watch Secrets.
    fn access_review(&self, client: &kube::Client) -> AccessReviewAuthorizer {
        AccessReviewAuthorizer::new(
            client.clone(),
            DecisionTtl {
                allow: self.authz_allow_ttl,
                deny: self.authz_deny_ttl,
            },
            self.secrets_tenants
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from),
        )
    }

    /// Serves `ctrlhub.v1`, `grpc.health.v1` and server reflection (v1 and v1alpha, so grpcurl
    /// and older clients both find the services without the .proto files) on its own task
    /// until the returned server is stopped.
    fn serve_grpc(
        &self,
        listener: tokio::net::TcpListener,
        service: Service,
        health: tonic_health::pb::health_server::HealthServer<
            impl tonic_health::pb::health_server::Health,
        >,
        ports: &Ports,
    ) -> anyhow::Result<Server> {
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = self.grpc_tls()? {
            server = server
                .tls_config(tls.timeout(self.handshake_timeout))
                .context("configuring TLS for the gRPC server")?;
        }
        let stop = CancellationToken::new();
        let net = &ports.grpc;
        let incoming = tokio_stream::wrappers::ReceiverStream::new(crate::net::accept::accept(
            listener,
            net.caps.clone(),
            net.state.clone(),
            stop.clone(),
        ));
        let calls = crate::net::conn::CountCallsLayer(net.state.registry.clone());
        let observed = crate::grpc::server_metrics::ServerMetricsLayer::new(&net.state.metrics);
        let streams = self.max_concurrent_streams;
        let shutdown = {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        };
        let service =
            ControllerManagerServer::new(service).max_decoding_message_size(self.max_message_bytes);
        let reflection_v1 = reflection()
            .build_v1()
            .context("building the gRPC reflection service")?;
        let reflection_v1alpha = reflection()
            .build_v1alpha()
            .context("building the gRPC reflection service")?;
        let task = tokio::spawn(async move {
            let _ = server
                .http2_keepalive_interval(Some(crate::net::KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(crate::net::KEEPALIVE_TIMEOUT))
                .max_concurrent_streams(streams)
                .http2_max_header_list_size(crate::net::MAX_HEADER_BYTES)
                .layer(calls)
                .layer(observed)
                .add_service(service)
                .add_service(health)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await;
        });
        Ok(Server { stop, task })
    }
}

/// A reflection builder with the manager's and the health service's descriptors.
///
/// Not inlined, on purpose: with both builders built inline in `serve_grpc`, rustc 1.95's release
/// build (opt-level 3) handed the second builder the first one's freed vector, a use-after-free
/// in safe code that crashed `ctrlhub run` at start (valgrind: an invalid write in
/// `register_encoded_file_descriptor_set` into the block `ReflectionServiceState::new` freed).
#[inline(never)]
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ctrlhub_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// What a leaving member's wait for its handovers allows beyond the shutdown grace and the
/// hold: its sessions' ends and one out-of-cycle renewal.
const LEAVE_MARGIN: Duration = Duration::from_secs(5);

/// The running election: what it reports, how to stop it, and when it has (Lease released).
struct Election {
    leading: watch::Receiver<bool>,
    state: watch::Receiver<LeaderState>,
    stop: CancellationToken,
    finished: tokio::sync::oneshot::Receiver<()>,
}

/// Each port's connection caps and rules.
struct Ports {
    grpc: PortNet,
    http: PortNet,
    probe: PortNet,
}

/// Connections the probe port holds at once, apart from the other ports' budget (a flood of
/// those never takes the kubelet's probes); a quarter of them per peer. The kubelet opens one
/// per probe and closes it.
const PROBE_CONNECTIONS: usize = 32;

/// One port's connection caps (per peer and in all) and the rules its connections live by.
struct PortNet {
    caps: Arc<crate::throttle::Slots<crate::throttle::PeerKey>>,
    state: crate::net::conn::PortState,
}

/// A server running on its own task.
struct Server {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn bind(what: &str, addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {what} {addr}"))
}

/// Sessions live only on the leader: when it steps down, every session must reconnect; the pod
/// label follows leadership so the Service routes controllers to the leader.
fn follow_leadership(
    controllers: Arc<ControllerTable>,
    mut leading: watch::Receiver<bool>,
    stop: CancellationToken,
    pod_label: Option<Arc<PodLabel>>,
) {
    tokio::spawn(async move {
        // Start from "not leading" and look before waiting: the election may already have been
        // won when this task starts, and the pod must be labelled then too.
        let mut was = false;
        loop {
            let now = *leading.borrow_and_update();
            if was && !now {
                controllers.revoke_all(
                    RevokeReason::LeadershipLost,
                    "this manager lost the leader lease; reconnect to the new leader",
                );
            }
            if was != now
                && let Some(p) = &pod_label
            {
                p.set(now).await;
            }
            was = now;
            tokio::select! {
                r = leading.changed() => if r.is_err() { return },
                _ = stop.cancelled() => return,
            }
        }
    });
}

/// Removes, every second, the controllers whose grace period without a session is over.
fn sweep_sessionless(controllers: Arc<ControllerTable>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => controllers.sweep(std::time::Instant::now()),
                _ = stop.cancelled() => return,
            }
        }
    });
}

/// Serves probes, metrics and the status page until `stop` fires.
fn serve_http(
    listener: tokio::net::TcpListener,
    state: HttpState,
    tls: Option<tokio_rustls::TlsAcceptor>,
    net: PortNet,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(tls::serve(
        listener,
        http::router(Arc::new(state)),
        tls,
        net.caps,
        net.state,
        stop,
    ))
}

/// Serves the kubelet's probes on their own port until `stop` fires.
fn serve_probes(
    listener: tokio::net::TcpListener,
    probes: &Arc<Probes>,
    net: PortNet,
    stop: &CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(probe = %addr, "serving /livez, /readyz and /healthz on the probe port");
    }
    tokio::spawn(tls::serve(
        listener,
        http::probes::router(probes.clone()),
        None,
        net.caps,
        net.state,
        stop.clone(),
    ));
}

/// What a shutdown hands over, and how long it lets attempts already out finish first.
struct Handover<'a> {
    grace: Duration,
    pod_label: Option<&'a PodLabel>,
    election: Election,
}

/// Stop handing out work, let attempts already out finish (at most the grace), revoke sessions,
/// stop serving gRPC, drop the leader label, release the lease, and give each task a bounded
/// time to finish.
async fn shut_down(
    controllers: &ControllerTable,
    grpc: Server,
    handover: Handover<'_>,
    http: tokio::task::JoinHandle<()>,
) {
    let Handover {
        grace,
        pod_label,
        election,
    } = handover;
    // Nothing new goes out, but sessions stay open: an attempt that finishes within the grace
    // reports its result here instead of being done again by the successor. Said after the
    // fact, so the line means nothing new goes out any more.
    controllers.quiesce();
    tracing::info!(
        ?grace,
        "shutting down: nothing new goes out; waiting for attempts already out, then revoking sessions and releasing the lease"
    );
    await_attempts(controllers, grace).await;
    // Closed, not only revoked: a controller told to reconnect must not attach here again in
    // the moments before the gRPC server stops, or it would wait for that server's graceful
    // timeout instead of reaching the successor.
    controllers.close("the manager is shutting down; reconnect to the next leader");
    // Give sessions a moment to deliver Revoked before the transport closes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    grpc.stop.cancel();
    if let Some(p) = pod_label {
        // Stop attracting controllers before the lease is released to a successor.
        p.set(false).await;
    }
    // Keys whose attempts may still run on a replica of an exclusive session stay fenced for
    // the hold: releasing the Lease earlier would let a successor hand them out beside them.
    if let Some(until) = controllers.fenced_until() {
        let wait = until.saturating_duration_since(std::time::Instant::now());
        tracing::info!(?wait, "waiting for fenced keys before releasing the lease");
        tokio::time::sleep(wait).await;
    }
    election.stop.cancel();
    // A leaving member's keeper renews once more and lets its peers list it before deleting it.
    let _ = tokio::time::timeout(Duration::from_secs(10), election.finished).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), grpc.task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), http).await;
}

/// Waits until no attempt is out on a live session, or the grace is over.
async fn await_attempts(controllers: &ControllerTable, grace: Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    // Polled: a shutdown happens once, and results arrive on many sessions' tasks.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let out = controllers.live_attempts();
        if out == 0 {
            tracing::info!("every attempt already out has reported its result");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                out,
                ?grace,
                "shutdown grace over with attempts still out: they are re-delivered by the next leader (exclusive ones once the hold is over)"
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory as _, Parser};

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    /// Every option has an environment variable: `CTRLHUB_` and the long flag's name, except
    /// `--kubeconfig`, which reads the `KUBECONFIG` every Kubernetes tool reads.
    #[test]
    fn every_flag_has_its_consistently_named_environment_variable() {
        let command = Run::command();
        let mut checked = 0;
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let want = match long {
                "kubeconfig" => "KUBECONFIG".to_string(),
                other => format!("CTRLHUB_{}", other.replace('-', "_").to_uppercase()),
            };
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env.as_deref(), Some(want.as_str()), "--{long}");
            checked += 1;
        }
        assert!(checked > 30, "{checked} flags");
    }

    fn parsed(args: &[&str]) -> RunArgs {
        let mut argv = vec!["run"];
        argv.extend_from_slice(args);
        Run::try_parse_from(argv).expect("valid arguments").args
    }

    #[test]
    fn static_auth_off_loopback_needs_the_explicit_flag() {
        let err = parsed(&[])
            .check_static_auth()
            .expect_err("0.0.0.0 with static auth");
        let text = err.to_string();
        assert!(text.contains("--insecure-static-auth"), "{text}");
        assert!(text.contains("--grpc-addr 0.0.0.0:9090"), "{text}");
        assert!(
            parsed(&["--grpc-addr", "127.0.0.1:1", "--http-addr", "[::1]:2"])
                .check_static_auth()
                .is_ok()
        );
        assert!(
            parsed(&["--insecure-static-auth"])
                .check_static_auth()
                .is_ok()
        );
        assert!(
            parsed(&["--auth", "kubernetes"])
                .check_static_auth()
                .is_ok()
        );
    }
}
