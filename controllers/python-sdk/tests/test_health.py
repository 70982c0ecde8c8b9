"""The optional health endpoint: /healthz while the event loop runs (500 once it is stuck),
/readyz while registered and neither draining nor outdated (503 with a one-line reason)."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import ctrlhub
import pytest
from conftest import Cluster, Manager, Running, eventually
from ctrlhub._health import HealthServer


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()


def test_healthz_fails_once_the_loop_has_not_run_for_a_while() -> None:
    reason = ["controller web: connecting to the manager at 127.0.0.1:9090"]
    server = HealthServer("127.0.0.1:0", lambda: reason[0], stuck_after=0.3)
    try:
        server.beat()
        assert get(server.port, "/healthz") == (200, "ok")
        assert get(server.port, "/readyz") == (503, reason[0])
        reason[0] = ""
        assert get(server.port, "/readyz") == (200, "ready")
        time.sleep(0.5)  # no beat: the loop is stuck
        code, text = get(server.port, "/healthz")
        assert code == 500 and text.startswith("event loop stuck: it has not run for 0."), text
        server.beat()
        assert get(server.port, "/healthz") == (200, "ok")
        assert get(server.port, "/metrics")[0] == 404
    finally:
        server.close()


def test_the_address_is_checked_and_read_from_the_environment() -> None:
    assert ctrlhub.Config.from_env({"CTRLHUB_HEALTH_ADDR": "0.0.0.0:8081"}).health_addr == "0.0.0.0:8081"
    assert ctrlhub.Config.from_env({}).health_addr is None
    with pytest.raises(ctrlhub.ConfigError, match="invalid health address 'localhost' .CTRLHUB_HEALTH_ADDR."):
        ctrlhub.Config(health_addr="localhost")


async def test_readyz_follows_the_session(devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running]) -> None:
    op = ctrlhub.Operator()
    release = asyncio.Event()

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns)
    async def handler(name: str) -> None:
        await release.wait()

    running = serve(op, ctrlhub.Config(addr=f"http://{manager.addr}", health_addr="127.0.0.1:0"))
    server = await eventually("the health server", lambda: op.health)
    loop = asyncio.get_running_loop()

    async def probe(path: str) -> tuple[int, str]:
        return await loop.run_in_executor(None, get, server.port, path)

    first = await probe("/readyz")
    assert first[0] == 200 or first == (503, f"controller {ns}: connecting to the manager at {manager.addr}"), first
    await eventually("ready once registered", lambda: _is(probe("/readyz"), (200, "ready")))
    assert await probe("/healthz") == (200, "ok")
    devcluster.configmap(ns, "busy")
    await eventually("the handler running", lambda: op.controllers[0].running == 1)
    stopping = asyncio.ensure_future(running.stop())
    code, text = await eventually("not ready while draining", lambda: _not_ok(probe("/readyz")))
    assert (code, text) == (503, f"controller {ns}: draining"), text
    assert await probe("/healthz") == (200, "ok"), "draining is alive"
    release.set()
    await stopping
    assert op.health is None, "the endpoint closes with serve"
    with pytest.raises(OSError):
        get(server.port, "/healthz")


async def _is(probe: Any, want: tuple[int, str]) -> bool:
    return bool(await probe == want)


async def _not_ok(probe: Any) -> Any:
    code, text = await probe
    return (code, text) if code != 200 else None
