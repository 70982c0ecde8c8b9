//! Log output for ctrlhub's binaries: human-readable text or one JSON object per line, chosen
//! with `--log-format` / `CTRLHUB_LOG_FORMAT`, filtered by `RUST_LOG`.
//!
//! JSON lines are tracing-subscriber's own format: `timestamp`, `level`, `target`, the event's
//! `fields` (with `message`) and the current `span` with its fields. Inside a traced reconcile
//! that span is `reconcile` and carries `trace_id` and `span_id`, the ids of its OpenTelemetry
//! span, so a log line joins its trace (e.g. a Grafana derived field on `"trace_id":"(\w+)"`).

use std::io::IsTerminal as _;
use tracing_subscriber::EnvFilter;

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event; colours only on a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the process's log subscriber: `format` on stderr, filtered by `RUST_LOG` or, when
/// that is unset or invalid, by `default_filter` (e.g. `"info,kube=warn"`). Call once, first.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // `try_init`: a second call (a test harness, an embedding program) keeps the first one.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

/// The `trace_id` and `span_id` (lowercase hex, as in `traceparent`) of the span in `cx`, for
/// log fields; `None` when `cx` has no valid span.
pub fn ids(cx: &opentelemetry::Context) -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt as _;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}
