//! One SDK run's world: a devcluster, a tenant (ServiceAccount, RBAC, token file), the managers
//! behind a leader-routing proxy, a trace receiver, and the conformance controller processes
//! with their reports. Checks share it; each uses a namespace and controller name of its own.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::process::Command;

use super::interface::{self as iface, Directives, Event, SCOPE_LABEL};
use super::otlp::OtlpSink;
use super::proxy::{LeaderProxy, Route};
use super::ring::{MEMBER_ARGS, OwnerFn, Ring};
use super::sdk::{Sdk, repo_root};
use super::{Failure, require};
use crate::cluster::Cluster;
use crate::manager::{FAST_LEASE, Launch, Manager};

/// The managers' leader election: see [`World::start_manager`].
const LEASE: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];
use crate::objects::{apply, namespace_object};
use crate::process::{ChildProcess, target_dir};
use crate::rbac::{RBAC_ARGS, configmap_reader, service_account_object};
use crate::wait::{PATIENCE, POLL_INTERVAL, TimedOut};

/// The namespace of the controllers' ServiceAccount (their tenant).
pub const TENANT_NAMESPACE: &str = "conformance";
/// The controllers' ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "controller";
/// The audience of the controllers' tokens.
pub const AUDIENCE: &str = "ctrlhub";

/// Wall-clock Unix microseconds, the clock of the report lines.
pub fn now_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// Everything one SDK's checks run against.
pub struct World {
    /// The SDK under test.
    pub sdk: Sdk,
    /// `target/conformance/<sdk>/`: logs and reports of this run.
    pub dir: PathBuf,
    /// The devcluster.
    pub cluster: Cluster,
    /// The managers running now (stopped and killed ones are removed).
    managers: Vec<Manager>,
    /// What controllers dial.
    pub proxy: LeaderProxy,
    /// Where the managers export traces.
    pub otlp: OtlpSink,
    /// The token file every controller reads unless a check gives it its own.
    pub token_file: PathBuf,
    /// The ring members of the ring rows (none until a ring check starts them).
    pub ring: Ring,
    launch: Launch,
    launched: u32,
}

impl World {
    /// Starts the devcluster, the tenant, the trace receiver, one leading manager and the proxy;
    /// `ring_owner` places controllers on ring members.
    pub async fn start(sdk: &Sdk, ring_owner: OwnerFn) -> Result<World, Failure> {
        let dir = target_dir().join("conformance").join(&sdk.name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let cluster = Cluster::start(devcluster::Options::default()).await?;
        tenant(&cluster).await?;
        let otlp = OtlpSink::start()
            .await
            .context("starting the OTLP receiver")?;
        let launch = launch(&dir, otlp.endpoint())?;
        let proxy = LeaderProxy::start(Vec::new())
            .await
            .context("starting the proxy")?;
        let token_file = dir.join("token");
        let mut world = World {
            sdk: sdk.clone(),
            dir,
            cluster,
            managers: Vec::new(),
            proxy,
            otlp,
            token_file,
            ring: Ring::new(ring_owner),
            launch,
            launched: 0,
        };
        let token = world.issue_token(Duration::from_secs(3600))?;
        write_token(&world.token_file, &token)?;
        world.start_manager().await?;
        world.wait_leader().await?;
        Ok(world)
    }

    /// Launches one more manager behind the proxy (leader or standby, as the Lease decides).
    pub async fn start_manager(&mut self) -> Result<(), Failure> {
        self.launched += 1;
        let identity = format!("{}-m{}", self.sdk.name, self.launched);
        let mut args: Vec<&str> = RBAC_ARGS.to_vec();
        // A 4 s Lease with a 2 s renew deadline: failover stays quick, and the hold
        // (lease less renew deadline) is 2 s, so replicas heartbeat every 400 ms and stop after
        // 1 s of silence, loose enough for a loaded machine.
        args.extend(LEASE);
        // Every check registers a controller of its own; the tenant's registration rate limit
        // is not what this suite is about.
        args.extend(["--max-registrations-per-second", "0"]);
        let m = Manager::launch(&self.cluster, &identity, &args, &self.launch).await?;
        self.managers.push(m);
        self.route();
        Ok(())
    }

    /// Launches ring member `<sdk>-<name>` (ring mode, fast member Leases, a 2 s handover
    /// drain) without adding it to [`World::ring`]: the caller may keep the world busy
    /// meanwhile, then pushes it.
    pub async fn launch_member(&self, name: &str) -> Result<Manager, Failure> {
        let identity = format!("{}-{name}", self.sdk.name);
        let mut args: Vec<&str> = RBAC_ARGS.to_vec();
        args.extend(FAST_LEASE);
        args.extend(MEMBER_ARGS);
        args.extend(["--max-registrations-per-second", "0"]);
        Ok(Manager::launch(&self.cluster, &identity, &args, &self.launch).await?)
    }

    /// Launches ring member `<sdk>-<name>` and adds it to [`World::ring`].
    pub async fn start_member(&mut self, name: &str) -> Result<(), Failure> {
        let m = self.launch_member(name).await?;
        self.ring.members.push(m);
        Ok(())
    }

    fn route(&self) {
        self.proxy
            .set_routes(self.managers.iter().map(Route::to).collect());
    }

    /// The index of the manager that leads now, if one does.
    async fn leader_index(&self) -> Option<usize> {
        for (i, m) in self.managers.iter().enumerate() {
            if m.leading().await {
                return Some(i);
            }
        }
        None
    }

    /// Waits until some manager leads, and returns it.
    pub async fn wait_leader(&self) -> Result<&Manager, Failure> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(i) = self.leader_index().await {
                return Ok(&self.managers[i]);
            }
            if Instant::now() >= deadline {
                return Err(TimedOut {
                    what: "a manager to lead".into(),
                    timeout: PATIENCE,
                    last: format!("{} managers, none leading", self.managers.len()),
                }
                .into());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Starts a manager when none runs (a check that replaces managers failed half-way), so
    /// that one red row does not turn the next ones red too.
    pub async fn heal(&mut self) -> Result<(), Failure> {
        if self.managers.is_empty() {
            self.start_manager().await?;
        }
        self.wait_leader().await?;
        Ok(())
    }

    /// The running manager named `identity`.
    pub fn manager(&self, identity: &str) -> Result<&Manager, Failure> {
        self.managers
            .iter()
            .find(|m| m.identity == identity)
            .ok_or_else(|| Failure::Setup(format!("no running manager {identity}")))
    }

    /// Takes the leading manager out of the proxy's routes and hands it to the caller, who
    /// stops or kills it.
    pub async fn take_leader(&mut self) -> Result<Manager, Failure> {
        self.wait_leader().await?;
        let i = self
            .leader_index()
            .await
            .ok_or_else(|| Failure::Setup("the leader stepped down on its own".into()))?;
        let m = self.managers.remove(i);
        self.route();
        Ok(m)
    }

    /// The leader's `/status` entry of controller `name` (None when it has none).
    pub async fn controller_status(&self, name: &str) -> Result<Option<Value>, Failure> {
        let leader = self.wait_leader().await?;
        let status = leader.try_status().await?;
        Ok(status["controllers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == json!(name)))
            .cloned())
    }

    /// Waits until the leader's `/status` entry of controller `name` satisfies `holds`; fails
    /// at once when one of `procs` exits that should not.
    pub async fn wait_controller(
        &self,
        what: &str,
        name: &str,
        procs: &[&Proc],
        holds: impl Fn(&Value) -> bool,
    ) -> Result<Value, Failure> {
        let found = self
            .wait_controller_entry(what, name, procs, |c| c.is_some_and(&holds))
            .await?;
        Ok(found.unwrap_or_default())
    }

    /// [`World::wait_controller`] where `holds` also sees the absence of the entry (a
    /// controller whose last replica left is not listed).
    pub async fn wait_controller_entry(
        &self,
        what: &str,
        name: &str,
        procs: &[&Proc],
        holds: impl Fn(Option<&Value>) -> bool,
    ) -> Result<Option<Value>, Failure> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let status = self.controller_status(name).await?;
            if holds(status.as_ref()) {
                return Ok(status);
            }
            for p in procs {
                p.require_running()
                    .map_err(|e| Failure::Violation(format!("while waiting for {what}: {e}")))?;
            }
            if Instant::now() >= deadline {
                let last = status.map_or("no such controller".into(), |s| s.to_string());
                return Err(TimedOut {
                    what: what.into(),
                    timeout: PATIENCE,
                    last,
                }
                .into());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Creates namespace `ns`.
    pub async fn namespace(&self, ns: &str) -> Result<(), Failure> {
        Ok(apply(&self.cluster.client, &namespace_object(ns, &[])).await?)
    }

    /// Creates or replaces ConfigMap `ns/name`, in the controllers' label selector or not, with
    /// `directives` as its data; returns its new resourceVersion.
    pub async fn put(
        &self,
        ns: &str,
        name: &str,
        in_scope: bool,
        directives: &Directives,
    ) -> Result<String, Failure> {
        let scope = if in_scope { "in" } else { "out" };
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "labels": {SCOPE_LABEL: scope}},
            "data": directives.to_data()});
        let api: Api<ConfigMap> = Api::namespaced(self.cluster.client.clone(), ns);
        let cm = api
            .patch(
                name,
                &PatchParams::apply("conformance").force(),
                &Patch::Apply(&obj),
            )
            .await
            .with_context(|| format!("applying ConfigMap {ns}/{name}"))?;
        Ok(cm.metadata.resource_version.unwrap_or_default())
    }

    /// Creates Lease `ns/name`, owned (controller reference) by ConfigMap `ns/owner`, with
    /// `spec.holderIdentity` `holder`: an owned child of a key.
    pub async fn put_child(
        &self,
        ns: &str,
        owner: &str,
        name: &str,
        holder: &str,
    ) -> Result<(), Failure> {
        let configmaps: Api<ConfigMap> = Api::namespaced(self.cluster.client.clone(), ns);
        let uid = configmaps
            .get(owner)
            .await
            .with_context(|| format!("reading ConfigMap {ns}/{owner}"))?
            .metadata
            .uid
            .unwrap_or_default();
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": owner, "uid": uid,
                "controller": true}]},
            "spec": {"holderIdentity": holder}});
        apply(&self.cluster.client, &lease)
            .await
            .with_context(|| format!("applying Lease {ns}/{name}"))?;
        Ok(())
    }

    /// Deletes ConfigMap `ns/name`.
    pub async fn delete(&self, ns: &str, name: &str) -> Result<(), Failure> {
        let api: Api<ConfigMap> = Api::namespaced(self.cluster.client.clone(), ns);
        api.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting ConfigMap {ns}/{name}"))?;
        Ok(())
    }

    /// A token of the controllers' ServiceAccount for ctrlhub's audience, valid for `ttl`.
    pub fn issue_token(&self, ttl: Duration) -> Result<String, Failure> {
        self.cluster
            .dc
            .issue_token(TENANT_NAMESPACE, SERVICE_ACCOUNT, &[AUDIENCE], ttl)
            .map_err(|e| Failure::Setup(format!("issuing a token: {e}")))
    }

    /// Starts a conformance controller process as `spawn` says.
    pub fn spawn(&self, spawn: &Spawn) -> Result<Proc, Failure> {
        let name = format!("{}-{}", spawn.controller, spawn.replica);
        let report = self.dir.join(format!("{name}.jsonl"));
        let log = self.dir.join(format!("{name}.log"));
        let (program, args) = self.sdk.command();
        let mut cmd = Command::new(&program);
        cmd.args(&args).current_dir(repo_root());
        self.environment(&mut cmd, spawn, &report);
        let out = std::fs::File::create(self.dir.join(format!("{name}.stdout.log")))
            .context("creating the stdout log")?;
        cmd.stdout(out);
        let process = ChildProcess::spawn(&mut cmd, &log)
            .with_context(|| format!("starting {} for {name}", self.sdk.name))?;
        Ok(Proc {
            name,
            report,
            log,
            state: Mutex::new(ProcState {
                process,
                exit: None,
                may_exit: false,
            }),
        })
    }

    fn environment(&self, cmd: &mut Command, spawn: &Spawn, report: &Path) {
        // Only what the interface lists: nothing of whoever runs the tests leaks in.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().into_owned();
            if key.starts_with("CTRLHUB_")
                || key.starts_with("CONFORMANCE_")
                || key.starts_with("OTEL_")
                || key == "KUBECONFIG"
            {
                cmd.env_remove(key);
            }
        }
        let token_file = spawn.token_file.as_ref().unwrap_or(&self.token_file);
        let addr = spawn.addr.clone().unwrap_or_else(|| self.proxy.endpoint());
        cmd.env(iface::ENV_ADDR, addr)
            .env(iface::ENV_TOKEN_FILE, token_file)
            .env(iface::ENV_CONTROLLER, &spawn.controller)
            .env(iface::ENV_NAMESPACE, &spawn.namespace)
            .env(iface::ENV_MAX_IN_FLIGHT, spawn.max_in_flight.to_string())
            .env(iface::ENV_DEADLINE_MS, spawn.deadline_ms.to_string())
            .env(iface::ENV_BACKOFF_BASE_MS, spawn.backoff_ms.0.to_string())
            .env(iface::ENV_BACKOFF_MAX_MS, spawn.backoff_ms.1.to_string())
            .env(iface::ENV_REPORT, report)
            .env(iface::ENV_REPLICA, &spawn.replica)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", self.otlp.endpoint())
            .env("RUST_LOG", "info");
        if let Some(owns) = spawn.owns {
            cmd.env(iface::ENV_OWNS, owns);
        }
        if let Some(revision) = spawn.revision {
            cmd.env(iface::ENV_REVISION, revision.to_string());
        }
    }
}

/// The tenant: its namespace, ServiceAccount and a cluster-wide grant to read ConfigMaps.
async fn tenant(c: &Cluster) -> Result<(), Failure> {
    apply(&c.client, &namespace_object(TENANT_NAMESPACE, &[])).await?;
    apply(
        &c.client,
        &service_account_object(TENANT_NAMESPACE, SERVICE_ACCOUNT),
    )
    .await?;
    for obj in configmap_reader(TENANT_NAMESPACE, SERVICE_ACCOUNT, None) {
        apply(&c.client, &obj).await?;
    }
    for obj in lease_reader(TENANT_NAMESPACE, SERVICE_ACCOUNT) {
        apply(&c.client, &obj).await?;
    }
    Ok(())
}

/// A ClusterRole to get, list and watch Leases, bound to `sa_ns/sa`: the owned children of the
/// owns rows.
fn lease_reader(sa_ns: &str, sa: &str) -> [Value; 2] {
    let name = format!("{sa_ns}-{sa}-lease-reader");
    let rbac = "rbac.authorization.k8s.io";
    [
        serde_json::json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "verbs": ["get", "list", "watch"]}]}),
        serde_json::json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]}),
    ]
}

/// How this run launches managers: the debug binary, logs in the run's directory, traces to
/// the receiver.
fn launch(dir: &Path, otlp: &str) -> Result<Launch, Failure> {
    let binary = target_dir().join("debug").join("ctrlhub");
    require(binary.exists(), || {
        format!(
            "{} is missing: run `cargo build --workspace --bins` first",
            binary.display()
        )
    })
    .map_err(|e| Failure::Setup(e.to_string()))?;
    Ok(Launch {
        binary,
        log_dir: dir.to_path_buf(),
        rust_log: "info,ctrlhub=debug".into(),
        token: None,
        env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), otlp.into()),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
        ],
    })
}

/// Replaces the token file the way a kubelet does: write a new file, rename it over the old.
pub fn write_token(path: &Path, token: &str) -> Result<(), Failure> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, token).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// How to start one conformance controller replica.
#[derive(Debug, Clone)]
pub struct Spawn {
    /// `CONFORMANCE_CONTROLLER`.
    pub controller: String,
    /// `CONFORMANCE_NAMESPACE`.
    pub namespace: String,
    /// `CONFORMANCE_REPLICA`.
    pub replica: String,
    /// `CONFORMANCE_DEADLINE_MS`.
    pub deadline_ms: u64,
    /// `CONFORMANCE_BACKOFF_BASE_MS` and `_MAX_MS`.
    pub backoff_ms: (u64, u64),
    /// `CONFORMANCE_MAX_IN_FLIGHT`.
    pub max_in_flight: u32,
    /// A token file of its own (default: the world's).
    pub token_file: Option<PathBuf>,
    /// `CONFORMANCE_OWNS` (unset: no owns).
    pub owns: Option<&'static str>,
    /// `CTRLHUB_REVISION` (unset: the SDK's default, 0).
    pub revision: Option<u64>,
    /// `CTRLHUB_ADDR` (default: the world's leader-routing proxy).
    pub addr: Option<String>,
}

impl Spawn {
    /// Replica `replica` of controller `controller` watching `namespace`, with the suite's
    /// defaults: a 10 s deadline, a 200 ms to 5 s backoff, 4 in flight.
    pub fn new(controller: &str, namespace: &str, replica: &str) -> Spawn {
        Spawn {
            controller: controller.into(),
            namespace: namespace.into(),
            replica: replica.into(),
            deadline_ms: 10_000,
            backoff_ms: (200, 5_000),
            max_in_flight: 4,
            token_file: None,
            owns: None,
            revision: None,
            addr: None,
        }
    }
}

struct ProcState {
    process: ChildProcess,
    exit: Option<ExitStatus>,
    may_exit: bool,
}

/// A running conformance controller replica and its report.
pub struct Proc {
    /// `<controller>-<replica>`.
    pub name: String,
    /// Its report file.
    pub report: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
    state: Mutex<ProcState>,
}

impl Proc {
    /// Every complete report line so far.
    pub fn events(&self) -> Result<Vec<Event>, Failure> {
        iface::read_report(&self.report)
    }

    /// Sends SIGTERM (a graceful stop: the process may exit from now on).
    pub fn terminate(&self) {
        let mut s = self.state.lock();
        s.may_exit = true;
        s.process.signal("TERM");
    }

    /// Sends SIGKILL (a crash: the process may exit from now on).
    pub fn kill(&self) {
        let mut s = self.state.lock();
        s.may_exit = true;
        s.process.signal("KILL");
    }

    /// Declares that the process may exit on its own from now on (e.g. when superseded).
    pub fn may_exit(&self) {
        self.state.lock().may_exit = true;
    }

    /// The exit status, once the process has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut s = self.state.lock();
        if s.exit.is_none() {
            s.exit = s.process.try_wait().ok().flatten();
        }
        s.exit
    }

    /// A violation when the process exited although nothing allowed it to.
    pub fn require_running(&self) -> Result<(), Failure> {
        let allowed = self.state.lock().may_exit;
        match self.exit_status() {
            Some(status) if !allowed => Err(Failure::Violation(format!(
                "controller {} exited unexpectedly ({status}); see {}",
                self.name,
                self.log.display()
            ))),
            _ => Ok(()),
        }
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&self) -> Result<ExitStatus, Failure> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(TimedOut {
                    what: format!("controller {} to exit", self.name),
                    timeout: PATIENCE,
                    last: "still running".into(),
                }
                .into());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// The report lines of `procs`, merged in time order.
pub fn merged(procs: &[&Proc]) -> Result<Vec<Event>, Failure> {
    let mut all = Vec::new();
    for p in procs {
        all.extend(p.events()?);
    }
    all.sort_by_key(|e| e.ts_us);
    Ok(all)
}

/// Waits until `found` finds what it looks for in the merged reports of `procs`. Fails at once
/// when a report breaks the interface or a process exits that should not.
pub async fn wait_events<T>(
    what: &str,
    procs: &[&Proc],
    found: impl FnMut(&[Event]) -> Option<T>,
) -> Result<T, Failure> {
    wait_events_within(what, procs, PATIENCE, found).await
}

/// [`wait_events`] with a bound of its own, for things the contract bounds more tightly.
pub async fn wait_events_within<T>(
    what: &str,
    procs: &[&Proc],
    within: Duration,
    mut found: impl FnMut(&[Event]) -> Option<T>,
) -> Result<T, Failure> {
    let deadline = Instant::now() + within;
    loop {
        let events = merged(procs)?;
        if let Some(v) = found(&events) {
            return Ok(v);
        }
        for p in procs {
            p.require_running()
                .map_err(|e| Failure::Violation(format!("while waiting for {what}: {e}")))?;
        }
        if Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.into(),
                timeout: within,
                last: tail(&events),
            }
            .into());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Watches the reports of `procs` for `window` and fails if a line `forbidden` matches
/// appears: the one way to show that something does not happen. Callers choose windows several
/// times longer than the forbidden thing would take.
pub async fn stay_quiet(
    what: &str,
    procs: &[&Proc],
    window: Duration,
    forbidden: impl Fn(&Event) -> bool,
) -> Result<(), Failure> {
    let until = Instant::now() + window;
    loop {
        let events = merged(procs)?;
        if let Some(e) = events.iter().find(|e| forbidden(e)) {
            return Err(Failure::Violation(format!("{what}, but got {}", line(e))));
        }
        if Instant::now() >= until {
            return Ok(());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The last few lines, for a timeout's "last seen".
fn tail(events: &[Event]) -> String {
    let start = events.len().saturating_sub(4);
    let lines: Vec<String> = events[start..].iter().map(line).collect();
    format!("{} report lines; last: {}", events.len(), lines.join(" | "))
}

/// One report line, briefly.
pub fn line(e: &Event) -> String {
    if !(e.is_start() || e.is_end()) {
        return format!("{} {}", e.replica, e.event);
    }
    if e.is_end() {
        format!(
            "{} end {} id={} attempt={} outcome={}",
            e.replica, e.key, e.id, e.attempt, e.outcome
        )
    } else {
        format!(
            "{} {} {} id={} attempt={} reasons={}",
            e.replica,
            e.event,
            e.key,
            e.id,
            e.attempt,
            e.reason_list()
        )
    }
}
