"""Logs an operator can run on: the level and format from CTRLHUB_LOG / CTRLHUB_LOG_FORMAT, one
line per reconcile start and end, failures at WARN in one line with a traceback at most once
a minute per key, the key and request id on every line logged during a reconcile (JSON lines
in the manager's shape, with trace and span ids), leader changes logged as reconnecting, and
the reconnect backoff reset by every registration."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import ctrlhub
import pytest
from conftest import Cluster, Manager, Running, eventually
from ctrlhub._logs import ContextFilter, Span, TracebackBudget, current, format_from_env, level_from_env


def cfg(m: Manager, **kw: Any) -> ctrlhub.Config:
    return ctrlhub.Config(addr=f"http://{m.addr}", **{"reconnect_initial": 0.05, "reconnect_max": 0.5, **kw})


# ---- units ---------------------------------------------------------------------------------------


def test_level_and_format_come_from_the_same_variables_as_in_every_sdk() -> None:
    assert level_from_env({}) == logging.INFO
    assert [level_from_env({"CTRLHUB_LOG": v}) for v in ("error", "warn", "info", "debug", "trace", " DEBUG ")] == [
        logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG, ctrlhub.TRACE, logging.DEBUG]
    with pytest.raises(ctrlhub.ConfigError, match="CTRLHUB_LOG='loud': the log level is one of error, warn, info, debug, trace"):
        level_from_env({"CTRLHUB_LOG": "loud"})
    assert format_from_env({}) == "text" and format_from_env({"CTRLHUB_LOG_FORMAT": "json"}) == "json"
    with pytest.raises(ctrlhub.ConfigError, match="CTRLHUB_LOG_FORMAT='yaml'"):
        format_from_env({"CTRLHUB_LOG_FORMAT": "yaml"})


def test_run_refuses_an_unknown_level_in_one_line(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    script = tmp_path / "c.py"
    script.write_text("import ctrlhub\n@ctrlhub.reconcile('v1/ConfigMap')\nasync def c(key): pass\nctrlhub.run()\n")
    proc = subprocess.run([sys.executable, str(script)], env={**os.environ, "CTRLHUB_LOG": "loud"}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "CTRLHUB_LOG='loud': the log level is one of error, warn, info, debug, trace" in proc.stderr
    assert "Traceback" not in proc.stderr


class _Traced:
    span_traceparent = "00-427cc54d8016c41e51b4e24e7a0f4578-fdb7b6d5d6316525-01"


def _record(msg: str, level: int = logging.INFO, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("ctrlhub.web", level, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def test_json_lines_have_the_managers_shape_with_trace_and_span_ids() -> None:
    span = Span("web", "shop/blog", "web-3", 2, "web-abc", _Traced())
    line = json.loads(ctrlhub.JsonFormatter().format(_record("reconcile end", logging.WARNING, ctrlhub_span=span,
                                                             ctrlhub_fields={"key": "shop/blog", "outcome": "error"})))
    assert set(line) == {"timestamp", "level", "target", "fields", "span"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line["timestamp"]) and line["level"] == "WARN"
    assert line["target"] == "ctrlhub.web" and line["fields"] == {"message": "reconcile end", "key": "shop/blog", "outcome": "error"}
    assert line["span"] == {"name": "reconcile", "controller": "web", "key": "shop/blog", "request_id": "web-3", "attempt": 2,
                            "session_id": "web-abc", "trace_id": "427cc54d8016c41e51b4e24e7a0f4578", "span_id": "fdb7b6d5d6316525"}
    plain = json.loads(ctrlhub.JsonFormatter().format(_record("registered")))
    assert "span" not in plain, "outside a reconcile: no span"


def test_text_lines_carry_the_key_and_request_id_once() -> None:
    span = Span("web", "shop/blog", "web-3", 1, "s")
    text = ctrlhub.TextFormatter()
    assert text.format(_record("patched the Service", ctrlhub_span=span)).endswith(
        " INFO ctrlhub.web: patched the Service key=shop/blog request_id=web-3")
    own = text.format(_record("reconcile end key=shop/blog outcome=success", ctrlhub_span=span, ctrlhub_fields={"key": "shop/blog"}))
    assert own.endswith("reconcile end key=shop/blog outcome=success request_id=web-3")


def test_a_traceback_at_most_once_a_minute_per_key() -> None:
    budget = TracebackBudget(60)
    assert budget.allow("a", 0.0) and not budget.allow("a", 59.0) and budget.allow("b", 59.0) and budget.allow("a", 60.5)


# ---- against the manager ---------------------------------------------------------------------------


async def test_failures_are_one_warn_line_each_with_one_traceback_a_minute(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    op = ctrlhub.Operator()
    attempts: list[int] = []
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(ctrlhub.JsonFormatter())
    handler.addFilter(ContextFilter())
    logging.getLogger().addHandler(handler)

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns, backoff=(0.005, 0.02))
    def fails(attempt: int, logger: logging.LoggerAdapter[logging.Logger]) -> None:
        attempts.append(attempt)
        logger.info("trying")  # the handler's logger
        logging.getLogger("some.library").info("a library's line")  # any logger, on the handler's thread
        if attempt < 8:
            raise ValueError(f"broken {attempt % 1}")

    caplog.set_level("INFO")
    try:
        serve(op, cfg(manager))
        devcluster.configmap(ns, "flaky")
        await eventually("eight attempts", lambda: (r := manager.controller(ns)) and len(attempts) >= 8 and r.get("inFlight") == 0)
    finally:
        logging.getLogger().removeHandler(handler)
    mine = [r for r in caplog.records if getattr(r, "ctrlhub_fields", {}).get("key") == f"{ns}/flaky"]
    ends = [r for r in mine if r.getMessage().startswith("reconcile end")]
    assert [r.levelname for r in ends] == ["WARNING"] * 7 + ["INFO"], [r.getMessage() for r in ends]
    assert all("outcome=error" in r.getMessage() and "error=ValueError: broken 0" in r.getMessage() for r in ends[:7])
    assert sum(r.exc_info is not None for r in caplog.records) == 1, "one traceback for the key in this minute"
    assert "(at test_logs.py:" in ends[1].getMessage(), "the others say where, in one line"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a handler failure is no ERROR"
    starts = [r for r in mine if r.getMessage().startswith("reconcile start")]
    assert len(starts) == 8 and starts[1].ctrlhub_fields["reasons"] == ["RETRY"]
    assert ends[-1].ctrlhub_fields["outcome"] == "success" and isinstance(ends[-1].ctrlhub_fields["duration_ms"], int)
    json_lines = [json.loads(line) for line in out.getvalue().splitlines()]
    for message in ("trying", "a library's line"):
        found = [j for j in json_lines if j["fields"]["message"] == message]
        assert len(found) == 8 and all(j["span"]["key"] == f"{ns}/flaky" for j in found), found[:1]
        assert len({j["span"]["request_id"] for j in found}) == 8, "each attempt its own request id"


async def test_a_manager_shutting_down_is_reconnecting_never_rejected(
    devcluster: Cluster, start_manager: Callable[..., Manager], ns: str, serve: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
) -> None:
    m1 = start_manager(extra=("--shutdown-grace", "3s"))
    await m1.leading()
    op = ctrlhub.Operator()
    seen: list[str] = []
    op.reconcile("v1/ConfigMap", name=ns, namespaces=ns)(lambda name: seen.append(name))
    caplog.set_level("INFO", logger=f"ctrlhub.{ns}")
    serve(op, cfg(m1, reconnect_initial=0.02, reconnect_max=0.05))
    devcluster.configmap(ns, "before")
    await eventually("the first key", lambda: "before" in seen)
    m1.proc.send_signal(signal.SIGTERM)  # revokes the session, then answers UNAVAILABLE until it exits
    await asyncio.get_running_loop().run_in_executor(None, m1.proc.wait, 60)
    m2 = start_manager(grpc_port=m1.grpc_port)
    await m2.leading()
    devcluster.configmap(ns, "after")
    await eventually("a key through the next manager", lambda: "after" in seen)
    text = "\n".join(f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.name == f"ctrlhub.{ns}")
    assert "reconnecting in" in text, text
    assert "reject" not in text.lower(), text
    assert not [r for r in caplog.records if r.name == f"ctrlhub.{ns}" and r.levelno >= logging.WARNING and "session ended" in r.getMessage()], text


async def test_two_manager_restarts_in_a_row_each_cost_one_first_backoff_step(
    devcluster: Cluster, start_manager: Callable[..., Manager], ns: str, serve: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 2-pod rollout of the manager: the session registered with the second manager ends
    within a second of registering, and the reconnect still waits one first step (0.2 s at
    most here), not a delay grown by the failed connection attempts before it."""
    m1 = start_manager()
    await m1.leading()
    op = ctrlhub.Operator()
    op.reconcile("v1/ConfigMap", name=ns, namespaces=ns)(lambda name: None)
    controller = op.controllers[0]
    caplog.set_level("INFO", logger=f"ctrlhub.{ns}")
    serve(op, cfg(m1, reconnect_initial=0.2, reconnect_max=10))
    def reconnects() -> list[float]:
        return [float(m.group(1)) for r in caplog.records if (m := re.search(r"reconnecting in (\d+) ms", r.getMessage()))]

    first = await eventually("registered with the first manager", lambda: controller.session_id)
    m1.stop(signal.SIGKILL)
    await eventually("connection attempts failing while no manager runs", lambda: len(reconnects()) >= 4)
    m2 = start_manager(grpc_port=m1.grpc_port)
    second = await eventually("registered with the second manager", lambda: controller.session_id not in (None, first) and controller.session_id,
                              timeout=90)
    registered_at = time.monotonic()
    m2.stop(signal.SIGKILL)  # the second leader change, right away
    assert time.monotonic() - registered_at < 1.0, "within a second of registering (the old reset needed a 1 s session)"
    delays = reconnects()
    await eventually("the reconnect after the second restart", lambda: len(reconnects()) > len(delays))
    after = reconnects()
    assert max(delays) > 200, f"failed connection attempts grow the delay: {delays}"
    assert after[len(delays)] <= 200, f"the session that registered reset the backoff: {after}"
    m3 = start_manager(grpc_port=m1.grpc_port)
    await eventually("registered with the third manager", lambda: controller.session_id not in (None, second), timeout=90)
    m3.stop()


def test_the_current_span_is_per_task() -> None:
    span = Span("web", "a/b", "r1", 1, "s")

    async def main() -> tuple[Any, Any]:
        async def inner() -> Any:
            current.set(span)
            await asyncio.sleep(0)
            return current.get()

        got = await asyncio.create_task(inner())
        return got, current.get()

    assert asyncio.run(main()) == (span, None)
