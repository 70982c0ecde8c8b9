//! The manager's own Kubernetes API traffic, as client-go reports a component's
//! (`rest_client_*`): requests by verb, resource and status code, their latency, and how long
//! requests waited for the client's rate limiter. Labels are bounded: the verb comes from the
//! method (LIST and WATCH told apart), the resource is the path's plural only, never a name or
//! a namespace.

use super::{counter, histogram};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, Registry};
use std::time::Duration;

/// client-go's `rest_client_request_duration_seconds` buckets (5 ms to 60 s).
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// client-go's `rest_client_rate_limiter_duration_seconds` buckets.
const LIMITER_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// `rest_client_*` series of the manager's Kubernetes clients.
#[derive(Clone)]
pub(crate) struct ApiClientMetrics {
    requests: IntCounterVec,
    latency: HistogramVec,
    limiter_wait: Histogram,
}

impl ApiClientMetrics {
    /// Registers the series in `r`.
    pub(super) fn register(r: &Registry) -> Self {
        let limiter_wait = Histogram::with_opts(
            HistogramOpts::new(
                "rest_client_rate_limiter_duration_seconds",
                "How long requests to the Kubernetes API waited for the client's rate limiter (--kube-api-qps, --kube-api-burst)",
            )
            .buckets(LIMITER_BUCKETS.to_vec()),
        );
        ApiClientMetrics {
            requests: counter(
                r,
                "rest_client_requests_total",
                "Requests to the Kubernetes API by verb (GET, LIST, WATCH, POST, PUT, PATCH, DELETE), resource (plural) and HTTP status code (<error> when no response came)",
                &["verb", "resource", "code"],
            ),
            latency: histogram(
                r,
                "rest_client_request_duration_seconds",
                "Time from sending a request to the Kubernetes API to its response headers (a watch: to its start), by verb and resource",
                &["verb", "resource"],
                LATENCY_BUCKETS.to_vec(),
            ),
            limiter_wait: super::register(
                r,
                "rest_client_rate_limiter_duration_seconds",
                limiter_wait,
            ),
        }
    }

    /// A request answered with `code` (or `<error>`) after `took`.
    pub(crate) fn observe(&self, verb: &str, resource: &str, code: &str, took: Duration) {
        self.requests
            .with_label_values(&[verb, resource, code])
            .inc();
        self.latency
            .with_label_values(&[verb, resource])
            .observe(took.as_secs_f64());
    }

    /// A request waited `waited` for the rate limiter (zero when a token was there).
    pub(crate) fn limiter_waited(&self, waited: Duration) {
        self.limiter_wait.observe(waited.as_secs_f64());
    }

    /// The series every dashboard panel reads exist from the start: the Lease requests of
    /// leader election, which every replica makes.
    pub(super) fn preinitialise(&self) {
        for verb in ["GET", "PUT"] {
            self.latency.with_label_values(&[verb, "leases"]);
            self.requests.with_label_values(&[verb, "leases", "200"]);
        }
    }
}
