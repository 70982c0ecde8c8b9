//! Tenancy seams: who a session is (authentication), what it may watch (authorization), and how
//! much it may use (limits). `ctrlhub dev` uses a static token and allows everything; the
//! multi-tenancy issue plugs TokenReview and SubjectAccessReview in behind the same traits.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

/// A boxed future, so the seams stay object-safe (`Arc<dyn Authenticator>`).
pub type SeamFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Tenant name used for controller names, limits and metrics: the full username, so two
    /// ServiceAccounts with the same name in different namespaces are different tenants.
    pub tenant: String,
    /// Full username as the authenticator reported it.
    pub username: String,
    /// The user's uid (a ServiceAccount's uid changes when it is re-created).
    pub uid: String,
    /// Groups, passed on to SubjectAccessReview.
    pub groups: Vec<String>,
}

/// Why authentication failed. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No bearer token in the request metadata.
    #[error("missing bearer token: send gRPC metadata `authorization: Bearer <token>`")]
    Missing,
    /// The authorization metadata is not `Bearer <token>`.
    #[error("malformed authorization metadata: expected `Bearer <token>`")]
    Malformed,
    /// The token is not accepted (unknown, expired, tampered, or its ServiceAccount is gone).
    #[error("the bearer token was not accepted: use a current ServiceAccount token")]
    Rejected,
    /// The token is valid but not issued for ctrlhub.
    #[error(
        "the bearer token is not for audience {0:?}: request a projected token with that audience"
    )]
    WrongAudience(String),
    /// The authenticator could not decide (API server unreachable); retry.
    #[error("cannot verify the bearer token right now: {0}")]
    Unavailable(String),
}

/// Turns a bearer token into an identity.
pub trait Authenticator: Send + Sync {
    /// Authenticate a token.
    fn authenticate<'a>(&'a self, token: &'a str) -> SeamFuture<'a, Result<Identity, AuthError>>;
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
    fn authenticate<'a>(&'a self, token: &'a str) -> SeamFuture<'a, Result<Identity, AuthError>> {
        let found = self
            .tokens
            .get(token)
            .map(|tenant| Identity {
                tenant: tenant.clone(),
                username: format!("ctrlhub:static:{tenant}"),
                uid: String::new(),
                groups: Vec::new(),
            })
            .ok_or(AuthError::Rejected);
        Box::pin(std::future::ready(found))
    }
}

/// What a tenant wants to do with a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// list + watch (registrations).
    Watch,
    /// get + list (cached reads).
    Read,
}

impl Access {
    /// The Kubernetes verbs this access needs, all of them.
    pub fn verbs(self) -> [&'static str; 2] {
        match self {
            Access::Watch => ["list", "watch"],
            Access::Read => ["get", "list"],
        }
    }
}

/// Why an authorization decision could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthzError {
    /// The policy could not be consulted (API server unreachable); retry.
    #[error("cannot check permissions right now: {0}")]
    Unavailable(String),
}

/// Decides whether an identity may watch or read a resource in a namespace ("" = all).
pub trait Authorizer: Send + Sync {
    /// Whether `who` may `access` `group/plural` in `namespace`.
    fn allowed<'a>(
        &'a self,
        who: &'a Identity,
        access: Access,
        group: &'a str,
        plural: &'a str,
        namespace: &'a str,
    ) -> SeamFuture<'a, Result<bool, AuthzError>>;
}

/// Allows everything (dev mode).
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn allowed<'a>(
        &'a self,
        _: &'a Identity,
        _: Access,
        _: &'a str,
        _: &'a str,
        _: &'a str,
    ) -> SeamFuture<'a, Result<bool, AuthzError>> {
        Box::pin(std::future::ready(Ok(true)))
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
