//! The hostile-tenant bed, shared by the suite `tests/tests/adversity/hostile.rs` and by
//! `ctrlhub-bench hostile`: a real `ctrlhub run --auth kubernetes` manager with its default
//! limits on devcluster, two tenants (ServiceAccounts `team-a/ctl` and `team-b/ctl`, each allowed
//! to list and watch ConfigMaps in its own namespace), team-b's well-behaved controller and the
//! probe that measures it, a [`Watchdog`] on the manager (resident memory, `/readyz`, the Lease),
//! and one driver per attack team-a makes.
//!
//! Everything here observes the manager from the outside, as a tenant or an operator would: gRPC
//! sessions, the Kubernetes Lease, `/readyz`, devcluster's request counters and the manager
//! process' `VmRSS`. Nothing reads the manager's internals, so the suite judges any
//! implementation of the fixes by what users rely on.

use anyhow::{Context, Result, anyhow};
use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams};
use parking_lot::Mutex;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::cluster::Cluster;
use crate::manager::{Launch, Manager};
use crate::objects::{apply, configmap_object, namespace_object};
use crate::process::rss_bytes;
use crate::rbac::{configmap_reader, service_account_object};
use crate::replica::{Replica, configmaps, key, namespace_names, object, register, secs};
use crate::wait::{PATIENCE, poll_until};

/// The attacker's namespace (and its ServiceAccount's).
pub const TEAM_A: &str = "team-a";
/// The well-behaved tenant's namespace.
pub const TEAM_B: &str = "team-b";
/// The ServiceAccount name of both tenants.
pub const SA: &str = "ctl";
/// The audience the manager accepts (`--audience`).
pub const AUDIENCE: &str = "ctrlhub";
/// The Lease the manager holds (passed explicitly so no environment variable moves it).
pub const LEASE_NAME: &str = "ctrlhub-leader";
/// The Lease's namespace.
pub const LEASE_NAMESPACE: &str = "default";
/// The label every tenant namespace carries, `hostile.ctrlhub.dev/team=<namespace>` (attack 7
/// scopes by it).
pub const TEAM_LABEL: &str = "hostile.ctrlhub.dev/team";
/// team-b's ConfigMap whose updates are measured.
pub const LIVE: &str = "live";
/// A namespace of nobody's: no tenant reconciles it and it carries no [`TEAM_LABEL`], so what is
/// written there loads only the informers that list every namespace (attack 7's).
pub const BYSTANDER: &str = "bystander";

/// The Kubernetes username (and ctrlhub tenant) of ServiceAccount `ns/sa`.
pub fn username(ns: &str, sa: &str) -> String {
    format!("system:serviceaccount:{ns}:{sa}")
}

/// Mebibytes.
pub const MIB: u64 = 1024 * 1024;

/// The bed: devcluster, the manager and both tenants' credentials.
pub struct Bed {
    /// devcluster in process (its faults and request counters are used by attacks 3 and 10).
    pub cluster: Cluster,
    /// The manager under attack.
    pub manager: Manager,
    /// team-a's `authorization` metadata value (`Bearer <token>`, valid for an hour).
    pub a_auth: String,
    /// team-b's `authorization` metadata value.
    pub b_auth: String,
    /// One HTTP/2 connection to the manager that attacks making many calls share.
    channel: Channel,
    /// team-b's own HTTP/2 connection: tenants are separate processes, so one tenant's abuse of
    /// its connection (a flood of refused streams, say) must not be measured as the manager
    /// ending team-b's session.
    team_b_channel: Channel,
}

impl Bed {
    /// Starts devcluster and both tenants, then `ctrlhub run --auth kubernetes` as `launch`
    /// says, with `extra` flags appended (limits stay at their defaults unless `extra` names
    /// one); returns once the manager holds the Lease.
    pub async fn start(launch: &Launch, identity: &str, extra: &[&str]) -> Result<Bed> {
        let cluster = Cluster::start(devcluster::Options::default()).await?;
        let a_auth = tenant(&cluster, TEAM_A).await?;
        let b_auth = tenant(&cluster, TEAM_B).await?;
        let mut args = vec![
            "--auth",
            "kubernetes",
            "--audience",
            AUDIENCE,
            "--lease-name",
            LEASE_NAME,
            "--lease-namespace",
            LEASE_NAMESPACE,
        ];
        args.extend_from_slice(extra);
        let manager = Manager::launch(&cluster, identity, &args, launch).await?;
        let endpoint =
            tonic::transport::Endpoint::from_shared(manager.grpc.clone())?.tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .context("connecting to the manager's gRPC port")?;
        let team_b_channel = endpoint
            .connect()
            .await
            .context("connecting team-b to the manager's gRPC port")?;
        let bed = Bed {
            cluster,
            manager,
            a_auth,
            b_auth,
            channel,
            team_b_channel,
        };
        bed.wait_leading().await?;
        Ok(bed)
    }

    /// The manager's process id.
    pub fn pid(&self) -> u32 {
        self.manager.process.pid()
    }

    /// The manager's resident memory now (0 once it is gone).
    pub fn rss(&self) -> u64 {
        rss_bytes(self.pid()).unwrap_or(0)
    }

    /// The connection to the manager that every session but team-b's measured one shares.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Waits until the Lease names this manager as its holder.
    pub async fn wait_leading(&self) -> Result<()> {
        let leases: Api<Lease> = Api::namespaced(self.cluster.client.clone(), LEASE_NAMESPACE);
        poll_until("the manager to hold the Lease", PATIENCE, || async {
            let holder = lease_holder(&leases).await?.0;
            (holder == self.manager.identity)
                .then_some(())
                .ok_or(format!("holder {holder:?}"))
        })
        .await?;
        Ok(())
    }

    /// Waits until `/readyz` answers 200 (the manager's caches, team-b's included, are synced):
    /// the state every attack starts from.
    pub async fn wait_ready(&self) -> Result<()> {
        let http = probe_client()?;
        let url = format!("{}/readyz", self.manager.http);
        poll_until("the manager to be ready", PATIENCE, || async {
            match http.get(&url).send().await {
                Ok(r) if r.status() == reqwest::StatusCode::OK => Ok(()),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
        Ok(())
    }

    /// Registers `register` with `auth` over the shared connection: Err is the manager's answer.
    pub async fn connect(
        &self,
        register: pb::Register,
        auth: &str,
    ) -> Result<Replica, tonic::Status> {
        Replica::connect_over(self.channel(), register, Some(auth), &[]).await
    }

    /// team-b's [`Bed::connect`], over its own connection, retried while the manager answers
    /// UNAVAILABLE (it has written the Lease but not yet started to lead), for up to
    /// [`PATIENCE`].
    pub async fn connect_team_b(&self, register: pb::Register) -> Result<Replica> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let channel = self.team_b_channel.clone();
            match Replica::connect_over(channel, register.clone(), Some(&self.b_auth), &[]).await {
                Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other.map_err(|s| anyhow!("registering: {s:?}")),
            }
        }
    }

    /// Lets ServiceAccount `ns/sa` list and watch `resources` (plurals of the core group) in its
    /// own namespace, with a Role and RoleBinding named `<sa>-<resources>`.
    pub async fn grant(&self, ns: &str, sa: &str, resources: &[&str]) -> Result<()> {
        let rbac = "rbac.authorization.k8s.io";
        let name = format!("{sa}-{}", resources.join("-"));
        let role = json!({"apiVersion": format!("{rbac}/v1"), "kind": "Role",
            "metadata": {"name": name, "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": resources, "verbs": ["get", "list", "watch"]}]});
        let binding = json!({"apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]});
        apply(&self.cluster.client, &role).await?;
        apply(&self.cluster.client, &binding).await
    }

    /// Creates namespace [`BYSTANDER`] and fills it like [`Bed::fill`]: bulk that costs every
    /// cluster-wide informer its list, with no controller's work queue behind it.
    pub async fn fill_bystander(&self, prefix: &str, count: usize, bytes: usize) -> Result<()> {
        apply(&self.cluster.client, &namespace_object(BYSTANDER, &[])).await?;
        self.fill(BYSTANDER, prefix, count, bytes).await
    }

    /// Creates `count` ConfigMaps `<prefix>-00000..` in `ns`, each holding `bytes` bytes of data.
    pub async fn fill(&self, ns: &str, prefix: &str, count: usize, bytes: usize) -> Result<()> {
        let payload = "x".repeat(bytes);
        futures::stream::iter(0..count)
            .map(|i| {
                let obj =
                    configmap_object(ns, &format!("{prefix}-{i:05}"), &[("payload", &payload)]);
                let client = self.cluster.client.clone();
                async move { apply(&client, &obj).await }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Writes ConfigMap `ns/name` with `data`.
    pub async fn put(&self, ns: &str, name: &str, data: &[(&str, &str)]) -> Result<()> {
        apply(&self.cluster.client, &configmap_object(ns, name, data)).await
    }

    /// Deletes ConfigMap `ns/name`.
    pub async fn delete_configmap(&self, ns: &str, name: &str) -> Result<()> {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.cluster.client.clone(), ns);
        api.delete(name, &DeleteParams::default()).await?;
        Ok(())
    }

    /// How many TokenReviews devcluster has served so far.
    pub fn token_reviews(&self) -> u64 {
        self.cluster
            .dc
            .stats()
            .request_count("create", "tokenreviews")
    }
}

/// A tenant: namespace `ns` (labelled [`TEAM_LABEL`]), ServiceAccount [`SA`] allowed to list
/// and watch ConfigMaps there, and an hour-long token for the manager's audience.
async fn tenant(c: &Cluster, ns: &str) -> Result<String> {
    apply(&c.client, &namespace_object(ns, &[(TEAM_LABEL, ns)])).await?;
    apply(&c.client, &service_account_object(ns, SA)).await?;
    for obj in configmap_reader(ns, SA, Some(ns)) {
        apply(&c.client, &obj).await?;
    }
    let token =
        c.dc.issue_token(ns, SA, &[AUDIENCE], Duration::from_secs(3600))?;
    Ok(format!("Bearer {token}"))
}

/// The Lease's holder identity and transition count.
async fn lease_holder(leases: &Api<Lease>) -> Result<(String, i32), String> {
    let lease = leases.get(LEASE_NAME).await.map_err(|e| e.to_string())?;
    let spec = lease.spec.unwrap_or_default();
    Ok((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or_default(),
    ))
}

/// What team-b's controller has received: the instant each value of `data.v` of its
/// ConfigMap first arrived.
#[derive(Default)]
struct Deliveries {
    seen: Mutex<HashMap<String, Instant>>,
    arrived: Notify,
    ended: Mutex<Option<String>>,
}

impl Deliveries {
    /// When `value` arrived, waiting for it until `deadline`.
    async fn wait(&self, value: &str, deadline: Instant) -> Option<Instant> {
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(at) = self.seen.lock().get(value) {
                return Some(*at);
            }
            if tokio::time::timeout_at(deadline.into(), arrived)
                .await
                .is_err()
            {
                return self.seen.lock().get(value).copied();
            }
        }
    }
}

/// team-b's well-behaved controller: reconciles ConfigMaps in team-b, answers Done at once, and
/// records when each update of [`LIVE`] arrived.
pub struct TeamB {
    deliveries: Arc<Deliveries>,
    task: JoinHandle<()>,
    client: kube::Client,
    updates: u64,
    started: Instant,
}

impl TeamB {
    /// Creates team-b's ConfigMap, registers its controller and waits for the first request.
    pub async fn start(bed: &Bed) -> Result<TeamB> {
        bed.put(TEAM_B, LIVE, &[("v", "u0")]).await?;
        let registration = register("steady", configmaps(), 4, Some(TEAM_B));
        let replica = bed.connect_team_b(registration).await?;
        let deliveries = Arc::new(Deliveries::default());
        let task = tokio::spawn(serve_team_b(replica, deliveries.clone()));
        let started = Instant::now();
        let first = deliveries.wait("u0", started + PATIENCE).await;
        first.ok_or_else(|| anyhow!("team-b's controller got no first request"))?;
        Ok(TeamB {
            deliveries,
            task,
            client: bed.cluster.client.clone(),
            updates: 0,
            started,
        })
    }

    /// Updates team-b's ConfigMap and waits up to `bound` for the request carrying the update:
    /// Ok(latency from the write until the request arrived), or Err when it did not arrive.
    pub async fn update(&mut self, bound: Duration) -> Result<Duration, Late> {
        self.updates += 1;
        let value = format!("u{}", self.updates);
        let t0 = Instant::now();
        let written = apply(
            &self.client,
            &configmap_object(TEAM_B, LIVE, &[("v", &value)]),
        )
        .await;
        if let Err(e) = written {
            return Err(Late::Unwritten(format!("{e:#}")));
        }
        match self.deliveries.wait(&value, t0 + bound).await {
            Some(at) => Ok(at.saturating_duration_since(t0)),
            None => Err(Late::Undelivered {
                update: self.updates,
                after: t0.saturating_duration_since(self.started),
                bound,
            }),
        }
    }

    /// How team-b's session ended, if it did (it never should: team-b is never revoked).
    pub fn ended(&self) -> Option<String> {
        self.deliveries.ended.lock().clone()
    }
}

impl Drop for TeamB {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers every request Done at once and records each `data.v` of [`LIVE`] it carries.
async fn serve_team_b(mut replica: Replica, deliveries: Arc<Deliveries>) {
    let started = Instant::now();
    loop {
        match replica.recv().await {
            Ok(Some(r)) => {
                replica.done(&r.id).await;
                let value = object(&r)["data"]["v"].as_str().map(str::to_string);
                if let (Some(v), true) = (value, key(&r) == format!("{TEAM_B}/{LIVE}")) {
                    deliveries.seen.lock().entry(v).or_insert_with(Instant::now);
                    deliveries.arrived.notify_waiters();
                }
            }
            Ok(None) => {}
            Err(()) => {
                *deliveries.ended.lock() = Some(format!(
                    "team-b's session ended (revoked or closed by the manager) {:.1?} after it \
                     started",
                    started.elapsed()
                ));
                deliveries.arrived.notify_waiters();
                return;
            }
        }
    }
}

/// An update of team-b that did not reach its controller in time.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Late {
    /// The request carrying it did not arrive within the bound.
    #[error("update #{update} (sent {after:.1?} into the run) was not delivered within {bound:?}")]
    Undelivered {
        /// Which update (1-based).
        update: u64,
        /// When it was written, from team-b's start.
        after: Duration,
        /// The bound it missed.
        bound: Duration,
    },
    /// The API server did not take the write (so nothing was measured).
    #[error("the update could not be written: {0}")]
    Unwritten(String),
}

/// How team-b is measured: `updates` updates, `gap` apart, each expected within `bound`, for
/// at most `window`.
#[derive(Debug, Clone, Copy)]
pub struct ProbePlan {
    /// How many updates at most.
    pub updates: usize,
    /// Pause between one delivery (or miss) and the next update.
    pub gap: Duration,
    /// How long an update may take to arrive.
    pub bound: Duration,
    /// How long the whole probe may take.
    pub window: Duration,
}

/// team-b's measured updates.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Latencies of the updates that arrived within the bound.
    pub latencies: Vec<Duration>,
    /// The updates that did not.
    pub late: Vec<Late>,
}

impl Samples {
    /// Median, 99th percentile and maximum of the delivered updates, with every late update
    /// counted at the bound it missed (a lower bound of its real latency).
    pub fn percentiles(&self, bound: Duration) -> (Duration, Duration, Duration) {
        let mut all = self.latencies.clone();
        all.extend(self.late.iter().map(|_| bound));
        if all.is_empty() {
            return Default::default();
        }
        all.sort();
        let q = |p: f64| all[((all.len() as f64 - 1.0) * p).round() as usize];
        (q(0.5), q(0.99), all[all.len() - 1])
    }

    /// Updates measured.
    pub fn count(&self) -> usize {
        self.latencies.len() + self.late.len()
    }

    /// Adds another probe's samples.
    pub fn extend(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.late.extend(other.late);
    }
}

/// Measures team-b as `plan` says; stops early if team-b's session ends.
pub async fn probe(team_b: &mut TeamB, plan: ProbePlan) -> Samples {
    let start = Instant::now();
    let mut samples = Samples::default();
    while samples.count() < plan.updates && start.elapsed() < plan.window {
        match team_b.update(plan.bound).await {
            Ok(latency) => samples.latencies.push(latency),
            Err(late) => samples.late.push(late),
        }
        if team_b.ended().is_some() {
            break;
        }
        tokio::time::sleep(plan.gap).await;
    }
    samples
}

/// Measures team-b every `plan.gap` (each update within `plan.bound`) while `attack` runs, for at
/// most `plan.window`; returns the attack's result and the samples.
pub async fn probe_during<T>(
    team_b: &mut TeamB,
    plan: ProbePlan,
    attack: impl std::future::Future<Output = T>,
) -> (T, Samples) {
    let running = AtomicBool::new(true);
    let attack = async {
        let out = attack.await;
        running.store(false, Ordering::Relaxed);
        out
    };
    let probing = async {
        let start = Instant::now();
        let mut samples = Samples::default();
        while running.load(Ordering::Relaxed) && start.elapsed() < plan.window {
            let one = ProbePlan { updates: 1, ..plan };
            samples.extend(probe(team_b, one).await);
            if team_b.ended().is_some() {
                break;
            }
        }
        samples
    };
    tokio::join!(attack, probing)
}

/// What the [`Watchdog`] saw of the manager.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Resident memory at the first sample.
    pub rss_start: u64,
    /// The highest resident memory sampled.
    pub rss_peak: u64,
    /// Samples taken.
    pub samples: usize,
    /// `/readyz` answers other than 200 (or no answer within 3 s), with the first few kept.
    pub readyz_failures: usize,
    /// The first `/readyz` failures, described.
    pub readyz_seen: Vec<String>,
    /// Samples where the Lease was not held by the manager under test, or changed hands.
    pub lease_failures: usize,
    /// The first Lease failures, described.
    pub lease_seen: Vec<String>,
}

impl Health {
    /// How much the resident memory grew from the first sample to the peak.
    pub fn rss_growth(&self) -> u64 {
        self.rss_peak.saturating_sub(self.rss_start)
    }

    /// Everything that went wrong with readiness or leadership, as sentences.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.readyz_failures > 0 {
            out.push(format!(
                "/readyz was not 200 in {} of {} samples, first: {:?}",
                self.readyz_failures, self.samples, self.readyz_seen
            ));
        }
        if self.lease_failures > 0 {
            out.push(format!(
                "the manager did not keep its Lease in {} of {} samples, first: {:?}",
                self.lease_failures, self.samples, self.lease_seen
            ));
        }
        out
    }
}

/// Samples the manager every 200 ms: resident memory, `/readyz` and the Lease (held by the
/// manager under test, with no transition since the watchdog started). When the resident memory
/// grows past `cap` it raises [`Watchdog::breached`], so drivers stop their attacks before the
/// manager takes the machine down with it.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    breached: Arc<AtomicBool>,
    task: JoinHandle<Health>,
}

impl Watchdog {
    /// Starts sampling `bed`'s manager.
    pub async fn start(bed: &Bed, cap: u64) -> Result<Watchdog> {
        let leases: Api<Lease> = Api::namespaced(bed.cluster.client.clone(), LEASE_NAMESPACE);
        let (holder, transitions) = lease_holder(&leases).await.map_err(|e| anyhow!(e))?;
        let sampler = Sampler {
            http: probe_client()?,
            readyz: format!("{}/readyz", bed.manager.http),
            leases,
            identity: bed.manager.identity.clone(),
            lease: (holder, transitions),
            pid: bed.pid(),
            cap,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let breached = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(sampler.run(stop.clone(), breached.clone()));
        Ok(Watchdog {
            stop,
            breached,
            task,
        })
    }

    /// A flag that turns true once the resident memory grew past the cap.
    pub fn breached(&self) -> Arc<AtomicBool> {
        self.breached.clone()
    }

    /// Stops sampling and returns what was seen.
    pub async fn finish(self) -> Health {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// The HTTP client that probes `/readyz` as the kubelet does: a manager serving its probes
/// over HTTPS with a self-signed certificate is probed without verifying the certificate, and an
/// answer slower than 3 s counts as none.
fn probe_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(3))
        .build()?)
}

/// What the watchdog samples with.
struct Sampler {
    http: reqwest::Client,
    readyz: String,
    leases: Api<Lease>,
    identity: String,
    lease: (String, i32),
    pid: u32,
    cap: u64,
}

impl Sampler {
    async fn run(self, stop: Arc<AtomicBool>, breached: Arc<AtomicBool>) -> Health {
        let mut h = Health {
            rss_start: rss_bytes(self.pid).unwrap_or(0),
            ..Default::default()
        };
        let started = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let at = started.elapsed();
            h.samples += 1;
            let rss = rss_bytes(self.pid).unwrap_or(0);
            h.rss_peak = h.rss_peak.max(rss);
            if rss.saturating_sub(h.rss_start) > self.cap {
                breached.store(true, Ordering::Relaxed);
            }
            if let Err(e) = self.ready().await {
                h.readyz_failures += 1;
                keep_first(&mut h.readyz_seen, format!("at {at:.1?}: {e}"));
            }
            if let Err(e) = self.leading().await {
                h.lease_failures += 1;
                keep_first(&mut h.lease_seen, format!("at {at:.1?}: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        h
    }

    async fn ready(&self) -> Result<(), String> {
        match self.http.get(&self.readyz).send().await {
            Ok(r) if r.status() == reqwest::StatusCode::OK => Ok(()),
            Ok(r) => Err(format!(
                "{} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            )),
            Err(e) => Err(format!("no answer: {e}")),
        }
    }

    async fn leading(&self) -> Result<(), String> {
        let now = lease_holder(&self.leases).await?;
        if now.0 != self.identity || now.1 != self.lease.1 {
            return Err(format!(
                "holder {:?} after {} transitions (was {:?} after {})",
                now.0, now.1, self.lease.0, self.lease.1
            ));
        }
        Ok(())
    }
}

/// Keeps the first five descriptions of a recurring failure.
fn keep_first(list: &mut Vec<String>, what: String) {
    if list.len() < 5 {
        list.push(what);
    }
}

/// A team-a session that receives requests and never answers them (a deadlocked controller),
/// counting what it holds.
pub struct Holder {
    held: Arc<Mutex<Vec<SystemTime>>>,
    peak: Arc<AtomicUsize>,
    received: Arc<AtomicUsize>,
    tx: mpsc::Sender<pb::ControllerMessage>,
    task: JoinHandle<()>,
}

impl Holder {
    /// Reads `replica`'s requests in the background without ever answering them.
    pub fn spawn(mut replica: Replica) -> Holder {
        let held = Arc::new(Mutex::new(Vec::new()));
        let peak = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(AtomicUsize::new(0));
        let tx = replica.answers();
        let (h, p, n) = (held.clone(), peak.clone(), received.clone());
        let task = tokio::spawn(async move {
            while let Ok(request) = replica.recv().await {
                let Some(r) = request else { continue };
                let deadline = r
                    .deadline
                    .and_then(|t| SystemTime::try_from(t).ok())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                n.fetch_add(1, Ordering::Relaxed);
                let mut held = h.lock();
                held.push(deadline);
                let now = SystemTime::now();
                held.retain(|d| *d > now);
                p.fetch_max(held.len(), Ordering::Relaxed);
            }
        });
        Holder {
            held,
            peak,
            received,
            tx,
            task,
        }
    }

    /// Requests held right now: received, unanswered and before their deadline.
    pub fn in_flight(&self) -> usize {
        let now = SystemTime::now();
        self.held.lock().iter().filter(|d| **d > now).count()
    }

    /// The most requests held at once so far.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Requests received so far (redeliveries included).
    pub fn received(&self) -> usize {
        self.received.load(Ordering::Relaxed)
    }

    /// Sends `Credit{max_in_flight}` on the session.
    pub async fn credit(&self, max_in_flight: u32) -> Result<()> {
        let credit = pb::controller_message::Message::Credit(pb::Credit { max_in_flight });
        self.tx
            .send(pb::ControllerMessage {
                message: Some(credit),
            })
            .await
            .map_err(|_| anyhow!("the session is gone"))
    }

    /// Waits until the number of requests received has not grown for `quiet` (or `timeout`
    /// passed); returns it.
    pub async fn settle(&self, quiet: Duration, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut last = (self.received(), Instant::now());
        while Instant::now() < deadline && last.1.elapsed() < quiet {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.received();
            if now != last.0 {
                last = (now, Instant::now());
            }
        }
        last.0
    }

    /// Whether the session is still open.
    pub fn alive(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A manager's answer to a registration, kept as what a test asserts on.
pub type Answer = Result<Replica, tonic::Status>;

/// Describes an answer: `accepted`, or the status code and message.
pub fn describe(answer: &Answer) -> String {
    match answer {
        Ok(_) => "accepted (Registered)".into(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// A ConfigMap registration of team-a's controller `name` over its own namespace.
pub fn team_a_registration(name: &str, credits: u32) -> pb::Register {
    register(name, configmaps(), credits, Some(TEAM_A))
}

// ----- attack 1: seat monopoly ---------------------------------------------------------------

/// Attack 1: team-a fills its namespace with `keys` ConfigMaps and registers a controller with
/// `max_in_flight: keys` that never answers (the default 60 s deadline).
pub async fn seat_monopoly(bed: &Bed, keys: usize) -> Result<Holder> {
    bed.fill(TEAM_A, "hog", keys, 16).await?;
    let hog = team_a_registration("hog", keys as u32);
    let replica = bed
        .connect(hog, &bed.a_auth)
        .await
        .map_err(|s| anyhow!("{s:?}"))?;
    Ok(Holder::spawn(replica))
}

/// Attack 1's long deadline: a registration asking for a century per request.
pub async fn century_deadline(bed: &Bed) -> Answer {
    let mut r = team_a_registration("forever", 1);
    r.request_deadline = Some(secs(100.0 * 365.25 * 86_400.0));
    bed.connect(r, &bed.a_auth).await
}

// ----- attack 2: redelivery storm ------------------------------------------------------------

/// The request deadlines attack 2 tries, shortest first.
pub const DEADLINE_LADDER: [Duration; 12] = [
    Duration::from_millis(1),
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
];

/// Attack 2 under way: the session with the shortest deadline the manager accepted, never read.
pub struct Storm {
    /// Each shorter deadline tried and the manager's refusal of it.
    pub refused: Vec<(Duration, tonic::Status)>,
    /// The deadline the storm runs with.
    pub deadline: Duration,
    /// The session, held open and never read.
    _session: Replica,
}

/// Attack 2: team-a registers over `keys` ConfigMaps with `max_in_flight: keys` and the shortest
/// request deadline the manager accepts (trying [`DEADLINE_LADDER`] in order), then never reads
/// its stream, so every request misses its deadline.
pub async fn redelivery_storm(bed: &Bed, keys: usize) -> Result<Storm> {
    bed.fill(TEAM_A, "storm", keys, 16).await?;
    let mut refused = Vec::new();
    for deadline in DEADLINE_LADDER {
        let mut r = team_a_registration("storm", keys as u32);
        r.request_deadline = Some(secs(deadline.as_secs_f64()));
        match bed.connect(r, &bed.a_auth).await {
            Ok(session) => {
                return Ok(Storm {
                    refused,
                    deadline,
                    _session: session,
                });
            }
            Err(status) => refused.push((deadline, status)),
        }
    }
    Err(anyhow!("every request deadline was refused: {refused:?}"))
}

// ----- attack 3: readiness poisoning ---------------------------------------------------------

/// A label selector of about `bytes` bytes: one `In` requirement with many values.
pub fn huge_selector(bytes: usize) -> pb::LabelSelector {
    let values = (0..bytes / 16).map(|i| format!("value-{i:09}")).collect();
    pb::LabelSelector {
        match_labels: Default::default(),
        match_expressions: vec![pb::LabelSelectorRequirement {
            key: "hostile.ctrlhub.dev/pick".into(),
            operator: pb::label_selector_requirement::Operator::In as i32,
            values,
        }],
    }
}

/// Attack 3: a registration whose primary label selector is about `bytes` bytes (the informer's
/// list URL would be too long for any API server).
pub async fn poisoned_selector(bed: &Bed, bytes: usize) -> Answer {
    let mut r = team_a_registration("poison", 1);
    r.label_selector = Some(huge_selector(bytes));
    bed.connect(r, &bed.a_auth).await
}

/// How attack 3 keeps a new informer from starting.
#[derive(Debug, Clone, Copy)]
pub enum ListFault {
    /// Every list of the kind takes this long.
    Slow(Duration),
    /// Every list of the kind fails with this HTTP status (403: the manager may not list it).
    Failing(u16),
}

/// Attack 3: team-a may list and watch `plural` (a core kind, `kind`) in its namespace, but the
/// manager's list of it is slow or failing (`fault`, injected into devcluster); team-a registers
/// a controller for it.
pub async fn stalled_informer(bed: &Bed, kind: &str, plural: &str, fault: ListFault) -> Answer {
    if let Err(e) = bed.grant(TEAM_A, SA, &[plural]).await {
        return Err(tonic::Status::internal(format!("granting {plural}: {e:#}")));
    }
    let faults = bed.cluster.dc.faults();
    match fault {
        ListFault::Slow(delay) => faults.add_latency("list", plural, delay),
        ListFault::Failing(code) => faults.fail_next("list", plural, u32::MAX, code),
    }
    let primary = pb::ResourceType {
        group: String::new(),
        version: "v1".into(),
        kind: kind.into(),
        plural: String::new(),
    };
    let r = register(&format!("stalled-{plural}"), primary, 1, Some(TEAM_A));
    bed.connect(r, &bed.a_auth).await
}

// ----- attack 4: quadratic registrations -----------------------------------------------------

/// Attack 4's registration: `owns` listing ConfigMap `entries` times.
pub fn owns_flood(entries: usize) -> pb::Register {
    let owned = pb::OwnedResource {
        resource: Some(configmaps()),
        controller_only: true,
        predicate: None,
        metadata_only: false,
    };
    pb::Register {
        owns: vec![owned; entries],
        ..team_a_registration("owner", 1)
    }
}

/// Attack 4, once: registers [`owns_flood`] and closes the session at once. Returns the answer
/// and how long it took.
pub async fn owns_flood_cycle(bed: &Bed, entries: usize) -> (Result<(), tonic::Status>, Duration) {
    let t0 = Instant::now();
    let answer = bed.connect(owns_flood(entries), &bed.a_auth).await;
    (answer.map(drop), t0.elapsed())
}

// ----- attack 5: leak on churn ---------------------------------------------------------------

/// The manager's resident memory after `cycle` Connect → Register → close cycles.
#[derive(Debug, Clone, Copy)]
pub struct ChurnSample {
    /// Cycles completed.
    pub cycle: usize,
    /// Resident memory then.
    pub rss: u64,
}

/// Attack 5: `cycles` Connect → Register → close cycles by `workers` concurrent loops (each on
/// its own controller name, so each cycle creates and removes a controller), sampling the
/// manager's memory every `every` cycles; stops early when `stop` is raised.
pub async fn churn(
    bed: &Bed,
    cycles: usize,
    workers: usize,
    every: usize,
    stop: Arc<AtomicBool>,
) -> Result<Vec<ChurnSample>> {
    let done = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let loops = (0..workers).map(|w| {
        let (done, samples, stop) = (done.clone(), samples.clone(), stop.clone());
        let name = format!("churn-{w}");
        async move {
            while !stop.load(Ordering::Relaxed) {
                let n = done.fetch_add(1, Ordering::Relaxed);
                if n >= cycles {
                    break;
                }
                let session = bed
                    .connect(team_a_registration(&name, 1), &bed.a_auth)
                    .await;
                drop(session.map_err(|s| anyhow!("cycle {n}: {s:?}"))?);
                if (n + 1) % every == 0 {
                    samples.lock().push(ChurnSample {
                        cycle: n + 1,
                        rss: bed.rss(),
                    });
                }
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    futures::future::try_join_all(loops).await?;
    let mut out = samples.lock().clone();
    out.sort_by_key(|s| s.cycle);
    Ok(out)
}

/// The least-squares slope of resident memory over cycles, in bytes per cycle, of the samples
/// from cycle `from` on (after warm-up); None with fewer than three such samples.
pub fn growth_per_cycle(samples: &[ChurnSample], from: usize) -> Option<f64> {
    let pts: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.cycle >= from)
        .map(|s| (s.cycle as f64, s.rss as f64))
        .collect();
    if pts.len() < 3 {
        return None;
    }
    let n = pts.len() as f64;
    let (mx, my) = (
        pts.iter().map(|p| p.0).sum::<f64>() / n,
        pts.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let cov: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let var: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    (var > 0.0).then(|| cov / var)
}

// ----- attack 6: credentials outlive revocation ----------------------------------------------

/// Attack 6: a team-a session registered with a token that expires after `lifetime`. Returns
/// the session and the token's expiry.
pub async fn expiring_session(bed: &Bed, lifetime: Duration) -> Result<(Replica, Instant)> {
    let token = bed
        .cluster
        .dc
        .issue_token(TEAM_A, SA, &[AUDIENCE], lifetime)?;
    let expiry = Instant::now() + lifetime;
    let r = team_a_registration("expiring", 4);
    let session = bed
        .connect(r, &format!("Bearer {token}"))
        .await
        .map_err(|s| anyhow!("{s:?}"))?;
    Ok((session, expiry))
}

/// Attack 6: a session of another team-a ServiceAccount, `sa`, allowed like team-a's; the
/// attack then deletes the account ([`delete_account`]).
pub async fn account_session(bed: &Bed, sa: &str) -> Result<Replica> {
    let c = &bed.cluster;
    apply(&c.client, &service_account_object(TEAM_A, sa)).await?;
    for obj in configmap_reader(TEAM_A, sa, Some(TEAM_A)) {
        apply(&c.client, &obj).await?;
    }
    let token =
        c.dc.issue_token(TEAM_A, sa, &[AUDIENCE], Duration::from_secs(3600))?;
    let r = team_a_registration(sa, 4);
    bed.connect(r, &format!("Bearer {token}"))
        .await
        .map_err(|s| anyhow!("{s:?}"))
}

/// Deletes ServiceAccount `team-a/sa` (its RoleBinding stays, as it would in a real cluster).
pub async fn delete_account(bed: &Bed, sa: &str) -> Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(bed.cluster.client.clone(), TEAM_A);
    api.delete(sa, &DeleteParams::default()).await?;
    Ok(())
}

// ----- attack 7: cache amplification ---------------------------------------------------------

/// Attack 7's `i`-th registration: ConfigMaps in every namespace labelled team-a's way, with a
/// distinct primary selector that every object matches (a label nobody sets must not exist).
pub fn amplifier(i: usize) -> pb::Register {
    let absent = pb::LabelSelectorRequirement {
        key: format!("hostile.ctrlhub.dev/absent-{i}"),
        operator: pb::label_selector_requirement::Operator::DoesNotExist as i32,
        values: vec![],
    };
    let team = pb::LabelSelector {
        match_labels: [(TEAM_LABEL.to_string(), TEAM_A.to_string())].into(),
        match_expressions: vec![],
    };
    pb::Register {
        namespaces: Some(pb::NamespaceScope {
            scope: Some(pb::namespace_scope::Scope::LabelSelector(team)),
        }),
        label_selector: Some(pb::LabelSelector {
            match_labels: Default::default(),
            match_expressions: vec![absent],
        }),
        ..register(&format!("amp-{i}"), configmaps(), 1, None)
    }
}

/// Attack 7: registers `count` [`amplifier`]s one after the other (stopping when `stop` is
/// raised); returns each answer.
pub async fn cache_amplification(bed: &Bed, count: usize, stop: &AtomicBool) -> Vec<Answer> {
    let mut answers = Vec::new();
    for i in 0..count {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        answers.push(bed.connect(amplifier(i), &bed.a_auth).await);
    }
    answers
}

// ----- attack 8: credit bypass ---------------------------------------------------------------

/// Attack 8: team-a fills its namespace with `keys` ConfigMaps and registers a never-answering
/// controller with `max_in_flight: 1` and no controller-wide bound; the caller then raises its
/// credit with [`Holder::credit`].
pub async fn credit_bypass(bed: &Bed, keys: usize) -> Result<Holder> {
    bed.fill(TEAM_A, "credit", keys, 16).await?;
    let r = pb::Register {
        max_concurrent_reconciles: 0,
        ..team_a_registration("credit", 1)
    };
    let replica = bed
        .connect(r, &bed.a_auth)
        .await
        .map_err(|s| anyhow!("{s:?}"))?;
    Ok(Holder::spawn(replica))
}

// ----- attack 9: large messages --------------------------------------------------------------

/// A valid Register of about `bytes` bytes: its predicate is a label selector with that many
/// bytes of values (evaluated in the manager, so no list URL grows).
pub fn large_register(bytes: usize) -> pb::Register {
    pb::Register {
        predicate: Some(pb::Predicate {
            predicate: Some(pb::predicate::Predicate::LabelSelector(huge_selector(
                bytes,
            ))),
        }),
        ..team_a_registration("large", 1)
    }
}

/// What a loop of large registrations got.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Registrations accepted.
    pub accepted: usize,
    /// Refusals by status code.
    pub refused: BTreeMap<String, usize>,
    /// The first refusal's message.
    pub first_refusal: Option<String>,
}

/// Attack 9: `loops` concurrent loops each registering [`large_register`]`(bytes)` and closing
/// the session, until `stop` is raised. Returns what the manager answered.
pub async fn large_messages(bed: &Bed, bytes: usize, loops: usize, stop: Arc<AtomicBool>) -> Tally {
    let message = large_register(bytes);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let each = (0..loops).map(|_| async {
        while !stop.load(Ordering::Relaxed) {
            let answer = bed.connect(message.clone(), &bed.a_auth).await;
            let mut t = tally.lock();
            match answer {
                Ok(_) => t.accepted += 1,
                Err(s) => {
                    *t.refused.entry(format!("{:?}", s.code())).or_default() += 1;
                    t.first_refusal
                        .get_or_insert_with(|| s.message().to_string());
                }
            }
        }
    });
    futures::future::join_all(each).await;
    std::mem::take(&mut *tally.lock())
}

// ----- attack 10: TokenReview amplification --------------------------------------------------

/// A junk bearer token shaped like a JWT (three base64url segments), distinct every time.
pub fn junk_token(n: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    let mut segment = |len: usize| -> String {
        (0..len)
            .map(|_| {
                const ALPHABET: &[u8] =
                    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
                char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])
            })
            .collect()
    };
    format!("eyJhbGciOiJSUzI1NiJ9.{}{n:x}.{}", segment(80), segment(86))
}

/// How long a junk-token flood goes on issuing calls at most.
pub const FLOOD_WINDOW: Duration = Duration::from_secs(10);

/// What a junk-token flood got.
#[derive(Debug, Clone, Default)]
pub struct Flood {
    /// Calls made (fewer than asked for if the flood reached [`FLOOD_WINDOW`]).
    pub calls: usize,
    /// Calls the manager accepted (it must accept none).
    pub accepted: usize,
    /// Answers by status code.
    pub codes: BTreeMap<String, usize>,
    /// How long the flood took.
    pub elapsed: Duration,
    /// TokenReviews devcluster served during the flood.
    pub token_reviews: u64,
}

/// Attack 10: `calls` Connects, each with a distinct junk token, `concurrency` at a time over one
/// connection.
pub async fn junk_token_flood(bed: &Bed, calls: usize, concurrency: usize) -> Flood {
    let before = bed.token_reviews();
    let t0 = Instant::now();
    let answers: Vec<Result<(), tonic::Code>> = futures::stream::iter(0..calls)
        // A manager that makes callers queue instead of refusing them must not stretch the
        // flood past what the attack is about: thousands of calls within seconds.
        .take_while(|_| std::future::ready(t0.elapsed() < FLOOD_WINDOW))
        .map(|n| junk_connect(bed.channel(), n))
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut flood = Flood {
        calls: answers.len(),
        elapsed: t0.elapsed(),
        token_reviews: bed.token_reviews().saturating_sub(before),
        ..Default::default()
    };
    for a in answers {
        match a {
            Ok(()) => flood.accepted += 1,
            Err(code) => *flood.codes.entry(format!("{code:?}")).or_default() += 1,
        }
    }
    flood
}

/// One Connect with the `n`-th junk token; Ok if the manager opened the stream.
async fn junk_connect(channel: Channel, n: usize) -> Result<(), tonic::Code> {
    let register = pb::ControllerMessage {
        message: Some(pb::controller_message::Message::Register(Box::new(
            team_a_registration("junk", 1),
        ))),
    };
    let mut request = tonic::Request::new(futures::stream::iter(vec![register]));
    let value = format!("Bearer {}", junk_token(n))
        .parse()
        .map_err(|_| tonic::Code::Internal)?;
    request.metadata_mut().insert("authorization", value);
    request.set_timeout(PATIENCE);
    let mut client = ControllerManagerClient::new(channel);
    match client.connect(request).await {
        Ok(_) => Ok(()),
        Err(s) => Err(s.code()),
    }
}

// ----- attack 11: scope ----------------------------------------------------------------------

/// team-b's object attack 11 points at.
pub const TARGET: &str = "secret-plan";

/// What team-a's controller received during attack 11.
#[derive(Debug, Clone, Default)]
pub struct Escape {
    /// Every key delivered, in order.
    pub keys: Vec<String>,
    /// Keys delivered outside team-a, with what the request carried.
    pub leaked: Vec<String>,
}

/// The key only attack 11's in-scope mapping can produce: no such ConfigMap exists, a second
/// pointer names it.
pub const MARKER: &str = "team-a/mapped-marker";

/// Attack 11: team-a's ConfigMap `pointer` names `team-b/secret-plan` in `data.target`; team-a
/// registers for its own namespace with a watch of ConfigMaps mapped by field path
/// `data.target`, then updates, deletes and re-creates the pointer `rounds` times. Last, a
/// second pointer names [`MARKER`] in team-a: its delivery proves the mapping works and that
/// everything written before it had its chance to arrive.
pub async fn scope_escape(bed: &Bed, rounds: usize) -> Result<Escape> {
    bed.put(TEAM_B, TARGET, &[("plan", "team-b only")]).await?;
    let target = format!("{TEAM_B}/{TARGET}");
    bed.put(TEAM_A, "pointer", &[("target", &target)]).await?;
    let watch = pb::WatchedResource {
        resource: Some(configmaps()),
        mapping: Some(pb::watched_resource::Mapping::FieldPath(
            "data.target".into(),
        )),
        predicate: None,
        metadata_only: false,
    };
    let r = pb::Register {
        watches: vec![watch],
        namespaces: Some(namespace_names(&[TEAM_A])),
        ..team_a_registration("mapper", 16)
    };
    let session = bed
        .connect(r, &bed.a_auth)
        .await
        .map_err(|s| anyhow!("{s:?}"))?;
    let (rx, reader) = answer_all(session);
    for round in 0..rounds {
        let round = round.to_string();
        bed.put(TEAM_A, "pointer", &[("target", &target), ("round", &round)])
            .await?;
        bed.delete_configmap(TEAM_A, "pointer").await?;
        bed.put(TEAM_A, "pointer", &[("target", &target)]).await?;
    }
    bed.put(TEAM_A, "marker-pointer", &[("target", MARKER)])
        .await?;
    let escape = collect_escape(rx, MARKER).await;
    reader.abort();
    Ok(escape)
}

/// Answers every request of `session` Done and passes it on, in the background.
fn answer_all(
    mut session: Replica,
) -> (
    mpsc::UnboundedReceiver<pb::ReconcileRequest>,
    JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            match session.recv().await {
                Ok(Some(r)) => {
                    session.done(&r.id).await;
                    let _ = tx.send(r);
                }
                Ok(None) => {}
                Err(()) => return,
            }
        }
    });
    (rx, reader)
}

/// Reads team-a's requests until `marker` arrives and one more second passes (or
/// [`PATIENCE`]).
async fn collect_escape(
    mut rx: mpsc::UnboundedReceiver<pb::ReconcileRequest>,
    marker: &str,
) -> Escape {
    let mut escape = Escape::default();
    let mut end = Instant::now() + PATIENCE;
    while let Ok(Some(r)) = tokio::time::timeout_at(end.into(), rx.recv()).await {
        let k = key(&r);
        if k == marker && end > Instant::now() + Duration::from_secs(1) {
            end = Instant::now() + Duration::from_secs(1);
        }
        if !k.starts_with(&format!("{TEAM_A}/")) {
            escape.leaked.push(format!(
                "{k} (reasons {:?}, object {})",
                r.reasons,
                carried(&r)
            ));
        }
        escape.keys.push(k);
    }
    escape
}

/// What a request carried of its object: its data, or that of its tombstone.
fn carried(r: &pb::ReconcileRequest) -> String {
    let json = match &r.object {
        Some(pb::reconcile_request::Object::ObjectJson(j)) => j.as_slice(),
        Some(pb::reconcile_request::Object::Tombstone(t)) => t.object_json.as_slice(),
        None => return "none".into(),
    };
    let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    format!("data {}", v["data"])
}

/// The secret team-b's failing controller puts in its error messages (attack 12).
pub const SECRET: &str = "password=hunter2-team-b";

/// What team-a could read of the manager's HTTP port (attack 12).
#[derive(Debug, Default)]
pub struct Snoop {
    /// Paths and statuses an anonymous caller got that were not a refusal (401/403); the probes
    /// are not counted here.
    pub anonymous_served: Vec<(String, u16)>,
    /// Probes (`/healthz`, `/readyz`) that did not answer an anonymous caller 200.
    pub probes_refused: Vec<(String, u16)>,
    /// What team-a's own token got: path and status.
    pub team_a: Vec<(String, u16)>,
    /// Paths whose answer to team-a names team-b or carries its secret.
    pub leaked: Vec<String>,
    /// Whether team-a's view of `/status` shows team-a's own controller.
    pub sees_own: bool,
    /// Whether an operator with the `get` grant sees team-b in `/status` and `/metrics`.
    pub operator_sees_all: bool,
    /// Whether the port answered plaintext HTTP.
    pub plaintext_answered: bool,
    /// Requests team-a made in its flood (valid and junk tokens) while team-b was measured.
    pub flood: usize,
    /// Flood requests answered 5xx.
    pub flood_errors: usize,
}

/// Attack 12, HTTP: team-b runs a controller whose errors carry [`SECRET`]; team-a, with a
/// controller of its own, reads every path of the HTTP port anonymously and with its own
/// API-server token, floods it with `flood` requests, and an operator with the `get` grant
/// reads it too.
pub async fn http_snoop(bed: &Bed, flood: usize) -> Result<Snoop> {
    let leaky = leaky_team_b(bed).await?;
    let own = bed
        .connect(register("own", configmaps(), 1, Some(TEAM_A)), &bed.a_auth)
        .await
        .map_err(|s| anyhow!("team-a's own controller: {s:?}"))?;
    let http = crate::manager::self_signed_client()?;
    let m = &bed.manager;
    let mut snoop = Snoop::default();
    // First the operator's view, which waits until team-b's secret is there to be leaked.
    let operator = operator_token(bed).await?;
    snoop.operator_sees_all = operator_sees_team_b(&http, &m.http, &operator).await;
    anonymous_reads(&http, &m.http, &mut snoop).await;
    let a_token = bed
        .cluster
        .dc
        .issue_token(TEAM_A, SA, &[], Duration::from_secs(3600))?;
    team_a_reads(&http, &m.http, &a_token, &mut snoop).await?;
    let plain = m.http.replacen("https://", "http://", 1);
    snoop.plaintext_answered = reqwest::get(format!("{plain}/status")).await.is_ok();
    (snoop.flood, snoop.flood_errors) = http_flood(&http, &m.http, &a_token, flood).await;
    leaky.abort();
    drop(own);
    Ok(snoop)
}

/// team-b's controller `leaky`, failing every request with [`SECRET`] in its message (retried
/// a minute later), in the background.
async fn leaky_team_b(bed: &Bed) -> Result<JoinHandle<()>> {
    let mut replica = bed
        .connect(
            register("leaky", configmaps(), 1, Some(TEAM_B)),
            &bed.b_auth,
        )
        .await
        .map_err(|s| anyhow!("team-b's leaky controller: {s:?}"))?;
    Ok(tokio::spawn(async move {
        while let Ok(Some(r)) = replica.recv().await {
            let error = pb::reconcile_result::Error {
                message: format!("cannot log in with {SECRET}"),
                retry_after: Some(secs(60.0)),
            };
            replica
                .reply(&r.id, pb::reconcile_result::Outcome::Error(error))
                .await;
        }
    }))
}

/// The paths of the HTTP port.
const HTTP_PATHS: [&str; 5] = ["/", "/status", "/metrics", "/healthz", "/readyz"];

async fn anonymous_reads(http: &reqwest::Client, base: &str, snoop: &mut Snoop) {
    for path in HTTP_PATHS {
        let code = match http.get(format!("{base}{path}")).send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        let probe = path == "/healthz" || path == "/readyz";
        if probe && code != 200 {
            snoop.probes_refused.push((path.into(), code));
        }
        if !probe && code != 401 && code != 403 {
            snoop.anonymous_served.push((path.into(), code));
        }
    }
}

async fn team_a_reads(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    snoop: &mut Snoop,
) -> Result<()> {
    for path in ["/", "/status", "/metrics"] {
        let r = http
            .get(format!("{base}{path}"))
            .bearer_auth(token)
            .send()
            .await?;
        snoop.team_a.push((path.into(), r.status().as_u16()));
        let body = r.text().await?;
        if body.contains(TEAM_B) || body.contains(SECRET) {
            snoop.leaked.push(path.into());
        }
        if path == "/status" {
            snoop.sees_own = body.contains("\"own\"");
        }
    }
    Ok(())
}

/// A ServiceAccount `monitoring/prometheus` with `get` on every path of the port (an operator's
/// view); its API-server token.
async fn operator_token(bed: &Bed) -> Result<String> {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "ctrlhub-operator-view"},
        "rules": [{"nonResourceURLs": ["/metrics", "/status", "/"], "verbs": ["get"]}],
    });
    apply(&bed.cluster.client, &role).await?;
    crate::rbac::prometheus_bound_to(&bed.cluster, "ctrlhub-operator-view").await
}

/// Whether the operator's `/status` names team-b's secret-carrying error and `/metrics` has
/// team-b's series (waiting for the first error to be recorded).
async fn operator_sees_team_b(http: &reqwest::Client, base: &str, token: &str) -> bool {
    let read = |path: &'static str| async move {
        let r = http
            .get(format!("{base}{path}"))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = r.status();
        let body = r.text().await.map_err(|e| e.to_string())?;
        if status.is_success() && body.contains(TEAM_B) {
            Ok(body)
        } else {
            Err(format!("{path}: {status}"))
        }
    };
    let status = poll_until("the operator sees team-b's error", PATIENCE, || async {
        let body = read("/status").await?;
        body.contains(SECRET)
            .then_some(())
            .ok_or_else(|| "no error yet".to_string())
    })
    .await;
    status.is_ok() && read("/metrics").await.is_ok()
}

/// `http_flood` as team-a with a fresh API-server token of its own.
pub async fn http_flood_team_a(bed: &Bed, count: usize) -> Result<(usize, usize)> {
    let http = crate::manager::self_signed_client()?;
    let token = bed
        .cluster
        .dc
        .issue_token(TEAM_A, SA, &[], Duration::from_secs(3600))?;
    Ok(http_flood(&http, &bed.manager.http, &token, count).await)
}

/// `count` requests from team-a, 8 at a time, alternating its valid token on `/status` and junk
/// tokens on `/metrics`; returns how many were made and how many got a 5xx.
async fn http_flood(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    count: usize,
) -> (usize, usize) {
    let errors = futures::stream::iter(0..count)
        .map(|i| async move {
            let (path, bearer) = if i % 2 == 0 {
                ("/status", token.to_string())
            } else {
                ("/metrics", junk_token(i))
            };
            let sent = http
                .get(format!("{base}{path}"))
                .bearer_auth(bearer)
                .send()
                .await;
            sent.map_or(true, |r| r.status().is_server_error())
        })
        .buffer_unordered(8)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    (count, errors)
}

// ===== round two: what the first twelve did not name =========================================

/// CPU time (user + system) the process `pid` has used, from `/proc/<pid>/stat` (0 if gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name; 100 ticks a
    // second on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

// ----- attack 13: resync storm ---------------------------------------------------------------

/// Attack 13: team-a's registration asking for a resync every `period`.
pub async fn short_resync(bed: &Bed, name: &str, period: Duration) -> Answer {
    let mut r = team_a_registration(name, 1);
    r.resync_period = Some(prost_types::Duration {
        seconds: period.as_secs() as i64,
        nanos: period.subsec_nanos() as i32,
    });
    bed.connect(r, &bed.a_auth).await
}

// ----- attack 14: predicate cost -------------------------------------------------------------

/// A predicate of `leaves` identical `annotations_changed` leaves under one `any_of`.
pub fn annotations_bomb(leaves: usize) -> pb::Predicate {
    let leaf = pb::Predicate {
        predicate: Some(pb::predicate::Predicate::AnnotationsChanged(
            pb::predicate::AnnotationsChanged {},
        )),
    };
    pb::Predicate {
        predicate: Some(pb::predicate::Predicate::AnyOf(pb::predicate::AnyOf {
            predicates: vec![leaf; leaves],
        })),
    }
}

/// Attack 14's registration `i`: team-a's ConfigMaps filtered by a `leaves`-leaf bomb, on the
/// primary and on `owned` owned kinds (ConfigMaps owning ConfigMaps) each.
pub fn predicate_bomb(i: usize, leaves: usize, owned: usize) -> pb::Register {
    let owns = (0..owned)
        .map(|_| pb::OwnedResource {
            resource: Some(configmaps()),
            controller_only: true,
            predicate: Some(annotations_bomb(leaves)),
            metadata_only: false,
        })
        .collect();
    pb::Register {
        predicate: Some(annotations_bomb(leaves)),
        owns,
        ..team_a_registration(&format!("bomb-{i}"), 1)
    }
}

/// Attack 14's target: ConfigMap `team-a/annotated` with `count` annotations (the same ones
/// every time) and `data.round` set to `round`: every update leaves the annotations as they
/// were, so every `annotations_changed` leaf is false and no `any_of` stops early.
pub async fn annotate(bed: &Bed, count: usize, round: usize) -> Result<()> {
    let annotations: serde_json::Map<String, serde_json::Value> = (0..count)
        .map(|i| {
            (
                format!("hostile.ctrlhub.dev/a{i}"),
                json!(format!("value-{i}")),
            )
        })
        .collect();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "annotated", "namespace": TEAM_A, "annotations": annotations},
        "data": {"round": round.to_string()}});
    apply(&bed.cluster.client, &cm).await
}

// ----- attack 15: Sybil tenants --------------------------------------------------------------

/// Attack 15: tenant `sybil-<i>` (a namespace, ServiceAccount `ctl` allowed ConfigMaps there,
/// one ConfigMap) registers a controller with one credit and a 600 s deadline that never
/// answers. Each namespace is a tenant of its own under the default grouping.
pub async fn sybil(bed: &Bed, i: usize) -> Result<Holder> {
    let ns = format!("sybil-{i:03}");
    let auth = tenant(&bed.cluster, &ns).await?;
    bed.put(&ns, "held", &[("v", "0")]).await?;
    let mut r = register("sybil", configmaps(), 1, Some(&ns));
    r.request_deadline = Some(secs(600.0));
    let replica = bed
        .connect(r, &auth)
        .await
        .map_err(|s| anyhow!("sybil {i}: {s:?}"))?;
    Ok(Holder::spawn(replica))
}

// ----- attack 16: events never acknowledged --------------------------------------------------

/// Attack 16: an EVENTS-mode registration over team-a's ConfigMaps whose session reads every
/// event and acknowledges none.
pub async fn deaf_events(bed: &Bed, name: &str) -> Result<Holder> {
    let r = pb::Register {
        mode: pb::register::Mode::Events as i32,
        max_concurrent_reconciles: 0,
        ..team_a_registration(name, 1)
    };
    let replica = bed
        .connect(r, &bed.a_auth)
        .await
        .map_err(|s| anyhow!("{s:?}"))?;
    Ok(Holder::spawn(replica))
}

// ----- attack 18: tombstones of other tenants ------------------------------------------------

/// Attack 18's churn: `count` ConfigMaps of `bytes` bytes each created and deleted in
/// [`BYSTANDER`], another tenant's namespace (not team-b's, whose own controller would be
/// measured working through the churn).
pub async fn churn_bystander(bed: &Bed, round: usize, count: usize, bytes: usize) -> Result<()> {
    let prefix = format!("churn-{round}");
    bed.fill_bystander(&prefix, count, bytes).await?;
    futures::stream::iter(0..count)
        .map(|i| {
            let name = format!("{prefix}-{i:05}");
            async move { bed.delete_configmap(BYSTANDER, &name).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

// ----- attack 19: credit flood ---------------------------------------------------------------

/// Attack 19: `count` Credit messages on `holder`'s session, alternating between two values so
/// that every one changes the session's demand.
pub async fn credit_flood(holder: &Holder, count: usize) -> Result<()> {
    for i in 0..count {
        holder.credit(1 + (i % 2) as u32).await?;
    }
    Ok(())
}

// ----- attack 20: List amplification ---------------------------------------------------------

/// Attack 20: Lists of team-a's ConfigMaps through session `session` with a label selector
/// nothing matches and the largest page, by `workers` loops until `stop`; returns how many
/// Lists were answered and the most items one answer carried.
pub async fn list_flood(
    bed: &Bed,
    session: &str,
    workers: usize,
    stop: Arc<AtomicBool>,
) -> (usize, usize) {
    let answered = Arc::new(AtomicUsize::new(0));
    let largest = Arc::new(AtomicUsize::new(0));
    let loops = (0..workers).map(|_| {
        let mut client = ControllerManagerClient::new(bed.channel());
        let (auth, session) = (bed.a_auth.clone(), session.to_string());
        let (stop, answered, largest) = (stop.clone(), answered.clone(), largest.clone());
        async move {
            let mut token = String::new();
            while !stop.load(Ordering::Relaxed) {
                let request = pb::ListRequest {
                    session_id: session.clone(),
                    resource: Some(configmaps()),
                    namespace: TEAM_A.into(),
                    label_selector: Some(pb::LabelSelector {
                        match_labels: [("hostile.ctrlhub.dev/none".to_string(), "x".to_string())]
                            .into(),
                        match_expressions: vec![],
                    }),
                    page_size: 5000,
                    page_token: token.clone(),
                };
                let mut req = tonic::Request::new(request);
                if let Ok(v) = auth.parse() {
                    req.metadata_mut().insert("authorization", v);
                }
                match client.list(req).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        answered.fetch_add(1, Ordering::Relaxed);
                        largest.fetch_max(r.items.len(), Ordering::Relaxed);
                        token = r.next_page_token;
                    }
                    Err(_) => token.clear(),
                }
            }
        }
    });
    futures::future::join_all(loops).await;
    (
        answered.load(Ordering::Relaxed),
        largest.load(Ordering::Relaxed),
    )
}
