//! Child processes the suites and the harness start: where their binaries are, free ports for
//! them, and a handle that signals, stops and reaps them.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use tokio::process::{Child, ChildStdout, Command};

use crate::wait::PATIENCE;

/// The workspace's target directory (`CARGO_TARGET_DIR` moves it).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// A binary of this workspace in `target/debug`, where `tests/run.sh` builds them first
/// (`CTRLHUB_BIN` points the suites at another build of the manager). Panics with a hint when
/// it is missing.
pub fn bin(name: &str) -> PathBuf {
    bin_in(&target_dir().join("debug"), name).unwrap_or_else(|e| {
        panic!("{e:#}: run `cargo build --workspace --bins` first (tests/run.sh does)")
    })
}

/// Binary `name` in `dir`, checked to exist; `CTRLHUB_BIN` overrides the manager's path (to
/// measure or test another build of it with the same harness).
pub fn bin_in(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = match std::env::var_os("CTRLHUB_BIN") {
        Some(p) if name == "ctrlhub" => PathBuf::from(p),
        _ => dir.join(name),
    };
    anyhow::ensure!(path.exists(), "{} is missing", path.display());
    Ok(path)
}

/// Resident memory of process `pid` in bytes (`VmRSS` of `/proc/PID/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Where [`try_free_port`] looks: below Linux's ephemeral range (32768-60999 by default).
const LISTEN_PORTS: std::ops::Range<u16> = 20_000..32_768;

/// A free loopback port for a process the test starts next (bound and released).
///
/// It is taken below the kernel's ephemeral range, where no outgoing connection and no
/// `bind(0)` of another process (a devcluster the harness started a moment before, the suites
/// running beside this one) can take it between this check and the process's own bind; a
/// port is picked at random so concurrent suites rarely try the same one.
pub fn try_free_port() -> std::io::Result<u16> {
    use rand::Rng;
    let mut rng = rand::rng();
    for _ in 0..64 {
        let port = rng.random_range(LISTEN_PORTS);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    // A crowded range: any free port, as before.
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// [`try_free_port`] for tests.
pub fn free_port() -> u16 {
    try_free_port().expect("a free port")
}

/// A running child process, killed when dropped.
pub struct ChildProcess {
    child: Option<Child>,
    pid: u32,
}

impl ChildProcess {
    /// Spawns `cmd` with stdin closed and stderr appended to a new file `log`; the caller
    /// decides what happens to stdout.
    pub fn spawn(cmd: &mut Command, log: &Path) -> Result<ChildProcess> {
        let stderr = std::fs::File::create(log)
            .with_context(|| format!("creating the log file {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {:?}", cmd.as_std().get_program()))?;
        let pid = child.id().context("the child has a pid")?;
        Ok(ChildProcess {
            child: Some(child),
            pid,
        })
    }

    /// The process id (of the process as started, even after it exited).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The child's stdout, if it was piped and not taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    /// The exit status if the process has exited (a stopped or killed handle counts as exited).
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => child.try_wait(),
            None => Ok(Some(ExitStatus::default())),
        }
    }

    /// Sends `signal` (a `kill -SIGNAL` name such as "STOP" or "CONT") while the process runs.
    pub fn signal(&self, signal: &str) {
        if self.child.is_some() {
            let _ = std::process::Command::new("kill")
                .args([format!("-{signal}"), self.pid.to_string()])
                .status();
        }
    }

    /// SIGTERM and wait for the exit (graceful: a manager releases its lease); SIGKILL if it
    /// has not exited after [`PATIENCE`].
    pub async fn stop(&mut self) {
        self.signal("TERM");
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(PATIENCE, child.wait()).await.is_err()
        {
            let _ = child.kill().await;
        }
    }

    /// SIGKILL and reap (a crash: a manager's lease must expire).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// Logs of a controller binary the suites run as a child process (the SDK's sessions and
/// reconnects): to stderr, which the suites keep per process, at `RUST_LOG` or `info`.
pub fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
}
