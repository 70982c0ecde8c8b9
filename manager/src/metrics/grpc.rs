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

/// Buckets of `ctrlhub_batch_size`: the sizes a batch can have, up to the manager's limit (64).
const BATCH_BUCKETS: &[f64] = &[2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// The Connect method, whose stream messages are counted.
const CONNECT: [&str; 3] = ["bidi_stream", "ctrlhub.v1.ControllerManager", "Connect"];

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
    msg_sent: IntCounterVec,
    msg_received: IntCounterVec,
    batch_size: HistogramVec,
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
            msg_sent: counter(
                r,
                "grpc_server_msg_sent_total",
                "Total number of gRPC stream messages sent by the server (Connect: a batch is one message).",
                &call,
            ),
            msg_received: counter(
                r,
                "grpc_server_msg_received_total",
                "Total number of gRPC stream messages received by the server (Connect: a batch is one message).",
                &call,
            ),
            batch_size: histogram(
                r,
                "ctrlhub_batch_size",
                "Pieces of work (requests, events, results, acks) per batch on Connect streams, by direction (sent, received); a piece that travels alone is not observed.",
                &["direction"],
                BATCH_BUCKETS.to_vec(),
            ),
        }
    }

    /// Series at 0 for a method the server serves, so "no calls" reads 0, not "No data".
    pub(crate) fn preinitialise(&self, m: GrpcMethod<'_>) {
        self.started.with_label_values(&m.labels());
        if m.labels() == CONNECT {
            self.msg_sent.with_label_values(&CONNECT);
            self.msg_received.with_label_values(&CONNECT);
            for direction in ["sent", "received"] {
                self.batch_size.with_label_values(&[direction]);
            }
        }
        let [kind, service, method] = m.labels();
        self.handled
            .with_label_values(&[kind, service, method, "OK"]);
        if kind == "unary" {
            self.handling.with_label_values(&m.labels());
        }
    }

    /// A Connect stream message went out carrying `pieces` pieces of work (0: not work, 1: a
    /// piece alone, more: a batch).
    pub(crate) fn connect_sent(&self, pieces: usize) {
        self.msg_sent.with_label_values(&CONNECT).inc();
        self.batched("sent", pieces);
    }

    /// A Connect stream message came in carrying `pieces` pieces of work (as above).
    pub(crate) fn connect_received(&self, pieces: usize) {
        self.msg_received.with_label_values(&CONNECT).inc();
        self.batched("received", pieces);
    }

    fn batched(&self, direction: &str, pieces: usize) {
        if pieces > 1 {
            self.batch_size
                .with_label_values(&[direction])
                .observe(pieces as f64);
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
