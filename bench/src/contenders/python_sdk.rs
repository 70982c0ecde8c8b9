//! The Python SDK (`controllers/python-sdk`) in the throughput scenario: its no-op bench
//! controller (`bench/python-sdk/controller.py`) on Widgets, live and from a backlog, beside the
//! kopf reference of the same run.
//!
//! The SDK is installed with pip from the repository's source into `<out>/python-sdk-venv` (made
//! with `CTRLHUB_BENCH_PYTHON`, else `python3`), before anything is timed, and again whenever its
//! sources or the protos change. Timing is kopf's: live from the first create once every replica
//! registered, backlog from starting the Python processes (imports included).

use super::Run;
use crate::env::{
    Cluster, Collector, Manager, Proc, Reconciled, ScriptController, out_dir, wait_sessions,
};
use crate::report::Row;
use crate::scenarios::LOAD_PATIENCE;
use anyhow::{Context, Result, bail};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Replicas of the Python controller (processes of one controller, sharing its queue): one, like
/// the single kopf process it is compared with; `CTRLHUB_BENCH_PYTHON_REPLICAS` overrides it.
pub const REPLICAS: usize = 1;
/// Concurrent handlers (and credit) per replica; `CTRLHUB_BENCH_PYTHON_CONCURRENCY` overrides it.
pub const CONCURRENCY: u32 = 16;

fn replicas() -> usize {
    std::env::var("CTRLHUB_BENCH_PYTHON_REPLICAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REPLICAS)
}

fn concurrency() -> u32 {
    std::env::var("CTRLHUB_BENCH_PYTHON_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CONCURRENCY)
}

/// Concurrent creates of the load generator, as in the throughput scenario.
const CREATE_CONCURRENCY: usize = 32;

/// An installed Python SDK: the venv's interpreter and the bench controller.
#[derive(Debug, Clone)]
pub struct PythonSdk {
    /// `<venv>/bin/python`.
    pub python: PathBuf,
    /// `bench/python-sdk/controller.py` in the repository.
    pub controller: PathBuf,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fingerprint of what the installed SDK is built from: its sources and the protos.
fn fingerprint(root: &Path) -> Result<String> {
    let mut files = Vec::new();
    let mut dirs = vec![
        root.join("controllers/python-sdk"),
        root.join("proto/ctrlhub/v1"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                if !name.starts_with('.') && name != "__pycache__" && name != "tests" {
                    dirs.push(path);
                }
            } else if !name.contains("_pb2")
                && (name.ends_with(".py") || name.ends_with(".proto") || name.ends_with(".toml"))
            {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        f.hash(&mut h);
        std::fs::read(&f)?.hash(&mut h);
    }
    Ok(format!("{:016x}", h.finish()))
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Install the SDK into `<out>/python-sdk-venv` unless it is there from the same sources.
pub async fn install() -> Result<PythonSdk> {
    tokio::task::spawn_blocking(|| {
        let root = repo();
        let venv = out_dir().join("python-sdk-venv");
        let python = venv.join("bin").join("python");
        let stamp = venv.join(".ctrlhub-fingerprint");
        let want = fingerprint(&root)?;
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(want.as_str()) {
            let base = std::env::var_os("CTRLHUB_BENCH_PYTHON").unwrap_or_else(|| "python3".into());
            let started = Instant::now();
            if !python.exists() {
                eprintln!("python-sdk: creating the venv {}", venv.display());
                run_checked(
                    Command::new(&base).args(["-m", "venv"]).arg(&venv),
                    "python3 -m venv",
                )?;
            }
            eprintln!("python-sdk: installing controllers/python-sdk with pip");
            run_checked(
                Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "--no-input",
                    ])
                    .arg(root.join("controllers/python-sdk")),
                "pip install controllers/python-sdk",
            )?;
            std::fs::write(&stamp, &want)?;
            eprintln!(
                "python-sdk: installed in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        Ok(PythonSdk {
            python,
            controller: root.join("bench/python-sdk/controller.py"),
        })
    })
    .await
    .context("the python-sdk installer panicked")?
}

/// Start `replicas` processes of the bench controller `name` on Widgets in `ns`.
pub fn controllers(
    sdk: &PythonSdk,
    m: &Manager,
    name: &str,
    ns: &str,
    replicas: usize,
    sink: &UnboundedSender<Reconciled>,
) -> Result<Vec<Proc>> {
    let script = ScriptController {
        interpreter: &sdk.python,
        script: &sdk.controller,
        tag: "python-sdk",
        concurrency: concurrency(),
        env: &[],
    };
    script.start(m, name, ns, replicas, sink)
}

async fn stop(procs: Vec<Proc>) {
    for mut p in procs {
        p.stop().await;
    }
}

/// The Python SDK's live and backlog runs.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Live.
    pub live: Run,
    /// Backlog.
    pub backlog: Run,
}

/// Measure the Python SDK with `n` objects per run on `c`, with a manager of its own.
pub async fn measure(c: &Cluster, sdk: &PythonSdk, n: usize) -> Result<Figures> {
    let m = Manager::start(c, "throughput-python", &[]).await?;
    m.wait_leading().await?;
    let ns = "tp-python-live";
    c.namespace(ns).await?;
    let (col, tx) = Collector::new();
    let procs = controllers(sdk, &m, ns, ns, replicas(), &tx)?;
    wait_sessions(&m, ns, replicas() as u64).await?;
    let start = Instant::now();
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let last = col.wait_distinct(n, LOAD_PATIENCE).await?;
    stop(procs).await;
    let live = Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    };
    eprintln!("  python-sdk live    {:>6.0} obj/s", live.rate());

    let ns = "tp-python-backlog";
    let create = c.create_widgets(ns, n, CREATE_CONCURRENCY).await?;
    let (col, tx) = Collector::new();
    let start = Instant::now();
    let procs = controllers(sdk, &m, ns, ns, replicas(), &tx)?;
    let last = col.wait_distinct(n, LOAD_PATIENCE).await?;
    stop(procs).await;
    let backlog = Run {
        objects: n,
        elapsed: last.duration_since(start),
        create,
    };
    eprintln!("  python-sdk backlog {:>6.0} obj/s", backlog.rate());
    Ok(Figures { live, backlog })
}

/// The table rows: the Python SDK's figures, and its ratios to kopf's `on.event` of this run.
pub fn rows(f: &Figures, kopf_event: Option<(&Run, &Run)>) -> Vec<Row> {
    let cell = |r: &Run| format!("{:.0} ({:.2} s)", r.rate(), r.elapsed.as_secs_f64());
    let shape = format!("{}×{}", replicas(), concurrency());
    let mut rows = vec![
        Row::info(
            "throughput",
            &format!("live, Python SDK ({shape}): obj/s (s)"),
            cell(&f.live),
            "",
        ),
        Row::info(
            "throughput",
            &format!("backlog, Python SDK ({shape}): obj/s (s)"),
            cell(&f.backlog),
            "",
        ),
    ];
    if let Some((live, backlog)) = kopf_event {
        rows.push(Row::info(
            "throughput",
            "live ratio Python SDK / kopf.on.event",
            format!("{:.2}", f.live.rate() / live.rate()),
            "",
        ));
        rows.push(Row::new(
            "throughput",
            "backlog ratio Python SDK / kopf.on.event",
            format!("{:.2}", f.backlog.rate() / backlog.rate()),
            "",
            "≥ 3.0",
            crate::report::Verdict::of(f.backlog.rate() / backlog.rate() >= 3.0),
        ));
    }
    rows
}

/// The figures as JSON.
pub fn json(f: &Figures, kopf_event: Option<(&Run, &Run)>) -> serde_json::Value {
    let run = |r: &Run| {
        serde_json::json!({"objects": r.objects, "seconds": r.elapsed.as_secs_f64(),
            "objectsPerSecond": r.rate(), "createSeconds": r.create.as_secs_f64()})
    };
    let mut v = serde_json::json!({"replicas": replicas(), "concurrencyPerReplica": concurrency(),
        "live": run(&f.live), "backlog": run(&f.backlog)});
    if let Some((live, backlog)) = kopf_event {
        v["liveRatioKopfEvent"] = serde_json::json!(f.live.rate() / live.rate());
        v["backlogRatioKopfEvent"] = serde_json::json!(f.backlog.rate() / backlog.rate());
    }
    v
}
