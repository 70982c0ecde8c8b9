"""The write helpers against devcluster, through the real manager: apply, adopt, patch_status
(a custom resource and a built-in), finalizers from sync and async handlers, the not-found and
conflict checks on every error type, and Kubernetes Events (posted for handler failures,
aggregated, rate-limited, never blocking)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import ctrlhub
import pytest
import yaml
from conftest import REPO, Cluster, Manager, Running, eventually
from kubernetes import client
from kubernetes.client.exceptions import ApiException

WEBSITE = ctrlhub.Kind("example.ctrlhub.io", "v1", "Website")
FINALIZER = "example.ctrlhub.io/test"


def cfg(m: Manager) -> ctrlhub.Config:
    return ctrlhub.Config(addr=f"http://{m.addr}", reconnect_initial=0.05, reconnect_max=0.5)


def websites(devcluster: Cluster) -> client.CustomObjectsApi:
    """The Website CRD of deploy/examples (created once per devcluster)."""
    ext = client.ApiextensionsV1Api(devcluster.api)
    try:
        ext.create_custom_resource_definition(yaml.safe_load((REPO / "deploy/examples/website/crd.yaml").read_text()))
    except ApiException as err:
        if err.status != 409:
            raise
    return client.CustomObjectsApi(devcluster.api)


async def create_website(api: client.CustomObjectsApi, ns: str, name: str, image: str = "nginx:1.27") -> dict[str, Any]:
    def create() -> Any:
        try:
            return api.create_namespaced_custom_object("example.ctrlhub.io", "v1", ns, "websites", {
                "apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "metadata": {"name": name},
                "spec": {"image": image, "replicas": 1}})
        except ApiException as err:
            if err.status == 404:
                return None  # the new kind is not served yet
            raise

    return await eventually(f"Website {name} created", create)  # type: ignore[no-any-return]


def get_website(api: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return api.get_namespaced_custom_object("example.ctrlhub.io", "v1", ns, "websites", name)  # type: ignore[no-any-return]
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}


async def test_apply_adopt_and_patch_status_from_an_async_handler(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running]
) -> None:
    api = websites(devcluster)
    op = ctrlhub.Operator(api_client=devcluster.api)
    seen: dict[str, Any] = {}

    @op.reconcile(WEBSITE, name=ns, namespaces=ns, owns=["v1/ConfigMap", "apps/v1/Deployment"])
    async def handler(obj: dict[str, Any] | None, request: ctrlhub.Request, apply: Any, adopt: Any, patch_status: Any) -> None:
        if obj is None:
            return
        name = obj["metadata"]["name"]
        child = adopt({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-conf"}, "data": {"image": obj["spec"]["image"]}}, obj)
        seen["configmap"] = await apply(child)
        seen["website"] = await patch_status(obj, {"readyReplicas": 7})
        dep = await request.apply(request.adopt(deployment(f"{name}-web"), obj))
        seen["deployment"] = await request.patch_status(dep, {"replicas": 1, "readyReplicas": 1})

    serve(op, cfg(manager))
    site = await create_website(api, ns, "site")
    await eventually("the handler's writes", lambda: len(seen) == 3)
    owner = {"apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "name": "site", "uid": site["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    cm = devcluster.read(ns, "site-conf")
    assert cm["metadata"]["ownerReferences"] == [owner] and cm["metadata"]["namespace"] == ns and cm["data"] == {"image": "nginx:1.27"}
    managers = {(f["manager"], f["operation"]) for f in cm["metadata"]["managedFields"]}
    assert (ns, "Apply") in managers, "applied with the controller's name as field manager"
    assert seen["configmap"]["metadata"]["uid"] == cm["metadata"]["uid"], "apply returns the object as stored"
    assert (get_website(api, ns, "site") or {}).get("status", {}).get("readyReplicas") == 7, "a custom resource's status"
    assert seen["website"]["status"]["readyReplicas"] == 7
    dep = client.AppsV1Api(devcluster.api).read_namespaced_deployment("site-web", ns)
    assert dep.status.ready_replicas == 1, "a built-in's status"
    assert [(r.kind, r.name, r.controller) for r in dep.metadata.owner_references] == [("Website", "site", True)]


async def test_finalizers_from_a_sync_handler_return_booleans(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running]
) -> None:
    api = websites(devcluster)
    op = ctrlhub.Operator(api_client=devcluster.api)
    results: list[Any] = []
    cleanups: list[str] = []

    @op.reconcile(WEBSITE, name=ns, namespaces=ns)
    def handler(obj: dict[str, Any] | None, finalizers: ctrlhub.SyncFinalizers) -> None:
        if obj is None:
            return
        ran = finalizers.finalize(obj, FINALIZER, lambda o: cleanups.append(o["metadata"]["name"]))
        results.append(ran)
        if ran or finalizers.is_deleting(obj):
            return
        results.append(finalizers.ensure(obj, FINALIZER))

    serve(op, cfg(manager))
    await create_website(api, ns, "sync-site")
    await eventually("the finalizer", lambda: FINALIZER in ((get_website(api, ns, "sync-site") or {}).get("metadata", {}).get("finalizers") or []))
    api.delete_namespaced_custom_object("example.ctrlhub.io", "v1", ns, "websites", "sync-site")
    await eventually("the Website gone", lambda: get_website(api, ns, "sync-site") is None)
    assert cleanups == ["sync-site"], "cleaned up exactly once"
    assert all(isinstance(r, bool) for r in results), f"a sync handler gets values, never coroutines: {results}"
    assert True in results


async def test_finalize_from_an_async_handler_runs_a_sync_cleanup_off_the_event_loop(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running]
) -> None:
    api = websites(devcluster)
    op = ctrlhub.Operator(api_client=devcluster.api)
    cleanup_threads: list[threading.Thread] = []
    loop_thread = threading.current_thread()

    def cleanup(obj: dict[str, Any]) -> None:
        cleanup_threads.append(threading.current_thread())
        time.sleep(1.0)  # a blocking call, as a user's client makes

    @op.reconcile(WEBSITE, name=ns, namespaces=ns)
    async def handler(obj: dict[str, Any] | None, finalizers: ctrlhub.Finalizers) -> None:
        if obj is None:
            return
        if await finalizers.finalize(obj, FINALIZER, cleanup) or finalizers.is_deleting(obj):
            return
        await finalizers.ensure(obj, FINALIZER)

    serve(op, cfg(manager))
    await create_website(api, ns, "async-site")
    await eventually("the finalizer", lambda: FINALIZER in ((get_website(api, ns, "async-site") or {}).get("metadata", {}).get("finalizers") or []))
    api.delete_namespaced_custom_object("example.ctrlhub.io", "v1", ns, "websites", "async-site")
    await eventually("the cleanup to start", lambda: cleanup_threads)
    lag, last = 0.0, time.monotonic()
    while get_website(api, ns, "async-site") is not None and time.monotonic() - last < 30:
        await asyncio.sleep(0.02)
        now = time.monotonic()
        lag, last = max(lag, now - last), now
    assert get_website(api, ns, "async-site") is None
    assert cleanup_threads and cleanup_threads[0] is not loop_thread, "the sync cleanup ran on a worker thread"
    assert lag < 0.5, f"the event loop stalled {lag:.2f} s while the cleanup blocked"
    assert op.controllers[0].ready, "the session lived on through the cleanup"


def test_not_found_and_conflict_whatever_the_error_type(devcluster: Cluster, ns: str) -> None:
    kube = ctrlhub.Kube("checker", devcluster.api)
    core = client.CoreV1Api(devcluster.api)
    devcluster.configmap(ns, "exists")
    with pytest.raises(ctrlhub.WriteError) as missing:
        kube.patch_status({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nope", "namespace": ns}}, {})
    with pytest.raises(ApiException) as api_missing:
        core.read_namespaced_config_map("nope", ns)
    with pytest.raises(ApiException) as api_exists:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "exists"}})
    stale = devcluster.read(ns, "exists")
    kube.merge_patch(stale, {"data": {"a": "b"}})
    with pytest.raises(ctrlhub.WriteError) as conflict:
        kube.merge_patch(stale, {"metadata": {"finalizers": ["x.io/y"], "resourceVersion": stale["metadata"]["resourceVersion"]}})
    assert ctrlhub.is_not_found(missing.value) and missing.value.status == 404 and missing.value.reason == "NotFound"
    assert ctrlhub.is_not_found(api_missing.value) and not ctrlhub.is_conflict(api_missing.value)
    assert ctrlhub.is_conflict(api_exists.value) and ctrlhub.is_conflict(conflict.value) and not ctrlhub.is_not_found(conflict.value)
    assert not ctrlhub.is_not_found(ValueError("404")) and not ctrlhub.is_conflict(KeyError(409))


def test_adopt_sets_the_controller_reference_and_refuses_what_kubernetes_forbids() -> None:
    owner = {"apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "metadata": {"name": "w", "namespace": "a", "uid": "u-1"}}
    child = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "u-0", "controller": True},
        {"apiVersion": "v1", "kind": "Keep", "name": "k", "uid": "u-2"}]}}
    assert ctrlhub.adopt(child, owner) is child
    assert child["metadata"]["namespace"] == "a", "the owner's namespace on a child without one"
    assert child["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Keep", "name": "k", "uid": "u-2"},
        {"apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "name": "w", "uid": "u-1", "controller": True, "blockOwnerDeletion": True},
    ], "one controller reference: the new owner's"
    ctrlhub.adopt(child, owner)
    assert len(child["metadata"]["ownerReferences"]) == 2, "adopting again changes nothing"
    with pytest.raises(ctrlhub.AdoptError, match="another namespace"):
        ctrlhub.adopt({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "b"}}, owner)
    with pytest.raises(ctrlhub.AdoptError, match="cluster-scoped"):
        ctrlhub.adopt({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}, owner)
    with pytest.raises(ctrlhub.AdoptError, match="no uid"):
        ctrlhub.adopt({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}, {**owner, "metadata": {"name": "w", "namespace": "a"}})
    cluster_owner = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "uid": "u-9"}}
    namespaced = ctrlhub.adopt({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team"}}, cluster_owner)
    assert namespaced["metadata"]["namespace"] == "team", "a cluster-scoped owner may own namespaced children"
    assert issubclass(ctrlhub.AdoptError, ctrlhub.WriteError)


async def test_handler_failures_are_posted_as_warning_events(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running]
) -> None:
    """A failure with the object becomes one Warning ReconcileFailed Event counted up; none for
    the primary's NotFound, none for a request without its object; Events the handler records
    itself come from the controller."""
    op = ctrlhub.Operator(api_client=devcluster.api)
    attempts: dict[str, int] = {}

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns, labels={"with": "object"}, backoff=(0.01, 0.05))
    def with_object(name: str, obj: dict[str, Any] | None, events: ctrlhub.EventRecorder) -> None:
        attempts[name] = attempts.get(name, 0) + 1
        if name == "boom":
            raise ValueError("boom")
        if name == "gone":
            raise ctrlhub.WriteError("the ConfigMap went meanwhile", 404, "NotFound")
        assert obj is not None
        events.info(obj, "Checked", "all good")

    @op.reconcile("v1/ConfigMap", name=f"{ns}-bare", namespaces=ns, labels={"with": "nothing"}, backoff=(0.01, 0.05))
    def without_object(name: str) -> None:
        attempts[f"bare-{name}"] = attempts.get(f"bare-{name}", 0) + 1
        raise ValueError("no object to post about")

    serve(op, cfg(manager))
    for name in ("boom", "gone", "fine"):
        devcluster.configmap(ns, name, labels={"with": "object"})
    devcluster.configmap(ns, "bare", labels={"with": "nothing"})
    await eventually("several failed attempts each", lambda: min(attempts.get(k, 0) for k in ("boom", "gone", "bare-bare")) >= 4)
    for c in op.controllers:
        assert c.events is not None and c.events.flush()
    core = client.CoreV1Api(devcluster.api)
    events = core.list_namespaced_event(ns).items
    failed = [e for e in events if e.reason == "ReconcileFailed"]
    assert len(failed) == 1, [(e.involved_object.name, e.reason, e.count) for e in events]
    (boom,) = failed
    assert (boom.type, boom.involved_object.name, boom.involved_object.kind) == ("Warning", "boom", "ConfigMap")
    assert boom.message == "ValueError: boom" and boom.reporting_component == f"ctrlhub.io/{ns}"
    assert boom.count >= 3, "the same failure again is counted on the same Event"
    checked = [e for e in events if e.reason == "Checked"]
    assert [(e.type, e.involved_object.name, e.message) for e in checked] == [("Normal", "fine", "all good")]
    assert not [e for e in events if e.involved_object.name in ("gone", "bare")]


class FakeKube:
    """Records the recorder's API calls; ``delay`` makes each one slow, ``fail`` makes it fail."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.delay = delay
        self.fail = fail

    def request(self, method: str, path: str, body: Any = None, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.delay)
        if self.fail:
            raise ctrlhub.WriteError("no Kubernetes credentials")
        self.calls.append((method, path, body))
        return body


SITE = {"apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "metadata": {"name": "w", "namespace": "a", "uid": "u-1"}}


def test_the_same_event_again_within_ten_minutes_is_counted_not_repeated() -> None:
    now = [1000.0]
    kube = FakeKube()
    rec = ctrlhub.EventRecorder("web", kube, instance="pod-1", clock=lambda: now[0])  # type: ignore[arg-type]
    rec.warning(SITE, "ReconcileFailed", "boom")
    rec.warning(SITE, "ReconcileFailed", "boom")
    rec.warning(SITE, "ReconcileFailed", "other message")
    now[0] += 601
    rec.warning(SITE, "ReconcileFailed", "boom")
    assert rec.flush()
    (m1, p1, create), (m2, p2, series), (m3, _, other), (m4, _, again) = kube.calls
    assert (m1, p1) == ("POST", "/api/v1/namespaces/a/events") and create["count"] == 1
    assert create["involvedObject"] == {"apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "name": "w", "namespace": "a", "uid": "u-1"}
    assert (create["type"], create["reason"], create["message"]) == ("Warning", "ReconcileFailed", "boom")
    assert (create["reportingComponent"], create["reportingInstance"], create["source"]) == (
        "ctrlhub.io/web", "pod-1", {"component": "ctrlhub.io/web", "host": "pod-1"})
    assert (m2, p2) == ("PATCH", f"/api/v1/namespaces/a/events/{create['metadata']['name']}") and series["count"] == 2
    assert m3 == "POST" and other["message"] == "other message", "another message is another Event"
    assert m4 == "POST" and again["metadata"]["name"] != create["metadata"]["name"], "after 10 minutes: a new Event"


def test_an_object_gets_25_events_in_a_burst_then_one_per_five_minutes() -> None:
    now = [0.0]
    kube = FakeKube()
    rec = ctrlhub.EventRecorder("web", kube, clock=lambda: now[0])  # type: ignore[arg-type]
    for i in range(30):
        rec.info(SITE, "Step", f"step {i}")
    other = {**SITE, "metadata": {**SITE["metadata"], "name": "v", "uid": "u-2"}}  # type: ignore[dict-item]
    rec.info(other, "Step", "another object has its own budget")
    assert rec.flush()
    assert len(kube.calls) == 26 and rec.dropped == 5
    now[0] += 299
    rec.info(SITE, "Step", "too early")
    now[0] += 2
    rec.info(SITE, "Step", "one more after five minutes")
    assert rec.flush()
    assert [c[2]["message"] for c in kube.calls[26:]] == ["one more after five minutes"]


def test_recording_never_blocks_nor_raises(caplog: pytest.LogCaptureFixture) -> None:
    slow = ctrlhub.EventRecorder("web", FakeKube(delay=0.5))  # type: ignore[arg-type]
    t0 = time.monotonic()
    for i in range(5):
        slow.warning(SITE, "ReconcileFailed", f"failure {i}")
    assert time.monotonic() - t0 < 0.1, "info/warning return at once"
    failing = ctrlhub.EventRecorder("web", FakeKube(fail=True))  # type: ignore[arg-type]
    caplog.set_level("DEBUG", logger="ctrlhub.events")
    for i in range(3):
        failing.warning(SITE, "ReconcileFailed", f"failure {i}")
    assert failing.flush()
    failing.warning({"metadata": {}}, "NoKind", "an object without kind or name")
    warns = [r for r in caplog.records if r.name == "ctrlhub.events" and r.levelname == "WARNING"]
    debugs = [r for r in caplog.records if r.name == "ctrlhub.events" and r.levelname == "DEBUG"]
    assert len(warns) == 1 and "no Kubernetes credentials" in warns[0].getMessage(), "WARN at most once a minute"
    assert len(debugs) >= 3, "the rest at DEBUG"
    assert slow.flush(10)
