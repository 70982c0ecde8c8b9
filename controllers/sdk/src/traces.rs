//! OpenTelemetry traces of a controller: [`ctrlhub_otel`] (setup from the standard `OTEL_*`
//! variables and W3C propagation, shared with the manager) re-exported, plus the controller's
//! side of a reconcile.
//!
//! A controller binary calls [`init`] once, inside its tokio runtime, and [`Traces::shutdown`]
//! before it exits, so that the spans of the last reconciles are exported rather than lost:
//!
//! ```no_run
//! # async fn example() -> Result<(), ctrlhub_sdk::traces::TracesError> {
//! let traces = ctrlhub_sdk::traces::init("my-controller")?;
//! // ... Controller::run(..).await ...
//! traces.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Each reconcile runs inside a span named `reconcile` of kind SERVER whose
//! parent is the manager's dispatch span (from
//! `ReconcileRequest.traceparent`), so one trace spans the manager's queue,
//! the gRPC hop and the controller. The span is the current OpenTelemetry
//! context while the reconcile function runs: spans started from
//! `opentelemetry::Context::current()` become its children.

pub use ctrlhub_otel::*;

use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::{Context, KeyValue};

/// The `ctrlhub.outcome` of a result and, for failures, its message.
pub fn outcome_label(
    outcome: &ctrlhub_proto::v1::reconcile_result::Outcome,
) -> (&'static str, Option<&str>) {
    use ctrlhub_proto::v1::reconcile_result::Outcome as O;
    match outcome {
        O::Done(_) => ("success", None),
        O::RequeueAfter(r)
            if r.delay
                .as_ref()
                .is_none_or(|d| d.seconds == 0 && d.nanos == 0) =>
        {
            ("requeue", None)
        }
        O::RequeueAfter(_) => ("requeue_after", None),
        O::Error(e) => ("error", Some(e.message.as_str())),
        O::Terminal(t) => ("terminal", Some(t.message.as_str())),
    }
}

/// Starts the controller side of one reconcile: a SERVER span named
/// `reconcile`, child of the manager's dispatch span named by
/// `traceparent` (a new trace when it is empty). SERVER because a
/// ReconcileRequest is a request/response exchange (exactly one result,
/// under a deadline) whose caller is the manager's CLIENT dispatch span,
/// not a fire-and-forget message. Only the key, attempt and ids are
/// recorded — never the object or any credential.
pub fn start_reconcile(controller: &str, req: &crate::Request<impl Sized>) -> Context {
    use opentelemetry::trace::{SpanKind, Tracer as _};
    let parent = extract(&req.traceparent, &req.tracestate);
    let mut attributes = vec![
        KeyValue::new("ctrlhub.controller", controller.to_owned()),
        KeyValue::new("ctrlhub.attempt", i64::from(req.attempt)),
        KeyValue::new("ctrlhub.request.id", req.id.clone()),
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", "ctrlhub.v1.ControllerManager"),
        KeyValue::new("rpc.method", "Connect"),
    ];
    attributes.extend(key_attributes(&req.key.namespace, &req.key.name));
    let tracer = tracer();
    let span = tracer
        .span_builder("reconcile")
        .with_kind(SpanKind::Server)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    parent.with_span(span)
}
