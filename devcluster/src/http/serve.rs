//! Serving connections: the accept loop, TLS handshakes, HTTP/1.1 and HTTP/2 on one port, and
//! graceful shutdown.

use super::tls;
use crate::Error;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Accepts connections on `listener` until `token` is cancelled, serving each with `router`
/// (over TLS when an acceptor is given).
pub(crate) fn spawn(
    listener: TcpListener,
    router: Router,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    token: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                },
                _ = token.cancelled() => break,
            };
            let _ = tcp.set_nodelay(true);
            let router = router.clone();
            let acceptor = acceptor.clone();
            let token = token.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        router.clone().oneshot(req.map(axum::body::Body::new))
                    },
                );
                let builder = auto::Builder::new(TokioExecutor::new());
                let result = match acceptor {
                    Some(acceptor) => match acceptor.accept(tcp).await {
                        Ok(tls) => serve(&builder, TokioIo::new(tls), service, &token).await,
                        Err(e) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                    },
                    None => serve(&builder, TokioIo::new(tcp), service, &token).await,
                };
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
        }
    })
}

/// The TLS acceptor for the generated serving certificate, offering HTTP/2 and HTTP/1.1.
pub(crate) fn acceptor(certs: &tls::Certs) -> Result<tokio_rustls::TlsAcceptor, Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(certs.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| Error::Tls(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(certs.key_pem.as_bytes())
        .map_err(|e| Error::Tls(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| Error::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn serve<I, S>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    shutdown: &CancellationToken,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
        > + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            // Watches end on the same token, so the connection drains quickly.
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
            Ok(())
        }
    }
}
