//! Real parts for the SDK's end-to-end tests: a devcluster process, `ctrlhub run` managers on
//! loopback gRPC (static token `dev`), a TCP proxy that can cut or freeze connections, and
//! waiting on conditions. Nothing here fakes the manager. The binaries come from
//! `target/debug`: build them first with `cargo build --bin ctrlhub --bin devcluster` (or
//! `cargo build --workspace --bins`).
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ctrlhub_sdk::Config;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long any condition may take before a test fails: generous, for a loaded machine.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// The static token of every manager started here.
pub(crate) const TOKEN: &str = "dev";

/// The workspace's target directory (`CARGO_TARGET_DIR` moves it).
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// A binary of this workspace in `target/debug`.
pub(crate) fn bin(name: &str) -> PathBuf {
    let path = target_dir().join("debug").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bin ctrlhub --bin devcluster` (or `cargo build \
         --workspace --bins`) first",
        path.display()
    );
    path
}

/// A free loopback port for a process started next (bound and released), below Linux's
/// ephemeral range (32768-60999): no outgoing connection or `bind(0)` of another process can
/// take it before that process binds. Picked at random (a `RandomState` hash) so suites running
/// side by side rarely try the same one.
pub(crate) fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        let port = 20_000 + (h.finish() % 12_768) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free loopback port")
        .local_addr()
        .expect("a bound address")
        .port()
}

/// Polls `probe` every 20 ms until it returns `Some`, for at most `within`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let until = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A child process, killed (SIGKILL) when dropped.
pub(crate) struct Process {
    pub child: Child,
    pub log: PathBuf,
}

impl Process {
    /// Sends `signal` (`TERM`, `KILL`, `STOP`, `CONT`).
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits (without blocking the runtime) until the process exits.
    pub(crate) async fn exited(&mut self, within: Duration) -> ExitStatus {
        eventually("the process to exit", within, || {
            let status = self.child.try_wait().unwrap();
            async move { status }
        })
        .await
    }

    /// The last `n` lines of its log.
    pub(crate) fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory of one test (logs, kubeconfig).
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = target_dir()
        .join("sdk-tests")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A devcluster process and a client for it.
pub(crate) struct Cluster {
    pub process: Process,
    pub kubeconfig: PathBuf,
    pub client: kube::Client,
    pub dir: PathBuf,
}

impl Cluster {
    /// Starts devcluster on a free port; its kubeconfig and logs go to a scratch directory.
    pub(crate) async fn start(name: &str) -> Cluster {
        let dir = scratch(name);
        let kubeconfig = dir.join("kubeconfig");
        let log = dir.join("devcluster.log");
        let mut child = Command::new(bin("devcluster"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let first = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        let process = Process { child, log };
        let line = tokio::time::timeout(PATIENCE, first)
            .await
            .expect("devcluster did not start in time")
            .unwrap()
            .unwrap();
        assert!(
            line.starts_with("devcluster ready at "),
            "devcluster said {line:?}"
        );
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        Cluster {
            process,
            kubeconfig,
            client: kube::Client::try_from(config).unwrap(),
            dir,
        }
    }

    /// Creates namespace `name`.
    pub(crate) async fn namespace(&self, name: &str) {
        use k8s_openapi::api::core::v1::Namespace;
        let api: kube::Api<Namespace> = kube::Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}
        }))
        .unwrap();
        api.create(&Default::default(), &ns).await.unwrap();
    }
}

/// How a manager runs.
#[derive(Clone, Debug)]
pub(crate) struct ManagerOptions {
    /// `--identity`.
    pub identity: String,
    /// The gRPC port (a free one unless set).
    pub grpc_port: Option<u16>,
    /// `--lease-duration`, `--renew-deadline` (their difference is the hold unless
    /// `hold` is set). Default 10 s and 5 s: a hold of 5 s, roomy on a loaded machine.
    pub lease: (&'static str, &'static str),
    /// `--hold-period`.
    pub hold: Option<&'static str>,
    /// `--lease-name` (managers of different names do not compete for leadership).
    pub lease_name: Option<&'static str>,
    /// `--controller-grace`: how long a controller without sessions is kept (0: removed at
    /// once, so that its next registration starts from the caches).
    pub controller_grace: Option<&'static str>,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            identity: "sdk-test".into(),
            grpc_port: None,
            lease: ("10s", "5s"),
            hold: None,
            lease_name: None,
            controller_grace: None,
        }
    }
}

/// A `ctrlhub run` process.
pub(crate) struct Manager {
    pub process: Process,
    pub grpc_port: u16,
    pub http_port: u16,
}

impl Manager {
    /// Starts a manager against `cluster` and waits until it leads.
    pub(crate) async fn start(cluster: &Cluster, opts: ManagerOptions) -> Manager {
        let m = Self::spawn(cluster, opts);
        m.leading().await;
        m
    }

    /// Starts a manager without waiting for it to lead.
    pub(crate) fn spawn(cluster: &Cluster, opts: ManagerOptions) -> Manager {
        let grpc_port = opts.grpc_port.unwrap_or_else(free_port);
        let http_port = free_port();
        let log = cluster.dir.join(format!(
            "ctrlhub-{}-{grpc_port}-{http_port}.log",
            opts.identity
        ));
        let mut cmd = Command::new(bin("ctrlhub"));
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc_port}")])
            .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
            .args(["--token", TOKEN, "--identity", &opts.identity])
            .args([
                "--lease-duration",
                opts.lease.0,
                "--renew-deadline",
                opts.lease.1,
            ])
            .args(["--retry-period", "250ms"])
            .args(opts.hold.iter().flat_map(|h| ["--hold-period", h]))
            .args(opts.lease_name.iter().flat_map(|n| ["--lease-name", n]))
            .args(
                opts.controller_grace
                    .iter()
                    .flat_map(|g| ["--controller-grace", g]),
            )
            .env_remove("CTRLHUB_WATCH_NAMESPACE")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env("RUST_LOG", "info,ctrlhub=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().unwrap();
        Manager {
            process: Process { child, log },
            grpc_port,
            http_port,
        }
    }

    /// The gRPC endpoint.
    pub(crate) fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// SDK settings for this manager, with a quick reconnect.
    pub(crate) fn config(&self) -> Config {
        config_for(self.addr())
    }

    /// `/status`, or `None` while it does not answer.
    pub(crate) async fn status(&self) -> Option<Value> {
        http_get_json(self.http_port, "/status").await
    }

    /// The `/status` entry of controller `name`.
    pub(crate) async fn controller(&self, name: &str) -> Option<Value> {
        let status = self.status().await?;
        status["controllers"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
    }

    /// How many sessions the manager holds for controller `name`.
    pub(crate) async fn sessions(&self, name: &str) -> usize {
        let Some(c) = self.controller(name).await else {
            return 0;
        };
        c["sessionList"].as_array().map_or(0, Vec::len)
    }

    /// Waits until this manager leads.
    pub(crate) async fn leading(&self) {
        eventually("the manager to lead", PATIENCE, || async {
            let status = self.status().await?;
            (status["leading"] == true).then_some(())
        })
        .await;
    }
}

/// SDK settings for `addr`: static token, reconnect from 50 ms to 1 s.
pub(crate) fn config_for(addr: String) -> Config {
    let mut config = Config::new(addr, TOKEN);
    config.reconnect = ctrlhub_sdk::Backoff::new(
        Duration::from_millis(50),
        Duration::from_secs(1),
        Duration::from_secs(30),
    );
    config
}

/// A GET on the loopback HTTP port, parsed as JSON (HTTP/1.0: the body ends with the
/// connection).
async fn http_get_json(port: u16, path: &str) -> Option<Value> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8(response).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

/// A TCP proxy in front of a manager: every new connection is forwarded; [`Proxy::freeze`]
/// stops forwarding bytes on the connections open at that moment (none is closed), as a
/// network partition would; connections opened later flow normally.
pub(crate) struct Proxy {
    pub port: u16,
    accepted: Arc<AtomicU64>,
    frozen_up_to: watch::Sender<u64>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts forwarding 127.0.0.1:`port` to 127.0.0.1:`upstream`.
    pub(crate) async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (frozen_up_to, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (freezes, count, stopped) = (frozen_up_to.clone(), accepted.clone(), stop.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let number = count.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(pipe(client, upstream, freezes.subscribe(), number));
            }
        });
        Proxy {
            port,
            accepted,
            frozen_up_to,
            stop,
        }
    }

    /// The proxied gRPC endpoint.
    pub(crate) fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Freezes every connection open now.
    pub(crate) fn freeze(&self) {
        let mark = self.accepted.load(Ordering::SeqCst);
        self.frozen_up_to.send_replace(mark);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Forwards connection `number` both ways until either side closes, or stops forwarding for
/// good (holding both sockets open) once a freeze covers it.
async fn pipe(
    client: TcpStream,
    upstream: u16,
    mut frozen_up_to: watch::Receiver<u64>,
    number: u64,
) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let frozen = tokio::select! {
        _ = tokio::io::copy(&mut cr, &mut sw) => false,
        _ = tokio::io::copy(&mut sr, &mut cw) => false,
        covered = frozen_up_to.wait_for(|mark| *mark >= number) => covered.is_ok(),
    };
    if frozen {
        std::future::pending::<()>().await;
    }
}

/// A path relative to the repository root.
pub(crate) fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// A GET on a loopback port: the status code and the body (`None` while nothing answers).
pub(crate) async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8(response).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The SDK's log lines in this test process, as JSON objects: [`captured_logs`] installs a
/// global JSON subscriber (the SDK's shape) once per test binary, at DEBUG for the SDK.
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Every line logged so far.
    pub(crate) fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The lines about controller `name` (its `controller` field, or that of its span).
    pub(crate) fn of(&self, name: &str) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["fields"]["controller"] == name || l["span"]["controller"] == name)
            .collect()
    }
}

/// The process's captured logs (see [`Logs`]).
pub(crate) fn captured_logs() -> Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new("info,ctrlhub_sdk=debug"))
            .with_writer(move || writer.clone())
            .init();
        logs
    })
    .clone()
}

/// A TCP proxy playing the Service in front of the leader: new connections go to the current
/// upstream; [`SwitchProxy::switch`] points it at another manager and cuts every open
/// connection, as a leader change does.
pub(crate) struct SwitchProxy {
    pub port: u16,
    upstream: Arc<std::sync::atomic::AtomicU16>,
    cuts: watch::Sender<u64>,
}

impl SwitchProxy {
    /// Starts forwarding 127.0.0.1:`port` to 127.0.0.1:`upstream`.
    pub(crate) async fn start(upstream: u16) -> SwitchProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(std::sync::atomic::AtomicU16::new(upstream));
        let (cuts, _) = watch::channel(0u64);
        let (to, cut) = (target.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = to.load(Ordering::SeqCst);
                let mut cut = cut.subscribe();
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut cr, &mut sw) => {}
                        _ = tokio::io::copy(&mut sr, &mut cw) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        SwitchProxy {
            port,
            upstream: target,
            cuts,
        }
    }

    /// The proxied gRPC endpoint.
    pub(crate) fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// New connections go to `upstream`; the open ones are closed.
    pub(crate) fn switch(&self, upstream: u16) {
        self.upstream.store(upstream, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }
}
