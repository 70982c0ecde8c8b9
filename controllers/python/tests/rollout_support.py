"""Helpers for the config-rollout tests: real processes, free ports, polling."""

from __future__ import annotations

import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

CONTROLLER_DIR = Path(__file__).resolve().parents[1]
REPO = CONTROLLER_DIR.parents[1]
CONTROLLER_SCRIPT = CONTROLLER_DIR / "rollout_controller.py"
DEVCLUSTER_READY = "devcluster ready at "
START_TIMEOUT_S = 60.0

T = TypeVar("T")


def target_binary(name: str, env_override: str) -> Path:
    """target/debug/<name>, honouring an explicit override and CARGO_TARGET_DIR."""
    override = os.environ.get(env_override)
    if override:
        return Path(override)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / name


def free_port() -> int:
    """A free loopback port for a process started next, below Linux's ephemeral range
    (32768-60999), where no outgoing connection or bind(0) of another process can take it
    before that process binds; picked at random so suites running side by side rarely meet."""
    for _ in range(64):
        port = random.randrange(20000, 32768)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, probe: Callable[[], tuple[bool, T]], timeout: float = 60.0, interval: float = 0.1) -> T:
    """Poll probe() -> (ok, observation) until ok; fail with the last observation."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        ok, last = probe()
        if ok:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")


class Proc:
    """A child process whose stderr is collected into a file for failure messages."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None,
                 stdout: Any = subprocess.DEVNULL) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.stderr"
        self._log = open(self.log_path, "w")  # closed in stop()
        self.popen = subprocess.Popen(argv, stdout=stdout, stderr=self._log, env=env, text=True)

    def stderr(self) -> str:
        # The child writes straight to the file; our handle only needs to exist.
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.stderr().splitlines()[-lines:])

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; returns the exit code (None if killed)."""
        code: int | None = self.popen.poll()
        if code is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                code = self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
                code = None
        self._log.close()
        return code


def controller_argv(manager: str, kubeconfig: Path, token: str = "dev") -> list[str]:
    return [sys.executable, str(CONTROLLER_SCRIPT), "--manager", manager, "--token", token,
            "--kubeconfig", str(kubeconfig)]


@dataclass
class Cluster:
    url: str
    kubeconfig: Path
    api_client: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api_client)


@pytest.fixture
def devcluster(tmp_path: Path) -> Iterator[Cluster]:
    """A real devcluster process on a free port, with its kubeconfig and a client."""
    binary = target_binary("devcluster", "DEVCLUSTER_BIN")
    if not binary.exists():
        pytest.fail(f"{binary} not found; build it first with `cargo build --workspace --bins` at {REPO}")
    kubeconfig = tmp_path / "kubeconfig"
    proc = Proc("devcluster", [str(binary), "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
                tmp_path, stdout=subprocess.PIPE)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.popen.stdout is not None
        for line in proc.popen.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        try:
            line = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            pytest.fail(f"devcluster printed nothing within {START_TIMEOUT_S:.0f}s; stderr:\n{proc.tail()}")
        if line is None or not line.startswith(DEVCLUSTER_READY):
            pytest.fail(f"unexpected first line from devcluster: {line!r}; stderr:\n{proc.tail()}")
        url = line[len(DEVCLUSTER_READY):].strip()
        yield Cluster(url, kubeconfig, config.new_client_from_config(config_file=str(kubeconfig)))
    finally:
        proc.stop()


def configmap(name: str, data: dict[str, str], rollout: str | None = None) -> client.V1ConfigMap:
    labels = {"ctrlhub.io/rollout": rollout} if rollout else {}
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data=data)


def deployment_mounting(name: str, configmap_name: str) -> client.V1Deployment:
    """A Deployment whose pod template mounts configmap_name as a volume."""
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(
                        name="web",
                        image="nginx:1.27",
                        volume_mounts=[client.V1VolumeMount(name="config", mount_path="/etc/web")],
                    )],
                    volumes=[client.V1Volume(
                        name="config",
                        config_map=client.V1ConfigMapVolumeSource(name=configmap_name),
                    )],
                ),
            ),
        ),
    )


def template_annotation(cluster: Cluster, namespace: str, name: str, key: str) -> str | None:
    dep = cluster.apps.read_namespaced_deployment(name, namespace)
    annotations = (dep.spec.template.metadata.annotations or {}) if dep.spec.template.metadata else {}
    return annotations.get(key)


def read_json(cluster: Cluster, kind: str, namespace: str, name: str) -> dict[str, Any]:
    """An object as raw Kubernetes JSON (what the manager would put on the wire)."""
    import json

    if kind == "ConfigMap":
        raw = cluster.core.read_namespaced_config_map(name, namespace, _preload_content=False)
    elif kind == "Deployment":
        raw = cluster.apps.read_namespaced_deployment(name, namespace, _preload_content=False)
    else:
        raise ValueError(kind)
    return json.loads(raw.data)


