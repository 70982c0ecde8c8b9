//! Who may read the HTTP port, and how much of it. With `--auth kubernetes` every path but the
//! kubelet's probes needs a bearer token, reviewed as the API server would (TokenReview for its
//! own audience, then SubjectAccessReview for the non-resource URL), as controller-runtime's
//! secured metrics and kube-rbac-proxy do:
//!
//! - `get` on the path (`/metrics`, `/status` or `/`) is the operator grant: it sees everything.
//! - Without it, `/metrics` is forbidden, and `/status` and the page show the caller only its own
//!   tenant's controllers, keys and errors, and nothing of the caches every tenant shares.
//!
//! A browser, which cannot send the header, presents the cookie of a session opened by logging
//! in with a token ([`super::session`]): the gate then reviews the session's token exactly as if
//! it had come in the header.
//!
//! With `--auth static` (`ctrlhub dev`, tests on loopback) the port is open and shows all.

use super::session::{self, Sessions};
use crate::tenancy::{
    AuthError, Authenticator, AuthzError, Identity, PathAuthorizer, TenantGrouping,
};
use crate::throttle::PeerThrottle;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Failed authentications a peer may make at once on the HTTP port before it is slowed down
/// (reserved before each review, so concurrency cannot spend more).
pub(crate) const AUTH_FAILURE_BURST: u32 = 20;
/// Failed authentications per second a peer may make after its burst.
pub(crate) const AUTH_FAILURES_PER_SECOND: f64 = 5.0;
/// TokenReviews in flight for one peer on the HTTP port (a cached token needs none).
pub(crate) const REVIEWS_IN_FLIGHT_PER_PEER: usize = 4;
/// TokenReviews in flight from the HTTP port in all.
pub(crate) const REVIEWS_IN_FLIGHT: usize = 8;

/// How the HTTP port decides who sees what.
pub(crate) enum Gate {
    /// Everything open to everyone (`--auth static`).
    Open,
    /// Bearer tokens reviewed by the API server (`--auth kubernetes`).
    Kubernetes(Box<KubernetesGate>),
}

/// The review steps of [`Gate::Kubernetes`].
pub(crate) struct KubernetesGate {
    authn: Arc<dyn Authenticator>,
    authz: Arc<dyn PathAuthorizer>,
    grouping: TenantGrouping,
    peers: PeerThrottle,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    sessions: Sessions,
}

/// A login that opened a session: who, and the cookie that names it.
#[derive(Debug)]
pub(crate) struct Login {
    /// The session id, the cookie's value.
    pub session: String,
    /// How long the session lives (at most the token's own life).
    pub lifetime: Duration,
}

impl Gate {
    /// A gate that reviews tokens with `authn` and paths with `authz`; a caller without the
    /// path grant sees its tenant, as `grouping` defines tenants.
    pub(crate) fn kubernetes(
        authn: Arc<dyn Authenticator>,
        authz: Arc<dyn PathAuthorizer>,
        grouping: TenantGrouping,
    ) -> Self {
        Gate::Kubernetes(Box::new(KubernetesGate {
            authn,
            authz,
            grouping,
            peers: PeerThrottle::new(
                AUTH_FAILURE_BURST,
                AUTH_FAILURES_PER_SECOND,
                REVIEWS_IN_FLIGHT_PER_PEER,
                REVIEWS_IN_FLIGHT,
            ),
            metrics: None,
            sessions: Sessions::default(),
        }))
    }

    /// Counts throttled authentications in `metrics`.
    pub(crate) fn with_metrics(self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        match self {
            Gate::Kubernetes(mut gate) => {
                gate.metrics = Some(metrics);
                Gate::Kubernetes(gate)
            }
            open => open,
        }
    }

    /// Who the caller of `path` is and what it may see. `tenant_view`: whether a caller without
    /// the path grant may still see its own tenant (the status page and `/status` do; `/metrics`
    /// does not, since its series are not split by who may read them).
    pub(crate) async fn viewer(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
        path: &str,
        tenant_view: bool,
    ) -> Result<Viewer, Refusal> {
        let Gate::Kubernetes(gate) = self else {
            return Ok(Viewer::Operator);
        };
        let who = gate.authenticate(headers, peer).await?;
        let granted = gate
            .authz
            .path_allowed(&who, "get", path)
            .await
            .map_err(|AuthzError::Unavailable(e)| Refusal::Unavailable(e))?;
        if granted {
            return Ok(Viewer::Operator);
        }
        if tenant_view {
            return Ok(Viewer::Tenant(gate.grouping.tenant_of(&who.username)));
        }
        Err(Refusal::Forbidden(format!(
            "{} may not get {path}: grant it with a ClusterRole rule {{nonResourceURLs: [\"{path}\"], verbs: [\"get\"]}} (decisions are cached; a new grant is seen within the --authz-deny-ttl)",
            who.username
        )))
    }
}

impl Gate {
    /// Logs in with `token`: reviewed like a bearer token (a failure counts against the peer's
    /// budget), then a session is opened for it. Static auth needs no login.
    pub(crate) async fn login(&self, token: &str, peer: Option<IpAddr>) -> Result<Login, Refusal> {
        let Gate::Kubernetes(gate) = self else {
            return Err(Refusal::Unauthenticated(
                "this manager runs --auth static: its page needs no login".into(),
            ));
        };
        let token = token.trim();
        if token.is_empty() {
            return Err(Refusal::Unauthenticated(
                "no token: paste one the API server accepts (kubectl create token <serviceaccount>)"
                    .into(),
            ));
        }
        let who = gate.review(token, peer).await?;
        let expiry = crate::tenancy::token_expiry(token);
        let (session, lifetime) = gate
            .sessions
            .open(token, &who.username, expiry, Instant::now())
            .map_err(|e| Refusal::Unavailable(e.to_string()))?;
        tracing::info!(user = %who.username, ?lifetime, "HTTP login: session opened");
        Ok(Login { session, lifetime })
    }

    /// Ends the session the request's cookie names, if any.
    pub(crate) fn logout(&self, headers: &HeaderMap) {
        if let (Gate::Kubernetes(gate), Some(id)) = (self, session::from_cookies(headers)) {
            gate.sessions.close(id);
        }
    }

    /// Who the request's session cookie logged in as, if it names a live session whose token
    /// is still accepted.
    pub(crate) async fn session_user(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Option<String> {
        let Gate::Kubernetes(gate) = self else {
            return None;
        };
        session::from_cookies(headers)?;
        if headers.contains_key(header::AUTHORIZATION) {
            return None;
        }
        gate.authenticate(headers, peer)
            .await
            .ok()
            .map(|who| who.username)
    }
}

impl KubernetesGate {
    /// The caller's identity from its bearer token, or from its session's token. A session whose
    /// token is no longer accepted is ended.
    async fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Identity, Refusal> {
        let (token, session) = self.credential(headers)?;
        let decided = self.review(&token, peer).await;
        if let (Err(Refusal::Unauthenticated(_)), Some(id)) = (&decided, session) {
            self.sessions.close(id);
        }
        decided
    }

    /// The token to review: the `Authorization` header's, else the session cookie's, else the
    /// missing-token refusal.
    fn credential<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> Result<(Cow<'h, str>, Option<&'h str>), Refusal> {
        if !headers.contains_key(header::AUTHORIZATION)
            && let Some(id) = session::from_cookies(headers)
        {
            return match self.sessions.token(id, Instant::now()) {
                Some(token) => Ok((Cow::Owned(token), Some(id))),
                None => Err(Refusal::Unauthenticated(
                    "your session has ended (logged out, expired, or the manager restarted or lost the lead): log in again at /login".into(),
                )),
            };
        }
        Ok((Cow::Borrowed(bearer(headers)?), None))
    }

    /// A token's identity. A token already decided (cached) is answered at once; any other
    /// reserves a review of its peer's budget first (given back when accepted), so a peer that
    /// keeps failing, or sends many at once, is refused before its tokens become TokenReviews.
    async fn review(&self, token: &str, peer: Option<IpAddr>) -> Result<Identity, Refusal> {
        if let Some(known) = self.authn.cached(token) {
            return known.map_err(refused);
        }
        let reservation = self.peers.reserve(peer, Instant::now()).map_err(|why| {
            if let Some(m) = &self.metrics {
                m.auth_throttled("http", why.label());
            }
            Refusal::TooMany(why.message(peer))
        })?;
        let decided = self.authn.authenticate(token).await;
        if decided.is_ok() {
            reservation.succeeded(Instant::now());
        }
        decided.map_err(refused)
    }
}

/// The refusal for a token that was not accepted.
fn refused(e: AuthError) -> Refusal {
    match e {
        AuthError::Unavailable(why) => Refusal::Unavailable(why),
        other => Refusal::Unauthenticated(other.to_string()),
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Result<&str, Refusal> {
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        Refusal::Unauthenticated(
            "missing bearer token: send `Authorization: Bearer <token>` with a token the API server accepts (e.g. `kubectl create token <serviceaccount>`)".into(),
        )
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Refusal::Unauthenticated(
                "malformed Authorization header: expected `Bearer <token>`".into(),
            )
        })
}

/// What a caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Viewer {
    /// Everything: the port is open, or the caller has the operator grant on the path.
    Operator,
    /// Only the controllers of this tenant (as limits count tenants).
    Tenant(String),
}

/// Why a request was refused; each answers with its HTTP status and says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// No valid token: 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid token without the grant: 403.
    #[error("{0}")]
    Forbidden(String),
    /// A peer that keeps presenting bad tokens: 429.
    #[error("{0}")]
    TooMany(String),
    /// The API server could not review the token or the access: 503.
    #[error("cannot check this request right now: {0}")]
    Unavailable(String),
}

impl Refusal {
    /// The HTTP status it answers with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            Refusal::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, format!("{self}\n")).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ctrlhub\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::{BoxFuture, StaticTokens};
    use std::collections::HashSet;

    /// Allows the paths it lists to everyone.
    struct Paths(HashSet<&'static str>);

    impl PathAuthorizer for Paths {
        fn path_allowed<'a>(
            &'a self,
            _: &'a Identity,
            _: &'static str,
            path: &'a str,
        ) -> BoxFuture<'a, Result<bool, AuthzError>> {
            Box::pin(std::future::ready(Ok(self.0.contains(path))))
        }
    }

    /// Static tokens that cost a review each (nothing is cached), as uncached TokenReviews do.
    struct Reviewing(StaticTokens);

    impl Authenticator for Reviewing {
        fn authenticate<'a>(
            &'a self,
            token: &'a str,
        ) -> BoxFuture<'a, Result<Identity, AuthError>> {
            self.0.authenticate(token)
        }
    }

    fn gate(granted: &[&'static str]) -> Gate {
        Gate::kubernetes(
            Arc::new(Reviewing(StaticTokens::new([(
                "good".to_string(),
                "system:serviceaccount:team-a:ctl".to_string(),
            )]))),
            Arc::new(Paths(granted.iter().copied().collect())),
            TenantGrouping::Namespace,
        )
    }

    fn with_token(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
        );
        h
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn open_gate_shows_everything_to_anyone() {
        let v = block_on(Gate::Open.viewer(&HeaderMap::new(), None, "/metrics", false));
        assert_eq!(v, Ok(Viewer::Operator));
    }

    #[test]
    fn no_token_is_unauthenticated() {
        let v = block_on(gate(&[]).viewer(&HeaderMap::new(), None, "/status", true));
        assert!(matches!(v, Err(Refusal::Unauthenticated(_))), "{v:?}");
        let v = block_on(gate(&[]).viewer(&with_token("bad"), None, "/status", true));
        assert!(matches!(v, Err(Refusal::Unauthenticated(_))), "{v:?}");
    }

    #[test]
    fn the_path_grant_sees_all_and_others_their_tenant() {
        let g = gate(&["/status"]);
        let v = block_on(g.viewer(&with_token("good"), None, "/status", true));
        assert_eq!(v, Ok(Viewer::Operator));
        // StaticTokens names the tenant `system:serviceaccount:...` in `username`'s place.
        let v = block_on(g.viewer(&with_token("good"), None, "/", true));
        assert!(matches!(v, Ok(Viewer::Tenant(_))), "{v:?}");
        let v = block_on(g.viewer(&with_token("good"), None, "/metrics", false));
        assert!(matches!(v, Err(Refusal::Forbidden(_))), "{v:?}");
    }

    #[test]
    fn a_peer_presenting_junk_is_slowed_down() {
        let g = gate(&[]);
        let peer = Some(IpAddr::from([10, 0, 0, 9]));
        let refusals: Vec<Refusal> = (0..=AUTH_FAILURE_BURST)
            .filter_map(|_| block_on(g.viewer(&with_token("junk"), peer, "/status", true)).err())
            .collect();
        assert!(
            matches!(refusals.last(), Some(Refusal::TooMany(_))),
            "{refusals:?}"
        );
        // Another peer is not affected.
        let other = block_on(g.viewer(
            &with_token("good"),
            Some(IpAddr::from([10, 0, 0, 8])),
            "/",
            true,
        ));
        assert!(other.is_ok(), "{other:?}");
    }
}
