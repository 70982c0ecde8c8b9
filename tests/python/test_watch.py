"""The official Python ``kubernetes`` client against devcluster: list+watch semantics."""

import threading
import time

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

NS = "default"
TIMEOUT = 30


def cm(name, labels=None, data=None):
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        data=data or {},
    )


def wait_until(what, probe, timeout=TIMEOUT):
    """Polls probe() until it returns a truthy value; fails with the last observation."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = probe()
        if ok:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last seen: {last}")


def test_list_then_watch_from_list_resource_version(devcluster):
    core = devcluster.core
    core.create_namespaced_config_map(NS, cm("a", {"suite": "lw"}, {"v": "0"}))
    core.create_namespaced_config_map(NS, cm("b", {"suite": "lw"}, {"v": "0"}))
    listed = core.list_namespaced_config_map(NS, label_selector="suite=lw")
    assert sorted(i.metadata.name for i in listed.items) == ["a", "b"]
    rv = listed.metadata.resource_version
    assert rv, "list must carry a resourceVersion"

    # Changes after the list; the watch from the list's rv must deliver exactly these.
    core.create_namespaced_config_map(NS, cm("c", {"suite": "lw"}, {"v": "0"}))
    core.patch_namespaced_config_map("a", NS, {"data": {"v": "1"}})
    core.delete_namespaced_config_map("b", NS)

    w = watch.Watch()
    seen = []
    for ev in w.stream(
        core.list_namespaced_config_map,
        NS,
        label_selector="suite=lw",
        resource_version=rv,
        _request_timeout=TIMEOUT,
    ):
        seen.append((ev["type"], ev["object"].metadata.name, ev["object"]))
        if len(seen) == 3:
            w.stop()
    assert [(t, n) for t, n, _ in seen] == [
        ("ADDED", "c"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    assert isinstance(seen[0][2], client.V1ConfigMap)
    assert seen[1][2].data == {"v": "1"}
    # The Watch tracks the last resourceVersion it saw, as informers rely on.
    assert w.resource_version == seen[2][2].metadata.resource_version


class Informer:
    """A minimal list+watch cache, written the way a real client must handle 410 Gone."""

    def __init__(self, core, selector):
        self.core = core
        self.selector = selector
        self.lock = threading.Lock()
        self.state = {}
        self.relists = 0
        self.expired = 0
        self.error = None
        self.stop = threading.Event()
        self.watch = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _list(self):
        listed = self.core.list_namespaced_config_map(NS, label_selector=self.selector)
        with self.lock:
            self.state = {i.metadata.name: i.metadata.resource_version for i in listed.items}
            self.relists += 1
        return listed.metadata.resource_version

    def _run(self):
        try:
            rv = self._list()
            while not self.stop.is_set():
                self.watch = watch.Watch()
                try:
                    for ev in self.watch.stream(
                        self.core.list_namespaced_config_map,
                        NS,
                        label_selector=self.selector,
                        resource_version=rv,
                        _request_timeout=120,
                    ):
                        obj = ev["object"]
                        with self.lock:
                            if ev["type"] == "DELETED":
                                self.state.pop(obj.metadata.name, None)
                            else:
                                self.state[obj.metadata.name] = obj.metadata.resource_version
                        if self.stop.is_set():
                            self.watch.stop()
                    # The Watch reconnects by itself after a plain disconnect; it only
                    # ends when stopped.
                    return
                except ApiException as e:
                    if e.status != 410:
                        raise
                    # Expired: our resourceVersion is gone. Relist and watch again.
                    with self.lock:
                        self.expired += 1
                    rv = self._list()
        except Exception as e:  # surfaced to the test thread
            self.error = e

    def snapshot(self):
        with self.lock:
            return dict(self.state)


def server_state(core, selector):
    listed = core.list_namespaced_config_map(NS, label_selector=selector)
    return {i.metadata.name: i.metadata.resource_version for i in listed.items}


def test_watch_survives_410(devcluster):
    core = devcluster.core
    sel = "suite=py410"
    for i in range(3):
        core.create_namespaced_config_map(NS, cm(f"x{i}", {"suite": "py410"}))

    inf = Informer(core, sel)
    inf.thread.start()

    def converged():
        if inf.error:
            raise inf.error
        want, have = server_state(core, sel), inf.snapshot()
        return want == have, {"server": want, "informer": have}

    wait_until("initial sync", converged)

    # Move the global resourceVersion past the informer's, drop history, cut the watch.
    # (Whether or not the informer's watch is already open, it resumes from an rv older
    # than the compaction point, so it must see 410 Expired.)
    core.create_namespaced_config_map(NS, cm("unrelated", {"suite": "other"}))
    devcluster.admin("compact")
    devcluster.admin("close-watches")

    core.create_namespaced_config_map(NS, cm("x3", {"suite": "py410"}))
    core.delete_namespaced_config_map("x0", NS)
    core.patch_namespaced_config_map("x1", NS, {"data": {"v": "changed"}})

    final = wait_until("informer to converge after 410", converged)
    assert sorted(final["informer"]) == ["x1", "x2", "x3"]
    assert inf.expired >= 1, "the watch must have failed with ApiException 410"
    assert inf.relists >= 2, "a 410 must be answered with a relist"

    # Still live after recovery.
    core.create_namespaced_config_map(NS, cm("x4", {"suite": "py410"}))
    final = wait_until("informer to see a post-recovery create", converged)
    assert "x4" in final["informer"]

    inf.stop.set()
    core.create_namespaced_config_map(NS, cm("wake", {"suite": "py410"}))
    inf.thread.join(timeout=TIMEOUT)
    assert inf.error is None, inf.error

