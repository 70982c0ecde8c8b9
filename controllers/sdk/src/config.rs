//! Where the manager is and how to authenticate to it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::backoff::Backoff;

/// Default manager endpoint (`ctrlhub dev`).
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:9090";
/// Default bearer token (`ctrlhub dev` accepts it).
pub const DEFAULT_TOKEN: &str = "dev";

/// Connection settings for [`Controller::run`](crate::Controller::run).
#[derive(Clone, Debug)]
pub struct Config {
    /// Manager endpoint (env `CTRLHUB_ADDR`): `host:port`, e.g.
    /// `ctrlhub.ctrlhub-system.svc:9090` (plaintext, or TLS when
    /// [`Config::tls`] is set), or a URL `http://host:port` /
    /// `https://host:port` (`https://` needs [`Config::tls`]).
    pub addr: String,
    /// Bearer token sent as `authorization: Bearer <token>` (env
    /// `CTRLHUB_TOKEN`, default `dev`).
    pub token: String,
    /// When set, the token is read from this file on every (re)connect, e.g.
    /// a projected ServiceAccount token (env `CTRLHUB_TOKEN_FILE`); takes
    /// precedence over `token`.
    pub token_file: Option<PathBuf>,
    /// Reconnect backoff (default 100 ms doubling to 10 s with jitter, reset
    /// whenever a session registers).
    pub reconnect: Backoff,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// HTTP/2 keepalive ping interval, so a dead peer is noticed.
    pub keepalive_interval: Duration,
    /// How long to wait for the manager to close a draining session after
    /// every in-flight reconcile has answered.
    pub drain_grace: Duration,
    /// How long a shutdown (SIGTERM) may take: the draining session lets its
    /// reconciles finish, each at most until its deadline; once this has
    /// passed since the shutdown began, the session ends and what still runs
    /// is cancelled. [`Controller::run`](crate::Controller::run) returns only
    /// when no reconcile runs any more. Default 30 s, Kubernetes' default
    /// `terminationGracePeriodSeconds`: keep it below the pod's.
    pub shutdown_grace: Duration,
    /// How long to wait before registering again after the manager said a
    /// newer (or conflicting) definition of this controller runs
    /// (`Revoked(SUPERSEDED)`, or `Rejected` with `outdated`). Default 30 s.
    pub outdated_wait: Duration,
    /// TLS to the manager (an `https://` address), with a client certificate
    /// when the manager requires mutual TLS.
    pub tls: Option<TlsFiles>,
    /// The tracer of this controller's spans; `None`: the global one that
    /// [`traces::init`](crate::traces::init) installs. Set it only when the
    /// controller shares its process with another traced service (as in
    /// `ctrlhub dev`), so its spans carry its own `service.name`.
    pub tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    /// Where to serve the HTTP health endpoint (`/healthz`, `/readyz`; see
    /// [`health`](crate::health)), e.g. `0.0.0.0:8081` (env `CTRLHUB_HEALTH_ADDR`, which also
    /// takes `:8081`). `None` (the default): no endpoint.
    pub health_addr: Option<SocketAddr>,
    /// How long the async runtime may run no tick before `/healthz` answers 500. Default
    /// 10 s.
    pub stuck_after: Duration,
}

/// PEM files for TLS to the manager, read anew on every (re)connect so that
/// rotated certificates (cert-manager, a projected Secret) take effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the manager's serving certificate (env
    /// `CTRLHUB_TLS_CA_FILE`).
    pub ca: PathBuf,
    /// This controller's client certificate, for a manager started with
    /// `--grpc-client-ca` (env `CTRLHUB_TLS_CERT_FILE`).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (env `CTRLHUB_TLS_KEY_FILE`).
    pub key: Option<PathBuf>,
    /// The name to verify in the manager's certificate, when it differs from
    /// the address's host (env `CTRLHUB_TLS_SERVER_NAME`).
    pub server_name: Option<String>,
}

/// Invalid connection settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The endpoint is not a valid URI.
    #[error("invalid manager address {addr:?}: {reason}")]
    InvalidAddr {
        /// The offending value.
        addr: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The token cannot be sent as gRPC metadata or read from its file.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// The TLS settings are incomplete or a PEM file cannot be read.
    #[error("invalid TLS settings: {0}")]
    InvalidTls(String),
    /// `CTRLHUB_HEALTH_ADDR` is not an address to listen on.
    #[error(
        "CTRLHUB_HEALTH_ADDR={value:?} is not an address to listen on: use host:port, e.g. 0.0.0.0:8081 (or :8081)"
    )]
    InvalidHealthAddr {
        /// The offending value.
        value: String,
    },
    /// `CTRLHUB_REVISION` is not a non-negative integer.
    #[error("CTRLHUB_REVISION must be a non-negative integer, got {0:?}")]
    InvalidRevision(String),
}

impl Default for Config {
    fn default() -> Self {
        Self::new(DEFAULT_ADDR, DEFAULT_TOKEN)
    }
}

impl Config {
    /// Settings for `addr` with a static `token` and default timings.
    pub fn new(addr: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            token: token.into(),
            token_file: None,
            reconnect: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(30),
            drain_grace: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            outdated_wait: Duration::from_secs(30),
            tls: None,
            tracer: None,
            health_addr: None,
            stuck_after: Duration::from_secs(10),
        }
    }

    /// [`Config::addr`] as a URL: `host:port` gets `https://` when TLS is
    /// configured and `http://` otherwise; a URL is kept as it is.
    pub fn uri(&self) -> String {
        if self.addr.contains("://") {
            self.addr.clone()
        } else if self.tls.is_some() {
            format!("https://{}", self.addr)
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// Settings from `CTRLHUB_ADDR`, `CTRLHUB_TOKEN`, `CTRLHUB_TOKEN_FILE`, the
    /// `CTRLHUB_TLS_*` files and `CTRLHUB_HEALTH_ADDR`, with the defaults above.
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut config = Self::new(
            var("CTRLHUB_ADDR").unwrap_or_else(|| DEFAULT_ADDR.into()),
            var("CTRLHUB_TOKEN").unwrap_or_else(|| DEFAULT_TOKEN.into()),
        );
        config.token_file = var("CTRLHUB_TOKEN_FILE").map(PathBuf::from);
        config.health_addr = Self::health_addr_from_env()?;
        let cert = var("CTRLHUB_TLS_CERT_FILE").map(PathBuf::from);
        let key = var("CTRLHUB_TLS_KEY_FILE").map(PathBuf::from);
        let server_name = var("CTRLHUB_TLS_SERVER_NAME");
        config.tls = match var("CTRLHUB_TLS_CA_FILE") {
            Some(ca) => Some(TlsFiles {
                ca: PathBuf::from(ca),
                cert,
                key,
                server_name,
            }),
            None if cert.is_some() || key.is_some() || server_name.is_some() => {
                return Err(ConfigError::InvalidTls(
                    "CTRLHUB_TLS_CERT_FILE, CTRLHUB_TLS_KEY_FILE and CTRLHUB_TLS_SERVER_NAME \
                     need CTRLHUB_TLS_CA_FILE (the CA of the manager's certificate)"
                        .into(),
                ));
            }
            None => None,
        };
        config.validate()?;
        Ok(config)
    }

    /// [`Config::health_addr`] from `CTRLHUB_HEALTH_ADDR` (`host:port`, or `:port` for every
    /// interface), for a controller that builds its `Config` otherwise.
    pub fn health_addr_from_env() -> Result<Option<SocketAddr>, ConfigError> {
        std::env::var("CTRLHUB_HEALTH_ADDR")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| parse_listen_addr(&v))
            .transpose()
    }

    /// Checks the address (and a static token) without connecting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let uri: http_uri::Uri =
            self.uri()
                .parse()
                .map_err(|e: http_uri::InvalidUri| ConfigError::InvalidAddr {
                    addr: self.addr.clone(),
                    reason: e.to_string(),
                })?;
        if uri.port_u16().is_none()
            && uri.scheme_str() == Some("http")
            && !self.addr.contains("://")
        {
            return Err(ConfigError::InvalidAddr {
                addr: self.addr.clone(),
                reason: "expected host:port, e.g. ctrlhub.ctrlhub-system.svc:9090".into(),
            });
        }
        match (uri.scheme_str(), &self.tls) {
            (Some("http"), None) | (Some("https"), Some(_)) => {}
            (Some("http"), Some(_)) => {
                return Err(ConfigError::InvalidTls(format!(
                    "TLS files are set but the address {} is http://; use https://",
                    self.addr
                )));
            }
            (Some("https"), None) => {
                return Err(ConfigError::InvalidTls(format!(
                    "{} is https:// but no CA is set: set CTRLHUB_TLS_CA_FILE (Config::tls) \
                     to the CA of the manager's certificate",
                    self.addr
                )));
            }
            _ => {
                return Err(ConfigError::InvalidAddr {
                    addr: self.addr.clone(),
                    reason: "expected host:port or an http:// or https:// URL".into(),
                });
            }
        }
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            return Err(ConfigError::InvalidTls(
                "a client certificate needs its key and a key its certificate: set both \
                 CTRLHUB_TLS_CERT_FILE and CTRLHUB_TLS_KEY_FILE, or neither"
                    .into(),
            ));
        }
        if self.token_file.is_none() {
            bearer(&self.token)?;
        }
        Ok(())
    }

    /// The TLS settings with the PEM files as they are now (None: plaintext).
    pub(crate) fn client_tls(
        &self,
    ) -> Result<Option<tonic::transport::ClientTlsConfig>, ConfigError> {
        let Some(files) = &self.tls else {
            return Ok(None);
        };
        let read = |path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| ConfigError::InvalidTls(format!("reading {}: {e}", path.display())))
        };
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&files.ca)?));
        if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
            tls = tls.identity(tonic::transport::Identity::from_pem(
                read(cert)?,
                read(key)?,
            ));
        }
        if let Some(name) = &files.server_name {
            tls = tls.domain_name(name.clone());
        }
        Ok(Some(tls))
    }

    /// The current `authorization` metadata value.
    pub(crate) fn authorization(
        &self,
    ) -> Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>, ConfigError> {
        match &self.token_file {
            Some(path) => {
                let token = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::InvalidToken(format!("reading {}: {e}", path.display()))
                })?;
                bearer(token.trim())
            }
            None => bearer(&self.token),
        }
    }
}

/// `host:port` (an IP address) or `:port` (every interface).
pub(crate) fn parse_listen_addr(value: &str) -> Result<SocketAddr, ConfigError> {
    let value = value.trim();
    let full = match value.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => value.to_owned(),
    };
    full.parse().map_err(|_| ConfigError::InvalidHealthAddr {
        value: value.to_owned(),
    })
}

fn bearer(
    token: &str,
) -> Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>, ConfigError> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| ConfigError::InvalidToken("token must be printable ASCII".into()))
}

/// `http::Uri` as re-exported by tonic.
mod http_uri {
    pub(super) use tonic::codegen::http::Uri;
    pub(super) use tonic::codegen::http::uri::InvalidUri;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_addresses() {
        assert!(
            Config::new("http://127.0.0.1:9090", "dev")
                .validate()
                .is_ok()
        );
        assert!(
            matches!(
                Config::new("https://ctrlhub.svc:443", "t").validate(),
                Err(ConfigError::InvalidTls(_))
            ),
            "https without a CA"
        );
        let tls = TlsFiles {
            ca: "ca.pem".into(),
            cert: Some("tls.crt".into()),
            key: None,
            server_name: None,
        };
        let mut c = Config::new("https://ctrlhub.svc:443", "t");
        c.tls = Some(tls.clone());
        assert!(
            matches!(c.validate(), Err(ConfigError::InvalidTls(_))),
            "a certificate without its key"
        );
        c.tls = Some(TlsFiles {
            key: Some("tls.key".into()),
            ..tls.clone()
        });
        assert!(c.validate().is_ok());
        c.addr = "http://ctrlhub.svc:9090".into();
        assert!(
            matches!(c.validate(), Err(ConfigError::InvalidTls(_))),
            "TLS files with an http:// address"
        );
        assert!(Config::new("http://[::1", "dev").validate().is_err());
        assert!(Config::new("ftp://a:1", "dev").validate().is_err());
        assert!(Config::new("no-port", "dev").validate().is_err());
        assert!(Config::new("http://a", "bad\ntoken").validate().is_err());
    }

    /// The README's address works with and without a scheme.
    #[test]
    fn host_and_port_without_a_scheme_is_accepted() {
        let plain = Config::new("ctrlhub.ctrlhub-system.svc:9090", "t");
        assert!(plain.validate().is_ok());
        assert_eq!(plain.uri(), "http://ctrlhub.ctrlhub-system.svc:9090");
        let mut tls = Config::new("ctrlhub.ctrlhub-system.svc:9090", "t");
        tls.tls = Some(TlsFiles {
            ca: "ca.pem".into(),
            cert: None,
            key: None,
            server_name: None,
        });
        assert!(tls.validate().is_ok());
        assert_eq!(tls.uri(), "https://ctrlhub.ctrlhub-system.svc:9090");
        assert!(Config::new("127.0.0.1:9090", "dev").validate().is_ok());
        assert!(Config::new("[::1]:9090", "dev").validate().is_ok());
    }

    /// The waits the crate docs promise.
    #[test]
    fn documented_defaults() {
        let c = Config::default();
        assert_eq!(c.outdated_wait, Duration::from_secs(30));
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert_eq!(c.drain_grace, Duration::from_secs(5));
    }

    #[test]
    fn health_addresses() {
        let parse = |v: &str| parse_listen_addr(v).ok().map(|a| a.to_string());
        assert_eq!(parse("0.0.0.0:8081").as_deref(), Some("0.0.0.0:8081"));
        assert_eq!(parse(":8081").as_deref(), Some("0.0.0.0:8081"));
        assert_eq!(parse("[::]:8081").as_deref(), Some("[::]:8081"));
        assert_eq!(parse("127.0.0.1:0").as_deref(), Some("127.0.0.1:0"));
        for bad in ["8081", "localhost", "0.0.0.0:http", ""] {
            assert!(
                matches!(
                    parse_listen_addr(bad),
                    Err(ConfigError::InvalidHealthAddr { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(Config::default().health_addr, None);
        assert_eq!(Config::default().stuck_after, Duration::from_secs(10));
    }

    #[test]
    fn authorization_is_bearer() -> Result<(), ConfigError> {
        let v = Config::new(DEFAULT_ADDR, "s3cret").authorization()?;
        assert_eq!(v.to_str().ok(), Some("Bearer s3cret"));
        Ok(())
    }
}
