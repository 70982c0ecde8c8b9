"""Kubernetes Events about objects, aggregated and rate-limited as client-go's recorder does,
posted by a background thread so that recording never blocks nor fails a reconcile.

They are core ``v1`` Events (``involvedObject``, ``count``, ``reportingComponent``): the API
server serves them as ``events.k8s.io/v1`` too, and ``kubectl describe`` lists them (also on
devcluster, which keeps the two groups apart)."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ._write import Kube, WriteError

__all__ = ["EventRecorder", "Severity"]

log = logging.getLogger("ctrlhub.events")

Severity = Literal["Normal", "Warning"]
"""A Kubernetes Event's ``type``."""

SERIES_WINDOW = 600.0
"""The same Event again within this many seconds increments its series instead of making a
new one."""
BURST = 25
"""Events per object allowed at once ..."""
REFILL = 300.0
"""... then one more per this many seconds."""
QUEUE = 1000
"""Events waiting to be posted; more are dropped (and logged at DEBUG)."""
NOTE_MAX = 1024


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")



def _instance() -> str:
    return (os.environ.get("POD_NAME") or socket.gethostname() or "unknown")[:128]


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class _Series:
    namespace: str
    name: str
    count: int
    seen: float
    created: threading.Event = field(default_factory=threading.Event)


class EventRecorder:
    """Records Events about objects for one controller (``reportingComponent``, shown as
    "From" by ``kubectl describe``: ``ctrlhub.io/<controller>``; ``reportingInstance``:
    ``$POD_NAME`` or the host name).

    ``info`` and ``warning`` return at once: a worker thread posts the Event with the
    controller's client. The same (object, type, reason, message) again within 10 minutes
    increments the existing Event's ``count`` instead of creating another; an object gets
    at most 25 Events in a burst, then one per 5 minutes (client-go's limits). Failures are
    logged at DEBUG, and at WARN at most once a minute; they never reach the handler."""

    def __init__(self, controller: str, kube: Kube, instance: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.controller = f"ctrlhub.io/{controller}"[:128]
        self.instance = instance or _instance()
        self._kube = kube
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, ...], _Bucket] = {}
        self._series: dict[tuple[str, ...], _Series] = {}
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue(QUEUE)
        self._worker: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._warned = -1e9
        self.posted = 0
        """Events created plus series updates posted so far (for tests and metrics)."""
        self.dropped = 0
        """Events dropped by the rate limit or a full queue."""

    def info(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """Records a Normal Event about ``obj`` (a Kubernetes object as JSON): a PascalCase
        ``reason`` (also its ``action``) and a human-readable ``message``."""
        self.record(obj, "Normal", reason, message)

    def warning(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """Records a Warning Event about ``obj``; see ``info``."""
        self.record(obj, "Warning", reason, message)

    def record(self, obj: Mapping[str, Any], type: Severity, reason: str, message: str, action: str | None = None) -> None:
        """Records an Event of ``type`` about ``obj``; see ``info``. Never raises."""
        try:
            self._record(obj, type, reason, message, action or reason)
        except Exception as err:  # recording must never fail a reconcile
            self._failed(f"cannot record the Event {reason}: {err}")

    def _record(self, obj: Mapping[str, Any], type: Severity, reason: str, message: str, action: str) -> None:
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        regarding = {k: v for k, v in {
            "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta.get("name"),
            "namespace": meta.get("namespace"), "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
        }.items() if v}
        if not regarding.get("name") or not regarding.get("kind"):
            self._failed(f"an Event {reason} about an object without kind or name is not recorded")
            return
        note = message if len(message) <= NOTE_MAX else message[: NOTE_MAX - 3] + "..."
        target = (str(regarding.get("namespace", "")), str(regarding["kind"]), str(regarding["name"]), str(regarding.get("uid", "")))
        now = self._clock()
        with self._lock:
            if not self._take(target, now):
                self.dropped += 1
                log.debug("Event %s about %s/%s dropped by the rate limit", reason, regarding["kind"], regarding["name"])
                return
            key = (*target, type, reason, note)
            series = self._series.get(key)
            if series is not None and now - series.seen <= SERIES_WINDOW:
                series.count += 1
                series.seen = now
                job = self._job_series(series, series.count)
            else:
                namespace = str(regarding.get("namespace") or "default")
                name = f"{regarding['name']}.{time.time_ns():x}"[:253]
                series = _Series(namespace, name, 1, now)
                self._series[key] = series
                if len(self._series) > 4096:
                    self._series = {k: s for k, s in self._series.items() if now - s.seen <= SERIES_WINDOW}
                now_text = _now()
                body = {
                    "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
                    "involvedObject": regarding, "reason": reason[:128], "message": note, "type": type,
                    "source": {"component": self.controller, "host": self.instance},
                    "reportingComponent": self.controller, "reportingInstance": self.instance, "action": action[:128],
                    "firstTimestamp": now_text, "lastTimestamp": now_text, "count": 1,
                }
                job = self._job_create(key, series, body)
            self._enqueue(job)

    def _take(self, target: tuple[str, ...], now: float) -> bool:
        bucket = self._buckets.get(target)
        if bucket is None:
            bucket = self._buckets[target] = _Bucket(BURST, now)
            if len(self._buckets) > 4096:
                self._buckets = {k: b for k, b in self._buckets.items() if now - b.at < REFILL * BURST or k == target}
        bucket.tokens = min(BURST, bucket.tokens + (now - bucket.at) / REFILL)
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _job_create(self, key: tuple[str, ...], series: _Series, body: dict[str, Any]) -> Callable[[], None]:
        def create() -> None:
            try:
                self._kube.request("POST", f"/api/v1/namespaces/{series.namespace}/events", body, timeout=10)
                self.posted += 1
            except BaseException:
                with self._lock:  # not created: the next such Event makes a new one
                    if self._series.get(key) is series:
                        del self._series[key]
                raise
            finally:
                series.created.set()

        return create

    def _job_series(self, series: _Series, count: int) -> Callable[[], None]:
        def update() -> None:
            series.created.wait(30)
            patch = {"count": count, "lastTimestamp": _now()}
            path = f"/api/v1/namespaces/{series.namespace}/events/{series.name}"
            try:
                self._kube.request("PATCH", path, patch, "application/merge-patch+json", timeout=10)
            except WriteError as err:
                if err.status != 404:
                    raise
                log.debug("Event %s/%s is gone; its series is not counted further", series.namespace, series.name)
                return
            self.posted += 1

        return update

    def _enqueue(self, job: Callable[[], None]) -> None:
        """Called with the lock held."""
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.dropped += 1
            log.debug("an Event was dropped: %d are waiting to be posted", QUEUE)
            return
        self._pending += 1
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name=f"ctrlhub-events-{self.controller}", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                job()
            except Exception as err:  # logged, never raised
                self._failed(f"posting an Event failed: {err}")
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def _failed(self, what: str) -> None:
        now = self._clock()
        if now - self._warned >= 60:
            self._warned = now
            log.warning("%s (Events are best effort; more such failures are logged at DEBUG for a minute)", what)
        else:
            log.debug("%s", what)

    def flush(self, timeout: float = 10.0) -> bool:
        """Waits until every recorded Event has been posted (or failed); returns False on
        timeout."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True
