"""Exclusive attempts, rolling upgrades and children in full, against the real manager (hold
1 s, heartbeats every 200 ms with the suite's 3 s / 2 s Lease) and devcluster: a manager gone
silent, a handler that will not stop, the shutdown grace, readable kinds and requests without
their object."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ctrlhub
import pytest
from conftest import Cluster, Manager, Proxy, Running, eventually
from kubernetes import client


def cfg(addr: str, **kw: Any) -> ctrlhub.Config:
    return ctrlhub.Config(addr=f"http://{addr}", reconnect_initial=0.05, reconnect_max=0.5, **kw)


async def test_a_silent_manager_ends_the_session_before_the_key_moves(
    devcluster: Cluster, manager: Manager, proxy: Proxy, ns: str, serve: Callable[..., Running]
) -> None:
    op = ctrlhub.Operator()
    events: list[tuple[str, int, float, str]] = []

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns, deadline=30)
    async def slow(attempt: int, reader: ctrlhub.Reader) -> None:
        events.append(("start", attempt, time.monotonic(), reader.session_id))
        try:
            await asyncio.sleep(30 if attempt == 1 else 0)
        except asyncio.CancelledError:
            events.append(("cancelled", attempt, time.monotonic(), reader.session_id))
            raise
        events.append(("end", attempt, time.monotonic(), reader.session_id))

    serve(op, cfg(proxy.addr))
    devcluster.configmap(ns, "partitioned")
    await eventually("attempt 1", lambda: any(e[0] == "start" for e in events))
    frozen_at = time.monotonic()
    proxy.freeze()  # the manager hears nothing more from this session, and answers nothing
    await eventually("attempt 2 done", lambda: ("end", 2) in {(e[0], e[1]) for e in events})
    (start1, cancelled1, start2, _end2) = events
    assert (cancelled1[0], cancelled1[1]) == ("cancelled", 1), events
    assert cancelled1[2] - frozen_at >= 0.4, "not before half the hold"
    assert start2[:2] == ("start", 2) and start2[2] > cancelled1[2], "the next attempt starts after the first stopped"
    assert start2[3] != start1[3], "on a new session"


SCRIPT = """
import logging, os, threading, time
import ctrlhub

@ctrlhub.reconcile("v1/ConfigMap", name=os.environ["NAME"], namespaces=os.environ["NAME"], deadline=60)
def stuck(name: str, cancelled: threading.Event) -> None:
    print("handler started", flush=True)
    time.sleep(float(os.environ["BLOCK"]))  # deaf to `cancelled`
    print("handler returned", flush=True)

grace = {"shutdown_grace": float(os.environ["GRACE"])} if os.environ.get("GRACE") else {}
ctrlhub.run(ctrlhub.Config(addr=os.environ["ADDR"], **grace))
"""


def controller_process(tmp_path: Path, name: str, addr: str, block: float, grace: float | None = None) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "stuck.py"
    script.write_text(SCRIPT)
    out = tmp_path / "stuck.log"
    env = {**os.environ, "NAME": name, "ADDR": addr, "BLOCK": str(block), "GRACE": "" if grace is None else str(grace)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=open(out, "w"), stderr=subprocess.STDOUT, text=True)
    return proc, out


async def test_a_handler_that_outlives_the_hold_ends_the_process(
    devcluster: Cluster, manager: Manager, proxy: Proxy, ns: str, tmp_path: Path
) -> None:
    proc, out = controller_process(tmp_path, ns, proxy.addr, block=60)
    try:
        devcluster.configmap(ns, "stuck")
        await eventually("the handler to start", lambda: "handler started" in out.read_text())
        proxy.freeze()
        code = await eventually("the process to exit", lambda: proc.poll() is not None and (proc.returncode,))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = out.read_text()
    assert code == (70,), log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "1 handler(s) of session" in errors[0] and "still running" in errors[0], log
    assert "handler returned" not in log


async def test_stopped_is_logged_only_once_every_handler_has_returned(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    op = ctrlhub.Operator()
    started = threading.Event()

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns, deadline=1.0)
    def overruns(logger: logging.Logger) -> None:
        started.set()
        time.sleep(1.5)  # past its deadline, deaf to `cancelled`
        logger.info("the handler returns")

    caplog.set_level("INFO", logger=f"ctrlhub.{ns}")
    running = serve(op, cfg(manager.addr))
    devcluster.configmap(ns, "overrun")
    await eventually("the handler to start", started.is_set)
    await running.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == f"ctrlhub.{ns}"]
    assert "the handler returns" in lines and "stopped" in lines, lines
    assert lines.index("the handler returns") < lines.index("stopped"), lines
    assert op.controllers[0].running == 0


async def test_sigterm_waits_for_handlers_up_to_the_shutdown_grace(
    devcluster: Cluster, manager: Manager, ns: str, tmp_path: Path
) -> None:
    proc, out = controller_process(tmp_path, ns, manager.addr, block=60, grace=0.5)
    try:
        devcluster.configmap(ns, "stuck")
        await eventually("the handler to start", lambda: "handler started" in out.read_text())
        proc.send_signal(signal.SIGTERM)
        code = await eventually("the process to exit", lambda: proc.poll() is not None and (proc.returncode,))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = out.read_text()
    # Non-zero, saying why: after the grace (exit 1), or as the hold ran out (exit 70).
    assert code in ((1,), (70,)), log
    assert "still running" in log and " INFO ctrlhub." in log and "stopped" not in log.split("draining")[-1], log


async def test_children_are_read_in_full_unless_every_entry_asks_for_metadata(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    apps = client.AppsV1Api(devcluster.api)
    op = ctrlhub.Operator()
    seen: dict[str, Any] = {}

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns,
                  owns=["apps/v1/Deployment", ctrlhub.Owns("v1/Secret", metadata_only=True)])
    async def reads(reader: ctrlhub.Reader, name: str) -> None:
        seen["deployment"] = await reader.get("apps/v1/Deployment", ns, "web")
        seen["secret"] = await reader.get_metadata("v1/Secret", ns, "creds")
        seen["raw"] = await reader.get_raw("v1/Secret", ns, "creds")
        try:
            await reader.get("v1/Secret", ns, "creds")
        except ctrlhub.MetadataOnlyError as err:
            seen["error"] = str(err)

    caplog.set_level("INFO", logger=f"ctrlhub.{ns}")
    labels = {"app": "web"}
    apps.create_namespaced_deployment(ns, {"metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                           "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    apps.patch_namespaced_deployment_status("web", ns, {"status": {"readyReplicas": 1}})
    devcluster.core.create_namespaced_secret(ns, {"metadata": {"name": "creds", "labels": labels}, "stringData": {"k": "v"}})
    registered: list[ctrlhub.Registration] = []
    op.controllers[0].on_registered(registered.append)
    serve(op, cfg(manager.addr))
    devcluster.configmap(ns, "reader")
    await eventually("the reads", lambda: "error" in seen)
    assert seen["deployment"]["status"]["readyReplicas"] == 1, "an owned kind is read in full"
    assert seen["secret"].name == "creds" and seen["secret"].labels == labels
    assert seen["raw"].metadata_only and "data" not in seen["raw"].object, "a metadata-only kind is served as metadata"
    assert "get_metadata" in seen["error"]
    readable = {str(k): form for k, form in registered[0].readable.items()}
    assert readable == {"v1/ConfigMap": "full", "apps/v1/Deployment": "full", "v1/Secret": "metadata"}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("readable through")]
    assert len(lines) == 1 and all(f"{k} ({v})" in lines[0] for k, v in readable.items()), lines


async def test_a_request_without_its_object_is_not_found_not_deleted(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running]
) -> None:
    op = ctrlhub.Operator()
    seen: list[tuple[str, Any, Any]] = []

    @op.reconcile("v1/Secret", name=ns, namespaces=ns, watches=[ctrlhub.Watch("v1/ConfigMap", label="site")])
    async def site(name: str, obj: dict[str, Any] | None, tombstone: dict[str, Any] | None) -> None:
        seen.append((name, obj, tombstone))

    serve(op, cfg(manager.addr))
    devcluster.configmap(ns, "points-nowhere", labels={"site": "ghost"})  # a primary that never existed
    await eventually("the request for the missing primary", lambda: seen)
    assert seen[0] == ("ghost", None, None)
    c = await eventually("the result", lambda: (c := manager.controller(ns)) and c.get("inFlight") == 0 and c)
    assert c.get("terminal", 0) == 0, c
