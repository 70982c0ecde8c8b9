"""A controller: its definition (turned into ``ctrlhub.v1.Register``) and its session loop
(connect, register, run handlers, reconnect with backoff, drain)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc

from . import traces
from ._config import Config, ConfigError
from ._reader import Reader, SyncReader
from ._request import EVENT_KWARGS, RECONCILE_KWARGS, Event, Getter, Request, injection
from ._timing import Backoff, time_left
from ._types import (
    FatalError,
    Kind,
    KindLike,
    Owns,
    Predicate,
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


@dataclass
class _End:
    """How a session ended."""

    retry: bool  # reconnect with backoff (else: stopped, or fatal raised)
    registered: bool
    reason: str = ""


def _classify(code: grpc.StatusCode, message: str, registered: bool, field: str = "", leader: str = "") -> _End:
    if code in _FATAL_BEFORE_REGISTERED and not registered:
        where = f" (field {field})" if field else ""
        raise FatalError(f"the manager refused the registration: {code.name}{where}: {message}", code.name, field)
    if code == grpc.StatusCode.UNAVAILABLE:
        return _End(True, registered, f"manager unavailable{f' (the leader is {leader})' if leader else ''}: {message}")
    return _End(True, registered, f"{code.name}: {message}")


class _Session:
    """One Connect stream: its writer, its handlers, and whether it registered or drains."""

    def __init__(self, call: Any, stub: pb_grpc.ControllerManagerStub) -> None:
        self.call = call
        self.stub = stub
        self.outbox: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.registered = False
        self.draining = False
        self.closed = False
        self.session_id = ""
        self.reader: Reader | None = None
        self.writer: asyncio.Task[None] | None = None

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
        """The session is over: cancel its handlers (their results are never sent)."""
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.writer is not None:
            self.writer.cancel()
            await asyncio.gather(self.writer, return_exceptions=True)


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
    ) -> None:
        if mode not in ("reconcile", "events"):
            raise ValueError(f"mode must be 'reconcile' or 'events', not {mode!r}")
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
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
        self.log = logging.getLogger(f"ctrlhub.{name}")
        reg = registration_pb2.Register(
            controller_name=name,
            mode=registration_pb2.Register.MODE_RECONCILE if mode == "reconcile" else registration_pb2.Register.MODE_EVENTS,
            primary=self.kind.to_proto(),
            owns=[(o if isinstance(o, Owns) else Owns(o)).to_proto() for o in owns],
            watches=[w.to_proto() for w in watches],
            max_concurrent_reconciles=controller_wide_limit or 0,
            include_object=wants_object if include_object is None else include_object,
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
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._session: _Session | None = None
        self.effective: registration_pb2.Register | None = None
        """The registration as the manager echoed it (``Registered.effective``) last time."""

    def to_register(self) -> registration_pb2.Register:
        """The ``Register`` message this controller sends."""
        reg = registration_pb2.Register()
        reg.CopyFrom(self._register)
        reg.max_in_flight = self.max_in_flight
        return reg

    @property
    def session_id(self) -> str | None:
        """The live session's id, or None between sessions."""
        s = self._session
        return s.session_id if s is not None and s.registered and not s.closed else None

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
        """Run until ``stop`` is set (then drain and return) or the manager refuses the
        controller for good (raises ``FatalError``)."""
        backoff = Backoff(config.reconnect_initial, config.reconnect_max)
        self._slots = asyncio.Semaphore(self.max_concurrent)
        if not self.is_async and self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.max_concurrent, thread_name_prefix=f"ctrlhub-{self.name}")
        try:
            while not stop.is_set():
                started = time.monotonic()
                end = await self._run_session(config, stop)
                if not end.retry or stop.is_set():
                    break
                delay = backoff.next_delay(end.registered, time.monotonic() - started)
                self.log.warning("session ended: %s; reconnecting in %.0f ms", end.reason, delay * 1000)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
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
        reading = asyncio.create_task(self._read(session, config, stop))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait((reading, stopping), return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                if session.registered:
                    await self._drain(session, reading, config)
                else:
                    call.cancel()  # nothing is in flight before Registered
                await asyncio.gather(reading, return_exceptions=True)
                return _End(False, session.registered, "stopped")
            return reading.result()
        finally:
            stopping.cancel()
            if not reading.done():
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
            self._session = None
            await session.close()
            call.cancel()
            await channel.close()

    async def _drain(self, session: _Session, reading: asyncio.Task[_End], config: Config) -> None:
        """Drain: no new work; let handlers finish and answer; the manager then ends the stream."""
        self.log.info("draining: %d handler(s) in flight", len(session.tasks))
        session.draining = True
        session.send(pb.ControllerMessage(drain=pb.Drain()))
        while session.tasks and not reading.done():
            await asyncio.wait(set(session.tasks) | {reading}, return_when=asyncio.FIRST_COMPLETED)
        try:
            await asyncio.wait_for(asyncio.shield(reading), config.drain_grace)
        except TimeoutError:
            self.log.warning("the manager did not end the drained stream within %.0f s; closing it", config.drain_grace)
            session.call.cancel()

    async def _read(self, session: _Session, config: Config, stop: asyncio.Event) -> _End:
        call = session.call
        try:
            async for msg in call:
                kind = msg.WhichOneof("message")
                if kind == "reconcile":
                    self._dispatch(session, msg.reconcile, config)
                elif kind == "event":
                    self._dispatch(session, msg.event, config)
                elif kind == "registered":
                    r = msg.registered
                    session.registered = True
                    session.session_id = r.session_id
                    session.reader = Reader(session.stub, config, r.session_id)
                    self.effective = r.effective
                    self.log.info("registered: session %s with leader %s", r.session_id, r.leader_identity or "-")
                    self.log.debug("effective registration: %s", r.effective)
                elif kind == "revoked":
                    return self._revoked(session, msg.revoked)
                elif kind == "rejected":
                    r = msg.rejected
                    code = _CODES.get(r.code, grpc.StatusCode.UNKNOWN)
                    self.log.warning("rejected: %s%s: %s", code.name, f" (field {r.field})" if r.field else "", r.message)
                    if session.draining:
                        return _End(False, True, "rejected while draining")
                    return _classify(code, r.message, session.registered, r.field)
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
            self.log.info("drained; the manager ended the stream")
            return _End(False, True, "drained")
        return _End(True, session.registered, "the manager ended the stream")

    def _revoked(self, session: _Session, r: registration_pb2.Revoked) -> _End:
        try:
            reason = registration_pb2.Revoked.Reason.Name(r.reason).removeprefix("REASON_")
        except ValueError:
            reason = str(r.reason)
        self.log.warning("session revoked: %s: %s%s", reason, r.message, f" (leader {r.leader_identity})" if r.leader_identity else "")
        if session.draining:
            return _End(False, True, "revoked while draining")
        if r.reason == _SUPERSEDED:
            raise FatalError(f"controller {self.name} was superseded by a newer definition: {r.message}", "SUPERSEDED")
        return _End(True, True, f"revoked ({reason}): {r.message}")

    # ---- one request ----------------------------------------------------------------------

    def _dispatch(self, session: _Session, msg: Any, config: Config) -> None:
        if self.mode == "reconcile":
            coro = self._reconcile(session, msg)
        else:
            coro = self._event(session, msg)
        task = asyncio.get_running_loop().create_task(coro)
        session.tasks.add(task)
        task.add_done_callback(session.tasks.discard)

    def _kwargs_for(self, r: Request | Event) -> dict[str, Any]:
        return {name: get(r) for name, get in self._kwargs}

    async def _invoke(self, r: Request | Event) -> Any:
        kwargs = self._kwargs_for(r)
        if self.is_async:
            return await self.handler(**kwargs)
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        return await loop.run_in_executor(self._pool, functools.partial(ctx.run, self.handler, **kwargs))

    def _limit(self, msg: Any) -> float:
        ts = msg.deadline
        deadline = ts.seconds + ts.nanos / 1e9 if ts.seconds or ts.nanos else None
        return time_left(deadline, time.time(), self.deadline or DEFAULT_DEADLINE)

    def _reader_for(self, session: _Session, limit: float) -> Reader | SyncReader:
        assert session.reader is not None
        if self.is_async:
            return session.reader
        return SyncReader(session.reader, asyncio.get_running_loop(), time.monotonic() + limit)

    async def _reconcile(self, session: _Session, msg: pb.ReconcileRequest) -> None:
        limit = self._limit(msg)
        request = Request(msg, self._reader_for(session, limit), self.log)
        answer = pb.ControllerMessage()
        result = answer.result
        result.id = msg.id
        info = self.log.isEnabledFor(logging.INFO)
        if info:
            self.log.info("reconcile start key=%s attempt=%d", request.key, msg.attempt)
        try:
            async with asyncio.timeout(limit) as timer:
                async with self._slots:
                    if traces.enabled():
                        with traces.reconcile_span(self.name, "reconcile", str(request.key), msg.id, msg.attempt, msg.traceparent, msg.tracestate) as span:
                            request._span_traceparent = span.traceparent or None
                            value = await self._run_handler(request)
                            span.set_outcome(*_label(value))
                    else:
                        value = await self._run_handler(request)
        except TimeoutError:
            if not timer.expired():
                raise
            request._cancel()
            self.log.warning("reconcile %s cancelled at its deadline (attempt %d); the manager re-delivers it", request.key, msg.attempt)
            return
        except asyncio.CancelledError:
            request._cancel()
            raise
        label = outcome(result, value)
        if label in ("error", "terminal"):
            self.log.warning("reconcile %s failed (%s, attempt %d): %s", request.key, label, msg.attempt, result.error.message or result.terminal.message)
        if info:
            self.log.info("reconcile end key=%s outcome=%s", request.key, label)
        session.send(answer)

    async def _run_handler(self, r: Request | Event) -> Any:
        """The handler's return value, or the exception it raised (to become the outcome)."""
        try:
            return await self._invoke(r)
        except asyncio.CancelledError:
            raise
        except TimeoutError as err:
            return err
        except Exception as err:  # noqa: BLE001 - every failure becomes a result
            from ._types import PermanentError, TemporaryError

            if not isinstance(err, (PermanentError, TemporaryError)):
                self.log.exception("%s handler raised", self.name)
            return err

    async def _event(self, session: _Session, msg: pb.Event) -> None:
        limit = self._limit(msg)
        event = Event(msg, self._reader_for(session, limit), self.log)
        try:
            async with asyncio.timeout(limit) as timer:
                async with self._slots:
                    value = await self._run_handler(event)
        except TimeoutError:
            if not timer.expired():
                raise
            event._cancel()
            self.log.warning("event %r cancelled at its deadline; the manager sends it again", event)
            return
        except asyncio.CancelledError:
            event._cancel()
            raise
        if isinstance(value, BaseException):
            self.log.warning("event %r not acknowledged (%s: %s); the manager sends it again after its deadline", event, type(value).__name__, value)
            return
        session.send(pb.ControllerMessage(event_ack=pb.EventAck(id=msg.id)))


def _label(value: Any) -> tuple[str, str | None]:
    from ._types import Done, PermanentError, RequeueAfter

    if value is None or isinstance(value, Done):
        return "success", None
    if isinstance(value, RequeueAfter):
        return "requeue_after", None
    if isinstance(value, PermanentError):
        return "terminal", str(value)
    return "error", str(value)
