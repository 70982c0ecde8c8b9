"""Real parts for the SDK's tests: a devcluster process, ``ctrlhub run`` managers on loopback
gRPC, and a Kubernetes client. Nothing here fakes the manager."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[3]
PATIENCE = 60.0
T = TypeVar("T")


def binary(name: str) -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / name
    if not path.exists():
        pytest.fail(f"{path} not found; build it first with `cargo build --workspace --bins` in {REPO}")
    return path


def free_port() -> int:
    """A free loopback port for a process started next, below Linux's ephemeral range
    (32768-60999), where no outgoing connection or bind(0) of another process can take it
    before that process binds; picked at random so suites running side by side rarely meet."""
    for _ in range(64):
        port = random.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(what: str, probe: Callable[[], Awaitable[T | None] | T | None], timeout: float = PATIENCE) -> T:
    """Poll ``probe`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last  # type: ignore[return-value]
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


@dataclass
class Cluster:
    url: str
    kubeconfig: Path
    api: client.ApiClient
    core: client.CoreV1Api = field(init=False)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)

    def namespace(self, name: str) -> str:
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        return name

    def configmap(self, ns: str, name: str, data: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data=data)
        self.core.create_namespaced_config_map(ns, body)
        return self.read(ns, name)

    def read(self, ns: str, name: str) -> dict[str, Any]:
        raw = self.core.read_namespaced_config_map(name, ns, _preload_content=False)
        return json.loads(raw.data)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One devcluster for the whole suite; each test uses namespaces of its own."""
    tmp = tmp_path_factory.mktemp("devcluster")
    kubeconfig = tmp / "kubeconfig"
    log = open(tmp / "devcluster.log", "w")
    proc = subprocess.Popen([str(binary("devcluster")), "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        line = lines.get(timeout=PATIENCE)
        assert line and line.startswith("devcluster ready at "), f"devcluster said {line!r}"
        yield Cluster(line.split(" at ", 1)[1].strip(), kubeconfig, config.new_client_from_config(config_file=str(kubeconfig)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


class Manager:
    """A ``ctrlhub run`` process (static token auth, fast leader election)."""

    def __init__(self, cluster: Cluster, log_dir: Path, token: str = "dev", extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, grpc_port: int | None = None, identity: str = "sdk-test") -> None:
        self.grpc_port = grpc_port or free_port()
        self.http = f"http://127.0.0.1:{free_port()}"
        self.addr = f"127.0.0.1:{self.grpc_port}"
        self.token = token
        self.log_path = log_dir / f"ctrlhub-{identity}-{self.grpc_port}-{time.monotonic_ns()}.log"
        argv = [str(binary("ctrlhub")), "run", "--kubeconfig", str(cluster.kubeconfig),
                "--grpc-addr", self.addr, "--http-addr", self.http.removeprefix("http://"),
                "--token", token, "--identity", identity,
                "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", *extra]
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        child_env.update(env or {})
        child_env.setdefault("RUST_LOG", "info")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=child_env)

    def status(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.http}/status", timeout=2) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except (OSError, urllib.error.HTTPError, ValueError):
            return None

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics``, by series (name and labels as exposed)."""
        req = urllib.request.Request(f"{self.http}/metrics", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            text = resp.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                samples[series] = float(value)
        return samples

    def controller(self, name: str) -> dict[str, Any] | None:
        status = self.status() or {}
        return next((c for c in status.get("controllers", []) if c.get("name") == name), None)

    async def leading(self) -> None:
        def probe() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"ctrlhub exited with {self.proc.returncode}:\n{self.tail()}")
            return (self.status() or {}).get("leading") is True

        await eventually("the manager to lead", probe)

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def start_manager(devcluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., Manager]]:
    """Starts managers for one test (stopped at its end); call it again to replace one."""
    started: list[Manager] = []

    def start(**kwargs: Any) -> Manager:
        m = Manager(devcluster, tmp_path, **kwargs)
        started.append(m)
        return m

    yield start
    for m in started:
        m.stop()


@pytest.fixture
async def manager(start_manager: Callable[..., Manager]) -> AsyncIterator[Manager]:
    m = start_manager()
    await m.leading()
    yield m


_ns_counter = [0]


@pytest.fixture
def ns(devcluster: Cluster, request: pytest.FixtureRequest) -> str:
    """A fresh namespace (also a good controller name) for one test."""
    _ns_counter[0] += 1
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.removeprefix("test_").replace("_", "-").lower())[:40].strip("-")
    return devcluster.namespace(f"{base}-{_ns_counter[0]}")


class Running:
    """An operator serving in the background of a test; ``stop()`` drains it."""

    def __init__(self, task: asyncio.Task[None], stop: asyncio.Event) -> None:
        self.task = task
        self.stop_event = stop

    async def stop(self, timeout: float = PATIENCE) -> None:
        self.stop_event.set()
        await asyncio.wait_for(self.task, timeout)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Running]]:
    """Runs ``operator.serve(config)`` as a task; cancelled at the end of the test."""
    import ctrlhub

    running: list[Running] = []

    def start(operator: ctrlhub.Operator, cfg: ctrlhub.Config) -> Running:
        stop = asyncio.Event()
        r = Running(asyncio.create_task(operator.serve(cfg, stop)), stop)
        running.append(r)
        return r

    yield start
    for r in running:
        if not r.task.done():
            r.stop_event.set()
            try:
                await asyncio.wait_for(r.task, 15)
            except (Exception, asyncio.CancelledError):  # already reported by the test
                r.task.cancel()


class Proxy:
    """A TCP proxy to a manager's gRPC port whose open connections can be frozen: no byte is
    forwarded either way and none is closed, as in a network partition. Connections opened
    after a freeze flow."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.addr = ""
        self._conns: list[dict[str, Any]] = []
        self._server: asyncio.base_events.Server | None = None
        self._closed = False

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.addr = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            writer.close()
            return
        conn: dict[str, Any] = {"frozen": False, "writers": (writer, up_writer)}
        self._conns.append(conn)
        await asyncio.gather(self._pump(reader, up_writer, conn), self._pump(up_reader, writer, conn), return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: dict[str, Any]) -> None:
        try:
            while data := await reader.read(65536):
                while conn["frozen"] and not self._closed:
                    await asyncio.sleep(0.01)
                if self._closed:
                    break
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def freeze(self) -> None:
        for conn in self._conns:
            conn["frozen"] = True

    async def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        for conn in self._conns:
            for w in conn["writers"]:
                w.close()


@pytest.fixture
async def proxy(manager: Manager) -> AsyncIterator[Proxy]:
    p = await Proxy(manager.grpc_port).start()
    yield p
    await p.close()
