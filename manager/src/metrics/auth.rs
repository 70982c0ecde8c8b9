//! How authentication and authorization decisions are made: the latency of the TokenReviews and
//! SubjectAccessReviews sent to the API server, and how many decisions came from the cache
//! instead. A falling hit ratio means reviews per connection, and a reconnect storm becomes a
//! review storm.

use super::{counter, histogram};
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, Registry};
use std::time::Duration;

/// Review latency buckets: a healthy API server answers in milliseconds; a slow one in seconds.
const REVIEW_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `ctrlhub_auth_*` series.
#[derive(Clone)]
pub(crate) struct AuthMetrics {
    latency: HistogramVec,
    decisions: IntCounterVec,
}

impl AuthMetrics {
    /// Registers the series in `r`.
    pub(super) fn register(r: &Registry) -> Self {
        AuthMetrics {
            latency: histogram(
                r,
                "ctrlhub_auth_review_duration_seconds",
                "Time the API server took to answer a review: review is token (TokenReview) or access (SubjectAccessReview); port is grpc (controllers) or http (Prometheus, people)",
                &["review", "port"],
                REVIEW_BUCKETS.to_vec(),
            ),
            decisions: counter(
                r,
                "ctrlhub_auth_decisions_total",
                "Authentication and authorization decisions by where they came from: cache (hit) or a review sent to the API server (miss)",
                &["review", "port", "result"],
            ),
        }
    }

    /// The handle a reviewer of `review` (token or access) on `port` records with; its series
    /// exist at 0 from now on.
    pub(crate) fn reviewer(&self, review: &str, port: &str) -> ReviewMetrics {
        ReviewMetrics {
            latency: self.latency.with_label_values(&[review, port]),
            hits: self.decisions.with_label_values(&[review, port, "hit"]),
            misses: self.decisions.with_label_values(&[review, port, "miss"]),
        }
    }
}

/// One reviewer's series, labels bound.
#[derive(Clone)]
pub(crate) struct ReviewMetrics {
    latency: Histogram,
    hits: IntCounter,
    misses: IntCounter,
}

impl ReviewMetrics {
    /// A decision answered from the cache.
    pub(crate) fn hit(&self) {
        self.hits.inc();
    }

    /// A review sent to the API server, answered (or failed) after `took`.
    pub(crate) fn reviewed(&self, took: Duration) {
        self.misses.inc();
        self.latency.observe(took.as_secs_f64());
    }
}
