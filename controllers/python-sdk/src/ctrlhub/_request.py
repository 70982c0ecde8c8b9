"""What a handler receives: the request (or event), and the keyword arguments a handler may
ask for by name, kopf-style."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from . import traces
from ._events import EventRecorder
from ._reader import Reader, SyncReader
from ._types import EventType, Key, Reason, TemporaryError
from ._write import Kube, WriteError, adopt
from .finalizers import Finalizers, SyncFinalizers
from .v1 import controller_pb2 as pb

__all__ = [
    "EVENT_KWARGS",
    "RECONCILE_KWARGS",
    "Event",
    "Helpers",
    "Request",
    "SyncEvent",
    "SyncRequest",
    "blocking",
    "injection",
]

T = TypeVar("T")
_CANCEL_LOCK = threading.Lock()
"""Guards making a request's ``cancelled`` event against setting it (rare, and brief)."""


def _decode(raw: bytes, what: str) -> dict[str, Any]:
    """A JSON object from the manager. Never called on empty bytes: an empty object means no
    state (NotFound), an empty tombstone a deletion whose last state is unknown. Something
    undecodable is the manager's fault, not the object's: the attempt fails and is retried,
    never answered as a terminal error."""
    try:
        obj = json.loads(raw)
    except ValueError as err:
        raise TemporaryError(f"the manager sent a {what} that is not valid JSON: {err}") from err
    if not isinstance(obj, dict):
        raise TemporaryError(f"the manager sent a {what} that is not a JSON object")
    return obj


def _timestamp(ts: Any) -> float | None:
    return ts.seconds + ts.nanos / 1e9 if ts.seconds or ts.nanos else None


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a worker thread, off the event loop. If the awaiting task is cancelled
    the call still runs to its end (a thread cannot be interrupted; the SDK's calls carry the
    request's deadline as their timeout), and only then is the cancellation raised: a handler
    has stopped only once nothing it started still runs."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    fut = loop.run_in_executor(None, functools.partial(ctx.run, fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():
            try:
                await asyncio.wait((fut,))
            except asyncio.CancelledError:
                continue
        raise


class Helpers:
    """What a controller's handlers write with: its ``Kube`` (the client and field manager),
    its ``EventRecorder`` and the SDK's event loop."""

    def __init__(self, kube: Kube, recorder: EventRecorder, loop: asyncio.AbstractEventLoop) -> None:
        self.kube = kube
        self.recorder = recorder
        self.loop = loop


class _Delivery:
    """What every request and event has: its key, reader, logger, cancellation and helpers."""

    def __init__(self, key: Key, reader: Any, logger: logging.Logger | logging.LoggerAdapter[Any],
                 helpers: Helpers | None, stop_at: float | None) -> None:
        self.key = key
        """The primary object's key."""
        self.reader = reader
        self.logger = logger
        """The controller's logger; every line carries this request's key and request id."""
        self._cancelled: threading.Event | None = None  # made when first asked for: most never are
        self._stopped = False
        self._helpers = helpers
        self._stop_at = stop_at  # time.monotonic() when the handler is cancelled

    @property
    def cancelled(self) -> threading.Event:
        """Set when the handler must stop (its deadline is near, its session ended, or the
        manager stopped answering heartbeats); sync handlers, which cannot be interrupted, must
        check it between steps and return soon after it is set: the SDK answers the request only
        once the handler has returned, and exits the process if a handler outlives the hold
        (``Registration.hold``)."""
        event = self._cancelled
        if event is None:
            with _CANCEL_LOCK:  # a handler's thread may ask while the event loop cancels
                if self._cancelled is None:
                    self._cancelled = threading.Event()
                    if self._stopped:
                        self._cancelled.set()
                event = self._cancelled
        return event

    def _cancel(self) -> None:
        with _CANCEL_LOCK:
            self._stopped = True
            if self._cancelled is not None:
                self._cancelled.set()

    def _kube(self) -> Kube:
        if self._helpers is None:
            raise WriteError("this request has no Kubernetes client (it was not made by a running controller)")
        return self._helpers.kube

    def _timeout(self) -> float:
        """Seconds a write may take: until the handler's deadline, at least 1."""
        return 60.0 if self._stop_at is None else max(1.0, self._stop_at - time.monotonic())

    @property
    def events(self) -> EventRecorder:
        """Kubernetes Events about objects (``events.info(obj, reason, message)``,
        ``events.warning(...)``); never blocks nor fails the handler."""
        if self._helpers is None:
            raise WriteError("this request has no Kubernetes client (it was not made by a running controller)")
        return self._helpers.recorder

    @property
    def api_client(self) -> Any:
        """The ``kubernetes.client.ApiClient`` the helpers write with, for your own calls
        (``kubernetes.client.CoreV1Api(request.api_client)``); blocking: call it from a sync
        handler, or through ``asyncio.to_thread`` from an async one."""
        return self._kube().api_client

    @staticmethod
    def adopt(child: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
        """See ``ctrlhub.adopt``: ``owner`` becomes ``child``'s controller owner; returns
        ``child``."""
        return adopt(child, owner)


class _AsyncWrites(_Delivery):
    reader: Reader
    """Cached Get/List through the session that delivered this request."""

    @property
    def finalizers(self) -> Finalizers:
        """``ensure`` and ``finalize`` for this object (``await`` them)."""
        return Finalizers(lambda obj, body: blocking(self._kube().merge_patch, obj, body, self._timeout()), blocking)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of ``obj`` (a full object: apiVersion, kind, metadata.name and
        namespace, what you want set) with the controller's name as field manager, forcing
        conflicts; returns the object as the API server stored it. Raises ``WriteError``."""
        return await blocking(self._kube().apply, obj, self._timeout())

    async def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of ``obj``'s status subresource with ``status`` (custom resources
        and built-ins); returns the updated object. Raises ``WriteError``."""
        return await blocking(self._kube().patch_status, obj, status, self._timeout())


class _SyncWrites(_Delivery):
    reader: SyncReader
    """Cached Get/List through the session that delivered this request (blocking)."""

    @property
    def finalizers(self) -> SyncFinalizers:
        """``ensure`` and ``finalize`` for this object (blocking)."""
        loop = self._helpers.loop if self._helpers is not None else None

        def run_async(coro: Any) -> Any:
            if loop is None:
                raise WriteError("no event loop to run an async cleanup on")
            return asyncio.run_coroutine_threadsafe(coro, loop).result(self._timeout())

        return SyncFinalizers(lambda obj, body: self._kube().merge_patch(obj, body, self._timeout()), run_async)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """See ``Request.apply`` (blocking, on the handler's thread)."""
        return self._kube().apply(obj, self._timeout())

    def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """See ``Request.patch_status`` (blocking, on the handler's thread)."""
        return self._kube().patch_status(obj, status, self._timeout())


class _RequestData(_Delivery):
    """One reconcile request: a key to bring to its desired state, with the object as of
    dispatch when the controller includes objects."""

    def __init__(self, msg: pb.ReconcileRequest, reader: Any, logger: logging.Logger | logging.LoggerAdapter[Any],
                 helpers: Helpers | None = None, stop_at: float | None = None) -> None:
        super().__init__(Key(msg.key.namespace, msg.key.name), reader, logger, helpers, stop_at)
        self._pb = msg
        self._object: Any = ...
        self._tombstone: Any = ...
        self._span_traceparent: str | None = None
        self._reasons: tuple[Reason | int, ...] | None = None

    @property
    def id(self) -> str:
        """The request id (opaque)."""
        return self._pb.id

    @property
    def session_id(self) -> str:
        """The session that delivered the request (``Registered.session_id``)."""
        return str(self.reader.session_id)

    @property
    def attempt(self) -> int:
        """1, plus the consecutive attempts of this key that did not succeed."""
        return self._pb.attempt

    @property
    def reasons(self) -> tuple[Reason | int, ...]:
        """Why the key was enqueued (informational)."""
        if self._reasons is None:
            self._reasons = tuple(Reason.of(r) for r in self._pb.reasons)
        return self._reasons

    @property
    def object(self) -> dict[str, Any] | None:
        """The object as Kubernetes JSON, or None: it is gone (a ``tombstone`` says the manager
        saw it deleted), the manager's cache does not hold it (NotFound: nothing says it was
        deleted, so do not clean up after it), or the controller does not include objects."""
        if self._object is ...:
            raw = self._pb.object_json if self._pb.HasField("object_json") else b""
            self._object = _decode(raw, "object") if raw else None
        return self._object  # type: ignore[no-any-return]

    @property
    def tombstone(self) -> dict[str, Any] | None:
        """The last known state of an object the manager saw deleted (or leave the controller's
        scope, reason ``LEFT_SCOPE``); ``{}`` when it kept no state of it; None when the request
        carries no tombstone, which is the only case where the object is known to be gone."""
        if self._tombstone is ...:
            if not self._pb.HasField("tombstone"):
                self._tombstone = None
            else:
                raw = self._pb.tombstone.object_json
                self._tombstone = _decode(raw, "tombstone") if raw else {}
        return self._tombstone  # type: ignore[no-any-return]

    @property
    def final_state_unknown(self) -> bool:
        """The tombstone may be older than the object's real final state."""
        return self._pb.tombstone.final_state_unknown

    @property
    def deadline(self) -> datetime | None:
        """The manager's deadline for the result; the handler is cancelled a little before."""
        ts = _timestamp(self._pb.deadline)
        return None if ts is None else datetime.fromtimestamp(ts, UTC)

    @property
    def traceparent(self) -> str:
        """W3C traceparent of the manager's dispatch span (``""`` without tracing)."""
        return self._pb.traceparent

    @property
    def tracestate(self) -> str:
        """W3C tracestate accompanying ``traceparent``."""
        return self._pb.tracestate

    @property
    def span_traceparent(self) -> str:
        """W3C traceparent of this handler's own span: the request's trace, a new span id."""
        if self._span_traceparent is None:
            self._span_traceparent = traces.child_traceparent(self._pb.traceparent)
        return self._span_traceparent

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} key={self.key} attempt={self.attempt}>"


class Request(_RequestData, _AsyncWrites):
    """One reconcile request, as an **async** handler receives it (``request``): the key, the
    object, why and which attempt, the cached ``reader``, and the writes (``apply``,
    ``patch_status``, ``adopt``, ``finalizers``, ``events``), awaitable and never blocking the
    event loop."""


class SyncRequest(_RequestData, _SyncWrites):
    """One reconcile request, as a **sync** handler receives it: the same as ``Request``, with
    a blocking ``reader``, ``apply``, ``patch_status`` and ``finalizers`` (the handler runs on
    a thread of its own)."""


class _EventData(_Delivery):
    """One change to an object of the primary type (MODE_EVENTS)."""

    def __init__(self, msg: pb.Event, reader: Any, logger: logging.Logger | logging.LoggerAdapter[Any],
                 helpers: Helpers | None = None, stop_at: float | None = None) -> None:
        super().__init__(Key(msg.key.namespace, msg.key.name), reader, logger, helpers, stop_at)
        self._pb = msg
        try:
            self.type: EventType | int = EventType(msg.type)
        except ValueError:
            self.type = msg.type
        self._object: Any = ...

    @property
    def id(self) -> str:
        """The event id (opaque)."""
        return self._pb.id

    @property
    def object(self) -> dict[str, Any]:
        """The object (its last known state for DELETED)."""
        if self._object is ...:
            self._object = _decode(self._pb.object_json, "object") if self._pb.object_json else {}
        return self._object  # type: ignore[no-any-return]

    @property
    def sequence(self) -> int:
        """Position in the key's history within one leader term."""
        return self._pb.sequence

    @property
    def attempt(self) -> int:
        """1 on first delivery, more when delivered again."""
        return self._pb.attempt

    @property
    def deadline(self) -> datetime | None:
        """Acknowledge before this (the handler returning acknowledges)."""
        ts = _timestamp(self._pb.deadline)
        return None if ts is None else datetime.fromtimestamp(ts, UTC)

    @property
    def traceparent(self) -> str:
        """W3C traceparent of the manager's dispatch span."""
        return self._pb.traceparent

    @property
    def tracestate(self) -> str:
        """W3C tracestate accompanying ``traceparent``."""
        return self._pb.tracestate

    @property
    def span_traceparent(self) -> str:
        """W3C traceparent for this handler's log lines: the event's trace, a new span id."""
        return traces.child_traceparent(self._pb.traceparent)

    def __repr__(self) -> str:
        kind = self.type.name if isinstance(self.type, EventType) else self.type
        return f"<{type(self).__name__} {self.id} {kind} key={self.key} sequence={self.sequence}>"


class Event(_EventData, _AsyncWrites):
    """One change (MODE_EVENTS), as an **async** event handler receives it (``event``), with
    the same writes as ``Request``."""


class SyncEvent(_EventData, _SyncWrites):
    """One change (MODE_EVENTS), as a **sync** event handler receives it, with the same
    blocking writes as ``SyncRequest``."""


AnyRequest = Request | SyncRequest
AnyEvent = Event | SyncEvent


def _body(r: Any) -> dict[str, Any]:
    if isinstance(r, _EventData):
        return r.object
    return r.object or r.tombstone or {}


def _meta(r: Any) -> dict[str, Any]:
    meta = _body(r).get("metadata")
    return meta if isinstance(meta, dict) else {}


Getter = Callable[[Any], Any]

COMMON: dict[str, Getter] = {
    "key": lambda r: r.key,
    "name": lambda r: r.key.name,
    "namespace": lambda r: r.key.namespace,
    "attempt": lambda r: r.attempt,
    "reader": lambda r: r.reader,
    "logger": lambda r: r.logger,
    "cancelled": lambda r: r.cancelled,
    "deadline": lambda r: r.deadline,
    "spec": lambda r: _body(r).get("spec") or {},
    "status": lambda r: _body(r).get("status") or {},
    "meta": _meta,
    "labels": lambda r: _meta(r).get("labels") or {},
    "annotations": lambda r: _meta(r).get("annotations") or {},
    "apply": lambda r: r.apply,
    "patch_status": lambda r: r.patch_status,
    "adopt": lambda r: r.adopt,
    "finalizers": lambda r: r.finalizers,
    "events": lambda r: r.events,
}

RECONCILE_KWARGS: dict[str, Getter] = {
    **COMMON,
    "request": lambda r: r,
    "obj": lambda r: r.object,
    "body": lambda r: r.object,
    "tombstone": lambda r: r.tombstone,
    "reasons": lambda r: r.reasons,
}
"""The keyword arguments a reconcile handler may declare."""

EVENT_KWARGS: dict[str, Getter] = {
    **COMMON,
    "event": lambda e: e,
    "type": lambda e: e.type,
    "obj": lambda e: e.object,
    "body": lambda e: e.object,
    "sequence": lambda e: e.sequence,
}
"""The keyword arguments an event handler may declare."""

NEEDS_OBJECT = {"obj", "body", "tombstone", "spec", "status", "meta", "labels", "annotations"}


def injection(fn: Callable[..., Any], available: Mapping[str, Getter], what: str) -> tuple[tuple[tuple[str, Getter], ...], bool]:
    """The (name, getter) pairs to call ``fn`` with, and whether it wants the object.

    A handler declares, by name, the arguments it wants (``**kwargs`` takes them all);
    an unknown name without a default is a mistake, reported now rather than per request."""
    wanted: list[tuple[str, Getter]] = []
    takes_all = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.kind is p.POSITIONAL_ONLY:
            raise TypeError(f"{what} {fn.__qualname__}: parameter {p.name!r} is positional-only; handlers get keyword arguments")
        elif p.name in available:
            wanted.append((p.name, available[p.name]))
        elif p.default is p.empty:
            raise TypeError(f"{what} {fn.__qualname__}: unknown parameter {p.name!r}; a handler may take {', '.join(sorted(available))}, or **kwargs")
    if takes_all:
        names = {n for n, _ in wanted}
        wanted += [(n, g) for n, g in available.items() if n not in names]
    return tuple(wanted), any(n in NEEDS_OBJECT for n, _ in wanted)
