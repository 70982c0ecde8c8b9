//! Tenancy seams: who a session is (authentication), what it may watch (authorization), and how
//! much it may use (limits). `ctrlhub dev` uses a static token and allows everything; the
//! multi-tenancy issue plugs TokenReview and SubjectAccessReview in behind the same traits.

use std::collections::HashMap;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Tenant name used for controller names, limits and metrics.
    pub tenant: String,
    /// Full username as the authenticator reported it.
    pub username: String,
}

/// Why authentication failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No bearer token in the request metadata.
    #[error("missing bearer token: send gRPC metadata `authorization: Bearer <token>`")]
    Missing,
    /// The token is not accepted.
    #[error("the bearer token was not accepted")]
    Rejected,
}

/// Turns a bearer token into an identity.
pub trait Authenticator: Send + Sync {
    /// Authenticate a token.
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError>;
}

/// Static tokens (for `ctrlhub dev` and tests): token → tenant.
pub struct StaticTokens {
    tokens: HashMap<String, String>,
}

impl StaticTokens {
    /// Accept exactly these tokens, each for its tenant.
    pub fn new(tokens: impl IntoIterator<Item = (String, String)>) -> Self {
        StaticTokens {
            tokens: tokens.into_iter().collect(),
        }
    }
}

impl Authenticator for StaticTokens {
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError> {
        self.tokens
            .get(token)
            .map(|tenant| Identity {
                tenant: tenant.clone(),
                username: format!("ctrlhub:static:{tenant}"),
            })
            .ok_or(AuthError::Rejected)
    }
}

/// What a tenant wants to do with a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// list + watch (registrations).
    Watch,
    /// get + list (cached reads).
    Read,
}

/// Decides whether an identity may watch or read a resource in a namespace ("" = all).
pub trait Authorizer: Send + Sync {
    /// Whether `who` may `access` `group/plural` in `namespace`.
    fn allowed(
        &self,
        who: &Identity,
        access: Access,
        group: &str,
        plural: &str,
        namespace: &str,
    ) -> bool;
}

/// Allows everything (dev mode).
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn allowed(&self, _: &Identity, _: Access, _: &str, _: &str, _: &str) -> bool {
        true
    }
}

/// Per-tenant limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Concurrent sessions per tenant.
    pub sessions: usize,
    /// Largest gRPC message accepted, in bytes.
    pub max_message_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            sessions: 256,
            max_message_bytes: 4 * 1024 * 1024,
        }
    }
}
