"""Pytest fixtures: a real devcluster process per test, reached through its kubeconfig."""

import os
import pathlib
import queue
import signal
import subprocess
import tempfile
import threading

import pytest
from kubernetes import client, config

REPO = pathlib.Path(__file__).resolve().parents[2]
READY_PREFIX = "devcluster ready at "
START_TIMEOUT = 60


def devcluster_binary():
    """Path of the devcluster binary (``DEVCLUSTER_BIN`` overrides target/debug)."""
    override = os.environ.get("DEVCLUSTER_BIN")
    if override:
        return pathlib.Path(override)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / "devcluster"


class Cluster:
    """A running devcluster process: its URL, kubeconfig and an API client."""

    def __init__(self, url, kubeconfig):
        self.url = url
        self.kubeconfig = kubeconfig
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api_client)

    def admin(self, action, body=None):
        """POST to a /_devcluster admin endpoint using the client's TLS settings."""
        import json

        resp = self.api_client.rest_client.pool_manager.request(
            "POST",
            f"{self.url}/_devcluster/{action}",
            body=json.dumps(body or {}),
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert 200 <= resp.status < 300, f"admin {action}: {resp.status} {resp.data!r}"
        return resp


@pytest.fixture
def devcluster():
    """Starts ``devcluster --listen 127.0.0.1:0 --kubeconfig <tmp>`` and yields a Cluster."""
    binary = devcluster_binary()
    if not binary.exists():
        pytest.fail(f"{binary} not found; run `cargo build --workspace --bins` first")
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = pathlib.Path(tmp) / "kubeconfig"
        proc = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
        )
        lines = queue.Queue()

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        try:
            try:
                line = lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"devcluster printed nothing within {START_TIMEOUT}s")
            if line is None or not line.startswith(READY_PREFIX):
                pytest.fail(f"unexpected first line from devcluster: {line!r}")
            url = line[len(READY_PREFIX):].strip()
            assert kubeconfig.exists(), "devcluster must write the kubeconfig before ready"
            yield Cluster(url, kubeconfig)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail("devcluster did not exit on SIGTERM")
            assert code == 0, f"devcluster exited with {code} on SIGTERM"
