"""TLS and mutual TLS to a real manager serving them, and the reconcile span joining the
manager's trace in OpenTelemetry."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ctrlhub
import trustme
from conftest import Cluster, Manager, Running, eventually
from test_session import QUIET


def pems(tmp: Path) -> dict[str, Path]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client_ca = trustme.CA()
    client = client_ca.issue_cert("controller.example")
    files = {
        "ca": ca.cert_pem, "server_cert": server.cert_chain_pems[0], "server_key": server.private_key_pem,
        "client_ca": client_ca.cert_pem, "client_cert": client.cert_chain_pems[0], "client_key": client.private_key_pem,
    }
    out = {}
    for name, blob in files.items():
        out[name] = tmp / f"{name}.pem"
        blob.write_to_path(str(out[name]))
    return out




async def test_tls_and_mutual_tls(devcluster: Cluster, start_manager: Callable[..., Manager], ns: str,
                                  serve: Callable[..., Running], tmp_path: Path) -> None:
    p = pems(tmp_path)
    seen: list[str] = []

    def operator(name: str) -> ctrlhub.Operator:
        op = ctrlhub.Operator()
        op.reconcile("v1/ConfigMap", name=name, namespaces=ns)(lambda key: seen.append(str(key)))
        return op

    # Server TLS, verified against its CA; the address as host:port with TLS files means TLS.
    m = start_manager(extra=("--grpc-tls-cert", str(p["server_cert"]), "--grpc-tls-key", str(p["server_key"])))
    await m.leading()
    running = serve(operator(f"{ns}-tls"), ctrlhub.Config(addr=m.addr, tls=ctrlhub.TLS(ca_file=p["ca"])))
    devcluster.configmap(ns, "k")
    await eventually("a reconcile over TLS", lambda: seen)
    await running.stop()
    m.stop()

    # Mutual TLS: without a client certificate nothing registers; with one it does.
    m = start_manager(extra=("--grpc-tls-cert", str(p["server_cert"]), "--grpc-tls-key", str(p["server_key"]),
                             "--grpc-client-ca", str(p["client_ca"])))
    await m.leading()
    anonymous = operator(f"{ns}-anon")
    serve(anonymous, ctrlhub.Config(addr=f"https://{m.addr}", tls=ctrlhub.TLS(ca_file=p["ca"]), reconnect_max=0.5))
    await asyncio.sleep(QUIET)
    assert anonymous.controllers[0].session_id is None and m.controller(f"{ns}-anon") is None
    tls = ctrlhub.TLS(ca_file=p["ca"], cert_file=p["client_cert"], key_file=p["client_key"], server_name="localhost")
    mutual = operator(f"{ns}-mtls")
    serve(mutual, ctrlhub.Config(addr=f"https://127.0.0.1:{m.grpc_port}", tls=tls))
    await eventually("an mTLS session", lambda: mutual.controllers[0].session_id)


async def test_reconcile_span_continues_the_managers_trace(devcluster: Cluster, start_manager: Callable[..., Manager],
                                                           ns: str, serve: Callable[..., Running]) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    await eventually("the SDK to see the provider", ctrlhub.traces.enabled)

    # Tracing on in the manager (exporting to nowhere): every request carries a traceparent.
    m = start_manager(env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    await m.leading()
    got: dict[str, Any] = {}

    op = ctrlhub.Operator()
    captured: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    logging.getLogger(f"ctrlhub.{ns}").addHandler(Capture())
    logging.getLogger(f"ctrlhub.{ns}").setLevel(logging.INFO)

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns)
    async def traced(request: ctrlhub.Request, logger: Any) -> None:
        with trace.get_tracer("test").start_as_current_span("inner"):
            pass
        got.update(traceparent=request.traceparent, mine=request.span_traceparent)
        logger.info("inside the span")
        got["line"] = json.loads(ctrlhub.JsonFormatter().format([r for r in captured if r.msg == "inside the span"][-1]))

    serve(op, ctrlhub.Config(addr=m.addr))
    devcluster.configmap(ns, "t")
    await eventually("a traced reconcile", lambda: got)
    spans = {s.name: s for s in await eventually("both spans", lambda: len(exporter.get_finished_spans()) >= 2 and exporter.get_finished_spans())}
    _, trace_id, parent_id, flags = got["traceparent"].split("-")
    reconcile, inner = spans["reconcile"], spans["inner"]
    assert f"{reconcile.context.trace_id:032x}" == trace_id and f"{reconcile.parent.span_id:016x}" == parent_id
    assert reconcile.kind == trace.SpanKind.SERVER and reconcile.attributes["ctrlhub.controller"] == ns
    assert reconcile.attributes["ctrlhub.outcome"] == "success"
    assert inner.parent.span_id == reconcile.context.span_id, "spans the handler starts are children"
    assert got["mine"] == f"00-{trace_id}-{reconcile.context.span_id:016x}-{flags}"
    span = got["line"]["span"]  # a JSON log line joins the trace: the handler's span, the manager's trace
    assert (span["trace_id"], span["span_id"]) == (trace_id, f"{reconcile.context.span_id:016x}") and span["key"] == f"{ns}/t"
