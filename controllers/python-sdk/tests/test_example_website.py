"""examples/website/website.py, the operator people write first, as a process against
`ctrlhub dev` (devcluster, the manager and its demo controller in one process): children
created and kept, the Ready condition from the Deployment's status (the test plays the kubelet,
devcluster runs no pods), a restart with no phantom delete, hand-edited children repaired, and
the deletion that cleans the registry up before the finalizer goes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, binary, eventually, free_port
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

EXAMPLE = REPO / "controllers" / "python-sdk" / "examples" / "website" / "website.py"
CRD = REPO / "deploy" / "examples" / "website" / "crd.yaml"
NS = "shop"
FINALIZER = "example.ctrlhub.io/registry"


class Dev:
    """`ctrlhub dev` on free ports, with its state (the kubeconfig) in a temporary directory."""

    def __init__(self, tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.grpc = f"127.0.0.1:{free_port()}"
        self.log_path = tmp / "ctrlhub-dev.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(binary("ctrlhub")), "dev", "--grpc-addr", self.grpc, "--http-addr", f"127.0.0.1:{free_port()}",
             "--state-dir", str(tmp / "state")],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "info"},
        )
        self.kubeconfig = tmp / "state" / "kubeconfig"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


class Operator:
    """The example as its own process, its output in a log file."""

    def __init__(self, dev: Dev, tmp: Path, n: int) -> None:
        self.log_path = tmp / f"website-{n}.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "KUBECONFIG": str(dev.kubeconfig), "CTRLHUB_ADDR": dev.grpc, "CTRLHUB_TOKEN": "dev"}
        self.proc = subprocess.Popen([sys.executable, str(EXAMPLE)], env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        assert self.proc.poll() is None, f"the operator exited with {self.proc.returncode}:\n{self.log()}"
        return True

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._log.close()
        return code


def start_dev(tmp_path: Path) -> Dev:
    """`ctrlhub dev` leading. A port `free_port()` chose may be taken meanwhile by the
    devcluster `ctrlhub dev` starts first (its own ephemeral port): then start again on new ports."""
    for attempt in range(3):
        d = Dev(tmp_path / f"dev-{attempt}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and d.proc.poll() is None:
            if "manager is the leader" in d.log_path.read_text():
                return d
            time.sleep(0.05)
        d.stop()
    raise AssertionError(f"ctrlhub dev did not lead in 3 tries: {d.log_path.read_text()}")


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Dev]:
    d = start_dev(tmp_path)
    try:
        yield d
    finally:
        d.stop()


def get(fn: Any, *args: Any) -> Any:
    """The object, or None on 404."""
    try:
        return fn(*args)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


async def test_website_operator(dev: Dev, tmp_path: Path) -> None:
    await eventually("ctrlhub dev to lead", lambda: "manager is the leader" in dev.log_path.read_text())
    api = config.new_client_from_config(config_file=str(dev.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom, ext = client.CustomObjectsApi(api), client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
    core.create_namespace({"metadata": {"name": NS}})

    def website(name: str = "blog") -> Any:
        return get(custom.get_namespaced_custom_object, "example.ctrlhub.io", "v1", NS, "websites", name)

    def registry() -> dict[str, str]:
        cm = get(core.read_namespaced_config_map, "website-registry", NS)
        return (cm.data if cm is not None else None) or {}

    def deployment() -> Any:
        return get(apps.read_namespaced_deployment, "blog", NS)

    def create() -> bool:
        try:
            custom.create_namespaced_custom_object("example.ctrlhub.io", "v1", NS, "websites", {
                "apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "metadata": {"name": "blog"},
                "spec": {"image": "nginx:1.27", "replicas": 2}})
        except ApiException as err:
            if err.status == 404:
                return False  # the new kind is not served yet
            raise
        return True

    op = Operator(dev, tmp_path, 1)
    try:
        await eventually("the Website created", create)

        # Created: the finalizer, the registry entry, both children, Ready False (nothing runs yet).
        await eventually("the finalizer", lambda: op.alive() and FINALIZER in (website()["metadata"].get("finalizers") or []))
        await eventually("the registry entry", lambda: registry().get("blog") == "nginx:1.27")
        d = await eventually("the Deployment", deployment)
        assert d.spec.replicas == 2 and d.spec.template.spec.containers[0].image == "nginx:1.27"
        assert d.metadata.labels == {"app.kubernetes.io/name": "blog"} and d.metadata.owner_references[0].kind == "Website"
        svc = await eventually("the Service", lambda: get(core.read_namespaced_service, "blog", NS))
        assert svc.spec.selector == {"app.kubernetes.io/name": "blog"}
        assert (svc.spec.ports[0].port, svc.spec.ports[0].target_port) == (80, 8080)

        def ready() -> str | None:
            conds = (website().get("status") or {}).get("conditions") or []
            return next((c["status"] for c in conds if c["type"] == "Ready"), None)

        await eventually("Ready False while no replica is ready", lambda: ready() == "False")

        # The kubelet's part: both replicas ready. The operator reads it through the manager's cache.
        apps.patch_namespaced_deployment_status("blog", NS, {"status": {"replicas": 2, "readyReplicas": 2}})
        await eventually("Ready True", lambda: ready() == "True")
        status = website()["status"]
        assert status["readyReplicas"] == 2 and status["observedGeneration"] == website()["metadata"]["generation"]

        # `kubectl describe website blog` shows the history: the operator's Events about it.
        def events(name: str) -> list[Any]:
            return core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items

        await eventually("the Waiting and Ready Events", lambda: {e.reason for e in events("blog")} >= {"Waiting", "Ready"})
        assert {(e.type, e.reporting_component) for e in events("blog")} == {("Normal", "ctrlhub.io/website")}
        described = subprocess.run(["kubectl", "--kubeconfig", str(dev.kubeconfig), "describe", "website", "blog", "-n", NS],
                                   capture_output=True, text=True, timeout=60, check=False)
        assert "ctrlhub.io/website" in described.stdout and "2/2 replicas ready" in described.stdout, described

        # A Website whose Deployment the API server refuses: every failure is a Warning Event, the
        # same one counted up rather than repeated.
        custom.create_namespaced_custom_object("example.ctrlhub.io", "v1", NS, "websites", {
            "apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "metadata": {"name": "broken"},
            "spec": {"image": "", "replicas": 1}})
        failed = await eventually("a ReconcileFailed Event counted twice", lambda: [
            e for e in events("broken") if e.reason == "ReconcileFailed" and (e.count or 0) >= 2])
        assert len(failed) == 1 and failed[0].type == "Warning" and "422" in failed[0].message, failed
        custom.delete_namespaced_custom_object("example.ctrlhub.io", "v1", NS, "websites", "broken")
        await eventually("the broken Website gone", lambda: website("broken") is None)

        # A restart: the new process must not take the Website for deleted (the registry entry
        # and the finalizer survive). Whether the manager hands it the key at once (a fresh
        # controller's INITIAL_LIST) or keeps the controller and its queue for a while, an
        # annotation makes sure it reconciles the Website.
        assert op.stop() == 0, op.log()
        op = Operator(dev, tmp_path, 2)
        await eventually("the restarted operator to register", lambda: op.alive() and "registered: session" in op.log())
        custom.patch_namespaced_custom_object("example.ctrlhub.io", "v1", NS, "websites", "blog",
                                              {"metadata": {"annotations": {"test/restarted": "yes"}}},
                                              _content_type="application/merge-patch+json")
        await eventually("the restarted operator to reconcile the Website",
                         lambda: op.alive() and re.search(f"reconcile end key={NS}/blog attempt=\\d+ outcome=success", op.log()))
        assert registry().get("blog") == "nginx:1.27", "a phantom delete removed the registry entry"
        assert FINALIZER in website()["metadata"]["finalizers"] and ready() == "True"

        # Hand edits are repaired: the Deployment's image and replicas, and a deleted Service.
        apps.patch_namespaced_deployment("blog", NS, {"spec": {"replicas": 5, "template": {"spec": {
            "containers": [{"name": "web", "image": "httpd:2.4"}]}}}})
        await eventually("the Deployment repaired", lambda: (x := deployment()) is not None and x.spec.replicas == 2
                         and x.spec.template.spec.containers[0].image == "nginx:1.27")
        core.delete_namespaced_service("blog", NS, _preload_content=False)  # answers a Status, not a Service
        await eventually("the Service recreated", lambda: get(core.read_namespaced_service, "blog", NS))

        # Deleted: the registry entry goes, then the finalizer, then the Website.
        custom.delete_namespaced_custom_object("example.ctrlhub.io", "v1", NS, "websites", "blog")
        await eventually("the Website gone", lambda: op.alive() and website() is None)
        assert "blog" not in registry()
    finally:
        code = op.stop()
    assert code == 0, op.log()
