//! The TypeScript SDK in the throughput scenario: `bench/typescript/controller.mjs`, a no-op
//! reconciler on `@ctrlhub/sdk` (`controllers/typescript-sdk`), run as Node.js processes beside
//! the Rust SDK's `bench-sdk-controller`, reporting the same `R <key> <latency-µs>` lines.
//!
//! [`typescript`] installs and builds it with npm before anything is timed (the SDK's `npm ci`
//! the first time, then `npm run build`, which regenerates its wire types from `proto/`);
//! [`controllers`] starts the replicas.

use crate::env::{Manager, Proc, Reconciled, ScriptController, run_logged};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tokio::sync::mpsc;

/// A built TypeScript bench controller.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeScript {
    /// The `node` executable.
    pub node: PathBuf,
    /// `bench/typescript/controller.mjs`.
    pub script: PathBuf,
    /// `node --version`, e.g. `v20.20.2`.
    pub version: String,
}

/// The repository root: `CTRLHUB_BENCH_REPO`, else where this crate was built from.
fn repo() -> PathBuf {
    std::env::var_os("CTRLHUB_BENCH_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// `npm` in `dir`, its output forwarded as progress.
fn npm(dir: &Path, args: &[&str]) -> Result<()> {
    run_logged(
        std::process::Command::new("npm")
            .args(args)
            .current_dir(dir),
        "npm",
    )
    .with_context(|| format!("`npm {}` in {}", args.join(" "), dir.display()))
}

/// Install (first use) and build the SDK and the bench controller; blocking.
fn ensure(repo: &Path) -> Result<TypeScript> {
    let started = Instant::now();
    let sdk = repo.join("controllers/typescript-sdk");
    let bench = repo.join("bench/typescript");
    for dir in [&sdk, &bench] {
        if !dir.join("node_modules").exists() {
            eprintln!("typescript: npm ci in {} (first run only)", dir.display());
            npm(dir, &["ci", "--no-audit", "--no-fund", "--loglevel=error"])?;
        }
    }
    npm(&sdk, &["run", "--silent", "build"])?;
    let node = PathBuf::from("node");
    let out = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .context("running `node --version` (Node.js 20 or later is needed)")?;
    if !out.status.success() {
        bail!("`node --version` failed");
    }
    eprintln!(
        "typescript: built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(TypeScript {
        node,
        script: bench.join("controller.mjs"),
        version: String::from_utf8_lossy(&out.stdout).trim().to_string(),
    })
}

/// Install and build the TypeScript bench controller (see the module docs).
pub async fn typescript() -> Result<TypeScript> {
    tokio::task::spawn_blocking(|| ensure(&repo()))
        .await
        .context("the TypeScript build panicked")?
}

/// Start `replicas` TypeScript controllers `name` on Widgets in `ns`, `concurrency` each,
/// reporting to `sink`.
pub fn controllers(
    ts: &TypeScript,
    m: &Manager,
    name: &str,
    ns: &str,
    replicas: usize,
    concurrency: u32,
    sink: &mpsc::UnboundedSender<Reconciled>,
) -> Result<Vec<Proc>> {
    let script = ScriptController {
        interpreter: &ts.node,
        script: &ts.script,
        tag: "ts",
        concurrency,
        env: &[("CTRLHUB_LOG", "warn".to_string())],
    };
    script.start(m, name, ns, replicas, sink)
}
