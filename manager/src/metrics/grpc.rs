//! gRPC server metrics with go-grpc-prometheus' names and labels, so its dashboards and alerts
//! work: calls started, calls handled by status code, and the handling time of unary calls.
//!
//! A stream (a controller's Connect lives as long as its session) is counted when it starts and
//! when it ends, with the code it ended with; its lifetime is not a call latency and is not
//! observed as one. `grpc_service` and `grpc_method` come from a fixed table of the methods the
//! server serves; anything else is counted as `unknown`, so a stranger's paths cannot grow the
//! series.

use super::{counter, histogram};
use prometheus::{HistogramVec, IntCounterVec, Registry};
use std::time::Duration;

/// go-grpc-prometheus' default handling-time buckets (prometheus.DefBuckets).
const HANDLING_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A method as its series name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrpcMethod<'a> {
    /// `grpc_type`: unary, client_stream, server_stream or bidi_stream.
    pub kind: &'a str,
    /// `grpc_service`, e.g. `ctrlhub.v1.ControllerManager`.
    pub service: &'a str,
    /// `grpc_method`, e.g. `Connect`.
    pub method: &'a str,
}

impl GrpcMethod<'_> {
    fn labels(&self) -> [&str; 3] {
        [self.kind, self.service, self.method]
    }
}

/// `grpc_server_*` series.
#[derive(Clone)]
pub(crate) struct GrpcServerMetrics {
    started: IntCounterVec,
    handled: IntCounterVec,
    handling: HistogramVec,
}

impl GrpcServerMetrics {
    /// Registers the series in `r`.
    pub(super) fn register(r: &Registry) -> Self {
        let call = ["grpc_type", "grpc_service", "grpc_method"];
        GrpcServerMetrics {
            started: counter(
                r,
                "grpc_server_started_total",
                "Total number of RPCs started on the server (a Connect stream when it opens).",
                &call,
            ),
            handled: counter(
                r,
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure (a Connect stream when it ends).",
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            ),
            handling: histogram(
                r,
                "grpc_server_handling_seconds",
                "Response latency (seconds) of unary RPCs handled by the server; streams are counted in started and handled only.",
                &call,
                HANDLING_BUCKETS.to_vec(),
            ),
        }
    }

    /// Series at 0 for a method the server serves, so "no calls" reads 0, not "No data".
    pub(crate) fn preinitialise(&self, m: GrpcMethod<'_>) {
        self.started.with_label_values(&m.labels());
        let [kind, service, method] = m.labels();
        self.handled
            .with_label_values(&[kind, service, method, "OK"]);
        if kind == "unary" {
            self.handling.with_label_values(&m.labels());
        }
    }

    /// A call of `m` started.
    pub(crate) fn started(&self, m: GrpcMethod<'_>) {
        self.started.with_label_values(&m.labels()).inc();
    }

    /// A call of `m` ended with `code` (go-grpc-prometheus' names: OK, Canceled, ...) after
    /// `took`; the time is observed for unary calls only.
    pub(crate) fn handled(&self, m: GrpcMethod<'_>, code: &str, took: Duration) {
        let [kind, service, method] = m.labels();
        self.handled
            .with_label_values(&[kind, service, method, code])
            .inc();
        if kind == "unary" {
            self.handling
                .with_label_values(&m.labels())
                .observe(took.as_secs_f64());
        }
    }
}
