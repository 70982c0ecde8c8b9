//! HTTPS for the HTTP port: the certificate comes from PEM files (a mounted Secret, e.g. from
//! cert-manager; re-read when they change, so a renewed certificate is served without a
//! restart) or is generated self-signed at start, as controller-runtime does for its secured
//! metrics when none is given. Also the port's server, shared by HTTP and HTTPS: connections
//! from `net`'s accept loop, HTTP/1.1 and HTTP/2 with bounded streams, headers and keepalive.

use crate::net::conn::{Activity, Counted, PortState};
use crate::throttle::{PeerKey, Slots};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// Concurrent HTTP/2 streams per connection on the HTTP port: probes, a scrape and a page's
/// requests need a handful; a client opening thousands at once is held to this many.
pub(crate) const MAX_STREAMS: u32 = 32;

/// The HTTP/1.1 read buffer, which bounds a request head (line and headers) a client can send.
const MAX_HTTP1_BUFFER: usize = 64 * 1024;

/// How often the certificate files are looked at for a change.
const RELOAD_CHECK: Duration = Duration::from_secs(10);

/// Why HTTPS could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{what} {path}: {why}")]
    File {
        /// Which flag's file.
        what: &'static str,
        /// The path.
        path: String,
        /// What went wrong.
        why: String,
    },
    /// The certificate could not be generated or does not fit its key.
    #[error("TLS certificate: {0}")]
    Certificate(String),
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub(crate) enum CertSource {
    /// PEM certificate chain and private key files.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// The private key.
        key: PathBuf,
    },
    /// Self-signed at start for these DNS names (and 127.0.0.1).
    SelfSigned(Vec<String>),
}

/// A TLS acceptor for `source`, offering HTTP/2 and HTTP/1.1.
pub(crate) fn acceptor(source: &CertSource) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver: Arc<dyn ResolvesServerCert> = match source {
        CertSource::Files { cert, key } => Arc::new(FileCert::load(cert, key, provider.clone())?),
        CertSource::SelfSigned(names) => Arc::new(self_signed(names, &provider)?),
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Certificate(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// A self-signed certificate for `names`, `localhost` and 127.0.0.1.
fn self_signed(
    names: &[String],
    provider: &CryptoProvider,
) -> Result<rustls::sign::SingleCertAndKey, TlsError> {
    let bad = |e: rcgen::Error| TlsError::Certificate(e.to_string());
    let mut sans: Vec<String> = names.to_vec();
    sans.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
    let made = rcgen::generate_simple_self_signed(sans).map_err(bad)?;
    let chain = vec![made.cert.der().clone()];
    let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    Ok(rustls::sign::SingleCertAndKey::from(certified(
        chain, key, provider,
    )?))
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| TlsError::Certificate(format!("the key does not fit the certificate: {e}")))?;
    Ok(certified)
}

/// A certificate from files, re-read when either file's modification time changes (checked at
/// most every [`RELOAD_CHECK`]); a file that cannot be read then keeps the last good one.
#[derive(Debug)]
struct FileCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    served: Arc<CertifiedKey>,
    stamps: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

impl FileCert {
    fn load(
        cert: &PathBuf,
        key: &PathBuf,
        provider: Arc<CryptoProvider>,
    ) -> Result<FileCert, TlsError> {
        let served = Arc::new(read_pair(cert, key, &provider)?);
        let stamps = (modified(cert), modified(key));
        Ok(FileCert {
            cert: cert.clone(),
            key: key.clone(),
            provider,
            state: Mutex::new(Loaded {
                served,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The certificate to serve, re-read first if the files changed.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut st = self.state.lock();
        let now = Instant::now();
        if now.saturating_duration_since(st.checked) < RELOAD_CHECK {
            return st.served.clone();
        }
        st.checked = now;
        let stamps = (modified(&self.cert), modified(&self.key));
        if stamps != st.stamps {
            match read_pair(&self.cert, &self.key, &self.provider) {
                Ok(fresh) => {
                    tracing::info!(cert = %self.cert.display(), "HTTP TLS certificate reloaded");
                    st.served = Arc::new(fresh);
                    st.stamps = stamps;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP TLS certificate changed but cannot be loaded; serving the previous one")
                }
            }
        }
        st.served.clone()
    }
}

impl ResolvesServerCert for FileCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_pair(
    cert: &PathBuf,
    key: &PathBuf,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let file_error = |what, path: &PathBuf, why: String| TlsError::File {
        what,
        path: path.display().to_string(),
        why,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| file_error("--http-tls-cert", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_error(
            "--http-tls-cert",
            cert,
            "no PEM certificate in the file".into(),
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| file_error("--http-tls-key", key, e.to_string()))?;
    certified(chain, private, provider)
}

/// Serves `router` on `listener` until `stop` fires, over TLS when `tls` is given. Connections
/// come through [`crate::net::accept`] (capped per peer and in all, each under its port's
/// deadlines: first bytes, first request, idle); each is its own task (a slow handshake holds
/// up no one else), must finish its TLS handshake within the first-bytes deadline, and tells
/// the handlers its peer address (for per-peer throttling).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    caps: Arc<Slots<PeerKey>>,
    port: PortState,
    stop: CancellationToken,
) {
    let handshake = port.rules.first_bytes;
    let mut incoming = crate::net::accept::accept(listener, caps, port.clone(), stop.clone());
    loop {
        let conn = tokio::select! {
            c = incoming.recv() => match c {
                Some(Ok(c)) => c,
                Some(Err(_)) => continue,
                None => return,
            },
            _ = stop.cancelled() => return,
        };
        let (router, tls, stop, metrics) = (
            router.clone(),
            tls.clone(),
            stop.clone(),
            port.metrics.clone(),
        );
        let (peer, activity) = (conn.peer(), conn.activity());
        tokio::spawn(async move {
            let served = match tls {
                Some(tls) => match tokio::time::timeout(handshake, tls.accept(conn)).await {
                    Ok(Ok(stream)) => {
                        connection(
                            TokioIo::new(stream),
                            router,
                            peer,
                            activity,
                            handshake,
                            &stop,
                        )
                        .await
                    }
                    Ok(Err(_)) => return,
                    Err(_) => {
                        metrics.connection_closed("http", "tls_handshake_timeout");
                        return;
                    }
                },
                None => {
                    connection(TokioIo::new(conn), router, peer, activity, handshake, &stop).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, %peer, "HTTP connection ended with an error");
            }
        });
    }
}

/// One connection: HTTP/1.1 or HTTP/2, closed gracefully when `stop` fires. Each request counts
/// as a call on `activity` until its response body ends (the idle timeout counts from then).
async fn connection<I>(
    io: I,
    router: Router,
    peer: SocketAddr,
    activity: Arc<Activity>,
    header_timeout: Duration,
    stop: &CancellationToken,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let call = activity.begin();
            let answer = router.clone().oneshot(req.map(axum::body::Body::new));
            async move {
                let response = answer.await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| axum::body::Body::new(Counted::new(body, call))),
                )
            }
        });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_HTTP1_BUFFER);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .keep_alive_interval(crate::net::KEEPALIVE_INTERVAL)
        .keep_alive_timeout(crate::net::KEEPALIVE_TIMEOUT)
        .max_header_list_size(crate::net::MAX_HEADER_BYTES);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_pem_say_which_flag() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        std::fs::write(&cert, "not a certificate").expect("write");
        std::fs::write(&key, "not a key").expect("write");
        let Err(e) = acceptor(&CertSource::Files { cert, key }) else {
            panic!("files that are not PEM were accepted");
        };
        assert!(e.to_string().contains("--http-tls-cert"), "{e}");
    }

    #[test]
    fn a_self_signed_certificate_is_made() {
        acceptor(&CertSource::SelfSigned(vec!["ctrlhub-0".into()])).expect("acceptor");
    }
}
