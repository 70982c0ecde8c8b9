//! OpenTelemetry for ctrlhub's manager and controllers alike: export over OTLP/gRPC configured by
//! the standard `OTEL_*` environment variables, and W3C Trace Context on ctrlhub's wire messages.
//! The manager and the Rust SDK both use this crate, so neither depends on the other.
//!
//! A binary calls [`init`] once, inside its tokio runtime, and [`Traces::shutdown`] before it
//! exits, so that the last spans are exported rather than lost (e.g. on SIGTERM):
//!
//! ```no_run
//! # async fn example() -> Result<(), ctrlhub_otel::TracesError> {
//! let traces = ctrlhub_otel::init("my-controller")?;
//! // ... run ...
//! traces.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Tracing is on only when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set (and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` says otherwise).
//! When it is off no exporter, thread or connection exists and no spans are created at all.
//! When it is on, the OpenTelemetry SDK reads the rest of the standard variables itself:
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (resource), `OTEL_TRACES_SAMPLER` /
//! `OTEL_TRACES_SAMPLER_ARG` (default `parentbased_always_on`, so a controller follows the
//! manager's sampling decision), `OTEL_BSP_*` (batch span processor), and
//! `OTEL_EXPORTER_OTLP[_TRACES]_{TIMEOUT,HEADERS,COMPRESSION}`. Only the gRPC protocol is built
//! in; the endpoint is a gRPC URL such as `http://otel-collector:4317`.
//!
//! Every process also reports `service.instance.id` (unless `OTEL_RESOURCE_ATTRIBUTES` sets
//! it), so that replicas of one service can be told apart: `POD_NAME` when set (the Downward
//! API), else `<hostname>-<pid>`; in a pod, `k8s.pod.name` and `k8s.namespace.name` from
//! `POD_NAME` and `POD_NAMESPACE`; and with [`init_with_version`], `service.version`.
//!
//! [`logs`] sets up the log output (text or JSON) with the ids of the current trace.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub mod logs;

/// Whether [`init`] installed an exporter in this process.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The instrumentation scope of ctrlhub's own spans.
pub const SCOPE: &str = "ctrlhub";

/// How long [`Traces::shutdown`] waits for the last batch to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The OTLP exporter rejected its configuration (e.g. an invalid
    /// endpoint URL in `OTEL_EXPORTER_OTLP_ENDPOINT`).
    #[error("cannot build the OTLP trace exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The installed trace pipeline; call [`Traces::shutdown`] before exiting.
#[derive(Debug)]
#[must_use = "call Traces::shutdown() before exiting or the last spans are lost"]
pub struct Traces {
    provider: Option<SdkTracerProvider>,
    /// Installed as the global provider by [`init`] (not [`init_component`]).
    global: bool,
}

impl Traces {
    /// No export: what a binary falls back to when [`init`] fails, since a
    /// tracing misconfiguration should not stop a controller.
    pub fn disabled() -> Self {
        Traces {
            provider: None,
            global: false,
        }
    }

    /// Whether spans are exported.
    pub fn enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// A tracer of this pipeline (ctrlhub's scope), for a component that must not use the
    /// global one (see [`init_component`]); None when disabled.
    pub fn tracer(&self) -> Option<SdkTracer> {
        use opentelemetry::trace::TracerProvider as _;
        self.provider.as_ref().map(|p| p.tracer(SCOPE))
    }

    /// Flushes every finished span to the collector (waiting at most 5 s)
    /// and stops the exporter. Spans ended afterwards are dropped.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        if self.global {
            ENABLED.store(false, Ordering::Relaxed);
        }
        // The batch processor blocks until its exporter (driven by this
        // runtime) is done, so it must not block a runtime worker.
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
                .await;
        match flushed {
            Ok(Ok(())) => tracing::debug!("trace exporter flushed and shut down"),
            Ok(Err(e)) => tracing::warn!(error = %e, "trace exporter did not shut down cleanly"),
            Err(e) => tracing::warn!(error = %e, "trace exporter shutdown task failed"),
        }
    }
}

/// Whether traces are exported by this process (after [`init`] found an
/// endpoint). Instrumentation checks this first so that tracing costs
/// nothing when it is off.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
}

/// Sets up trace export from the `OTEL_*` environment (see the module
/// docs); `default_service_name` is the `service.name` used unless
/// `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names one. Must be
/// called inside a tokio runtime (the gRPC exporter runs on it), once per
/// process.
pub fn init(default_service_name: &str) -> Result<Traces, TracesError> {
    init_with_version(default_service_name, None)
}

/// [`init`] for a binary that knows its release: `service.version` is `version` unless
/// `OTEL_RESOURCE_ATTRIBUTES` sets it.
pub fn init_with_version(
    default_service_name: &str,
    version: Option<&str>,
) -> Result<Traces, TracesError> {
    let Some(provider) = provider(ServiceName::Default(default_service_name), version)? else {
        return Ok(Traces::disabled());
    };
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    ENABLED.store(true, Ordering::Relaxed);
    tracing::info!("exporting OpenTelemetry traces over OTLP/gRPC");
    Ok(Traces {
        provider: Some(provider),
        global: true,
    })
}

/// A second trace pipeline in a process that already called [`init`], for a component with a
/// service of its own (`ctrlhub dev` runs the demo controller in the manager's process): the
/// same `OTEL_*` settings, but `service.name` is always `service_name`. Not installed globally;
/// hand [`Traces::tracer`] to the component. Disabled when [`init`] found no endpoint.
pub fn init_component(service_name: &str) -> Result<Traces, TracesError> {
    if !enabled() {
        return Ok(Traces::disabled());
    }
    Ok(Traces {
        provider: provider(ServiceName::Fixed(service_name), None)?,
        global: false,
    })
}

/// Whose `service.name` a pipeline reports.
enum ServiceName<'a> {
    /// This one unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names another.
    Default(&'a str),
    /// Always this one.
    Fixed(&'a str),
}

/// The batch-exporting provider the environment asks for, or None when tracing is off.
fn provider(
    name: ServiceName<'_>,
    version: Option<&str>,
) -> Result<Option<SdkTracerProvider>, TracesError> {
    let endpoint =
        env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || env_set("OTEL_EXPORTER_OTLP_ENDPOINT");
    if !endpoint || env_is("OTEL_SDK_DISABLED", "true") || env_is("OTEL_TRACES_EXPORTER", "none") {
        return Ok(None);
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(p) = std::env::var(var)
            && !p.is_empty()
            && p != "grpc"
        {
            tracing::warn!(
                "{var}={p} is not supported: this build exports traces over OTLP/gRPC only"
            );
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    Ok(Some(
        SdkTracerProvider::builder()
            .with_resource(resource(name, version))
            .with_batch_exporter(exporter)
            .build(),
    ))
}

/// The process's resource: the service's name and version, its instance, and the pod it runs
/// in; what `OTEL_RESOURCE_ATTRIBUTES` sets stays as it says.
fn resource(name: ServiceName<'_>, version: Option<&str>) -> opentelemetry_sdk::Resource {
    let mut resource = opentelemetry_sdk::Resource::builder();
    match name {
        ServiceName::Fixed(n) => resource = resource.with_service_name(n.to_owned()),
        ServiceName::Default(n)
            if !env_set("OTEL_SERVICE_NAME") && !resource_sets("service.name") =>
        {
            resource = resource.with_service_name(n.to_owned());
        }
        ServiceName::Default(_) => {}
    }
    let pod = [
        ("service.version", version.map(str::to_owned)),
        ("service.instance.id", Some(instance_id())),
        ("k8s.pod.name", env_value("POD_NAME")),
        ("k8s.namespace.name", env_value("POD_NAMESPACE")),
    ];
    for (key, value) in pod {
        if let Some(value) = value
            && !resource_sets(key)
        {
            resource = resource.with_attribute(KeyValue::new(key, value));
        }
    }
    resource.build()
}

/// The trimmed value of an environment variable, when it has one.
fn env_value(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Whether `OTEL_RESOURCE_ATTRIBUTES` sets `key`.
fn resource_sets(key: &str) -> bool {
    std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| {
        a.split(',').any(|kv| {
            kv.trim()
                .split_once('=')
                .is_some_and(|(k, _)| k.trim() == key)
        })
    })
}

/// This process among the replicas of its service: the pod's name when the Downward API
/// passes it as `POD_NAME`, else `<hostname>-<pid>` (a pod's hostname is its name too).
pub fn instance_id() -> String {
    if let Some(pod) = env_value("POD_NAME") {
        return pod;
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}-{}", std::process::id())
}

/// ctrlhub's tracer (a no-op before [`init`]).
pub fn tracer() -> opentelemetry::global::BoxedTracer {
    opentelemetry::global::tracer(SCOPE)
}

/// The W3C `traceparent` and `tracestate` of the span in `cx`, as carried by
/// `ReconcileRequest` and `Event`; empty strings when `cx` has no valid span.
/// An unsampled span still yields a `traceparent` (flags `00`) so the
/// receiver follows the sampling decision.
pub fn inject(cx: &Context) -> (String, String) {
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    (
        carrier.remove("traceparent").unwrap_or_default(),
        carrier.remove("tracestate").unwrap_or_default(),
    )
}

/// The remote parent context described by a `traceparent` / `tracestate`
/// pair; an empty context when `traceparent` is empty or invalid.
pub fn extract(traceparent: &str, tracestate: &str) -> Context {
    if traceparent.is_empty() {
        return Context::new();
    }
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
    carrier.insert("traceparent".into(), traceparent.to_owned());
    if !tracestate.is_empty() {
        carrier.insert("tracestate".into(), tracestate.to_owned());
    }
    let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), &carrier);
    if cx.span().span_context().is_valid() {
        cx
    } else {
        Context::new()
    }
}

/// `k8s.namespace.name` / `k8s.object.name` attributes of a key (namespace
/// left out for cluster-scoped objects).
pub fn key_attributes(namespace: &str, name: &str) -> Vec<KeyValue> {
    let mut kv = Vec::with_capacity(2);
    if !namespace.is_empty() {
        kv.push(KeyValue::new("k8s.namespace.name", namespace.to_owned()));
    }
    kv.push(KeyValue::new("k8s.object.name", name.to_owned()));
    kv
}

/// Longest error message kept as a span's status description.
pub const MAX_STATUS_MESSAGE: usize = 256;

/// `message` cut to at most [`MAX_STATUS_MESSAGE`] bytes on a char boundary.
pub fn status_message(message: &str) -> String {
    if message.len() <= MAX_STATUS_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_STATUS_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// Ends a span (the SDK's `reconcile`, or the manager's attempt spans) with its `ctrlhub.outcome` and, on failure, an error status.
pub fn finish(cx: &Context, outcome: &'static str, error: Option<&str>) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("ctrlhub.outcome", outcome));
    if let Some(message) = error {
        span.set_status(opentelemetry::trace::Status::error(status_message(message)));
    }
    span.end();
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn trace_context_round_trips_and_keeps_the_sampling_flag() {
        for flags in [TraceFlags::SAMPLED, TraceFlags::default()] {
            let sc = SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
                SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
                flags,
                false,
                TraceState::from_key_value([("vendor", "x")]).expect("valid"),
            );
            let cx = Context::new().with_remote_span_context(sc.clone());
            let (tp, ts) = inject(&cx);
            assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"));
            assert_eq!(ts, "vendor=x");
            let back = extract(&tp, &ts);
            let got = back.span().span_context().clone();
            assert_eq!(got.trace_id(), sc.trace_id());
            assert_eq!(got.span_id(), sc.span_id());
            assert_eq!(got.is_sampled(), sc.is_sampled());
            assert!(got.is_remote());
        }
    }

    #[test]
    fn no_or_garbage_traceparent_means_no_parent() {
        assert!(!extract("", "").has_active_span());
        assert!(
            !extract("not-a-traceparent", "")
                .span()
                .span_context()
                .is_valid()
        );
        assert_eq!(inject(&Context::new()), (String::new(), String::new()));
    }
}
