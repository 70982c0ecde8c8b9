//! The kopf contender: kopf's reference operator (`bench/kopf/operator.py`) on Widgets, in a
//! virtualenv of its own with every package pinned, measured beside ctrlhub's controllers in
//! the same run.

use crate::env::*;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;
use tokio::sync::mpsc;

/// The kopf operator's requirements, every package pinned (`bench/kopf/requirements.txt`).
/// Embedded so that a harness binary installs exactly what it was built with.
pub const KOPF_REQUIREMENTS: &str = include_str!("../../kopf/requirements.txt");

/// The kopf reference operator (`bench/kopf/operator.py`), embedded for the same reason.
pub const KOPF_OPERATOR: &str = include_str!("../../kopf/operator.py");

/// Which handler the kopf operator registers (its `CTRLHUB_BENCH_KOPF_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KopfMode {
    /// `@kopf.on.event`: no writes back, the like-for-like peer of the no-op reconcilers.
    Event,
    /// `@kopf.on.create`: kopf's usual mode, one merge patch per object (its
    /// `last-handled-configuration` annotation) after the handler.
    Create,
}

impl KopfMode {
    /// The mode's name as the operator and the JSON figures spell it.
    pub fn name(self) -> &'static str {
        match self {
            KopfMode::Event => "event",
            KopfMode::Create => "create",
        }
    }

    /// The decorator, for tables.
    pub fn decorator(self) -> &'static str {
        match self {
            KopfMode::Event => "kopf.on.event",
            KopfMode::Create => "kopf.on.create",
        }
    }
}

/// An installed kopf: the venv's interpreter and the operator file.
#[derive(Debug, Clone)]
pub struct Kopf {
    /// `<venv>/bin/python`.
    pub python: PathBuf,
    /// The operator file, written next to the venv from [`KOPF_OPERATOR`].
    pub operator: PathBuf,
    /// kopf's version as installed (e.g. `1.45.2`).
    pub version: String,
}

/// The Python that creates the kopf venv: `CTRLHUB_BENCH_PYTHON`, else `python3`.
fn kopf_base_python() -> PathBuf {
    std::env::var_os("CTRLHUB_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Install kopf into `<out>/kopf-venv` unless it is already there with the same requirements,
/// printing progress to stderr; returns the interpreter and the operator file.
///
/// The first call creates the venv with `python3 -m venv` and runs `pip install -r` on the
/// pinned requirements (PyPI, about 10 s); later calls only check that kopf imports. A file
/// lock serialises concurrent harnesses (a benchmark and the smoke test share `<target>/bench`).
pub async fn kopf() -> Result<Kopf> {
    tokio::task::spawn_blocking(|| ensure_kopf(&out_dir()))
        .await
        .context("the kopf installer panicked")?
}

fn ensure_kopf(out: &Path) -> Result<Kopf> {
    let venv = out.join("kopf-venv");
    let lock = std::fs::File::create(out.join("kopf-venv.lock"))
        .context("creating the kopf venv lock file")?;
    lock.lock().context("locking the kopf venv")?;
    let python = venv.join("bin").join("python");
    let stamp = venv.join(".ctrlhub-requirements.txt");
    let current = std::fs::read_to_string(&stamp).is_ok_and(|s| s == KOPF_REQUIREMENTS);
    let version = if current {
        kopf_version(&python).ok()
    } else {
        None
    };
    let version = match version {
        Some(v) => v,
        None => {
            install_kopf(&venv, &python)?;
            std::fs::write(&stamp, KOPF_REQUIREMENTS)?;
            kopf_version(&python)?
        }
    };
    let operator = out.join("kopf-operator.py");
    std::fs::write(&operator, KOPF_OPERATOR).context("writing the kopf operator")?;
    Ok(Kopf {
        python,
        operator,
        version,
    })
}

/// The installed kopf's version; an error when kopf does not import (a missing or broken venv,
/// e.g. after the base Python was upgraded).
fn kopf_version(python: &Path) -> Result<String> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import importlib.metadata, kopf; print(importlib.metadata.version('kopf'))",
        ])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "kopf does not import in {}: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn install_kopf(venv: &Path, python: &Path) -> Result<()> {
    let base = kopf_base_python();
    let started = Instant::now();
    if venv.exists() {
        eprintln!("kopf: {} is stale or broken; recreating it", venv.display());
        std::fs::remove_dir_all(venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    eprintln!(
        "kopf: creating the venv {} with {}",
        venv.display(),
        base.display()
    );
    run_logged(
        std::process::Command::new(&base)
            .args(["-m", "venv"])
            .arg(venv),
        "venv",
    )
    .with_context(|| {
        format!(
            "`{} -m venv` failed (on Debian the venv module is the python3-venv package; \
             CTRLHUB_BENCH_PYTHON picks another interpreter)",
            base.display()
        )
    })?;
    let requirements = venv.join("requirements.txt");
    std::fs::write(&requirements, KOPF_REQUIREMENTS)?;
    eprintln!("kopf: installing bench/kopf/requirements.txt from PyPI (first run only)");
    run_logged(
        std::process::Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--progress-bar",
                "off",
                // pip retries each failing download itself; allow slow mirrors.
                "--retries",
                "10",
                "--timeout",
                "60",
                "-r",
            ])
            .arg(&requirements),
        "pip",
    )
    .context("installing kopf with pip")?;
    eprintln!(
        "kopf: installed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Start the kopf operator in `mode` on Widgets in `ns` of `cluster`, standalone (no peering),
/// logging warnings only like the Rust controllers; its report lines go to `sink`. Returns the
/// process and its log file.
pub fn kopf_operator(
    kopf: &Kopf,
    cluster: &Cluster,
    ns: &str,
    mode: KopfMode,
    sink: &mpsc::UnboundedSender<Reconciled>,
) -> Result<(Proc, PathBuf)> {
    let log = out_dir()
        .join("logs")
        .join(format!("kopf-{}-{ns}.log", mode.name()));
    let args: Vec<String> = vec![
        "-m".into(),
        "kopf".into(),
        "run".into(),
        // No peering: peering needs kopf's own CRDs and is not what is measured.
        "--standalone".into(),
        "--quiet".into(),
        "--namespace".into(),
        ns.into(),
        kopf.operator.display().to_string(),
    ];
    let proc = spawn(
        &kopf.python,
        &args,
        &[
            ("KUBECONFIG", cluster.kubeconfig.display().to_string()),
            ("CTRLHUB_BENCH_KOPF_MODE", mode.name().to_string()),
        ],
        &log,
        Some(sink.clone()),
    )?;
    Ok((proc, log))
}
