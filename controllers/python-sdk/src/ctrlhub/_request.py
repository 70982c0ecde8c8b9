"""What a handler receives: the request (or event), and the keyword arguments a handler may
ask for by name, kopf-style."""

from __future__ import annotations

import inspect
import json
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from . import traces
from ._reader import Reader, SyncReader
from ._types import EventType, Key, PermanentError, Reason
from .v1 import controller_pb2 as pb


def _decode(raw: bytes, what: str) -> dict[str, Any]:
    """A JSON object from the manager. Never called on empty bytes: an empty object means no
    state (NotFound), an empty tombstone a deletion whose last state is unknown."""
    try:
        obj = json.loads(raw)
    except ValueError as err:
        raise PermanentError(f"the {what} is not valid JSON: {err}") from err
    if not isinstance(obj, dict):
        raise PermanentError(f"the {what} is not a JSON object")
    return obj


def _timestamp(ts: Any) -> float | None:
    return ts.seconds + ts.nanos / 1e9 if ts.seconds or ts.nanos else None


class _Cancellable:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        """Set when the handler must stop (its deadline is near, its session ended, or the
        manager stopped answering heartbeats); sync handlers, which cannot be interrupted, must
        check it between steps and return soon after it is set: the SDK answers the request only
        once the handler has returned, and exits the process if a handler outlives the hold
        (``Registration.hold``)."""

    def _cancel(self) -> None:
        self.cancelled.set()


class Request(_Cancellable):
    """One reconcile request: a key to bring to its desired state, with the object as of
    dispatch when the controller includes objects."""

    __slots__ = ("_pb", "key", "reader", "logger", "_object", "_tombstone", "_span_traceparent", "_reasons")

    def __init__(self, msg: pb.ReconcileRequest, reader: Reader | SyncReader, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self._pb = msg
        self.key = Key(msg.key.namespace, msg.key.name)
        """The primary object's key."""
        self.reader = reader
        """Cached Get/List through the session that delivered this request (a ``SyncReader`` in
        sync handlers)."""
        super().__init__()
        self.logger = logger
        """A logger for this controller."""
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
        return self.reader.session_id

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
        return None if ts is None else datetime.fromtimestamp(ts, timezone.utc)

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
        return f"<Request {self.id} key={self.key} attempt={self.attempt}>"


class Event(_Cancellable):
    """One change to an object of the primary type (MODE_EVENTS)."""

    __slots__ = ("_pb", "key", "type", "reader", "logger", "_object")

    def __init__(self, msg: pb.Event, reader: Reader | SyncReader, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self._pb = msg
        self.key = Key(msg.key.namespace, msg.key.name)
        """The object's key."""
        try:
            self.type: EventType | int = EventType(msg.type)
        except ValueError:
            self.type = msg.type
        self.reader = reader
        """Cached Get/List through the session that delivered this event."""
        super().__init__()
        self.logger = logger
        """A logger for this controller."""
        self._object: Any = ...

    @property
    def id(self) -> str:
        """The event id (opaque)."""
        return self._pb.id

    @property
    def object(self) -> dict[str, Any]:
        """The object (its last known state for DELETED)."""
        if self._object is ...:
            self._object = _decode(self._pb.object_json, "object")
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
        return None if ts is None else datetime.fromtimestamp(ts, timezone.utc)

    @property
    def traceparent(self) -> str:
        """W3C traceparent of the manager's dispatch span."""
        return self._pb.traceparent

    @property
    def tracestate(self) -> str:
        """W3C tracestate accompanying ``traceparent``."""
        return self._pb.tracestate

    def __repr__(self) -> str:
        kind = self.type.name if isinstance(self.type, EventType) else self.type
        return f"<Event {self.id} {kind} key={self.key} sequence={self.sequence}>"


def _body(r: Request | Event) -> dict[str, Any]:
    if isinstance(r, Event):
        return r.object
    return r.object or r.tombstone or {}


def _meta(r: Request | Event) -> dict[str, Any]:
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
