"""One attempt: a request (or event) from its arrival until its handler has really stopped,
and its answer. Attempts of a key never overlap in this process: the next waits for the
earlier one (of any session) to end. Each attempt logs one line when it starts and one when
it ends (INFO; WARN for a failure), and every line logged while it runs carries its key and
request id (``_logs.Span``)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _logs, traces
from ._reader import Reader, SyncReader
from ._request import Event, Helpers, Request, SyncEvent, SyncRequest, _RequestData
from ._session import _Session
from ._stop import DEADLINE
from ._types import Done, Key, PermanentError, RequeueAfter, TemporaryError, names, outcome
from ._write import is_not_found
from .v1 import controller_pb2 as pb

__all__ = ["Attempts", "time_left"]

DEFAULT_DEADLINE = 60.0
DEADLINE_MARGIN = 0.05
"""Stop this fraction of the time left before a request's deadline ..."""
DEADLINE_MARGIN_MAX = 0.5
"""... but at most this many seconds early."""
CONFIRM_AFTER_DEADLINE = 0.02
"""Seconds after a request's deadline (by this host's clock) at which the answer of an attempt
cancelled at its deadline is sent."""



def time_left(deadline: float | None, now: float, fallback: float) -> float:
    """Seconds a handler may run: until ``deadline`` (Unix seconds, the manager's clock) less a
    margin of 5 % of the time left, at most 0.5 s, for latency and clock skew; ``fallback``
    seconds when the request carries no deadline. Never negative."""
    remaining = fallback if deadline is None else deadline - now
    return max(0.0, remaining - min(max(remaining, 0.0) * DEADLINE_MARGIN, DEADLINE_MARGIN_MAX))


Delivery = Request | SyncRequest | Event | SyncEvent


class _Attempt:
    """One request (or event) from its arrival until its handler has really stopped."""

    __slots__ = ("done", "in_thread", "inner", "key", "request", "running", "session", "span", "started", "why")

    def __init__(self, session: _Session, request: Delivery, span: _logs.Span) -> None:
        self.session = session
        self.request = request
        self.key = request.key
        self.span = span
        self.inner: asyncio.Future[Any] | None = None
        self.in_thread = False
        self.why: str | None = None
        """Why it was stopped: its deadline, the end of its session, the shutdown."""
        self.done = asyncio.Event()
        """Set once it no longer runs (nor waits): the key is free in this process."""
        self.running = False
        self.started = 0.0

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
        loop = asyncio.get_running_loop()
        timer = loop.call_at(stop_at, self.stop, DEADLINE)
        try:
            if not fut.done():
                # asyncio.wait((fut,)) without its sets and extra coroutine: this is per request.
                waiter: asyncio.Future[None] = loop.create_future()
                wake = functools.partial(_wake, waiter)
                fut.add_done_callback(wake)
                try:
                    await waiter
                finally:
                    fut.remove_done_callback(wake)
        finally:
            timer.cancel()
            self.inner = None


def _wake(waiter: asyncio.Future[None], _: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Attempts:
    """The attempts of one controller (mixed into ``Controller``)."""

    name: str
    mode: str
    is_async: bool
    handler: Callable[..., Any]
    log: logging.Logger
    deadline: float | None
    _kwargs: tuple[tuple[str, Callable[[Any], Any]], ...]
    _slots: asyncio.Semaphore
    _keys: dict[Key, _Attempt]
    _attempts: set[_Attempt]
    _idle: asyncio.Event
    _helpers: Helpers | None
    _tracebacks: _logs.TracebackBudget

    def _dispatch(self, session: _Session, msg: Any) -> None:
        loop = asyncio.get_running_loop()
        limit = self._limit(msg)
        stop_at = time.monotonic() + limit
        reader = self._reader_for(session, stop_at)
        reconcile = self.mode == "reconcile"
        key = str(Key(msg.key.namespace, msg.key.name))
        span = _logs.Span(self.name, key, msg.id, msg.attempt, session.session_id, name="reconcile" if reconcile else "event")
        logger = _logs.HandlerLogger(self.log, span)
        cls: type[Delivery]
        if reconcile:
            cls = Request if self.is_async else SyncRequest
        else:
            cls = Event if self.is_async else SyncEvent
        request = cls(msg, reader, logger, self._helpers, stop_at)
        span.traceparent = request  # its trace and span ids, read when a line is written
        attempt = _Attempt(session, request, span)
        session.attempts.add(attempt)
        session.idle.clear()
        self._attempts.add(attempt)
        self._idle.clear()
        ctx = contextvars.copy_context()
        ctx.run(_logs.current.set, span)
        task = loop.create_task(self._attempt(attempt, msg, loop.time() + limit), context=ctx)
        task.add_done_callback(lambda t: self._forget(attempt, t))

    def _forget(self, attempt: _Attempt, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (err := task.exception()) is not None:
            self.log.error("the attempt of %s ended with %r; no result was sent", attempt.key, err, exc_info=err,
                           extra={"ctrlhub_span": attempt.span})
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

    def _reader_for(self, session: _Session, stop_at: float) -> Reader | SyncReader:
        assert session.reader is not None
        if self.is_async:
            return session.reader
        return SyncReader(session.reader, asyncio.get_running_loop(), stop_at)

    def _free(self, attempt: _Attempt, stop_at: float) -> bool:
        """Whether ``_claim`` would not wait: the first heartbeat was answered, no earlier
        attempt holds the key, a slot is free, and the attempt is neither stopped nor due."""
        return (attempt.why is None and attempt.session.echoed.is_set() and attempt.key not in self._keys
                and not self._slots.locked() and asyncio.get_running_loop().time() < stop_at)

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
        if self._free(attempt, stop_at):
            # Nothing to wait for (the usual case): claim now, without a task and a timer.
            self._keys[attempt.key] = attempt
            await self._slots.acquire()  # returns at once: a slot is free
        else:
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
        attempt.started = time.monotonic()
        try:
            if isinstance(request, _RequestData):
                if self.log.isEnabledFor(logging.INFO):  # the line is built only to be written
                    reasons = names(request.reasons)
                    self._line(attempt, logging.INFO, f"reconcile start key={attempt.key} reasons={','.join(reasons) or '-'} "
                               f"attempt={msg.attempt}", reasons=reasons)
                if traces.enabled():
                    with traces.reconcile_span(self.name, "reconcile", str(request.key), msg.id, msg.attempt, msg.traceparent, msg.tracestate) as span:
                        request._span_traceparent = span.traceparent or None
                        value = await self._execute(attempt, stop_at)
                        span.set_outcome(*(_label(value) if attempt.why is None else ("cancelled", attempt.why)))
                else:
                    value = await self._execute(attempt, stop_at)
            else:
                if self.log.isEnabledFor(logging.DEBUG):
                    self._line(attempt, logging.DEBUG,
                               f"event start key={attempt.key} type={_type_name(request)} sequence={request.sequence} attempt={msg.attempt}")
                value = await self._execute(attempt, stop_at)
        finally:
            attempt.running = False
            if fence is not None:
                fence.running -= 1
            self._release(attempt)
        if isinstance(request, _RequestData):
            self._answer(attempt, msg, value)
        else:
            self._acknowledge(attempt, value)

    def _line(self, attempt: _Attempt, level: int, message: str, *, exc: BaseException | None = None, **fields: Any) -> None:
        """One start or end line, its fields also structured (JSON)."""
        fields = {"key": str(attempt.key), "attempt": attempt.span.attempt, **fields}
        self.log.log(level, "%s", message, exc_info=exc, extra={"ctrlhub_fields": fields, "ctrlhub_span": attempt.span})

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

    def _kwargs_for(self, request: Delivery) -> dict[str, Any]:
        return {name: get(request) for name, get in self._kwargs}

    async def _call_async(self, request: Delivery) -> Any:
        try:
            return await self.handler(**self._kwargs_for(request))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # every failure becomes a result
            return err

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
            except BaseException as err:  # every failure becomes a result
                value = err
            try:
                loop.call_soon_threadsafe(finish, value)
            except RuntimeError:
                pass  # the event loop is gone: the process is ending

        threading.Thread(target=body, name=f"ctrlhub-{self.name}-{attempt.key}", daemon=True).start()
        return fut

    def _not_started(self, attempt: _Attempt, msg: Any) -> None:
        """An attempt stopped before its handler started (its session ended, or its deadline
        came while an earlier attempt of the key still ran)."""
        if attempt.why != DEADLINE or self.mode != "reconcile":
            return
        self._line(attempt, logging.WARNING, f"reconcile {attempt.key} not started before its deadline: an earlier "
                   "attempt of the key still ran", outcome="not_started")
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
        took = round((time.monotonic() - attempt.started) * 1000)
        answer = pb.ControllerMessage()
        result = answer.result
        result.id = msg.id
        if attempt.why is not None:
            result.error.message = f"cancelled: {attempt.why}"
            deadline = attempt.why == DEADLINE
            self._line(attempt, logging.WARNING if deadline else logging.INFO,
                       f"reconcile end key={key} attempt={msg.attempt} outcome=cancelled duration_ms={took} reason={attempt.why}"
                       + ("; the manager re-delivers it" if deadline else ""),
                       outcome="cancelled", duration_ms=took, reason=attempt.why)
            if deadline:
                self._confirm(attempt, msg, answer)
            else:
                session.send(answer)  # the shutdown grace: the session may still live
            return
        label = outcome(result, value)
        if label in ("error", "terminal"):
            error = result.error.message or result.terminal.message
            exc = value if isinstance(value, BaseException) else None
            deliberate = isinstance(exc, (TemporaryError, PermanentError))
            trace = exc if exc is not None and not deliberate and self._tracebacks.allow(f"{self.name}/{key}") else None
            where = "" if trace is not None or exc is None or deliberate else _logs.one_line_traceback(exc)
            self._line(attempt, logging.WARNING, f"reconcile end key={key} attempt={msg.attempt} outcome={label} "
                       f"duration_ms={took} error={error}" + (f" (at {where}; traceback at most once a minute per key)" if where else ""),
                       exc=trace, outcome=label, duration_ms=took, error=error)
            self._post_failure(attempt, value, error)
        elif self.log.isEnabledFor(logging.INFO):
            extra: dict[str, Any] = {"requeue_after_ms": round(result.requeue_after.delay.ToMilliseconds())} if label == "requeue_after" else {}
            self._line(attempt, logging.INFO, f"reconcile end key={key} attempt={msg.attempt} outcome={label} duration_ms={took}"
                       + "".join(f" {k}={v}" for k, v in extra.items()), outcome=label, duration_ms=took, **extra)
        session.send(answer)

    def _post_failure(self, attempt: _Attempt, value: Any, error: str) -> None:
        """A failed reconcile as a Warning Event ``ReconcileFailed`` about the object (not for a
        request without an object, nor for a failure that is its NotFound)."""
        request = attempt.request
        if self._helpers is None or not isinstance(request, _RequestData):
            return
        if isinstance(value, BaseException) and is_not_found(value):
            return
        try:
            obj = request.object
        except Exception:  # undecodable: nothing to post about
            return
        if obj:
            self._helpers.recorder.warning(obj, "ReconcileFailed", error)

    def _acknowledge(self, attempt: _Attempt, value: Any) -> None:
        event = attempt.request
        took = round((time.monotonic() - attempt.started) * 1000)
        if attempt.why is not None:
            self._line(attempt, logging.WARNING, f"event end key={attempt.key} outcome=cancelled duration_ms={took} "
                       f"reason={attempt.why}; the manager sends it again", outcome="cancelled", duration_ms=took)
            return
        if isinstance(value, BaseException):
            error = _logs.describe(value)
            deliberate = isinstance(value, (TemporaryError, PermanentError))
            trace = value if not deliberate and self._tracebacks.allow(f"{self.name}/{attempt.key}") else None
            self._line(attempt, logging.WARNING, f"event end key={attempt.key} outcome=error duration_ms={took} error={error}; "
                       "not acknowledged: the manager sends it again after its deadline", exc=trace,
                       outcome="error", duration_ms=took, error=error)
            return
        if self.log.isEnabledFor(logging.DEBUG):
            self._line(attempt, logging.DEBUG, f"event end key={attempt.key} outcome=acknowledged duration_ms={took}",
                       outcome="acknowledged", duration_ms=took)
        attempt.session.send(pb.ControllerMessage(event_ack=pb.EventAck(id=event.id)))


def _type_name(event: Any) -> str:
    t = event.type
    return str(getattr(t, "name", t))


def _label(value: Any) -> tuple[str, str | None]:
    if value is None or isinstance(value, Done):
        return "success", None
    if isinstance(value, RequeueAfter):
        return "requeue_after", None
    if isinstance(value, PermanentError):
        return "terminal", str(value)
    return "error", str(value)
