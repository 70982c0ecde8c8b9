"""W3C trace context: each handler runs in a ``reconcile`` span whose parent is the manager's
dispatch span (``ReconcileRequest.traceparent``), so one trace covers the manager's queue, the
gRPC hop and your handler.

With OpenTelemetry installed (``pip install 'ctrlhub-sdk[otel]'``) and a tracer provider set,
the span is a real OpenTelemetry span and the current span while the handler runs: spans your
handler starts become its children. ``init()`` sets such a provider from the standard
``OTEL_*`` variables, exporting over OTLP/gRPC. Without OpenTelemetry nothing is recorded, and
``Request.span_traceparent`` still names a span id of its own, so logs can carry it.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["child_traceparent", "enabled", "init", "reconcile_span"]

_HAVE_OTEL = importlib.util.find_spec("opentelemetry") is not None


def child_traceparent(traceparent: str) -> str:
    """A traceparent for a new span under ``traceparent``: the same trace id and flags, a new
    random span id; ``""`` when ``traceparent`` is not a valid version-00 traceparent."""
    parts = traceparent.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return ""
    return f"00-{parts[1]}-{secrets.token_hex(8)}-{parts[3]}"


_provider_set = False
_last_look = -1e9


def enabled() -> bool:
    """Whether OpenTelemetry is installed and a tracer provider (not the no-op default) is set.
    Cheap enough per request: a provider can be set only once, and until it is we look again
    at most once a second."""
    global _provider_set, _last_look
    if not _HAVE_OTEL or _provider_set:
        return _provider_set
    now = time.monotonic()
    if now - _last_look < 1.0:
        return False
    _last_look = now
    from opentelemetry import trace

    _provider_set = not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    return _provider_set


@contextmanager
def reconcile_span(controller: str, kind: str, key: str, request_id: str, attempt: int, traceparent: str, tracestate: str) -> Iterator[Any]:
    """The handler's span, current for the duration of the ``with`` block; yields an object
    with ``traceparent`` (the span's own) and ``set_outcome(label, error)``."""
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    parent = TraceContextTextMapPropagator().extract(carrier) if traceparent else context.Context()
    namespace, _, name = key.rpartition("/")
    span = trace.get_tracer("ctrlhub").start_span(
        kind,
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={
            "ctrlhub.controller": controller,
            "ctrlhub.attempt": attempt,
            "ctrlhub.request.id": request_id,
            "k8s.namespace.name": namespace,
            "ctrlhub.key.name": name,
            "rpc.system": "grpc",
            "rpc.service": "ctrlhub.v1.ControllerManager",
            "rpc.method": "Connect",
        },
    )
    handle = _Span(span)
    token = context.attach(trace.set_span_in_context(span, parent))
    try:
        yield handle
    finally:
        context.detach(token)
        span.end()


class _Span:
    def __init__(self, span: Any) -> None:
        from opentelemetry import trace

        self._span = span
        ctx = span.get_span_context()
        self.traceparent = (
            f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}" if ctx.is_valid and isinstance(span, trace.Span) else ""
        )

    def set_outcome(self, label: str, error: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("ctrlhub.outcome", label)
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))


def init(service_name: str) -> Any:
    """Set an OpenTelemetry tracer provider that exports over OTLP/gRPC to
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (and the other standard ``OTEL_*`` variables), with
    ``service.name`` = ``OTEL_SERVICE_NAME`` or ``service_name``. Returns the provider (call
    ``shutdown()`` on it before exiting so the last spans are exported), or None when no
    endpoint is configured or the ``otel`` extra is not installed."""
    if not _HAVE_OTEL or not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider
