"""A controller: its definition (turned into ``ctrlhub.v1.Register``) and its session loop
(connect, register, heartbeat, run handlers, reconnect with backoff, drain).

Attempts are exclusive (docs/protocol.md, "Exclusive attempts"): the SDK registers with
``exclusive_attempts``, a handler is cancelled at its deadline and its request answered only
once it has really returned, a key's next attempt never starts in this process while an earlier
one still runs, and ``_fence`` stops (or, failing that, exits) before the manager may hand a
session's keys to another replica."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc

from . import traces
from ._config import Config, ConfigError, revision_from_env
from ._fence import Fence, Watchdog
from ._reader import Reader, SyncReader
from ._request import EVENT_KWARGS, RECONCILE_KWARGS, Event, Request, injection
from ._timing import Backoff, time_left
from ._types import (
    FatalError,
    Form,
    Key,
    Kind,
    KindLike,
    Owns,
    Predicate,
    Registration,
    Selector,
    SelectorLike,
    Watch,
    duration,
    outcome,
    seconds,
)
from .v1 import controller_pb2 as pb
from .v1 import controller_pb2_grpc as pb_grpc
from .v1 import registration_pb2

log = logging.getLogger("ctrlhub")

# Refusals before Registered that reconnecting cannot fix (docs/protocol.md, "Reconnecting").
_FATAL_BEFORE_REGISTERED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
}
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_SUPERSEDED = registration_pb2.Revoked.REASON_SUPERSEDED
DEFAULT_DEADLINE = 60.0
CONFIRM_AFTER_DEADLINE = 0.02
"""Seconds after a request's deadline (by this host's clock) at which the answer of an attempt
cancelled at its deadline is sent."""
SETTLE_AFTER_GRACE = 1.0
"""Seconds a handler cancelled at the end of ``shutdown_grace`` gets to return."""

_DEADLINE = "its deadline is near"
_SESSION_ENDED = "its session ended"
_SHUTDOWN = "the shutdown grace is over"


@dataclass
class _End:
    """How a session ended."""

    retry: bool  # connect again (else: stopped, or fatal raised)
    registered: bool
    reason: str = ""
    outdated: bool = False  # a newer (or conflicting) definition runs: wait longer


def _classify(code: grpc.StatusCode, message: str, registered: bool, field: str = "", leader: str = "") -> _End:
    if code in _FATAL_BEFORE_REGISTERED and not registered:
        where = f" (field {field})" if field else ""
        raise FatalError(f"the manager refused the registration: {code.name}{where}: {message}", code.name, field)
    if code == grpc.StatusCode.UNAVAILABLE:
        return _End(True, registered, f"manager unavailable{f' (the leader is {leader})' if leader else ''}: {message}")
    return _End(True, registered, f"{code.name}: {message}")


class _Session:
    """One Connect stream: its writer, its attempts, its fence, and how far it got."""

    def __init__(self, call: Any, stub: pb_grpc.ControllerManagerStub) -> None:
        self.call = call
        self.stub = stub
        self.outbox: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
        self.attempts: set[_Attempt] = set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.registered = False
        self.draining = False
        self.closed = False
        self.session_id = ""
        self.reader: Reader | None = None
        self.writer: asyncio.Task[None] | None = None
        self.fence: Fence | None = None
        self.heartbeat: asyncio.Task[None] | None = None
        self.echoed = asyncio.Event()  # handlers may start: the first heartbeat was answered
        self.expired = asyncio.Event()  # half the hold without an answer: end the session

    def send(self, msg: pb.ControllerMessage) -> bool:
        """Queue ``msg`` on this stream; False once it is over (results never go elsewhere)."""
        if self.closed:
            return False
        self.outbox.put_nowait(msg)
        return True

    async def write_loop(self) -> None:
        write = self.call.write
        get = self.outbox.get
        try:
            while (msg := await get()) is not None:
                await write(msg)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as err:
            log.debug("writing to the stream failed: %s", err)

    async def close(self) -> None:
        """The session is over: stop its attempts (their results are never sent) without
        waiting for them, and stop writing."""
        self.closed = True
        if self.fence is not None:
            self.fence.live = False
        for attempt in list(self.attempts):
            attempt.stop(_SESSION_ENDED)
        for task in (self.heartbeat, self.writer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


class _Attempt:
    """One request (or event) from its arrival until its handler has really stopped."""

    __slots__ = ("session", "request", "key", "inner", "in_thread", "why", "done", "running")

    def __init__(self, session: _Session, request: Request | Event) -> None:
        self.session = session
        self.request = request
        self.key = request.key
        self.inner: asyncio.Future[Any] | None = None
        self.in_thread = False
        self.why: str | None = None
        """Why it was stopped: its deadline, the end of its session, the shutdown."""
        self.done = asyncio.Event()
        """Set once it no longer runs (nor waits): the key is free in this process."""
        self.running = False

    def stop(self, why: str) -> None:
        """Cancel it: the ``cancelled`` event for a sync handler (a thread cannot be
        interrupted), the task for an async one or for the wait before it starts."""
        if self.why is None:
            self.why = why
        self.request._cancel()
        if self.inner is not None and not self.in_thread:
            self.inner.cancel()

    async def until(self, fut: asyncio.Future[Any], stop_at: float, in_thread: bool = False) -> None:
        """Wait until ``fut`` is done; at ``stop_at`` (loop time) stop it, and still wait until
        it is really done."""
        self.inner, self.in_thread = fut, in_thread
        if self.why is not None:
            self.stop(self.why)
        timer = asyncio.get_running_loop().call_at(stop_at, self.stop, _DEADLINE)
        try:
            await asyncio.wait((fut,))
        finally:
            timer.cancel()
            self.inner = None


class Controller:
    """One controller: a primary kind, what else wakes it, and the handler for its requests
    (``mode="reconcile"``) or events (``mode="events"``).

    Usually made by the ``Operator.reconcile`` / ``Operator.on_event`` decorators (or
    ``ctrlhub.reconcile`` / ``ctrlhub.on_event``); see there for the parameters."""

    def __init__(
        self,
        name: str,
        kind: KindLike,
        handler: Callable[..., Any],
        *,
        mode: str = "reconcile",
        namespaces: str | Sequence[str] | SelectorLike | None = None,
        labels: SelectorLike | None = None,
        predicate: Predicate | None = None,
        owns: Iterable[KindLike | Owns] = (),
        watches: Iterable[Watch] = (),
        max_concurrent: int = 1,
        max_in_flight: int | None = None,
        controller_wide_limit: int | None = None,
        deadline: float | timedelta | None = None,
        resync: float | timedelta | None = None,
        backoff: tuple[float | timedelta, float | timedelta] | None = None,
        include_object: bool | None = None,
        revision: int | None = None,
    ) -> None:
        if mode not in ("reconcile", "events"):
            raise ValueError(f"mode must be 'reconcile' or 'events', not {mode!r}")
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        if revision is not None and not 0 <= revision < 2**64:
            raise ValueError(f"revision must be from 0 to 2^64-1, not {revision}")
        self.name = name
        self.kind = Kind.of(kind)
        self.handler = handler
        self.mode = mode
        self.is_async = inspect.iscoroutinefunction(handler)
        available = RECONCILE_KWARGS if mode == "reconcile" else EVENT_KWARGS
        self._kwargs, wants_object = injection(handler, available, "reconcile handler" if mode == "reconcile" else "event handler")
        self.max_concurrent = max_concurrent
        self.max_in_flight = max_in_flight or max_concurrent
        self.deadline = seconds(deadline) if deadline is not None else None
        self.revision = revision
        """``Register.revision``; None: ``CTRLHUB_REVISION``, else 0."""
        self.log = logging.getLogger(f"ctrlhub.{name}")
        reg = registration_pb2.Register(
            controller_name=name,
            mode=registration_pb2.Register.MODE_RECONCILE if mode == "reconcile" else registration_pb2.Register.MODE_EVENTS,
            primary=self.kind.to_proto(),
            owns=[(o if isinstance(o, Owns) else Owns(o)).to_proto() for o in owns],
            watches=[w.to_proto() for w in watches],
            max_concurrent_reconciles=controller_wide_limit or 0,
            include_object=wants_object if include_object is None else include_object,
            # Reconcile results confirm that an attempt ended, also after its deadline. An
            # event has no such answer (an ack means processed), so EVENTS sessions keep the
            # older rule: an event not acknowledged by its deadline is simply sent again.
            exclusive_attempts=mode == "reconcile",
        )
        if namespaces is not None:
            if isinstance(namespaces, str):
                reg.namespaces.names.names.append(namespaces)
            elif isinstance(namespaces, (Selector, dict)):
                reg.namespaces.label_selector.CopyFrom(Selector.of(namespaces).to_proto())
            else:
                reg.namespaces.names.names.extend(namespaces)
        if labels is not None:
            reg.label_selector.CopyFrom(Selector.of(labels).to_proto())
        if predicate is not None:
            reg.predicate.CopyFrom(predicate.to_proto())
        if deadline is not None:
            reg.request_deadline.SetInParent()
            reg.request_deadline.CopyFrom(duration(deadline))
        if resync is not None:
            reg.resync_period.SetInParent()
            reg.resync_period.CopyFrom(duration(resync))
        if backoff is not None:
            reg.backoff.base.CopyFrom(duration(backoff[0]))
            reg.backoff.max.CopyFrom(duration(backoff[1]))
        self._register = reg
        self._slots = asyncio.Semaphore(max_concurrent)
        self._session: _Session | None = None
        self._keys: dict[Key, _Attempt] = {}
        self._attempts: set[_Attempt] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._watchdog: Watchdog | None = None
        self._grace_end: float | None = None
        self._drained = False
        self._on_registered: list[Callable[[Registration], Any]] = []
        self._readable_logged: dict[Kind, Form] | None = None
        self.effective: registration_pb2.Register | None = None
        """The registration as the manager echoed it (``Registered.effective``) last time."""
        self.registration: Registration | None = None
        """The live session's ``Registered`` answer, None between sessions."""
        self.outdated = False
        """True after ``Revoked(SUPERSEDED)`` or ``Rejected`` with ``outdated``: another
        definition of this controller runs under a higher (or equal) revision, and this replica
        takes no work until it registers again (every ``Config.outdated_retry`` seconds)."""
        self.unfinished = 0
        """Handlers still running when ``serve`` gave up waiting for them (``shutdown_grace``)."""

    def to_register(self) -> registration_pb2.Register:
        """The ``Register`` message this controller sends (``CTRLHUB_REVISION`` read now)."""
        reg = registration_pb2.Register()
        reg.CopyFrom(self._register)
        reg.max_in_flight = self.max_in_flight
        reg.revision = self.revision if self.revision is not None else revision_from_env()
        return reg

    def on_registered(self, callback: Callable[[Registration], Any]) -> Callable[[Registration], Any]:
        """Calls ``callback(registration)`` on the event loop every time a session registers
        (usable as a decorator); an exception it raises is logged and ignored."""
        self._on_registered.append(callback)
        return callback

    @property
    def session_id(self) -> str | None:
        """The live session's id, or None between sessions."""
        s = self._session
        return s.session_id if s is not None and s.registered and not s.closed else None

    @property
    def ready(self) -> bool:
        """Whether this replica takes work: a session is registered and neither draining nor
        outdated. Serve it from a readiness probe if the process has one."""
        s = self._session
        return s is not None and s.registered and not s.closed and not s.draining and not self.outdated

    @property
    def running(self) -> int:
        """Handlers running now (or waiting for an earlier attempt of their key), in every
        session, those of ended sessions included."""
        return len(self._attempts)

    def set_max_in_flight(self, credit: int) -> None:
        """Change this replica's credit (how many requests the manager may have outstanding on
        it) now, with a ``Credit`` message, and for the sessions to come. 0 pauses dispatch
        without ending the session."""
        if credit < 0:
            raise ValueError("credit must not be negative")
        self.max_in_flight = credit
        s = self._session
        if s is not None and s.registered and not s.draining:
            s.send(pb.ControllerMessage(credit=pb.Credit(max_in_flight=credit)))

    # ---- the session loop -----------------------------------------------------------------

    async def serve(self, config: Config, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (then drain and return once the handlers have finished)
        or the manager refuses the controller for good (raises ``FatalError``)."""
        self.to_register()  # a bad CTRLHUB_REVISION is a ConfigError now, not on every connect
        backoff = Backoff(config.reconnect_initial, config.reconnect_max)
        self._slots = asyncio.Semaphore(self.max_concurrent)
        self._idle = asyncio.Event()
        self._idle.set()
        self.unfinished = 0
        self._watchdog = Watchdog(self.name)
        self._grace_end = None
        self._drained = False
        try:
            while not stop.is_set():
                started = time.monotonic()
                end = await self._run_session(config, stop)
                if not end.retry or stop.is_set():
                    break
                if end.outdated:
                    self.outdated = True
                    delay = config.outdated_retry
                    self.log.warning(
                        "%s; taking no work and registering again in %.0f s (a rollout replaces this replica, or the newer "
                        "definition's replicas go away)", end.reason, delay,
                    )
                else:
                    delay = backoff.next_delay(end.registered, time.monotonic() - started)
                    self.log.warning("session ended: %s; reconnecting in %.0f ms", end.reason, delay * 1000)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
            await self._settle(self._grace(config))
        finally:
            self._watchdog.stop()

    def _grace(self, config: Config) -> float:
        """When (loop time) the handlers' time is up: ``shutdown_grace`` after the stop was
        first seen."""
        if self._grace_end is None:
            self._grace_end = asyncio.get_running_loop().time() + config.shutdown_grace
        return self._grace_end

    async def _settle(self, grace_end: float) -> None:
        """Wait for every handler, of every session, to return: until ``grace_end``, then
        cancel the rest and give them ``SETTLE_AFTER_GRACE`` more."""
        loop = asyncio.get_running_loop()
        if self._attempts:
            self.log.info("waiting for %d handler(s) to return", len(self._attempts))
            try:
                await asyncio.wait_for(self._idle.wait(), max(0.0, grace_end - loop.time()))
            except TimeoutError:
                for attempt in list(self._attempts):
                    attempt.stop(_SHUTDOWN)
                try:
                    await asyncio.wait_for(self._idle.wait(), SETTLE_AFTER_GRACE)
                except TimeoutError:
                    self.unfinished = len(self._attempts)
                    keys = ", ".join(sorted(str(a.key) for a in self._attempts))
                    self.log.error(
                        "%d handler(s) still running after the shutdown grace, although cancelled (%s); leaving them "
                        "unfinished: return soon after `cancelled` is set", self.unfinished, keys,
                    )
                    return
        if self._drained:
            self.log.info("drained: the manager ended the stream")
        self.log.info("stopped")

    async def _run_session(self, config: Config, stop: asyncio.Event) -> _End:
        try:
            channel = config.channel()
            metadata = config.metadata()
        except ConfigError as err:  # a file missing mid-rotation: retry, it may come back
            return _End(True, False, str(err))
        stub = pb_grpc.ControllerManagerStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Connect(metadata=metadata)
        session = _Session(call, stub)
        self._session = session
        session.send(pb.ControllerMessage(register=self.to_register()))
        session.writer = asyncio.create_task(session.write_loop())
        reading = asyncio.create_task(self._read(session, config))
        stopping = asyncio.create_task(stop.wait())
        expired = asyncio.create_task(session.expired.wait())
        try:
            await asyncio.wait((reading, stopping, expired), return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                return reading.result()
            if expired.done():
                assert session.fence is not None
                self.log.warning(
                    "no heartbeat answer from the manager for %.1f s (half the %.1f s hold): cancelling %d handler(s) of "
                    "session %s and reconnecting", session.fence.age(time.monotonic()), session.fence.hold,
                    len(session.attempts), session.session_id,
                )
                return _End(True, True, "the manager stopped answering heartbeats")
            grace_end = self._grace(config)
            if session.registered:
                await self._drain(session, reading, config, grace_end)
            else:
                call.cancel()  # nothing is in flight before Registered
            await asyncio.gather(reading, return_exceptions=True)
            return _End(False, session.registered, "stopped")
        finally:
            stopping.cancel()
            expired.cancel()
            if not reading.done():
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
            self._session = None
            self.registration = None
            await session.close()
            call.cancel()
            await channel.close()

    async def _drain(self, session: _Session, reading: asyncio.Task[_End], config: Config, grace_end: float) -> None:
        """Drain: no new work; handlers finish and answer (or are cancelled at their deadline
        and answer once they return); the manager then ends the stream."""
        loop = asyncio.get_running_loop()
        self.log.info("draining: %d handler(s) in flight", len(session.attempts))
        session.draining = True
        session.send(pb.ControllerMessage(drain=pb.Drain()))
        idle = asyncio.create_task(session.idle.wait())
        try:
            await asyncio.wait((reading, idle), timeout=max(0.0, grace_end - loop.time()), return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
        if reading.done():
            return
        if session.attempts:
            self.log.warning("%d handler(s) still running at the end of the shutdown grace; ending the session", len(session.attempts))
            session.call.cancel()
            return
        try:
            await asyncio.wait_for(asyncio.shield(reading), config.drain_grace)
        except TimeoutError:
            self.log.warning("the manager did not end the drained stream within %.0f s; closing it", config.drain_grace)
            session.call.cancel()

    async def _read(self, session: _Session, config: Config) -> _End:
        call = session.call
        try:
            async for msg in call:
                kind = msg.WhichOneof("message")
                if kind == "reconcile":
                    self._dispatch(session, msg.reconcile)
                elif kind == "heartbeat":
                    fence = session.fence
                    if fence is not None and fence.answered(msg.heartbeat.nonce):
                        session.echoed.set()
                elif kind == "event":
                    self._dispatch(session, msg.event)
                elif kind == "registered":
                    self._registered(session, msg.registered, config)
                elif kind == "revoked":
                    return self._revoked(session, msg.revoked)
                elif kind == "rejected":
                    return self._rejected(session, msg.rejected)
                else:
                    self.log.debug("ignoring a manager message of unknown kind %r", kind)
        except grpc.aio.AioRpcError as err:
            if session.draining:
                if err.code() != grpc.StatusCode.CANCELLED:
                    self.log.warning("the draining session ended: %s: %s", err.code().name, err.details())
                return _End(False, True, "drained")
            leader = dict(err.trailing_metadata() or ()).get("ctrlhub-leader", "")
            return _classify(err.code(), err.details() or "", session.registered, leader=str(leader))
        if session.draining:
            self._drained = True  # logged once no handler runs any more
            return _End(False, True, "drained")
        return _End(True, session.registered, "the manager ended the stream")

    def _registered(self, session: _Session, r: registration_pb2.Registered, config: Config) -> None:
        readable: dict[Kind, Form] = {
            Kind.from_proto(x.resource): "metadata" if x.metadata_only else "full" for x in r.readable
        }
        hold = seconds(r.hold.ToTimedelta()) if r.HasField("hold") else 0.0
        interval = seconds(r.heartbeat_interval.ToTimedelta()) if r.HasField("heartbeat_interval") else 0.0
        session.registered = True
        session.session_id = r.session_id
        session.reader = Reader(session.stub, config, r.session_id, readable)
        if self._register.exclusive_attempts and hold > 0 and interval > 0:
            session.fence = Fence(hold, interval, time.monotonic())
            assert self._watchdog is not None
            loop = asyncio.get_running_loop()

            def expire() -> None:
                loop.call_soon_threadsafe(session.expired.set)

            self._watchdog.watch(session.fence, r.session_id, expire)
            session.heartbeat = asyncio.create_task(self._heartbeats(session, session.fence))
        else:
            # A manager that does not fence attempts (older than exclusive_attempts): results
            # count only before the deadline, and handlers start at once.
            session.echoed.set()
        self.outdated = False
        self.effective = r.effective
        registration = Registration(
            session_id=r.session_id,
            leader=r.leader_identity,
            revision=self.to_register().revision,
            readable=readable,
            heartbeat_interval=interval or None,
            hold=hold or None,
            effective=r.effective,
        )
        self.registration = registration
        self.log.info("registered: session %s with leader %s, revision %d", r.session_id, r.leader_identity or "-", registration.revision)
        if readable != self._readable_logged:
            self._readable_logged = readable
            self.log.info("readable through the manager's cache: %s", registration.describe_readable())
        self.log.debug("effective registration: %s", r.effective)
        for callback in self._on_registered:
            try:
                callback(registration)
            except Exception:  # noqa: BLE001 - a callback must not end the session
                self.log.exception("an on_registered callback raised")

    async def _heartbeats(self, session: _Session, fence: Fence) -> None:
        """A heartbeat now (handlers wait for its answer) and every interval after."""
        while not session.closed:
            nonce = fence.beat(time.monotonic())  # before it is written: an earlier anchor is safe
            session.send(pb.ControllerMessage(heartbeat=pb.Heartbeat(nonce=nonce)))
            await asyncio.sleep(fence.interval)

    def _revoked(self, session: _Session, r: registration_pb2.Revoked) -> _End:
        try:
            reason = registration_pb2.Revoked.Reason.Name(r.reason).removeprefix("REASON_")
        except ValueError:
            reason = str(r.reason)
        if session.draining:
            self.log.info("session revoked while draining: %s: %s", reason, r.message)
            return _End(False, True, "revoked while draining")
        if r.reason == _SUPERSEDED:
            return _End(True, True, f"superseded by a newer definition of controller {self.name}: {r.message}", outdated=True)
        self.log.warning("session revoked: %s: %s%s", reason, r.message, f" (leader {r.leader_identity})" if r.leader_identity else "")
        return _End(True, True, f"revoked ({reason}): {r.message}")

    def _rejected(self, session: _Session, r: registration_pb2.Rejected) -> _End:
        code = _CODES.get(r.code, grpc.StatusCode.UNKNOWN)
        field = f" (field {r.field})" if r.field else ""
        if session.draining:
            return _End(False, True, "rejected while draining")
        if r.outdated:
            return _End(True, session.registered, f"registration refused as outdated: {code.name}{field}: {r.message}", outdated=True)
        self.log.warning("rejected: %s%s: %s", code.name, field, r.message)
        return _classify(code, r.message, session.registered, r.field)

    # ---- one request ----------------------------------------------------------------------

    def _dispatch(self, session: _Session, msg: Any) -> None:
        loop = asyncio.get_running_loop()
        limit = self._limit(msg)
        reader = self._reader_for(session, limit)
        request: Request | Event = Request(msg, reader, self.log) if self.mode == "reconcile" else Event(msg, reader, self.log)
        attempt = _Attempt(session, request)
        session.attempts.add(attempt)
        session.idle.clear()
        self._attempts.add(attempt)
        self._idle.clear()
        task = loop.create_task(self._attempt(attempt, msg, loop.time() + limit))
        task.add_done_callback(lambda t: self._forget(attempt, t))

    def _forget(self, attempt: _Attempt, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (err := task.exception()) is not None:
            self.log.error("the attempt of %s ended with %r; no result was sent", attempt.key, err, exc_info=err)
        attempt.done.set()
        session = attempt.session
        session.attempts.discard(attempt)
        if not session.attempts:
            session.idle.set()
        self._attempts.discard(attempt)
        if not self._attempts:
            self._idle.set()

    def _limit(self, msg: Any) -> float:
        ts = msg.deadline
        deadline = ts.seconds + ts.nanos / 1e9 if ts.seconds or ts.nanos else None
        return time_left(deadline, time.time(), self.deadline or DEFAULT_DEADLINE)

    def _reader_for(self, session: _Session, limit: float) -> Reader | SyncReader:
        assert session.reader is not None
        if self.is_async:
            return session.reader
        return SyncReader(session.reader, asyncio.get_running_loop(), time.monotonic() + limit)

    async def _claim(self, attempt: _Attempt) -> None:
        """Wait for the first heartbeat answer, for the earlier attempt of the key (of any
        session) to end, and for a free slot; then hold the key and the slot."""
        await attempt.session.echoed.wait()
        while (earlier := self._keys.get(attempt.key)) is not None:
            await earlier.done.wait()
        self._keys[attempt.key] = attempt
        try:
            await self._slots.acquire()
        except BaseException:
            del self._keys[attempt.key]
            raise

    def _release(self, attempt: _Attempt) -> None:
        self._slots.release()
        if self._keys.get(attempt.key) is attempt:
            del self._keys[attempt.key]

    async def _attempt(self, attempt: _Attempt, msg: Any, stop_at: float) -> None:
        """One request: wait for its turn, run the handler under the deadline, and answer once
        the handler has returned."""
        session, request = attempt.session, attempt.request
        claim = asyncio.ensure_future(self._claim(attempt))
        await attempt.until(claim, stop_at)
        if claim.cancelled() or attempt.why is not None:
            if not claim.cancelled() and claim.exception() is None:
                self._release(attempt)
            self._not_started(attempt, msg)
            return
        fence = session.fence
        if fence is not None:
            fence.running += 1
        attempt.running = True
        try:
            if isinstance(request, Request):
                self.log.info("reconcile start key=%s attempt=%d", request.key, msg.attempt)
                if traces.enabled():
                    with traces.reconcile_span(self.name, "reconcile", str(request.key), msg.id, msg.attempt, msg.traceparent, msg.tracestate) as span:
                        request._span_traceparent = span.traceparent or None
                        value = await self._execute(attempt, stop_at)
                        span.set_outcome(*(_label(value) if attempt.why is None else ("cancelled", attempt.why)))
                else:
                    value = await self._execute(attempt, stop_at)
            else:
                value = await self._execute(attempt, stop_at)
        finally:
            attempt.running = False
            if fence is not None:
                fence.running -= 1
            self._release(attempt)
        if isinstance(request, Request):
            self._answer(attempt, msg, value)
        else:
            self._acknowledge(attempt, value)

    async def _execute(self, attempt: _Attempt, stop_at: float) -> Any:
        """The handler's return value or the exception it raised; returns only once the handler
        has really stopped (a sync handler's thread has returned)."""
        if self.is_async:
            task = asyncio.ensure_future(self._call_async(attempt.request))
            await attempt.until(task, stop_at)
            return None if task.cancelled() else task.result()
        fut = self._start_thread(attempt)
        await attempt.until(fut, stop_at, in_thread=True)
        return fut.result()

    def _kwargs_for(self, request: Request | Event) -> dict[str, Any]:
        return {name: get(request) for name, get in self._kwargs}

    async def _call_async(self, request: Request | Event) -> Any:
        try:
            return await self.handler(**self._kwargs_for(request))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - every failure becomes a result
            return self._failure(err)

    def _start_thread(self, attempt: _Attempt) -> asyncio.Future[Any]:
        """Runs the sync handler on a thread of its own (a daemon: a handler that never returns
        cannot hold the process at exit); the future completes when it has returned."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        ctx = contextvars.copy_context()
        request = attempt.request

        def finish(value: Any) -> None:
            if not fut.done():
                fut.set_result(value)

        def call() -> Any:
            return self.handler(**self._kwargs_for(request))

        def body() -> None:
            try:
                value = ctx.run(call)
            except BaseException as err:  # noqa: BLE001 - every failure becomes a result
                value = self._failure(err) if isinstance(err, Exception) else err
            try:
                loop.call_soon_threadsafe(finish, value)
            except RuntimeError:
                pass  # the event loop is gone: the process is ending

        threading.Thread(target=body, name=f"ctrlhub-{self.name}-{attempt.key}", daemon=True).start()
        return fut

    def _failure(self, err: Exception) -> Exception:
        from ._types import PermanentError, TemporaryError

        if not isinstance(err, (PermanentError, TemporaryError, TimeoutError)):
            self.log.error("%s handler raised", self.name, exc_info=err)
        return err

    def _not_started(self, attempt: _Attempt, msg: Any) -> None:
        """An attempt stopped before its handler started (its session ended, or its deadline
        came while an earlier attempt of the key still ran)."""
        if attempt.why != _DEADLINE or self.mode != "reconcile":
            return
        self.log.warning("reconcile %s not started before its deadline: an earlier attempt of the key still ran", attempt.key)
        answer = pb.ControllerMessage()
        answer.result.id = msg.id
        answer.result.error.message = "not started before the deadline: an earlier attempt of the key still ran in this replica"
        self._confirm(attempt, msg, answer)

    def _confirm(self, attempt: _Attempt, msg: Any, answer: pb.ControllerMessage) -> None:
        """Answer an attempt stopped at its deadline, once the deadline has passed: the manager
        then counts a missed deadline, discards the answer as an outcome (it only confirms that
        the attempt ended) and re-delivers the key as REDELIVERY. Only on a session that fences
        attempts: without, the manager has handed the key out again at the deadline."""
        session = attempt.session
        if session.fence is None or session.closed:
            return
        ts = msg.deadline
        wait = ts.seconds + ts.nanos / 1e9 + CONFIRM_AFTER_DEADLINE - time.time() if ts.seconds or ts.nanos else 0.0
        if wait <= 0:
            session.send(answer)
        else:
            asyncio.get_running_loop().call_later(wait, session.send, answer)

    def _answer(self, attempt: _Attempt, msg: pb.ReconcileRequest, value: Any) -> None:
        session, key = attempt.session, attempt.key
        answer = pb.ControllerMessage()
        result = answer.result
        result.id = msg.id
        if attempt.why is not None:
            result.error.message = f"cancelled: {attempt.why}"
            if attempt.why == _DEADLINE:
                self.log.warning("reconcile %s cancelled at its deadline (attempt %d); the manager re-delivers it", key, msg.attempt)
                self._confirm(attempt, msg, answer)
            else:
                session.send(answer)  # the shutdown grace: the session may still live
            self.log.info("reconcile end key=%s outcome=cancelled", key)
            return
        label = outcome(result, value)
        if label in ("error", "terminal"):
            self.log.warning("reconcile %s failed (%s, attempt %d): %s", key, label, msg.attempt, result.error.message or result.terminal.message)
        self.log.info("reconcile end key=%s outcome=%s", key, label)
        session.send(answer)

    def _acknowledge(self, attempt: _Attempt, value: Any) -> None:
        event = attempt.request
        if attempt.why is not None:
            self.log.warning("event %r cancelled (%s); the manager sends it again", event, attempt.why)
            return
        if isinstance(value, BaseException):
            self.log.warning("event %r not acknowledged (%s: %s); the manager sends it again after its deadline", event, type(value).__name__, value)
            return
        attempt.session.send(pb.ControllerMessage(event_ack=pb.EventAck(id=event.id)))


def _label(value: Any) -> tuple[str, str | None]:
    from ._types import Done, PermanentError, RequeueAfter

    if value is None or isinstance(value, Done):
        return "success", None
    if isinstance(value, RequeueAfter):
        return "requeue_after", None
    if isinstance(value, PermanentError):
        return "terminal", str(value)
    return "error", str(value)
