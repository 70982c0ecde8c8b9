//! The manager's own Kubernetes clients: every `kube::Client` the manager uses is built here,
//! on kube's default stack plus two tower layers.
//!
//! - [`observe`]: client-go's `rest_client_*` metrics (requests by verb, resource and code, and
//!   their latency), so a slow or failing API server — a Lease whose requests take seconds, a
//!   freeze that answers 503 — shows in `/metrics`.
//! - [`limit`]: client-go's QPS and burst, a token bucket every request takes one token from
//!   before it is sent (`--kube-api-qps`, `--kube-api-burst`), so a new leader relisting every
//!   tenant's informers at once cannot flood the API server. A watch takes its token when it
//!   starts and holds nothing while it runs.
//!
//! The leader-election client gets the metrics but not the limit: it makes two requests per
//! retry period at most, and sharing a bucket with tenants' lists would let a relist storm
//! delay a renewal until the Lease is lost.
//!
//! Owns: client construction. May call: `metrics`.

pub(crate) mod limit;
pub(crate) mod observe;

use crate::metrics::api::ApiClientMetrics;
use http::Request;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder};
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

pub(crate) use limit::Qps;

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// kube could not build its HTTP stack from the configuration (TLS, proxy, auth).
    #[error("building the Kubernetes client: {0}")]
    Kube(#[from] kube::Error),
}

/// How many requests may wait in the client's inner buffer (kube's own buffer holds as many).
const BUFFER: usize = 1024;

/// A client for `config` whose requests are counted and timed in `metrics` and, with `qps`,
/// limited to that rate. Builds the client's connection tasks on the current runtime.
///
/// Layers, innermost first: kube's stack without its retries → `observe` → `limit` → a buffer
/// → kube's own retry policy (429, 503 and 504 again with backoff). Every attempt is counted
/// and takes a token, as client-go counts and throttles them: a Lease whose writes answer 503
/// shows as 503s, not as nothing until the caller's timeout.
pub(crate) fn build(
    mut config: kube::Config,
    metrics: &ApiClientMetrics,
    qps: Option<Qps>,
) -> Result<kube::Client, ClientError> {
    let retries = std::mem::replace(&mut config.default_retry, false);
    let limiter = qps.and_then(|q| q.limiter());
    let builder = ClientBuilder::try_from(config)?
        .with_layer(&observe::ObserveLayer::new(metrics))
        // Outside the metrics: latency is the API server's, not the time spent waiting here
        // (that is rest_client_rate_limiter_duration_seconds).
        .with_layer(&limit::LimitLayer::new(limiter, metrics))
        // The retry layer needs a service it can clone.
        .with_layer(&BufferLayer::<Request<Body>>::new(BUFFER));
    let policy = retries.then(RetryPolicy::server_retry);
    Ok(builder
        .with_layer(&RetryLayer::new(Optional(policy)))
        .build())
}

/// kube's retry policy, or none when the configuration turned retries off.
#[derive(Clone)]
struct Optional(Option<RetryPolicy>);

impl<Res, E> tower::retry::Policy<Request<Body>, http::Response<Res>, E> for Optional
where
    RetryPolicy: tower::retry::Policy<Request<Body>, http::Response<Res>, E>,
{
    type Future =
        <RetryPolicy as tower::retry::Policy<Request<Body>, http::Response<Res>, E>>::Future;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<http::Response<Res>, E>,
    ) -> Option<Self::Future> {
        self.0.as_mut()?.retry(req, result)
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        self.0.as_mut()?.clone_request(req)
    }
}
