"""End to end: devcluster + the real ctrlhub manager + this controller, as processes.

Fails (never skips) when target/debug/ctrlhub is missing: a green run must mean the
Python controller really worked against the real manager.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import rollout_controller as rc
from rollout_support import (
    REPO,
    Cluster,
    Proc,
    configmap,
    controller_argv,
    deployment_mounting,
    free_port,
    read_json,
    target_binary,
    template_annotation,
    wait_until,
)

NS = "default"
READY_TIMEOUT_S = 60.0
ROLLOUT_TIMEOUT_S = 60.0


def _readyz(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200, f"HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        return False, f"HTTP {err.code}"
    except OSError as err:  # refused while the manager starts up
        return False, str(err)


def start_manager(cluster: Cluster, log_dir: Path) -> tuple[Proc, str]:
    """Start `ctrlhub run` against the cluster; return it and its gRPC address once ready."""
    binary = target_binary("ctrlhub", "CTRLHUB_BIN")
    if not binary.exists():
        pytest.fail(
            f"{binary} not found: the end-to-end test needs the real manager. "
            f"Build it with `cargo build --workspace --bins` in {REPO} (or set CTRLHUB_BIN)."
        )
    grpc_addr = f"127.0.0.1:{free_port()}"
    http_addr = f"127.0.0.1:{free_port()}"
    manager = Proc("ctrlhub", [
        str(binary), "run", "--kubeconfig", str(cluster.kubeconfig),
        "--grpc-addr", grpc_addr, "--http-addr", http_addr, "--token", "dev",
    ], log_dir)

    def ready() -> tuple[bool, str]:
        if not manager.running():
            pytest.fail(f"ctrlhub exited with {manager.popen.returncode} before ready; stderr:\n{manager.tail()}")
        return _readyz(f"http://{http_addr}/readyz")

    try:
        wait_until("ctrlhub /readyz to return 200", ready, timeout=READY_TIMEOUT_S, interval=0.2)
    except AssertionError as err:
        manager.stop()
        raise AssertionError(f"{err}\nctrlhub stderr:\n{manager.tail()}") from None
    return manager, grpc_addr


def expected_hash(cluster: Cluster, *names: str) -> str:
    return rc.config_hash([read_json(cluster, "ConfigMap", NS, n) for n in names])


def test_rollout_end_to_end(devcluster: Cluster, tmp_path: Path) -> None:
    manager, grpc_addr = start_manager(devcluster, tmp_path)
    controller = Proc("controller", controller_argv(grpc_addr, devcluster.kubeconfig), tmp_path)
    try:
        devcluster.core.create_namespaced_config_map(NS, configmap("web-config", {"greeting": "hello"}, rollout="web"))
        devcluster.apps.create_namespaced_deployment(NS, deployment_mounting("web", "web-config"))

        def annotation_is(want: str) -> tuple[bool, object]:
            if not controller.running():
                pytest.fail(f"controller exited with {controller.popen.returncode}; stderr:\n{controller.tail()}")
            got = template_annotation(devcluster, NS, "web", rc.HASH_ANNOTATION)
            return got == want, got

        def diagnostics() -> str:
            return f"\ncontroller stderr:\n{controller.tail()}\nctrlhub stderr:\n{manager.tail()}"

        first = expected_hash(devcluster, "web-config")
        try:
            wait_until("the hash annotation on deployment web", lambda: annotation_is(first), ROLLOUT_TIMEOUT_S)
        except AssertionError as err:
            raise AssertionError(f"{err}{diagnostics()}") from None

        # Changing the ConfigMap must wake the Deployment through the label mapping.
        devcluster.core.patch_namespaced_config_map("web-config", NS, {"data": {"greeting": "bonjour"}})
        second = expected_hash(devcluster, "web-config")
        assert second != first
        try:
            wait_until("the hash annotation to change", lambda: annotation_is(second), ROLLOUT_TIMEOUT_S)
        except AssertionError as err:
            raise AssertionError(f"{err}{diagnostics()}") from None

        log = controller.stderr()
        assert f"reconcile start key={NS}/web reasons=" in log
        assert re.search(f"reconcile end key={NS}/web attempt=\\d+ outcome=success", log)
    finally:
        code = controller.stop(timeout=30)
        manager.stop(timeout=30)
    # SIGTERM drains and exits cleanly.
    assert code == 0, f"controller exited with {code} on SIGTERM; stderr:\n{controller.tail()}"
