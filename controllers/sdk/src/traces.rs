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
//! `opentelemetry::Context::current()` become its children. The Kubernetes
//! API calls of this crate's helpers ([`apply`](crate::write::apply),
//! [`finalizers`](crate::finalizers), [`events`](crate::events)) are CLIENT
//! child spans of it; wrap your own calls in [`k8s_call`] so that a slow
//! write shows in the trace too.
//!
//! The log lines of a reconcile carry its `trace_id` and `span_id` (fields of
//! the `reconcile` log span), so logs and traces join.

pub use ctrlhub_otel::*;

use std::future::Future;

use opentelemetry::trace::{SpanBuilder, SpanKind, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

/// The tracer a reconcile's spans are made with, carried in its context so
/// that child spans use the same one (see [`Config::tracer`](crate::Config::tracer)).
#[derive(Clone, Debug)]
struct ComponentTracer(SdkTracer);

/// Starts a span from `builder` under `parent` with the reconcile's tracer:
/// the one in `parent` (or `own`), else the global one.
fn start(builder: SpanBuilder, parent: &Context, own: Option<&SdkTracer>) -> Context {
    let own = own.or_else(|| parent.get::<ComponentTracer>().map(|t| &t.0));
    match own {
        Some(tracer) => {
            let span = tracer.build_with_context(builder, parent);
            parent
                .with_span(span)
                .with_value(ComponentTracer(tracer.clone()))
        }
        None => {
            let tracer = tracer();
            let span = tracer.build_with_context(builder, parent);
            parent.with_span(span)
        }
    }
}

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
pub fn start_reconcile(
    controller: &str,
    req: &crate::Request<impl Sized>,
    own: Option<&SdkTracer>,
) -> Context {
    let parent = extract(&req.traceparent, &req.tracestate);
    let mut attributes = vec![
        KeyValue::new("ctrlhub.controller", controller.to_owned()),
        KeyValue::new("ctrlhub.attempt", i64::from(req.attempt)),
        KeyValue::new("ctrlhub.request.id", req.id.clone()),
        // The session id this replica logs at registration (`session_id`).
        KeyValue::new("ctrlhub.session.id", req.reader().session_id().to_owned()),
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", "ctrlhub.v1.ControllerManager"),
        KeyValue::new("rpc.method", "Connect"),
    ];
    attributes.extend(key_attributes(&req.key.namespace, &req.key.name));
    let builder = SpanBuilder::from_name("reconcile")
        .with_kind(SpanKind::Server)
        .with_attributes(attributes);
    start(builder, &parent, own)
}

/// A reconcile span that must end with an outcome. Dropped unfinished (the
/// session ended and its task was cancelled), it ends as `lost` with an error
/// status: a reconcile that never answered is not a success.
#[derive(Debug)]
pub(crate) struct ReconcileSpan(Option<Context>);

impl ReconcileSpan {
    /// Guards `cx` (None: tracing is off).
    pub(crate) fn new(cx: Option<Context>) -> Self {
        ReconcileSpan(cx)
    }

    /// The span's context, to run the reconcile function in.
    pub(crate) fn context(&self) -> Context {
        self.0.clone().unwrap_or_default()
    }

    /// `trace_id` and `span_id` for the log span.
    pub(crate) fn ids(&self) -> Option<(String, String)> {
        self.0.as_ref().and_then(logs::ids)
    }

    /// Ends the span with `outcome` (and an error status with `error`).
    pub(crate) fn finish(mut self, outcome: &'static str, error: Option<&str>) {
        if let Some(cx) = self.0.take() {
            finish(&cx, outcome, error);
        }
    }
}

impl Drop for ReconcileSpan {
    fn drop(&mut self) {
        if let Some(cx) = self.0.take() {
            finish(&cx, "lost", Some("session ended before the result"));
        }
    }
}

/// Runs one Kubernetes API call as a CLIENT span `"{method} {resource}"`
/// (e.g. `PATCH deployments`), child of the current span, recording the
/// object's namespace and name and, for a refused call, its HTTP status as an
/// error. Outside a traced reconcile it only awaits `call`.
pub async fn k8s_call<T>(
    method: &'static str,
    resource: &str,
    namespace: &str,
    name: &str,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    use opentelemetry::context::FutureExt as _;
    let parent = Context::current();
    if !enabled() || !parent.has_active_span() {
        return call.await;
    }
    let mut attributes = vec![
        KeyValue::new("http.request.method", method),
        KeyValue::new("k8s.resource.name", resource.to_owned()),
    ];
    attributes.extend(key_attributes(namespace, name));
    let builder = SpanBuilder::from_name(format!("{method} {resource}"))
        .with_kind(SpanKind::Client)
        .with_attributes(attributes);
    let cx = start(builder, &parent, None);
    let result = call.with_context(cx.clone()).await;
    let span = cx.span();
    match &result {
        Ok(_) => {}
        Err(kube::Error::Api(status)) => {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status.code),
            ));
            span.set_status(opentelemetry::trace::Status::error(status_message(
                &status.message,
            )));
        }
        Err(other) => span.set_status(opentelemetry::trace::Status::error(status_message(
            &other.to_string(),
        ))),
    }
    span.end();
    result
}
