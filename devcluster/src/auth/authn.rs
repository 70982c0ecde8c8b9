//! Authentication: who is asking. Every Kubernetes request carries a bearer token that is either
//! the static admin token (a `system:masters` member, what the generated kubeconfig uses) or a
//! ServiceAccount token minted by the TokenRequest API.

use crate::auth::token::{self, Claims, Signer, TokenError};
use crate::catalog::resources::GroupResource;
use crate::storage::Store;
use axum::http::{HeaderMap, header};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The admin user's name.
pub(crate) const ADMIN_USER: &str = "devcluster-admin";
/// The group that bypasses authorization, as in Kubernetes.
pub(crate) const MASTERS: &str = "system:masters";
/// Every authenticated identity is in this group.
pub(crate) const AUTHENTICATED: &str = "system:authenticated";
/// Every ServiceAccount is in this group (and in `system:serviceaccounts:<namespace>`).
pub(crate) const SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
/// TokenReview's `user.extra` key carrying the token's id, as kube-apiserver reports it.
pub(crate) const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// An authenticated user, as TokenReview reports it and the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Identity {
    /// User name, e.g. `system:serviceaccount:team-a:ctl`.
    pub username: String,
    /// The ServiceAccount's uid (empty for the admin).
    pub uid: String,
    /// Group memberships.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// The admin: full access.
    pub fn admin() -> Self {
        Identity {
            username: ADMIN_USER.into(),
            uid: String::new(),
            groups: vec![MASTERS.into(), AUTHENTICATED.into()],
            extra: BTreeMap::new(),
        }
    }

    fn service_account(claims: &Claims) -> Self {
        let ns = &claims.kubernetes.namespace;
        Identity {
            username: claims.sub.clone(),
            uid: claims.kubernetes.serviceaccount.uid.clone(),
            groups: vec![
                SERVICE_ACCOUNTS.into(),
                format!("{SERVICE_ACCOUNTS}:{ns}"),
                AUTHENTICATED.into(),
            ],
            extra: BTreeMap::from([(CREDENTIAL_ID.into(), vec![format!("JTI={}", claims.jti)])]),
        }
    }

    /// Whether authorization is bypassed.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// TokenReview's and SubjectAccessReview's `UserInfo` JSON.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"username": self.username, "groups": self.groups});
        if !self.uid.is_empty() {
            v["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            v["extra"] = json!(self.extra);
        }
        v
    }
}

/// Why a token did not authenticate; the text goes into 401 logs and TokenReview's `status.error`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum AuthnError {
    /// No `Authorization: Bearer` header.
    #[error("no bearer token")]
    Missing,
    /// The token failed verification.
    #[error("invalid bearer token, {0}")]
    Token(#[from] TokenError),
    /// The ServiceAccount the token names is gone, or was recreated with a new uid.
    #[error("invalid bearer token, service account {namespace}/{name} has been deleted")]
    ServiceAccountGone {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// Why a token could not be minted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MintError {
    /// No such ServiceAccount.
    #[error("serviceaccounts \"{name}\" not found")]
    NotFound {
        /// The missing ServiceAccount's name.
        name: String,
    },
}

/// Counts of authentication and authorization outcomes, for tests and `/_devcluster/stats`.
#[derive(Debug, Default)]
pub(crate) struct AuthStats {
    authenticated: AtomicU64,
    unauthenticated: AtomicU64,
    allowed: AtomicU64,
    forbidden: AtomicU64,
}

/// A snapshot of the authentication and authorization counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuthCounts {
    /// Requests that authenticated.
    pub authenticated: u64,
    /// Requests answered 401.
    pub unauthenticated: u64,
    /// Authenticated requests the authorizer allowed (the admin's included).
    pub allowed: u64,
    /// Requests answered 403.
    pub forbidden: u64,
}

impl AuthStats {
    pub(crate) fn authenticated(&self, ok: bool) {
        let c = if ok {
            &self.authenticated
        } else {
            &self.unauthenticated
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn authorized(&self, ok: bool) {
        let c = if ok { &self.allowed } else { &self.forbidden };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn counts(&self) -> AuthCounts {
        AuthCounts {
            authenticated: self.authenticated.load(Ordering::Relaxed),
            unauthenticated: self.unauthenticated.load(Ordering::Relaxed),
            allowed: self.allowed.load(Ordering::Relaxed),
            forbidden: self.forbidden.load(Ordering::Relaxed),
        }
    }
}

impl AuthCounts {
    /// As JSON for `/_devcluster/stats`.
    pub fn to_json(self) -> Value {
        json!({
            "authenticated": self.authenticated,
            "unauthenticated": self.unauthenticated,
            "allowed": self.allowed,
            "forbidden": self.forbidden,
        })
    }
}

/// Verifies bearer tokens and mints ServiceAccount tokens.
pub(crate) struct Authenticator {
    admin_token: String,
    signer: Signer,
    /// Outcome counters.
    pub(crate) stats: AuthStats,
}

fn service_accounts() -> GroupResource {
    GroupResource::new("", "serviceaccounts")
}

impl Authenticator {
    /// An authenticator accepting `admin_token` and tokens signed by a fresh key.
    pub(crate) fn new(admin_token: String) -> Self {
        Authenticator {
            admin_token,
            signer: Signer::generate(),
            stats: AuthStats::default(),
        }
    }

    /// The bearer token of a request's `Authorization` header.
    pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        let token = token.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
    }

    /// Authenticate an API request: the token must be for the API server's audience.
    pub(crate) fn authenticate(
        &self,
        store: &Store,
        headers: &HeaderMap,
    ) -> Result<Identity, AuthnError> {
        let token = Self::bearer(headers).ok_or(AuthnError::Missing)?;
        self.review(store, token, &[]).map(|(id, _)| id)
    }

    /// Authenticate `token` for `audiences` (empty: the API server's), returning the identity
    /// and the audiences it is valid for among those asked.
    pub(crate) fn review(
        &self,
        store: &Store,
        token: &str,
        audiences: &[String],
    ) -> Result<(Identity, Vec<String>), AuthnError> {
        if token == self.admin_token {
            // A static token is for the API server only, like kube-apiserver's token file.
            let auds = token::intersect(&[token::API_AUDIENCE.to_string()], audiences)?;
            return Ok((Identity::admin(), auds));
        }
        let claims = self.signer.verify(token)?;
        let auds = token::intersect(&claims.aud, audiences)?;
        let ns = &claims.kubernetes.namespace;
        let sa = &claims.kubernetes.serviceaccount;
        let live = store
            .lock()
            .get(&service_accounts(), ns, &sa.name)
            .filter(|obj| crate::meta::uid(obj) == sa.uid && !crate::meta::is_deleting(obj));
        if live.is_none() {
            return Err(AuthnError::ServiceAccountGone {
                namespace: ns.clone(),
                name: sa.name.clone(),
            });
        }
        Ok((Identity::service_account(&claims), auds))
    }

    /// Mint a token for ServiceAccount `namespace/name` (which must exist) valid for `ttl`.
    pub(crate) fn mint(
        &self,
        store: &Store,
        namespace: &str,
        name: &str,
        audiences: Vec<String>,
        ttl: Duration,
    ) -> Result<(String, Claims), MintError> {
        let sa = store
            .lock()
            .get(&service_accounts(), namespace, name)
            .ok_or_else(|| MintError::NotFound { name: name.into() })?;
        let audiences = if audiences.is_empty() {
            vec![token::API_AUDIENCE.to_string()]
        } else {
            audiences
        };
        let claims = Signer::claims(namespace, name, crate::meta::uid(&sa), audiences, ttl);
        Ok((self.signer.sign(&claims), claims))
    }
}
