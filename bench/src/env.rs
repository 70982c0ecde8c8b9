//! The test bed: devcluster in process, the bench CRD, object load, child processes (the
//! `ctrlhub` manager and thin controllers), resident memory, and the reconcile collector.

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

pub use ctrlhub_tests::FAST_LEASE;
use ctrlhub_tests::objects::{apply, namespace_object};
use ctrlhub_tests::process::{ChildProcess, rss_bytes};
use ctrlhub_tests::{Launch, PATIENCE, poll_until};
use std::ops::{Deref, DerefMut};
use tokio::sync::mpsc;

/// API group of the benchmark CRD.
pub const GROUP: &str = "bench.ctrlhub.io";
/// Version of the benchmark CRD.
pub const VERSION: &str = "v1";
/// Kind of the benchmark CRD.
pub const KIND: &str = "Widget";
/// Plural of the benchmark CRD (devcluster counts requests under this name).
pub const PLURAL: &str = "widgets";
/// Annotation holding the load generator's wall-clock time (µs since the epoch) of the write.
pub const TS_ANNOTATION: &str = "bench.ctrlhub.io/ts";

/// Wall-clock microseconds since the epoch: the one clock shared by the load generator and the
/// controllers (all processes run on this machine).
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// Latency in µs from the object's timestamp annotation to now, or -1 without one.
pub fn latency_of(annotations: Option<&std::collections::BTreeMap<String, String>>) -> i64 {
    annotations
        .and_then(|a| a.get(TS_ANNOTATION))
        .and_then(|v| v.parse::<i64>().ok())
        .map(|ts| (now_micros() - ts).max(0))
        .unwrap_or(-1)
}

/// The directory holding the harness' sibling binaries (`ctrlhub`, `bench-sdk-controller`, ...):
/// `CTRLHUB_BENCH_BIN_DIR`, else the directory of the running executable (test executables live
/// one level down, in `deps/`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CTRLHUB_BENCH_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    }
}

/// A sibling binary, checked to exist (`CTRLHUB_BIN` overrides the manager's path).
pub fn bin(name: &str) -> Result<PathBuf> {
    ctrlhub_tests::process::bin_in(&bin_dir(), name)
        .context("build it first (`cargo build --release -p ctrlhub -p ctrlhub-bench`)")
}

/// Where results and logs go: `CTRLHUB_BENCH_OUT`, else `<target>/bench`.
pub fn out_dir() -> PathBuf {
    let dir = std::env::var_os("CTRLHUB_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            bin_dir()
                .parent()
                .map(|p| p.join("bench"))
                .unwrap_or_else(|| PathBuf::from("target/bench"))
        });
    let _ = std::fs::create_dir_all(dir.join("logs"));
    dir
}

/// The summed resident memory of `pids` once it has settled: sampled every 250 ms until three
/// readings in a row agree within 1% (a burst's buffers freed, the manager's post-burst
/// `malloc_trim` run), or after 15 s, the last reading. Replaces a fixed pause before a reading.
pub async fn settled_rss(pids: &[u32]) -> u64 {
    let read = || pids.iter().filter_map(|p| rss_bytes(*p)).sum::<u64>();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut last = read();
    let mut steady = 0;
    while steady < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = read();
        let close = now.abs_diff(last) <= last / 100;
        steady = if close { steady + 1 } else { 0 };
        last = now;
    }
    last
}

/// devcluster in process with the benchmark CRD installed: the test support library's
/// [`ctrlhub_tests::Cluster`] (kubeconfig for child processes included), sized for bursts.
pub struct Cluster {
    hub: ctrlhub_tests::Cluster,
}

impl Deref for Cluster {
    type Target = ctrlhub_tests::Cluster;
    fn deref(&self) -> &Self::Target {
        &self.hub
    }
}

impl Cluster {
    /// Start devcluster and install the benchmark CRD.
    pub async fn start() -> Result<Cluster> {
        let opts = devcluster::Options {
            // Creating 100k objects in a burst must not push a lagging watch past the history
            // (a 410 would force a relist and distort the figures).
            history_limit: 200_000,
            ..Default::default()
        };
        let c = Cluster {
            hub: ctrlhub_tests::Cluster::start(opts).await?,
        };
        c.install_crd().await?;
        Ok(c)
    }

    async fn install_crd(&self) -> Result<()> {
        let crd = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{PLURAL}.{GROUP}")},
            "spec": {"group": GROUP, "scope": "Namespaced",
                "names": {"plural": PLURAL, "singular": "widget", "kind": KIND, "listKind": "WidgetList"},
                "versions": [{"name": VERSION, "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
        });
        apply(&self.client, &crd).await?;
        let api = self.widgets("default");
        poll_until("the Widget CRD to be served", PATIENCE, || async {
            let first = kube::api::ListParams::default().limit(1);
            api.list(&first)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await?;
        Ok(())
    }

    /// The Widget API in `ns`.
    pub fn widgets(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &widget_resource())
    }

    /// Create namespace `ns` (idempotent).
    pub async fn namespace(&self, ns: &str) -> Result<()> {
        apply(&self.client, &namespace_object(ns, &[])).await
    }

    /// Create `n` Widgets `w-000000..` in `ns` with `concurrency` writes in flight; returns how
    /// long it took.
    pub async fn create_widgets(&self, ns: &str, n: usize, concurrency: usize) -> Result<Duration> {
        self.namespace(ns).await?;
        let api = self.widgets(ns);
        let start = Instant::now();
        let results: Vec<Result<()>> = futures::stream::iter(0..n)
            .map(|i| {
                let api = api.clone();
                async move {
                    let obj: DynamicObject = serde_json::from_value(widget(ns, &widget_name(i)))?;
                    let mut tries = 0;
                    loop {
                        match api.create(&PostParams::default(), &obj).await {
                            Ok(_) => return Ok(()),
                            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
                            Err(e) if tries < 5 => {
                                tries += 1;
                                tracing_free_warn(&format!("create retry: {e}"));
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            Err(e) => return Err(anyhow!(e)),
                        }
                    }
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(start.elapsed())
    }

    /// Stamp Widget `name` in `ns` with the current time (a merge patch of the annotation).
    pub async fn touch(api: &Api<DynamicObject>, name: &str) -> Result<()> {
        let patch = serde_json::json!({"metadata": {"annotations": {TS_ANNOTATION: now_micros().to_string()}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

/// Errors during load generation are counted by the caller; this only keeps a trace of them on
/// stderr without pulling in a logging stack.
fn tracing_free_warn(msg: &str) {
    eprintln!("  warning: {msg}");
}

/// The Widget's ApiResource.
pub fn widget_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

/// The Widget as a ctrlhub resource type.
pub fn widget_type() -> ctrlhub_proto::v1::ResourceType {
    ctrlhub_proto::v1::ResourceType {
        group: GROUP.into(),
        version: VERSION.into(),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

/// Name of the i-th Widget.
pub fn widget_name(i: usize) -> String {
    format!("w-{i:06}")
}

/// A Widget of about 800 bytes of JSON once stored (metadata filled in by the server): a typical
/// small custom resource with labels, an annotation and a spec of a dozen fields.
pub fn widget(ns: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{VERSION}"), "kind": KIND,
        "metadata": {"name": name, "namespace": ns,
            "labels": {"app.kubernetes.io/name": "widget", "app.kubernetes.io/part-of": "ctrlhub-bench", "tier": "backend"},
            "annotations": {TS_ANNOTATION: now_micros().to_string()}},
        "spec": {"replicas": 3, "image": "registry.example.com/widgets/widget:1.2.3", "size": "medium",
            "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
            "env": {"LOG_LEVEL": "info", "REGION": "eu-west-1"}, "paused": false,
            "owner": "team-widgets", "tags": ["bench", "widget", "ctrlhub"]}
    })
}

/// One reconcile start observed by the harness.
#[derive(Debug, Clone)]
pub struct Reconciled {
    /// `namespace/name`.
    pub key: String,
    /// Update-to-reconcile-start latency in µs, or -1 when the object had no timestamp.
    pub latency_us: i64,
}

/// Aggregates the reconcile reports of one side (ctrlhub or its peer).
#[derive(Default)]
pub struct Tally {
    /// Distinct keys reconciled at least once.
    pub distinct: HashSet<String>,
    /// All reconciles.
    pub total: u64,
    /// When the last new distinct key arrived.
    pub last_new: Option<Instant>,
    /// Latencies recorded while `recording` is on.
    pub latencies: Vec<Duration>,
    /// Whether latencies are being recorded.
    pub recording: bool,
}

/// A shared [`Tally`] fed by a channel of [`Reconciled`].
#[derive(Clone, Default)]
pub struct Collector {
    /// The tally.
    pub tally: Arc<Mutex<Tally>>,
}

impl Collector {
    /// A collector and the sender its reports go to.
    pub fn new() -> (Collector, mpsc::UnboundedSender<Reconciled>) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Reconciled>();
        let c = Collector::default();
        let tally = c.tally.clone();
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                let mut t = tally.lock();
                t.total += 1;
                if t.recording && r.latency_us >= 0 {
                    t.latencies.push(Duration::from_micros(r.latency_us as u64));
                }
                if !t.distinct.contains(&r.key) {
                    t.distinct.insert(r.key);
                    t.last_new = Some(Instant::now());
                }
            }
        });
        (c, tx)
    }

    /// Run `f` on the tally.
    pub fn with<T>(&self, f: impl FnOnce(&mut Tally) -> T) -> T {
        f(&mut self.tally.lock())
    }

    /// Wait until `n` distinct keys were reconciled (keys whose name starts with `prefix`, i.e.
    /// `namespace/`), up to `timeout`; returns when the last of them arrived.
    pub async fn wait_distinct(&self, n: usize, timeout: Duration) -> Result<Instant> {
        let start = Instant::now();
        loop {
            let (count, last) = self.with(|t| (t.distinct.len(), t.last_new));
            if count >= n {
                return Ok(last.unwrap_or_else(Instant::now));
            }
            if start.elapsed() > timeout {
                bail!("only {count} of {n} keys reconciled after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Parse a controller's stdout report line `R <key> <latency-µs>`.
pub fn parse_report(line: &str) -> Option<Reconciled> {
    let mut parts = line.split_whitespace();
    if parts.next()? != "R" {
        return None;
    }
    let key = parts.next()?.to_string();
    let latency_us = parts.next()?.parse().ok()?;
    Some(Reconciled { key, latency_us })
}

/// A child process of the harness (a controller or kopf), killed when dropped.
pub type Proc = ChildProcess;

/// Spawn `bin args..` with `env`, stderr to `log`, stdout's report lines parsed into `sink`
/// A bench controller run as `<interpreter> <script> --addr .. --name .. --namespace ..
/// --concurrency ..` (the Python and TypeScript SDKs' no-op reconcilers), reporting `R` lines.
#[derive(Debug, Clone)]
pub struct ScriptController<'a> {
    /// The interpreter (`python`, `node`).
    pub interpreter: &'a Path,
    /// The controller's script.
    pub script: &'a Path,
    /// Names its logs: `<out>/logs/<tag>-<name>-<ns>-<replica>.log`.
    pub tag: &'a str,
    /// Concurrent handlers (and credit) per replica.
    pub concurrency: u32,
    /// Extra environment variables.
    pub env: &'a [(&'a str, String)],
}

impl ScriptController<'_> {
    /// Start `replicas` processes of controller `name` on Widgets in `ns`, reporting to `sink`.
    pub fn start(
        &self,
        m: &Manager,
        name: &str,
        ns: &str,
        replicas: usize,
        sink: &mpsc::UnboundedSender<Reconciled>,
    ) -> Result<Vec<Proc>> {
        (0..replicas)
            .map(|i| {
                let log = out_dir()
                    .join("logs")
                    .join(format!("{}-{name}-{ns}-{i}.log", self.tag));
                let args = [
                    self.script.display().to_string(),
                    "--addr".into(),
                    m.grpc.clone(),
                    "--name".into(),
                    name.into(),
                    "--namespace".into(),
                    ns.into(),
                    "--concurrency".into(),
                    self.concurrency.to_string(),
                ];
                spawn(self.interpreter, &args, self.env, &log, Some(sink.clone()))
            })
            .collect()
    }
}

/// Wait until the ctrlhub controller `name` has `sessions` sessions.
pub async fn wait_sessions(m: &Manager, name: &str, sessions: u64) -> Result<()> {
    let what = format!("controller {name} to have {sessions} sessions");
    ctrlhub_tests::poll_until(&what, ctrlhub_tests::PATIENCE, || async {
        let status = m.status().await;
        let n: u64 = status["controllers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == name)
            .map(|c| c["sessions"].as_u64().unwrap_or(0))
            .sum();
        if n >= sessions {
            Ok(())
        } else {
            Err(format!("{n} sessions"))
        }
    })
    .await?;
    Ok(())
}

/// (when given).
pub fn spawn(
    bin: &Path,
    args: &[String],
    env: &[(&str, String)],
    log: &Path,
    sink: Option<mpsc::UnboundedSender<Reconciled>>,
) -> Result<Proc> {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(if sink.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut proc = ChildProcess::spawn(&mut cmd, log)?;
    if let (Some(sink), Some(out)) = (sink, proc.take_stdout()) {
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(r) = parse_report(&line) {
                    let _ = sink.send(r);
                }
            }
        });
    }
    Ok(proc)
}

/// Resident memory of `proc` now (0 once it is gone).
pub fn rss(proc: &Proc) -> u64 {
    rss_bytes(proc.pid()).unwrap_or(0)
}

/// A `ctrlhub run` child process: the test support library's [`ctrlhub_tests::Manager`],
/// launched the harness' way.
pub struct Manager {
    hub: ctrlhub_tests::Manager,
}

impl Deref for Manager {
    type Target = ctrlhub_tests::Manager;
    fn deref(&self) -> &Self::Target {
        &self.hub
    }
}

impl DerefMut for Manager {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.hub
    }
}

impl Manager {
    /// Start a manager against `cluster` with `extra` flags (static token `dev` unless they
    /// choose `--auth`), logging to `<out>/logs`; returns once `/healthz` answers.
    pub async fn start(cluster: &Cluster, identity: &str, extra: &[&str]) -> Result<Manager> {
        let launch = Launch {
            binary: bin("ctrlhub")?,
            log_dir: out_dir().join("logs"),
            // Managers log warnings only: logging every dispatch would cost what is measured.
            // CTRLHUB_BENCH_RUST_LOG overrides it for investigations.
            rust_log: std::env::var("CTRLHUB_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            token: (!extra.contains(&"--auth")).then(|| "dev".into()),
            env: Vec::new(),
        };
        let hub = ctrlhub_tests::Manager::launch(cluster, identity, extra, &launch).await?;
        Ok(Manager { hub })
    }

    /// Wait until this manager leads.
    pub async fn wait_leading(&self) -> Result<()> {
        Ok(self.hub.try_wait_leading().await?)
    }

    /// `/status` as JSON (Null when unreachable).
    pub async fn status(&self) -> serde_json::Value {
        self.hub.try_status().await.unwrap_or_default()
    }

    /// Sum of `field` over the status' controllers.
    pub async fn controllers_sum(&self, field: &str) -> u64 {
        self.status().await["controllers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c[field].as_u64().unwrap_or(0))
            .sum()
    }

    /// Objects in the informers (summed).
    pub async fn informer_objects(&self) -> u64 {
        self.status().await["informers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|i| i["objects"].as_u64().unwrap_or(0))
            .sum()
    }

    /// Resident memory now.
    pub fn rss(&self) -> u64 {
        rss(&self.process)
    }
}

/// Arguments for `bench-sdk-controller`: controller `name` reconciling Widgets in `ns`.
pub fn sdk_controller_args(m: &Manager, name: &str, ns: &str, concurrency: u32) -> Vec<String> {
    vec![
        "--addr".into(),
        m.grpc.clone(),
        "--name".into(),
        name.into(),
        "--namespace".into(),
        ns.into(),
        "--concurrency".into(),
        concurrency.to_string(),
    ]
}

/// Start `replicas` `bench-sdk-controller` processes of controller `name`, reporting to `sink`.
pub fn sdk_controllers(
    m: &Manager,
    name: &str,
    ns: &str,
    replicas: usize,
    concurrency: u32,
    sink: &mpsc::UnboundedSender<Reconciled>,
) -> Result<Vec<Proc>> {
    let bin = bin("bench-sdk-controller")?;
    (0..replicas)
        .map(|i| {
            let log = out_dir()
                .join("logs")
                .join(format!("sdk-{name}-{ns}-{i}.log"));
            spawn(
                &bin,
                &sdk_controller_args(m, name, ns, concurrency),
                &[("RUST_LOG", "warn".to_string())],
                &log,
                Some(sink.clone()),
            )
        })
        .collect()
}

/// Start `count` independent `bench-kube-controller` processes on Widgets in `ns`.
pub fn kube_controllers(
    cluster: &Cluster,
    ns: &str,
    count: usize,
    sink: &mpsc::UnboundedSender<Reconciled>,
) -> Result<Vec<Proc>> {
    let bin = bin("bench-kube-controller")?;
    (0..count)
        .map(|i| {
            let log = out_dir().join("logs").join(format!("kube-{ns}-{i}.log"));
            spawn(
                &bin,
                &["--namespace".into(), ns.into()],
                &[("KUBECONFIG", cluster.kubeconfig.display().to_string())],
                &log,
                Some(sink.clone()),
            )
        })
        .collect()
}

/// A steady load: `rate` timestamp patches per second, round-robin over `objects` Widgets in
/// `ns`, until `stop` is set. Returns (writes sent, write errors, ticks that fell behind).
pub async fn load(
    client: &kube::Client,
    ns: &str,
    objects: usize,
    rate: u32,
    stop: Arc<std::sync::atomic::AtomicBool>,
    sent: Arc<std::sync::atomic::AtomicU64>,
    errors: Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::Ordering;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &widget_resource());
    // Ticks of 10 ms; up to 256 writes in flight so a slow response does not lower the rate.
    let per_tick = (rate as f64 / 100.0).max(0.0);
    let mut owed = 0.0;
    let mut next = 0usize;
    let permits = Arc::new(tokio::sync::Semaphore::new(256));
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            let name = widget_name(next % objects);
            next += 1;
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let api = api.clone();
            let sent = sent.clone();
            let errors = errors.clone();
            tokio::spawn(async move {
                match Cluster::touch(&api, &name).await {
                    Ok(()) => sent.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
                drop(permit);
            });
        }
    }
    // Let the writes in flight finish.
    let _ = permits.acquire_many(256).await;
}

/// Run `cmd`, forwarding its stdout and stderr lines to our stderr as `  <tag>: line` (progress
/// for whoever waits on the install); an error with the last lines when it fails.
pub(crate) fn run_logged(cmd: &mut std::process::Command, tag: &str) -> Result<()> {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tag}"))?;
    let tail = Arc::new(Mutex::new(std::collections::VecDeque::<String>::new()));
    let forward = |stream: Box<dyn std::io::Read + Send>| {
        let tail = tail.clone();
        let tag = tag.to_string();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(|l| l.ok())
            {
                eprintln!("  {tag}: {line}");
                let mut t = tail.lock();
                if t.len() == 20 {
                    t.pop_front();
                }
                t.push_back(line);
            }
        })
    };
    let mut threads = Vec::new();
    if let Some(out) = child.stdout.take() {
        threads.push(forward(Box::new(out)));
    }
    if let Some(err) = child.stderr.take() {
        threads.push(forward(Box::new(err)));
    }
    let status = child.wait()?;
    for t in threads {
        let _ = t.join();
    }
    if !status.success() {
        let t = tail.lock();
        bail!(
            "{tag} exited with {status}; its last lines:\n{}",
            t.iter().cloned().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(())
}
