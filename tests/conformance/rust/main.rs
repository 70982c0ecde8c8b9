//! `conformance-rust`: the Rust SDK's conformance controller. It implements the interface of
//! tests/conformance/README.md with `ctrlhub-sdk` doing every protocol step (sessions,
//! deadlines, cancellation, reconnects, Drain, the token file, traces, heartbeats and the hold,
//! one attempt of a key at a time, revisions and SUPERSEDED); this file only reads the
//! environment, follows each ConfigMap's directives and writes the report lines.

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ctrlhub_sdk::{
    Action, Backoff, CancellationToken, Config, Controller, ReconcileError, Request, Scope,
    Selector, SessionInfo, resource_type,
};

/// The label selector every conformance controller registers.
const SCOPE_LABEL: &str = "conformance.ctrlhub.io/scope";

/// The environment of README section 1 that is not the SDK's own (`CTRLHUB_ADDR` and
/// `CTRLHUB_TOKEN_FILE` are read by `Config::from_env`).
struct Settings {
    controller: String,
    namespace: String,
    max_in_flight: u32,
    deadline: Duration,
    backoff: (Duration, Duration),
    owns: Owns,
}

/// `CONFORMANCE_OWNS`: which Lease children the controller owns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owns {
    Nothing,
    Leases,
    LeaseMetadata,
}

impl Owns {
    fn from_env() -> Result<Owns> {
        match std::env::var("CONFORMANCE_OWNS")
            .unwrap_or_default()
            .as_str()
        {
            "" => Ok(Owns::Nothing),
            "leases" => Ok(Owns::Leases),
            "leases-metadata" => Ok(Owns::LeaseMetadata),
            other => {
                bail!("CONFORMANCE_OWNS must be unset, leases or leases-metadata, not {other:?}")
            }
        }
    }

    fn apply<K>(self, controller: Controller<K>) -> Controller<K> {
        match self {
            Owns::Nothing => controller,
            Owns::Leases => controller.owns::<Lease>(),
            Owns::LeaseMetadata => controller.owns_metadata::<Lease>(),
        }
    }
}

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} must be set"))
}

fn millis(name: &str) -> Result<Duration> {
    let ms: u64 = var(name)?
        .parse()
        .with_context(|| format!("{name} must be milliseconds"))?;
    Ok(Duration::from_millis(ms))
}

impl Settings {
    fn from_env() -> Result<Settings> {
        Ok(Settings {
            controller: var("CONFORMANCE_CONTROLLER")?,
            namespace: var("CONFORMANCE_NAMESPACE")?,
            max_in_flight: var("CONFORMANCE_MAX_IN_FLIGHT")?
                .parse()
                .context("CONFORMANCE_MAX_IN_FLIGHT must be a number")?,
            deadline: millis("CONFORMANCE_DEADLINE_MS")?,
            backoff: (
                millis("CONFORMANCE_BACKOFF_BASE_MS")?,
                millis("CONFORMANCE_BACKOFF_MAX_MS")?,
            ),
            owns: Owns::from_env()?,
        })
    }
}

/// The report file: one JSON object per line, each written at once.
struct Report {
    replica: String,
    file: Mutex<File>,
}

impl Report {
    fn open() -> Result<Report> {
        let path = var("CONFORMANCE_REPORT")?;
        let file = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {path}"))?;
        Ok(Report {
            replica: var("CONFORMANCE_REPLICA")?,
            file: Mutex::new(file),
        })
    }

    fn write(&self, mut line: Value) {
        line["ts_us"] = json!(now_us());
        line["replica"] = json!(self.replica);
        let mut text = line.to_string();
        text.push('\n');
        if let Err(e) = self.file.lock().write_all(text.as_bytes()) {
            eprintln!("conformance-rust: cannot write the report: {e}");
            std::process::exit(2);
        }
    }
}

fn now_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// A ConfigMap's instructions (README section 3).
struct Directives {
    data: BTreeMap<String, String>,
}

impl Directives {
    fn of(cm: Option<&ConfigMap>) -> Directives {
        Directives {
            data: cm.and_then(|c| c.data.clone()).unwrap_or_default(),
        }
    }

    /// Entry `min(attempt, len)` of a comma-separated list.
    fn entry(&self, key: &str, attempt: u32) -> Option<&str> {
        let list: Vec<&str> = self.data.get(key)?.split(',').map(str::trim).collect();
        let i = usize::try_from(attempt.max(1))
            .unwrap_or(usize::MAX)
            .min(list.len());
        Some(list[i - 1])
    }

    /// `sleep_ms` or `block_ms` for this attempt.
    fn millis(&self, key: &str, attempt: u32) -> Duration {
        let ms = self.entry(key, attempt).and_then(|v| v.parse().ok());
        Duration::from_millis(ms.unwrap_or(0))
    }

    /// The result to answer, and its report name.
    fn outcome(&self, attempt: u32) -> (Result<Action, ReconcileError>, &'static str) {
        let entry = self.entry("outcome", attempt).unwrap_or("done");
        match entry.split_once(':') {
            _ if entry == "error" => (Err(ReconcileError::retry("error directive")), "error"),
            _ if entry == "terminal" => (
                Err(ReconcileError::terminal("terminal directive")),
                "terminal",
            ),
            Some(("requeue", ms)) => {
                let delay = Duration::from_millis(ms.parse().unwrap_or(0));
                (Ok(Action::requeue_after(delay)), "requeue")
            }
            _ => (Ok(Action::done()), "done"),
        }
    }
}

/// Writes the `end` line when the reconcile ends, or `cancelled` when the SDK drops it
/// (deadline, session end, shutdown): the moment this handler stops acting.
struct EndLine {
    report: Arc<Report>,
    line: Value,
}

impl Drop for EndLine {
    fn drop(&mut self) {
        self.report.write(self.line.take());
    }
}

fn start_line<K>(req: &Request<K>, cm: Option<&ConfigMap>) -> Value {
    let reasons: Vec<String> = req
        .reasons
        .iter()
        .map(|r| r.as_str_name().trim_start_matches("REASON_").to_string())
        .collect();
    let object = match (&req.object, &req.deleted) {
        (Some(_), _) => "object",
        (None, Some(_)) => "tombstone",
        (None, None) => "none",
    };
    let rv = cm.and_then(|c| c.metadata.resource_version.clone());
    let deadline_us = req.manager_deadline.map_or(0, |d| {
        u64::try_from(d.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros()).unwrap_or(0)
    });
    // The SDK runs the handler inside its `reconcile` span, the current context here.
    let (span_traceparent, _) = ctrlhub_sdk::traces::inject(&opentelemetry::Context::current());
    json!({"event": "start", "session": req.reader().session_id(), "key": req.key.to_string(),
        "id": req.id, "attempt": req.attempt, "reasons": reasons, "object": object,
        "rv": rv.unwrap_or_default(), "deadline_us": deadline_us, "traceparent": req.traceparent,
        "span_traceparent": span_traceparent})
}

/// The `registered` line of a session.
fn registered_line(info: &SessionInfo) -> Value {
    let readable: serde_json::Map<String, Value> = info
        .readable
        .iter()
        .map(|r| {
            let form = if r.metadata_only { "metadata" } else { "full" };
            (r.resource.kind.clone(), json!(form))
        })
        .collect();
    json!({"event": "registered", "session": info.session_id, "revision": info.revision,
        "readable": readable})
}

async fn reconcile(req: Request<ConfigMap>, report: Arc<Report>) -> Result<Action, ReconcileError> {
    let cm = req.object.as_ref().or(req.deleted.as_ref());
    let directives = Directives::of(cm);
    report.write(start_line(&req, cm));
    let mut end = EndLine {
        report: report.clone(),
        line: json!({"event": "end", "session": req.reader().session_id(),
            "key": req.key.to_string(), "id": req.id, "attempt": req.attempt,
            "outcome": "cancelled"}),
    };
    // Cancellable: the SDK drops this future when it cancels the handler.
    tokio::time::sleep(directives.millis("sleep_ms", req.attempt)).await;
    // Not cancellable: a blocking sleep on a worker thread, which the SDK waits for.
    let block = directives.millis("block_ms", req.attempt);
    if !block.is_zero() {
        ctrlhub_sdk::blocking(move || std::thread::sleep(block)).await?;
        if req.cancelled().is_cancelled() {
            drop(end); // outcome "cancelled"
            return Err(ReconcileError::retry("cancelled while blocked"));
        }
    }
    if let Some(name) = directives.data.get("read") {
        end.line["reads"] = reads(&req, name).await;
    }
    if let Some(name) = directives.data.get("read_child") {
        end.line["child"] = read_child(&req, name).await;
    }
    let (result, outcome) = directives.outcome(req.attempt);
    end.line["outcome"] = json!(outcome);
    drop(end);
    result
}

/// Get the owned Lease `name` of the request's namespace through the manager's cache.
async fn read_child(req: &Request<ConfigMap>, name: &str) -> Value {
    let ns = req.namespace().unwrap_or_default();
    match req
        .reader()
        .get_raw(resource_type::<Lease>(), ns, name)
        .await
    {
        Ok(Some(raw)) => {
            let object: Value = serde_json::from_slice(&raw.json).unwrap_or_default();
            let holder = object["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default();
            json!({"name": name, "found": true, "metadata_only": raw.metadata_only,
                "holder": holder})
        }
        Ok(None) => json!({"name": name, "found": false, "metadata_only": false, "holder": ""}),
        Err(e) => json!({"error": format!("Get Lease {ns}/{name}: {e}")}),
    }
}

/// Get `name` and List the namespace through the manager's cache.
async fn reads(req: &Request<ConfigMap>, name: &str) -> Value {
    let ns = req.namespace().unwrap_or_default();
    let got = match req.reader().get::<ConfigMap>(ns, name).await {
        Ok(Some(cm)) => json!({"name": name, "found": true, "data": cm.data.unwrap_or_default()}),
        Ok(None) => json!({"name": name, "found": false}),
        Err(e) => return json!({"error": format!("Get {ns}/{name}: {e}")}),
    };
    match req.reader().list::<ConfigMap>(Some(ns), None).await {
        Ok(items) => {
            let mut names: Vec<String> =
                items.into_iter().filter_map(|c| c.metadata.name).collect();
            names.sort();
            json!({"get": got, "list": names})
        }
        Err(e) => json!({"error": format!("List {ns}: {e}")}),
    }
}

/// Cancels `shutdown` on SIGTERM or SIGINT: the SDK then drains.
fn on_signals(shutdown: CancellationToken) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        shutdown.cancel();
    });
    Ok(())
}

async fn run(settings: Settings, report: Arc<Report>) -> Result<()> {
    let mut config = Config::from_env()?;
    // README 5.5: a first delay of 50-500 ms, at most 5 s (the SDK's default grows to 10 s).
    config.reconnect = Backoff::new(
        Duration::from_millis(100),
        Duration::from_secs(2),
        Duration::from_secs(30),
    );
    let shutdown = CancellationToken::new();
    on_signals(shutdown.clone())?;
    let registered = report.clone();
    let controller = Controller::new(settings.controller)
        .reconciles::<ConfigMap>()
        .on_registered(move |info| registered.write(registered_line(info)));
    // Register.revision comes from CTRLHUB_REVISION, which the SDK reads itself.
    let result = settings
        .owns
        .apply(controller)
        .namespaces(Scope::Names(vec![settings.namespace]))
        .label_selector(Selector::labels([(SCOPE_LABEL, "in")]))
        .include_object(true)
        .resync_period(Duration::ZERO)
        .deadline(settings.deadline)
        .backoff(settings.backoff.0, settings.backoff.1)
        .max_concurrent_reconciles(settings.max_in_flight)
        .run(config, reconcile, report, shutdown)
        .await;
    if let Err(e) = result {
        bail!("the controller gave up: {e}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    ctrlhub_tests::process::log_to_stderr();
    let settings = Settings::from_env()?;
    let report = Arc::new(Report::open()?);
    let traces = ctrlhub_sdk::traces::init("conformance-rust").unwrap_or_else(|e| {
        eprintln!("conformance-rust: traces off: {e}");
        ctrlhub_sdk::traces::Traces::disabled()
    });
    let result = run(settings, report.clone()).await;
    traces.shutdown().await;
    report.write(json!({"event": "exit", "ok": result.is_ok()}));
    result
}
