//! Where the manager is and how to authenticate to it.

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
    /// Manager endpoint, e.g. `http://127.0.0.1:9090` (env `CTRLHUB_ADDR`);
    /// plaintext HTTP/2 (`http://`) only in this build.
    pub addr: String,
    /// Bearer token sent as `authorization: Bearer <token>` (env
    /// `CTRLHUB_TOKEN`, default `dev`).
    pub token: String,
    /// When set, the token is read from this file on every (re)connect, e.g.
    /// a projected ServiceAccount token (env `CTRLHUB_TOKEN_FILE`); takes
    /// precedence over `token`.
    pub token_file: Option<PathBuf>,
    /// Reconnect backoff (default 100 ms doubling to 10 s with jitter, reset
    /// after a session that lasted more than 30 s).
    pub reconnect: Backoff,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// HTTP/2 keepalive ping interval, so a dead peer is noticed.
    pub keepalive_interval: Duration,
    /// How long to wait for the manager to close a draining session after
    /// every in-flight reconcile has answered.
    pub drain_grace: Duration,
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
        }
    }

    /// Settings from `CTRLHUB_ADDR`, `CTRLHUB_TOKEN` and `CTRLHUB_TOKEN_FILE`,
    /// with the defaults above.
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut config = Self::new(
            var("CTRLHUB_ADDR").unwrap_or_else(|| DEFAULT_ADDR.into()),
            var("CTRLHUB_TOKEN").unwrap_or_else(|| DEFAULT_TOKEN.into()),
        );
        config.token_file = var("CTRLHUB_TOKEN_FILE").map(PathBuf::from);
        config.validate()?;
        Ok(config)
    }

    /// Checks the address (and a static token) without connecting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let uri: http_uri::Uri =
            self.addr
                .parse()
                .map_err(|e: http_uri::InvalidUri| ConfigError::InvalidAddr {
                    addr: self.addr.clone(),
                    reason: e.to_string(),
                })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(ConfigError::InvalidAddr {
                    addr: self.addr.clone(),
                    reason: "TLS is not compiled into this build (tonic's TLS feature is off); \
                             use http:// (e.g. through a TLS-terminating sidecar)"
                        .into(),
                });
            }
            _ => {
                return Err(ConfigError::InvalidAddr {
                    addr: self.addr.clone(),
                    reason: "expected an http:// URL".into(),
                });
            }
        }
        if self.token_file.is_none() {
            bearer(&self.token)?;
        }
        Ok(())
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

fn bearer(
    token: &str,
) -> Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>, ConfigError> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| ConfigError::InvalidToken("token must be printable ASCII".into()))
}

/// `http::Uri` as re-exported by tonic.
mod http_uri {
    pub use tonic::codegen::http::Uri;
    pub use tonic::codegen::http::uri::InvalidUri;
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
            Config::new("https://ctrlhub.svc:443", "t")
                .validate()
                .is_err()
        );
        assert!(Config::new("127.0.0.1:9090", "dev").validate().is_err());
        assert!(Config::new("http://[::1", "dev").validate().is_err());
        assert!(Config::new("http://a", "bad\ntoken").validate().is_err());
    }

    #[test]
    fn authorization_is_bearer() -> Result<(), ConfigError> {
        let v = Config::new(DEFAULT_ADDR, "s3cret").authorization()?;
        assert_eq!(v.to_str().ok(), Some("Bearer s3cret"));
        Ok(())
    }
}
