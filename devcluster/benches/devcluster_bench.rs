//! Throughput, latency and memory benchmark for devcluster, driven through kube-rs over HTTPS.
//!
//! The server runs in-process (`DevCluster::start(Options::default())`) on the same multi-thread
//! tokio runtime as the clients, so every number is end to end: TLS, HTTP, JSON encoding on the
//! server *and* JSON decoding in kube-rs, all sharing the machine's cores.
//!
//! What it measures (phases 2 and 4 share the same bulk-created objects; phase 3 runs last):
//!
//! 1. **Creates/s with watchers open** — ConfigMap creates from a few concurrent creators (kube-rs
//!    `Api::create`) while 10 `kube::runtime::watcher` streams on the same namespace are drained.
//!    Reports create rate, per-create latency (p50/p99), the time until every watcher has seen
//!    every object, and whether each watcher really saw all of them.
//! 2. **Bulk create and paginated list** — stores 10,000 and 100,000 small ConfigMaps with
//!    concurrent creators (reporting that create rate too), then lists each set completely with
//!    `limit=500` pages (following `continue` tokens). Reports the median over several full passes
//!    for 10k and over fewer passes for 100k, in milliseconds per full list.
//! 3. **Watch fan-out** — N watchers (10 and 50), each receiving M ADDED events, in two modes:
//!    `live` (watches open first, then a writer creates M objects; the clock runs until the last
//!    watcher has its M events) and `replay` (M objects created first, then N watches start from
//!    the older resourceVersion and are served from the watch history). Reports events delivered
//!    per second, summed over watchers.
//! 4. **Resident memory per stored object** — `VmRSS` from `/proc/self/status` before and after
//!    each bulk create of phase 2, divided by the object count, next to the object's JSON size as
//!    sent and as stored (GET, including `managedFields`). This is an upper bound: it also counts whatever the client side and
//!    the allocator kept, since client and server share the process.
//!
//! Output: a table on stdout, then one line `BENCH_JSON {...}` with every number. Progress of long
//! phases goes to stderr.
//!
//! Run it (release profile; building takes a few minutes on a small machine):
//!
//! ```text
//! cargo bench -p devcluster --bench devcluster_bench
//! ```
//!
//! Object counts scale with `DEVCLUSTER_BENCH_SCALE` (a positive factor, default 1) or
//! `--scale <factor>` after `--`, e.g. `DEVCLUSTER_BENCH_SCALE=0.1 cargo bench -p devcluster`
//! for a quick smoke run (500 creates, 1k/10k lists, 200 events per watcher). Watcher counts and
//! page size do not scale.

use anyhow::{Context, Result, anyhow, bail};
use devcluster::{DevCluster, Options};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Page size of every paginated list.
const PAGE_LIMIT: u32 = 500;
/// How long a watcher may take to catch up after the writes finished before it counts as failed.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// What to run, after scaling.
struct Settings {
    scale: f64,
    creates: usize,
    create_watchers: usize,
    creators: usize,
    bulk_creators: usize,
    list_sets: Vec<(usize, usize)>,
    fanout_watchers: Vec<usize>,
    fanout_events: usize,
}

impl Settings {
    fn new(scale: f64) -> Self {
        let n = |base: usize| ((base as f64 * scale).round() as usize).max(1);
        Settings {
            scale,
            creates: n(5_000),
            create_watchers: 10,
            creators: 4,
            bulk_creators: 16,
            // (object count, full list passes)
            list_sets: vec![(n(10_000), 5), (n(100_000), 3)],
            fanout_watchers: vec![10, 50],
            fanout_events: n(2_000),
        }
    }
}

fn parse_scale() -> Result<f64> {
    let mut scale = match std::env::var("DEVCLUSTER_BENCH_SCALE") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<f64>()
            .with_context(|| format!("DEVCLUSTER_BENCH_SCALE={v:?} is not a number"))?,
        _ => 1.0,
    };
    // `cargo bench` passes `--bench` (and possibly a filter); ignore anything we do not know.
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = if arg == "--scale" {
            Some(args.next().context("--scale needs a value")?)
        } else {
            arg.strip_prefix("--scale=").map(str::to_string)
        };
        if let Some(v) = value {
            scale = v
                .parse::<f64>()
                .with_context(|| format!("--scale {v:?} is not a number"))?;
        } else if arg == "--help" || arg == "-h" {
            println!(
                "usage: devcluster_bench [--scale FACTOR]  (or DEVCLUSTER_BENCH_SCALE=FACTOR)"
            );
            std::process::exit(0);
        }
    }
    if !(scale.is_finite() && scale > 0.0) {
        bail!("scale must be a positive number, got {scale}");
    }
    Ok(scale)
}

fn main() -> Result<()> {
    let settings = Settings::new(parse_scale()?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(run(settings))
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Resident set size of this process, from `/proc/self/status`.
fn rss_bytes() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line in /proc/self/status")?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("unparsable VmRSS line {line:?}"))?;
    Ok(kb * 1024)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn per_sec(count: usize, d: Duration) -> f64 {
    count as f64 / d.as_secs_f64().max(1e-9)
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

/// The benchmark's ConfigMap: a label and two small data keys (~300 bytes of JSON once stored).
fn config_map(name: &str, i: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([("app".to_string(), "bench".to_string())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("index".to_string(), i.to_string()),
            ("payload".to_string(), format!("{i:0>64}")),
        ])),
        ..Default::default()
    }
}

async fn create_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// The current resourceVersion of a namespace's ConfigMap collection.
async fn list_rv(api: &Api<ConfigMap>) -> Result<String> {
    api.list(&ListParams::default().limit(1))
        .await
        .context("listing for the current resourceVersion")?
        .metadata
        .resource_version
        .context("list response without resourceVersion")
}

struct CreateRun {
    elapsed: Duration,
    /// Per-create latencies, sorted; empty unless requested.
    latencies: Vec<Duration>,
}

/// Create `count` ConfigMaps named `{prefix}{i:06}` with `concurrency` tasks, printing progress.
async fn create_many(
    api: &Api<ConfigMap>,
    prefix: &str,
    count: usize,
    concurrency: usize,
    record_latency: bool,
    label: &str,
) -> Result<CreateRun> {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let reporter = {
        let done = done.clone();
        let label = label.to_string();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(3));
            tick.tick().await;
            loop {
                tick.tick().await;
                let d = done.load(Ordering::Relaxed);
                progress(format!(
                    "{label}: {d}/{count} created ({:.0}/s)",
                    per_sec(d, start.elapsed())
                ));
            }
        })
    };
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency.max(1) {
        let api = api.clone();
        let next = next.clone();
        let done = done.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let pp = PostParams::default();
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let name = format!("{prefix}{i:06}");
                let cm = config_map(&name, i);
                let t = Instant::now();
                if let Err(e) = api.create(&pp, &cm).await {
                    // Stop the other creators too.
                    next.store(count, Ordering::Relaxed);
                    return Err(anyhow!(e).context(format!("creating configmap {name}")));
                }
                if record_latency {
                    latencies.push(t.elapsed());
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    let mut failure = None;
    for task in tasks {
        match task.await {
            Ok(Ok(l)) => latencies.extend(l),
            Ok(Err(e)) => {
                failure.get_or_insert(e);
            }
            Err(e) => {
                failure.get_or_insert(anyhow!(e).context("creator task panicked"));
            }
        }
    }
    let elapsed = start.elapsed();
    reporter.abort();
    if let Some(e) = failure {
        return Err(e);
    }
    latencies.sort();
    Ok(CreateRun { elapsed, latencies })
}

/// One full paginated list; returns (items, pages).
async fn list_all(api: &Api<ConfigMap>) -> Result<(usize, usize)> {
    let mut items = 0;
    let mut pages = 0;
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE_LIMIT);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api
            .list(&lp)
            .await
            .with_context(|| format!("listing page {}", pages + 1))?;
        items += page.items.len();
        pages += 1;
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok((items, pages));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Phase 1: creates per second with watchers open

struct CreatesResult {
    creates: usize,
    creators: usize,
    watchers: usize,
    run: CreateRun,
    /// From the first create until every watcher saw every object (None if some never did).
    all_seen_after: Option<Duration>,
    /// Distinct objects each watcher saw.
    seen: Vec<usize>,
    watcher_errors: usize,
}

async fn phase_creates(
    cluster: &DevCluster,
    client: &kube::Client,
    s: &Settings,
) -> Result<CreatesResult> {
    let ns = "bench-creates";
    create_namespace(client, ns).await?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let expected = s.creates;
    let watches_before = cluster.stats().watches_open();

    let ready = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let mut seen_counters = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..s.create_watchers {
        let seen = Arc::new(AtomicUsize::new(0));
        seen_counters.push(seen.clone());
        let ready = ready.clone();
        let errors = errors.clone();
        let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
        handles.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut names = HashSet::new();
            let mut done_at = None;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        ready.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                        if let Some(name) = cm.metadata.name
                            && names.insert(name)
                        {
                            seen.store(names.len(), Ordering::SeqCst);
                            if names.len() >= expected {
                                done_at = Some(Instant::now());
                                break;
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(_) => {
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            done_at
        }));
    }

    // Wait until every watcher listed and its watch request is streaming.
    let wait_start = Instant::now();
    while ready.load(Ordering::SeqCst) < s.create_watchers
        || cluster.stats().watches_open() < watches_before + s.create_watchers
    {
        if wait_start.elapsed() > Duration::from_secs(30) {
            bail!(
                "watchers did not start within 30s ({} listed, {} watches open)",
                ready.load(Ordering::SeqCst),
                cluster.stats().watches_open()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    progress(format!(
        "phase 1: {} watchers open; creating {expected} ConfigMaps with {} creators",
        s.create_watchers, s.creators
    ));

    let start = Instant::now();
    let run = create_many(&api, "cm-", expected, s.creators, true, "phase 1").await?;
    progress(format!(
        "phase 1: creates done in {:.0} ms; waiting for watchers",
        ms(run.elapsed)
    ));

    let aborts: Vec<_> = handles.iter().map(|h| h.abort_handle()).collect();
    let joined = tokio::time::timeout(CATCH_UP_TIMEOUT, futures::future::join_all(handles)).await;
    let all_seen_after = match joined {
        Ok(results) => {
            let mut last: Option<Instant> = None;
            let mut complete = true;
            for r in results {
                match r {
                    Ok(Some(t)) => last = Some(last.map_or(t, |l| l.max(t))),
                    _ => complete = false,
                }
            }
            if complete {
                last.map(|t| t.saturating_duration_since(start))
            } else {
                None
            }
        }
        Err(_) => {
            for a in &aborts {
                a.abort();
            }
            None
        }
    };
    Ok(CreatesResult {
        creates: expected,
        creators: s.creators,
        watchers: s.create_watchers,
        run,
        all_seen_after,
        seen: seen_counters
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect(),
        watcher_errors: errors.load(Ordering::SeqCst),
    })
}

// ---------------------------------------------------------------------------------------------
// Phases 2 and 4: bulk create, paginated list latency, memory per object

struct ListResult {
    objects: usize,
    create: CreateRun,
    rss_before: u64,
    rss_after: u64,
    pages: usize,
    pass_ms: Vec<f64>,
}

async fn phase_list(
    cluster: &DevCluster,
    client: &kube::Client,
    s: &Settings,
    count: usize,
    passes: usize,
) -> Result<ListResult> {
    let ns = format!("bench-list-{count}");
    create_namespace(client, &ns).await?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let objects_before = cluster.stats().objects();

    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_before = rss_bytes()?;
    progress(format!(
        "phase 2: creating {count} ConfigMaps in {ns} with {} creators",
        s.bulk_creators
    ));
    let create = create_many(
        &api,
        "cm-",
        count,
        s.bulk_creators,
        false,
        &format!("phase 2 ({count})"),
    )
    .await?;
    // Let connection buffers and in-flight responses drain before sampling.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_bytes()?;
    let stored = cluster.stats().objects() - objects_before;
    if stored != count {
        bail!("expected {count} new objects in the store, found {stored}");
    }
    progress(format!(
        "phase 2: {count} created in {:.1} s ({:.0}/s); listing {passes} times at limit={PAGE_LIMIT}",
        create.elapsed.as_secs_f64(),
        per_sec(count, create.elapsed)
    ));

    let mut pass_ms = Vec::with_capacity(passes);
    let mut pages = 0;
    for pass in 1..=passes {
        let t = Instant::now();
        let (items, p) = list_all(&api).await?;
        let elapsed = t.elapsed();
        if items != count {
            bail!("full list of {ns} returned {items} items, expected {count}");
        }
        pages = p;
        pass_ms.push(ms(elapsed));
        progress(format!(
            "phase 2: list {count} pass {pass}/{passes}: {:.1} ms ({p} pages)",
            ms(elapsed)
        ));
    }
    Ok(ListResult {
        objects: count,
        create,
        rss_before,
        rss_after,
        pages,
        pass_ms,
    })
}

/// JSON sizes of one benchmark object, compact encoding.
struct ObjectSizes {
    /// As the client sends it in the create request.
    sent: usize,
    /// As stored and returned by GET.
    stored: usize,
    /// The stored object's `metadata.managedFields` alone.
    managed_fields: usize,
}

async fn object_sizes(client: &kube::Client, ns: &str, name: &str) -> Result<ObjectSizes> {
    let sent = serde_json::to_string(&config_map(name, 0))?.len();
    let req = http::Request::get(format!("/api/v1/namespaces/{ns}/configmaps/{name}"))
        .body(Vec::new())
        .context("building GET request")?;
    let text = client
        .request_text(req)
        .await
        .with_context(|| format!("GET configmap {ns}/{name}"))?;
    let value: Value = serde_json::from_str(&text).context("GET response is not JSON")?;
    let managed_fields = match value.pointer("/metadata/managedFields") {
        Some(mf) => serde_json::to_string(mf)?.len(),
        None => 0,
    };
    Ok(ObjectSizes {
        sent,
        stored: serde_json::to_string(&value)?.len(),
        managed_fields,
    })
}

// ---------------------------------------------------------------------------------------------
// Phase 3: watch fan-out

#[derive(Clone, Copy, PartialEq)]
enum FanoutMode {
    Live,
    Replay,
}

impl FanoutMode {
    fn as_str(self) -> &'static str {
        match self {
            FanoutMode::Live => "live",
            FanoutMode::Replay => "replay",
        }
    }
}

struct FanoutResult {
    mode: FanoutMode,
    watchers: usize,
    events_per_watcher: usize,
    delivered: usize,
    elapsed: Duration,
    write_elapsed: Duration,
    complete: bool,
}

/// Drain one raw watch until it has `expected` ADDED events; returns (events, finished at).
async fn drain_watch(
    api: Api<ConfigMap>,
    rv: String,
    expected: usize,
    delivered: Arc<AtomicUsize>,
) -> Result<(usize, Instant)> {
    let wp = WatchParams::default().disable_bookmarks();
    let stream = api.watch(&wp, &rv).await.context("starting watch")?;
    let mut stream = std::pin::pin!(stream);
    let mut count = 0;
    while count < expected {
        match stream.next().await {
            Some(Ok(WatchEvent::Added(_))) => {
                count += 1;
                delivered.fetch_add(1, Ordering::Relaxed);
            }
            Some(Ok(WatchEvent::Error(e))) => bail!("watch error event: {e:?}"),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(anyhow!(e).context("watch stream failed")),
            None => bail!("watch ended after {count} of {expected} events"),
        }
    }
    Ok((count, Instant::now()))
}

async fn phase_fanout(
    cluster: &DevCluster,
    client: &kube::Client,
    s: &Settings,
    watchers: usize,
    mode: FanoutMode,
) -> Result<FanoutResult> {
    let m = s.fanout_events;
    let ns = format!("bench-fanout-{watchers}-{}", mode.as_str());
    create_namespace(client, &ns).await?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let rv = list_rv(&api).await?;
    let delivered = Arc::new(AtomicUsize::new(0));
    let label = format!("phase 3 ({watchers} watchers, {})", mode.as_str());

    let spawn_watchers = || -> Vec<tokio::task::JoinHandle<Result<(usize, Instant)>>> {
        (0..watchers)
            .map(|_| tokio::spawn(drain_watch(api.clone(), rv.clone(), m, delivered.clone())))
            .collect()
    };

    let (start, handles, write_elapsed) = match mode {
        FanoutMode::Live => {
            let watches_before = cluster.stats().watches_open();
            let handles = spawn_watchers();
            let wait_start = Instant::now();
            while cluster.stats().watches_open() < watches_before + watchers {
                if wait_start.elapsed() > Duration::from_secs(30) {
                    bail!("{label}: watches did not open within 30s");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            progress(format!("{label}: watches open; writing {m} events"));
            let start = Instant::now();
            let run = create_many(&api, "ev-", m, s.creators, false, &label).await?;
            (start, handles, run.elapsed)
        }
        FanoutMode::Replay => {
            progress(format!("{label}: writing {m} events before watching"));
            let run = create_many(&api, "ev-", m, s.creators, false, &label).await?;
            progress(format!("{label}: starting {watchers} watches from rv {rv}"));
            let start = Instant::now();
            (start, spawn_watchers(), run.elapsed)
        }
    };

    let aborts: Vec<_> = handles.iter().map(|h| h.abort_handle()).collect();
    let joined = tokio::time::timeout(CATCH_UP_TIMEOUT, futures::future::join_all(handles)).await;
    let mut complete = true;
    let mut last = start;
    match joined {
        Ok(results) => {
            for r in results {
                match r {
                    Ok(Ok((_, t))) => last = last.max(t),
                    Ok(Err(e)) => {
                        progress(format!("{label}: watcher failed: {e:#}"));
                        complete = false;
                    }
                    Err(e) => {
                        progress(format!("{label}: watcher task failed: {e}"));
                        complete = false;
                    }
                }
            }
        }
        Err(_) => {
            for a in &aborts {
                a.abort();
            }
            progress(format!(
                "{label}: watchers did not finish within {CATCH_UP_TIMEOUT:?}"
            ));
            complete = false;
            last = Instant::now();
        }
    }
    let result = FanoutResult {
        mode,
        watchers,
        events_per_watcher: m,
        delivered: delivered.load(Ordering::Relaxed),
        elapsed: last.saturating_duration_since(start),
        write_elapsed,
        complete,
    };
    progress(format!(
        "{label}: {} events in {:.0} ms ({:.0} events/s)",
        result.delivered,
        ms(result.elapsed),
        per_sec(result.delivered, result.elapsed)
    ));
    Ok(result)
}

// ---------------------------------------------------------------------------------------------
// Driver and report

async fn run(s: Settings) -> Result<()> {
    let total_start = Instant::now();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    progress(format!(
        "scale {} ({profile} build, {cores} cores); starting devcluster",
        s.scale
    ));
    let opts = Options {
        // Replay fan-out reads the events back from the watch history.
        history_limit: Options::default().history_limit.max(s.fanout_events * 2),
        ..Options::default()
    };
    let history_limit = opts.history_limit;
    let cluster = DevCluster::start(opts)
        .await
        .context("starting devcluster")?;
    let client = cluster.client().await.context("building kube client")?;
    let rss_start = rss_bytes()?;

    // 1. Creates with watchers.
    let creates = phase_creates(&cluster, &client, &s).await?;

    // 2 + 4. Bulk creates, lists and memory.
    let mut lists = Vec::new();
    for &(count, passes) in &s.list_sets {
        lists.push(phase_list(&cluster, &client, &s, count, passes).await?);
    }
    let largest = lists
        .iter()
        .max_by_key(|l| l.objects)
        .context("no list sets configured")?;
    let sizes = object_sizes(
        &client,
        &format!("bench-list-{}", largest.objects),
        "cm-000000",
    )
    .await?;

    // 3. Fan-out (after the bulk phases, so RSS samples are not disturbed by it).
    let mut fanouts = Vec::new();
    for &watchers in &s.fanout_watchers {
        for mode in [FanoutMode::Live, FanoutMode::Replay] {
            fanouts.push(phase_fanout(&cluster, &client, &s, watchers, mode).await?);
        }
    }

    let objects_total = cluster.stats().objects();
    let rss_end = rss_bytes()?;
    let create_requests = cluster.stats().request_count("create", "configmaps");
    drop(client);
    cluster.shutdown().await;
    let total = total_start.elapsed();

    // ---- table ----
    println!();
    println!(
        "devcluster benchmark ({profile} build, {cores} cores, scale {})",
        s.scale
    );
    println!("{}", "=".repeat(92));

    println!();
    println!(
        "1. Creates with {} kube-runtime watchers open ({} creators, {} ConfigMaps)",
        creates.watchers, creates.creators, creates.creates
    );
    let seen_min = creates.seen.iter().copied().min().unwrap_or(0);
    let seen_ok = creates
        .seen
        .iter()
        .filter(|&&n| n == creates.creates)
        .count();
    let rows: Vec<(String, String)> = vec![
        (
            "creates/s".into(),
            format!("{:.0}", per_sec(creates.creates, creates.run.elapsed)),
        ),
        (
            "total create time".into(),
            format!("{:.0} ms", ms(creates.run.elapsed)),
        ),
        (
            "create latency p50 / p99".into(),
            format!(
                "{:.2} ms / {:.2} ms",
                ms(percentile(&creates.run.latencies, 0.50)),
                ms(percentile(&creates.run.latencies, 0.99))
            ),
        ),
        (
            "all watchers caught up after".into(),
            creates
                .all_seen_after
                .map_or("NEVER (see below)".into(), |d| format!("{:.0} ms", ms(d))),
        ),
        (
            "watchers that saw every create".into(),
            format!(
                "{seen_ok}/{} (fewest seen: {seen_min}/{})",
                creates.watchers, creates.creates
            ),
        ),
        (
            "watcher stream errors".into(),
            creates.watcher_errors.to_string(),
        ),
    ];
    print_rows(&rows);
    if seen_ok != creates.watchers {
        println!(
            "   !! NOT every watcher saw every create: per-watcher counts {:?}",
            creates.seen
        );
    }

    println!();
    println!("2. Bulk create + full paginated list (limit={PAGE_LIMIT}, kube-rs Api::list)");
    println!(
        "   {:>9} | {:>12} | {:>6} | {:>6} | {:>15} | {:>13} | {:>10}",
        "objects", "bulk create/s", "pages", "passes", "median list ms", "min/max ms", "ms/page"
    );
    println!("   {}", "-".repeat(88));
    for l in &lists {
        let med = median(&l.pass_ms);
        let min = l.pass_ms.iter().copied().fold(f64::INFINITY, f64::min);
        let max = l.pass_ms.iter().copied().fold(0.0, f64::max);
        println!(
            "   {:>9} | {:>12.0} | {:>6} | {:>6} | {:>15.1} | {:>6.0}/{:<6.0} | {:>10.2}",
            l.objects,
            per_sec(l.objects, l.create.elapsed),
            l.pages,
            l.pass_ms.len(),
            med,
            min,
            max,
            med / l.pages.max(1) as f64
        );
    }
    println!(
        "   (bulk creates use {} concurrent creators; list passes are sequential)",
        s.bulk_creators
    );

    println!();
    println!("3. Watch fan-out (raw kube-rs Api::watch streams, ADDED events, bookmarks off)");
    println!(
        "   {:>6} | {:>8} | {:>10} | {:>10} | {:>10} | {:>14} | {:>8}",
        "mode", "watchers", "events/w", "delivered", "total ms", "events/s total", "complete"
    );
    println!("   {}", "-".repeat(84));
    for f in &fanouts {
        println!(
            "   {:>6} | {:>8} | {:>10} | {:>10} | {:>10.0} | {:>14.0} | {:>8}",
            f.mode.as_str(),
            f.watchers,
            f.events_per_watcher,
            f.delivered,
            ms(f.elapsed),
            per_sec(f.delivered, f.elapsed),
            if f.complete { "yes" } else { "NO" }
        );
    }
    println!(
        "   (live: clock starts when the writer starts creating; the writer itself took {} ms.\n    \
         replay: M objects exist first and watches resume from the older resourceVersion)",
        fanouts
            .iter()
            .filter(|f| f.mode == FanoutMode::Live)
            .map(|f| format!("{:.0}", ms(f.write_elapsed)))
            .collect::<Vec<_>>()
            .join("/")
    );
    println!();
    println!("4. Resident memory per stored ConfigMap (VmRSS delta around the bulk create)");
    println!(
        "   {:>9} | {:>12} | {:>12} | {:>10} | {:>12}",
        "objects", "RSS before", "RSS after", "delta", "bytes/object"
    );
    println!("   {}", "-".repeat(66));
    for l in &lists {
        let delta = l.rss_after as f64 - l.rss_before as f64;
        println!(
            "   {:>9} | {:>8.1} MiB | {:>8.1} MiB | {:>6.1} MiB | {:>12.0}",
            l.objects,
            mib(l.rss_before as f64),
            mib(l.rss_after as f64),
            mib(delta),
            delta / l.objects as f64
        );
    }
    print_rows(&[
        (
            "object JSON as sent (client)".into(),
            format!("{} bytes", sizes.sent),
        ),
        (
            "object JSON as stored (GET)".into(),
            format!(
                "{} bytes (of which metadata.managedFields: {} bytes)",
                sizes.stored, sizes.managed_fields
            ),
        ),
        (
            "process RSS start / end".into(),
            format!(
                "{:.1} MiB / {:.1} MiB ({objects_total} objects stored at end)",
                mib(rss_start as f64),
                mib(rss_end as f64)
            ),
        ),
    ]);
    println!(
        "   (upper bound: client and server share the process, so allocator residue from the\n    \
         client side and the last {history_limit} watch-history entries are included)"
    );

    println!();
    println!(
        "total runtime {:.1} s; {create_requests} ConfigMap create requests served",
        total.as_secs_f64()
    );

    // ---- JSON ----
    let report = json!({
        "profile": profile,
        "cores": cores,
        "scale": s.scale,
        "total_runtime_s": total.as_secs_f64(),
        "creates": {
            "count": creates.creates,
            "creators": creates.creators,
            "watchers": creates.watchers,
            "elapsed_ms": ms(creates.run.elapsed),
            "creates_per_sec": per_sec(creates.creates, creates.run.elapsed),
            "latency_p50_ms": ms(percentile(&creates.run.latencies, 0.50)),
            "latency_p99_ms": ms(percentile(&creates.run.latencies, 0.99)),
            "all_watchers_caught_up_ms": creates.all_seen_after.map(ms),
            "watchers_complete": seen_ok,
            "seen_per_watcher": creates.seen,
            "watcher_errors": creates.watcher_errors,
        },
        "list": lists.iter().map(|l| json!({
            "objects": l.objects,
            "page_limit": PAGE_LIMIT,
            "pages": l.pages,
            "pass_ms": l.pass_ms,
            "median_ms": median(&l.pass_ms),
            "bulk_creators": s.bulk_creators,
            "bulk_create_ms": ms(l.create.elapsed),
            "bulk_creates_per_sec": per_sec(l.objects, l.create.elapsed),
        })).collect::<Vec<_>>(),
        "memory": {
            "sets": lists.iter().map(|l| json!({
                "objects": l.objects,
                "rss_before_bytes": l.rss_before,
                "rss_after_bytes": l.rss_after,
                "bytes_per_object": (l.rss_after as f64 - l.rss_before as f64) / l.objects as f64,
            })).collect::<Vec<_>>(),
            "object_json_sent_bytes": sizes.sent,
            "object_json_stored_bytes": sizes.stored,
            "object_json_managed_fields_bytes": sizes.managed_fields,
            "rss_start_bytes": rss_start,
            "rss_end_bytes": rss_end,
            "objects_at_end": objects_total,
            "history_limit": history_limit,
        },
        "fanout": fanouts.iter().map(|f| json!({
            "mode": f.mode.as_str(),
            "watchers": f.watchers,
            "events_per_watcher": f.events_per_watcher,
            "delivered": f.delivered,
            "elapsed_ms": ms(f.elapsed),
            "events_per_sec": per_sec(f.delivered, f.elapsed),
            "writer_ms": ms(f.write_elapsed),
            "complete": f.complete,
        })).collect::<Vec<_>>(),
    });
    println!("BENCH_JSON {report}");
    Ok(())
}

fn print_rows(rows: &[(String, String)]) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        println!("   {k:<width$} : {v}");
    }
}
