//! Attacks that need no credentials (or only junk ones) on a manager in the hostile bed
//! ([`crate::hostile::Bed`]), shared by `tests/tests/adversity/strangers.rs` and `ctrlhub-bench hostile`:
//! silent TCP and TLS connections, connection floods, junk-token waves, Connect streams that
//! never Register and Registers naming kinds that do not exist. Everything here observes the
//! manager from the outside: sockets closing, its open descriptors and CPU time in `/proc`, and
//! devcluster's request counters.

use anyhow::{Context, Result};
use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tonic::transport::Channel;

use crate::hostile::{Bed, team_a_registration};

/// The loopback address attackers connect from, so that per-peer caps on them leave the
/// tenants (on 127.0.0.1) alone, as a real attacker's address would.
pub const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
/// A second attacker address (the HTTPS port's tests).
pub const ATTACKER_2: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3));

/// Open descriptors of process `pid` (entries of `/proc/PID/fd`).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// CPU time (user + system) process `pid` has used, from `/proc/PID/stat` (clock ticks of
/// 10 ms, as Linux reports them to user space).
pub fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the state field.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The manager's gRPC or HTTP address from its URL (`http://127.0.0.1:PORT`).
pub fn socket_addr(url: &str) -> Result<SocketAddr> {
    let hostport = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .trim_end_matches('/');
    hostport
        .parse()
        .with_context(|| format!("address of {url}"))
}

/// Connections an attacker holds open without saying anything.
pub struct Silent {
    /// The connections that were established.
    pub streams: Vec<TcpStream>,
    /// Connection attempts that failed (refused, timed out).
    pub failed: usize,
}

impl Silent {
    /// How many of the connections the manager has not closed.
    pub fn still_open(&self) -> usize {
        self.streams.iter().filter(|s| !closed(s)).count()
    }
}

/// Whether the other side closed `stream` (EOF or reset); data it sent is read and dropped.
pub fn closed(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match stream.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Opens `count` TCP connections from `from` to `to`, 64 at a time, each within 2 s, and
/// says nothing on them.
pub async fn silent_connections(from: IpAddr, to: SocketAddr, count: usize) -> Silent {
    let results: Vec<Result<TcpStream>> = futures::stream::iter(0..count)
        .map(|_| async move {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(from, 0))?;
            let stream = tokio::time::timeout(Duration::from_secs(2), socket.connect(to))
                .await
                .context("connect timed out")??;
            Ok(stream)
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut silent = Silent {
        streams: Vec::new(),
        failed: 0,
    };
    for r in results {
        match r {
            Ok(s) => silent.streams.push(s),
            Err(_) => silent.failed += 1,
        }
    }
    silent
}

/// Waits until no more than `at_most` of `silent` are open, or `timeout` passed; returns how
/// long that took and how many were open then.
pub async fn wait_closed(silent: &Silent, at_most: usize, timeout: Duration) -> (Duration, usize) {
    let t0 = Instant::now();
    loop {
        let open = silent.still_open();
        if open <= at_most || t0.elapsed() >= timeout {
            return (t0.elapsed(), open);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A rustls verifier that accepts any certificate: the attacker does not care whom it talks to.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls_connector() -> Result<tokio_rustls::TlsConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A TLS connection to the HTTPS port, handshake done.
pub type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Opens `count` connections from `from` to the HTTPS port `to`, completes each TLS handshake
/// and then says nothing. Returns the connections that got through the handshake.
pub async fn silent_after_tls(
    from: IpAddr,
    to: SocketAddr,
    count: usize,
) -> Result<Vec<TlsStream>> {
    let connector = tls_connector()?;
    let mut out = Vec::new();
    for _ in 0..count {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0))?;
        let tcp = socket.connect(to).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        out.push(connector.connect(name, tcp).await?);
    }
    Ok(out)
}

/// One `GET path` over HTTP/1.1 on a kept-alive TLS connection from `from`; returns the
/// connection (still open) after the response head and body were read.
pub async fn tls_request(from: IpAddr, to: SocketAddr, path: &str) -> Result<TlsStream> {
    let mut stream = silent_after_tls(from, to, 1)
        .await?
        .pop()
        .context("no connection")?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // `/healthz` answers "ok" with a content-length: the head and the body fit one read or two.
    while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"ok") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await??;
        anyhow::ensure!(n > 0, "the connection closed before the response");
        got.extend_from_slice(&buf[..n]);
    }
    Ok(stream)
}

/// Waits until the other side closes `stream` (EOF or error) or `timeout` passes; returns how
/// long it stayed open, or None if it still is.
pub async fn until_closed(stream: &mut TlsStream, timeout: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((t0 + timeout).into(), stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(t0.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// What a batch of calls got: counts by gRPC status code (`Ok` for an accepted call,
/// `Pending` for none within the wait).
#[derive(Debug, Clone, Default)]
pub struct Answers {
    /// Answers by code.
    pub codes: BTreeMap<String, usize>,
    /// The first message of each refusal code.
    pub messages: BTreeMap<String, String>,
}

impl Answers {
    /// How many answers had `code`.
    pub fn count(&self, code: &str) -> usize {
        self.codes.get(code).copied().unwrap_or(0)
    }

    fn add(&mut self, answer: Result<(), tonic::Status>) {
        let (code, message) = match answer {
            Ok(()) => ("Ok".to_string(), String::new()),
            Err(s) if s.code() == tonic::Code::Cancelled && s.message() == "pending" => {
                ("Pending".to_string(), String::new())
            }
            Err(s) => (format!("{:?}", s.code()), s.message().to_string()),
        };
        *self.codes.entry(code.clone()).or_default() += 1;
        self.messages.entry(code).or_insert(message);
    }
}

/// Opens `count` Connect streams with `auth` over `channel`, all at once, that never send
/// their Register; each waits `wait` for the manager's answer (RESOURCE_EXHAUSTED for those over
/// the tenant's bound) and is then dropped. Returns what they got and `during`'s result, run
/// while they are all open.
pub async fn silent_connects<T>(
    channel: Channel,
    auth: &str,
    count: usize,
    wait: Duration,
    during: impl std::future::Future<Output = T>,
) -> Result<(Answers, T)> {
    let value: tonic::metadata::MetadataValue<tonic::metadata::Ascii> = auth.parse()?;
    let calls = (0..count).map(|_| {
        let mut client = ControllerManagerClient::new(channel.clone());
        let mut request = tonic::Request::new(futures::stream::pending::<pb::ControllerMessage>());
        request
            .metadata_mut()
            .insert("authorization", value.clone());
        async move {
            // A refusal after the headers comes as a stream: Rejected, then the status.
            let answer = async {
                let mut stream = client.connect(request).await?.into_inner();
                loop {
                    match stream.message().await? {
                        Some(pb::ManagerMessage {
                            message: Some(pb::manager_message::Message::Rejected(_)),
                        }) => continue,
                        _ => return Ok(()),
                    }
                }
            };
            match tokio::time::timeout(wait, answer).await {
                Err(_) => Err(tonic::Status::cancelled("pending")),
                Ok(answer) => answer,
            }
        }
    });
    let (answers, out) = tokio::join!(futures::future::join_all(calls), during);
    let mut tally = Answers::default();
    for a in answers {
        tally.add(a);
    }
    Ok((tally, out))
}

/// How many discovery requests devcluster has served.
pub fn discovery_calls(bed: &Bed) -> u64 {
    bed.cluster.dc.stats().request_count("get", "discovery")
}

/// A primary kind of group `nowhere.ctrlhub.dev` that no API server serves, distinct per `n`.
pub fn unknown_kind(n: usize) -> pb::ResourceType {
    pb::ResourceType {
        group: "nowhere.ctrlhub.dev".into(),
        version: "v1".into(),
        kind: format!("Missing{n}"),
        plural: String::new(),
    }
}

/// team-a registers `count` times, 8 at a time, naming `kind(i)` as the primary kind each time.
pub async fn unknown_kinds(
    bed: &Bed,
    count: usize,
    kind: impl Fn(usize) -> pb::ResourceType,
) -> Answers {
    let answers: Vec<Result<(), tonic::Status>> = futures::stream::iter(0..count)
        .map(|i| {
            let r = pb::Register {
                primary: Some(kind(i)),
                ..team_a_registration("unknown", 1)
            };
            async move { bed.connect(r, &bed.a_auth).await.map(drop) }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut tally = Answers::default();
    for a in answers {
        tally.add(a);
    }
    tally
}

/// Samples `pid`'s open descriptors every 50 ms while `work` runs; returns its result and the
/// highest count seen.
pub async fn peak_fds_during<T>(
    pid: u32,
    work: impl std::future::Future<Output = T>,
) -> (T, usize) {
    let done = std::sync::atomic::AtomicBool::new(false);
    let peak = std::sync::atomic::AtomicUsize::new(open_fds(pid));
    let sampler = async {
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            peak.fetch_max(open_fds(pid), std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let work = async {
        let out = work.await;
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    };
    let (out, ()) = tokio::join!(work, sampler);
    (out, peak.load(std::sync::atomic::Ordering::Relaxed))
}

/// A launch script that starts the manager with its open-file limit (soft and hard) at
/// `limit`, as a container runtime might: `sh -c 'ulimit -n LIMIT; exec BINARY "$@"'`.
pub fn with_fd_limit(
    binary: &std::path::Path,
    limit: u64,
    dir: &std::path::Path,
) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join(format!("ctrlhub-nofile-{limit}.sh"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nulimit -n {limit} || exit 97\nexec '{}' \"$@\"\n",
            binary.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

/// `count` requests for `/metrics` on the HTTPS port, each with a distinct junk token,
/// `concurrency` at a time; returns the statuses (0: no answer).
pub async fn junk_http_wave(bed: &Bed, count: usize, concurrency: usize) -> BTreeMap<u16, usize> {
    let Ok(http) = crate::manager::self_signed_client() else {
        return BTreeMap::new();
    };
    let url = format!("{}/metrics", bed.manager.http);
    let statuses: Vec<u16> = futures::stream::iter(0..count)
        .map(|i| {
            let request = http.get(&url).bearer_auth(crate::hostile::junk_token(i));
            async move { request.send().await.map_or(0, |r| r.status().as_u16()) }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut out = BTreeMap::new();
    for s in statuses {
        *out.entry(s).or_default() += 1;
    }
    out
}

/// Opens a connection from `from` to the gRPC port `to`, sends the HTTP/2 client preface and an
/// empty SETTINGS frame (a valid HTTP/2 connection), and then makes no call.
pub async fn h2_preface_then_silent(from: IpAddr, to: SocketAddr) -> Result<TcpStream> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let mut stream = socket.connect(to).await?;
    stream.write_all(PREFACE).await?;
    stream.write_all(&EMPTY_SETTINGS).await?;
    Ok(stream)
}

/// Waits until the other side closes `stream` or `timeout` passes; returns how long it took,
/// or None if it is still open.
pub async fn tcp_closed_within(stream: &TcpStream, timeout: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if closed(stream) {
            return Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}
