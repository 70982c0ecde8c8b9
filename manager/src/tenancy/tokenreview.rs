//! Authentication of controllers by their ServiceAccount tokens, through the Kubernetes
//! TokenReview API.
//!
//! The token must be valid *for ctrlhub's audience*: a projected token minted for another
//! service is refused even though it authenticates to the API server. Decisions are cached
//! briefly (reference: 2 minutes) so a reconnect storm does not become a TokenReview storm; a
//! rotated token is simply a new cache key, so long-lived sessions keep working.
//!
//! The HTTP port authenticates with the same reviewer but for the API server's own audience
//! ([`TokenReviewAuthenticator::for_api_audience`]): Prometheus and people present the tokens
//! they already have for the API server, as with controller-runtime's secured metrics.

use crate::metrics::auth::ReviewMetrics;
use crate::tenancy::decision_cache::TtlCache;
use crate::tenancy::{AuthError, Authenticator, BoxFuture, Identity};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// How many distinct tokens the cache remembers; beyond that, it evicts.
const CACHE_ENTRIES: usize = 10_000;

/// Authenticates bearer tokens with TokenReview.
pub(crate) struct TokenReviewAuthenticator {
    api: Api<TokenReview>,
    /// The audience tokens must carry; `None`: the API server's own.
    audience: Option<String>,
    ttl: Duration,
    cache: Mutex<TtlCache<String, Result<Identity, AuthError>>>,
    /// Review latency and cache hits, when the manager records them.
    metrics: Option<ReviewMetrics>,
}

impl TokenReviewAuthenticator {
    /// Review tokens through `client`, accepting only tokens for `audience`; decisions are
    /// cached for `ttl`.
    pub(crate) fn new(client: kube::Client, audience: impl Into<String>, ttl: Duration) -> Self {
        TokenReviewAuthenticator {
            api: Api::all(client),
            audience: Some(audience.into()),
            ttl,
            cache: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            metrics: None,
        }
    }

    /// Review tokens for the API server's own audience (what a ServiceAccount's mounted token
    /// and `kubectl create token` carry); decisions are cached for `ttl`.
    pub(crate) fn for_api_audience(client: kube::Client, ttl: Duration) -> Self {
        TokenReviewAuthenticator {
            api: Api::all(client),
            audience: None,
            ttl,
            cache: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            metrics: None,
        }
    }

    /// Records each decision as a cache hit or a timed review in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: ReviewMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The cached decision for `token`, counted as a hit.
    fn lookup(&self, token: &str, now: Instant) -> Option<Result<Identity, AuthError>> {
        let hit = self.cache.lock().get(&token.to_string(), now);
        if let (Some(_), Some(m)) = (&hit, &self.metrics) {
            m.hit();
        }
        hit
    }

    /// A TokenReview, timed.
    async fn timed_review(&self, token: &str) -> Result<Identity, AuthError> {
        let started = Instant::now();
        let decided = self.review(token).await;
        if let Some(m) = &self.metrics {
            m.reviewed(started.elapsed());
        }
        decided
    }

    async fn review(&self, token: &str) -> Result<Identity, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: self.audience.clone().map(|a| vec![a]),
            },
            ..Default::default()
        };
        let answer = self
            .api
            .create(&PostParams::default(), &review)
            .await
            // kube's error text names the request, never the body, so the token stays out.
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            // The API server says why (expired, audience); only the audience case is worth
            // telling the caller apart, and its message must not echo anything token-derived.
            let error = status.error.unwrap_or_default();
            if let Some(audience) = &self.audience
                && error.contains("audience")
            {
                return Err(AuthError::WrongAudience(audience.clone()));
            }
            return Err(AuthError::Rejected);
        }
        // An API server that ignores spec.audiences returns none: do not take that as a yes.
        if let Some(audience) = &self.audience {
            let audiences = status.audiences.unwrap_or_default();
            if !audiences.iter().any(|a| a == audience) {
                return Err(AuthError::WrongAudience(audience.clone()));
            }
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        if username.is_empty() {
            return Err(AuthError::Rejected);
        }
        Ok(Identity {
            tenant: username.clone(),
            username,
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
        })
    }
}

impl Authenticator for TokenReviewAuthenticator {
    fn cached(&self, token: &str) -> Option<Result<Identity, AuthError>> {
        self.lookup(token, Instant::now())
    }

    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, AuthError>> {
        Box::pin(async move {
            let now = Instant::now();
            if let Some(hit) = self.lookup(token, now) {
                return hit;
            }
            let decided = self.timed_review(token).await;
            // An outage is not a decision: the next attempt asks again.
            if !matches!(decided, Err(AuthError::Unavailable(_))) {
                self.cache
                    .lock()
                    .insert(token.to_string(), decided.clone(), self.ttl, now);
            }
            decided
        })
    }
}
