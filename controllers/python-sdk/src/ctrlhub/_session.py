"""The session loop of a controller: connect, register, heartbeat, dispatch requests to
attempts (``_attempt``), reconnect with backoff (``_backoff``) or at once to the owner a ring
member named (``_redirect``), wait out a newer definition, and drain. What a session sends goes through its ``Outbox`` (``_batches``), which batches
answers that are ready together once the manager takes batches.

Attempts are exclusive (docs/protocol.md, "Exclusive attempts"): the SDK registers with
``exclusive_attempts``, a handler is cancelled at its deadline and its request answered only
once it has really returned, and ``_fence`` stops (or, failing that, exits) before the manager
may hand a session's keys to another replica."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from ._backoff import Backoff
from ._batches import Outbox
from ._config import Config, ConfigError
from ._fence import Fence, Watchdog
from ._logs import TRACE
from ._reader import Reader
from ._redirect import MAX_REDIRECTS, OWNER_ADDR_TRAILER, OWNER_TRAILER, Redirect, Redirects
from ._stop import SESSION_ENDED, SHUTDOWN, Stoppable
from ._types import FatalError, Form, Kind, Registration, seconds
from .v1 import controller_pb2 as pb
from .v1 import controller_pb2_grpc as pb_grpc
from .v1 import registration_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from ._definition import Definition

__all__ = ["SessionLoop"]

# Refusals before Registered that reconnecting cannot fix (docs/protocol.md, "Reconnecting").
_FATAL_BEFORE_REGISTERED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_SUPERSEDED = registration_pb2.Revoked.REASON_SUPERSEDED
_UNIT_MOVED = registration_pb2.Revoked.REASON_UNIT_MOVED
# Revocations that are a manager's normal life (a leader change, a shutdown): reconnect quietly.
_TRANSIENT_REVOCATIONS = {registration_pb2.Revoked.REASON_LEADERSHIP_LOST, registration_pb2.Revoked.REASON_SHUTTING_DOWN}
SETTLE_AFTER_GRACE = 1.0
"""Seconds a handler cancelled at the end of ``shutdown_grace`` gets to return."""


@dataclass
class _End:
    """How a session ended."""

    retry: bool  # connect again (else: stopped, or fatal raised)
    registered: bool
    reason: str = ""
    outdated: bool = False  # a newer (or conflicting) definition runs: wait longer
    transient: bool = False  # a leader change or a manager shutting down: logged at INFO
    held: bool = False  # another identity of the tenant holds the name: ask again every outdated_retry
    redirect: Redirect | None = None  # a ring member named this controller's owner: dial it next (_redirect)


def _classify(code: grpc.StatusCode, message: str, registered: bool, field: str = "", leader: str = "",
              redirect: Redirect | None = None) -> _End:
    if code in _FATAL_BEFORE_REGISTERED and not registered:
        where = f" (field {field})" if field else ""
        raise FatalError(f"the manager refused the registration: {code.name}{where}: {message}", code.name, field)
    if code == grpc.StatusCode.ALREADY_EXISTS and not registered:
        # docs/protocol.md: the name is the other identity's until its controller goes; a
        # replica of ours asks again every 30 s rather than exiting.
        return _End(True, registered, f"another identity of the tenant holds this controller name: {message}", held=True)
    if code == grpc.StatusCode.UNAVAILABLE:
        if redirect is not None:
            return _End(True, registered, message, transient=True, redirect=redirect)
        return _End(True, registered, f"manager unavailable{f' (the leader is {leader})' if leader else ''}: {message}",
                    transient=True)
    return _End(True, registered, f"{code.name}: {message}")


class _Session:
    """One Connect stream: its writer, its attempts, its fence, and how far it got."""

    def __init__(self, call: Any, stub: pb_grpc.ControllerManagerStub, log: logging.Logger) -> None:
        self.call = call
        self.stub = stub
        self.log = log
        self.outbox = Outbox()
        self.attempts: set[Stoppable] = set()
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
        self.outbox.put(msg)
        return True

    async def write_loop(self) -> None:
        """Write what is queued, one message at a time (answers queued together as one batch)
        until the session closes (cancelled) or the stream fails."""
        write = self.call.write
        get = self.outbox.get
        trace = self.log.isEnabledFor(TRACE)
        try:
            while True:
                msg = await get()
                if trace:
                    self.log.log(TRACE, "sending %s", _describe(msg))
                await write(msg)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as err:
            self.log.debug("writing to the stream failed: %s", err)

    async def close(self) -> None:
        """The session is over: stop its attempts (their results are never sent) without
        waiting for them, and stop writing."""
        self.closed = True
        if self.fence is not None:
            self.fence.live = False
        for attempt in list(self.attempts):
            attempt.stop(SESSION_ENDED)
        for task in (self.heartbeat, self.writer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


def _describe(msg: Any) -> str:
    """A message for a TRACE line: its kind and its small fields (never an object's JSON)."""
    kind = msg.WhichOneof("message")
    inner = getattr(msg, kind) if kind else msg
    if kind in ("reconcile", "event"):
        return _describe_piece(kind, inner)
    if kind == "result":
        return f"result id={inner.id} outcome={inner.WhichOneof('outcome')}"
    if kind == "results":
        ids = [r.id for r in inner.results] + [a.id for a in inner.acks]
        return f"results ({len(ids)} in a batch) ids={','.join(ids)}"
    if kind == "register":
        return f"register controller={inner.controller_name} revision={inner.revision}"
    return f"{kind} {' '.join(str(inner).split())[:200]}"


def _describe_piece(kind: str, piece: Any) -> str:
    """A request or event for a TRACE line, alone or from a batch."""
    return f"{kind} id={piece.id} key={piece.key.namespace}/{piece.key.name} attempt={piece.attempt}"


class SessionLoop:
    """The session loop of one controller (mixed into ``Controller``)."""

    name: str
    log: logging.Logger
    definition: Definition
    outdated: bool
    registration: Registration | None
    effective: registration_pb2.Register | None
    unfinished: int
    _session: _Session | None
    _attempts: Collection[Stoppable]  # Attempts': every session's running handlers
    _idle: asyncio.Event
    _slots: asyncio.Semaphore
    _watchdog: Watchdog | None
    _grace_end: float | None
    _drained: bool
    _readable_logged: dict[Kind, Form] | None
    _on_registered: list[Callable[[Registration], Any]]
    _not_ready: str

    to_register: Callable[[], registration_pb2.Register]  # Controller's
    _dispatch: Callable[[_Session, Any], None]  # Attempts'

    async def _serve(self, config: Config, stop: asyncio.Event) -> None:
        self.to_register()  # a bad CTRLHUB_REVISION is a ConfigError now, not on every connect
        backoff = Backoff(config.reconnect_initial, config.reconnect_max)
        redirects = Redirects()
        self._slots = asyncio.Semaphore(self.definition.max_concurrent)
        self._idle = asyncio.Event()
        self._idle.set()
        self.unfinished = 0
        self._watchdog = Watchdog(self.name)
        self._grace_end = None
        self._drained = False
        self._not_ready = f"connecting to the manager at {config.target}"
        try:
            while not stop.is_set():
                end = await self._run_session(config, stop, redirects.target)
                if not end.retry or stop.is_set():
                    break
                if redirects.follow(end.registered, end.redirect):
                    assert end.redirect is not None
                    self._not_ready = f"redirected to {end.redirect}"
                    self.log.info("redirected to %s (%s); connecting to it now (redirect %d of at most %d in a row)",
                                  end.redirect, end.reason, redirects.in_a_row, MAX_REDIRECTS)
                    continue  # at once: following a redirect is not a failed attempt
                delay = self._delay_after(end, config, backoff)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
            self._not_ready = "stopping"
            await self._settle(self._grace(config))
        finally:
            self._watchdog.stop()

    def _delay_after(self, end: _End, config: Config, backoff: Backoff) -> float:
        """How long to wait before the next session (at the configured address), logged with
        why; the readiness reason says the same."""
        if end.outdated:
            self.outdated = True
            self._not_ready = f"outdated: {end.reason}"
            self.log.warning(
                "%s; taking no work and registering again in %.0f s (a rollout replaces this replica, or the newer "
                "definition's replicas go away)", end.reason, config.outdated_retry,
            )
            return config.outdated_retry
        if end.held:
            self._not_ready = f"waiting for the name: {end.reason}"
            self.log.warning("%s; registering again in %.0f s", end.reason, config.outdated_retry)
            return config.outdated_retry
        delay = backoff.next_delay(end.registered)
        self._not_ready = f"reconnecting: {end.reason}"
        if end.redirect is not None:  # one redirect too many in a row (Redirects.follow said no)
            self.log.warning(
                "not following the redirect to %s after %d in a row without registering (the ring members' views "
                "differ); reconnecting through %s in %.0f ms", end.redirect, MAX_REDIRECTS, config.target, delay * 1000,
            )
        else:
            self.log.log(logging.INFO if end.transient else logging.WARNING,
                         "session ended: %s; reconnecting in %.0f ms", end.reason, delay * 1000)
        return delay

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
                    attempt.stop(SHUTDOWN)
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

    async def _run_session(self, config: Config, stop: asyncio.Event, target: str | None) -> _End:
        """One session, at ``target`` (a redirect's owner address) or else the configured
        address, on a channel of its own: its cached reads go where its stream went."""
        try:
            channel = config.channel(target)
            metadata = config.metadata()
        except ConfigError as err:  # a file missing mid-rotation (retry, it may come back), a bad redirect address
            return _End(True, False, str(err))
        stub = pb_grpc.ControllerManagerStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Connect(metadata=metadata)
        session = _Session(call, stub, self.log)
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
        self._not_ready = "draining"
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
        trace = self.log.isEnabledFor(TRACE)
        try:
            async for msg in call:
                kind = msg.WhichOneof("message")
                if trace and kind != "batch":
                    self.log.log(TRACE, "received %s", _describe(msg))
                if kind == "reconcile":
                    self._dispatch(session, msg.reconcile)
                elif kind == "heartbeat":
                    fence = session.fence
                    if fence is not None and fence.answered(msg.heartbeat.nonce):
                        session.echoed.set()
                elif kind == "event":
                    self._dispatch(session, msg.event)
                elif kind == "batch":
                    self._dispatch_batch(session, msg.batch, trace)
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
            trailers = dict(err.trailing_metadata() or ())
            owner_addr = str(trailers.get(OWNER_ADDR_TRAILER, ""))
            redirect = Redirect(str(trailers.get(OWNER_TRAILER, "")), owner_addr) if owner_addr else None
            return _classify(err.code(), err.details() or "", session.registered, leader=str(trailers.get("ctrlhub-leader", "")),
                             redirect=redirect)
        if session.draining:
            self._drained = True  # logged once no handler runs any more
            return _End(False, True, "drained")
        return _End(True, session.registered, "the manager ended the stream", transient=True)

    def _dispatch_batch(self, session: _Session, batch: pb.WorkBatch, trace: bool) -> None:
        """Each request (or event) of a ``WorkBatch`` exactly as if it had come alone, in order."""
        count = len(batch.requests) + len(batch.events)
        for kind, pieces in (("reconcile", batch.requests), ("event", batch.events)):
            for piece in pieces:
                if trace:
                    self.log.log(TRACE, "received %s (%d in a batch)", _describe_piece(kind, piece), count)
                self._dispatch(session, piece)

    def _registered(self, session: _Session, r: registration_pb2.Registered, config: Config) -> None:
        readable: dict[Kind, Form] = {
            Kind.from_proto(x.resource): "metadata" if x.metadata_only else "full" for x in r.readable
        }
        hold = seconds(r.hold.ToTimedelta()) if r.HasField("hold") else 0.0
        interval = seconds(r.heartbeat_interval.ToTimedelta()) if r.HasField("heartbeat_interval") else 0.0
        session.registered = True
        session.session_id = r.session_id
        # An older manager does not echo max_batch (0): it would end the stream on a batch.
        session.outbox.allow(r.effective.max_batch)
        session.reader = Reader(session.stub, config, r.session_id, readable)
        if self.definition.mode == "reconcile" and hold > 0 and interval > 0:
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
        self._not_ready = ""
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
        member = f" (ring member {r.member_identity})" if r.member_identity and r.member_identity != r.leader_identity else ""
        self.log.info("registered: session %s with leader %s%s, revision %d", r.session_id, r.leader_identity or "-", member,
                      registration.revision)
        if readable != self._readable_logged:
            self._readable_logged = readable
            self.log.info("readable through the manager's cache: %s", registration.describe_readable())
        self.log.debug("effective registration: %s", " ".join(str(r.effective).split()))
        for callback in self._on_registered:
            try:
                callback(registration)
            except Exception:  # a callback must not end the session
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
        leader = f" (leader {r.leader_identity})" if r.leader_identity else ""
        if session.draining:
            self.log.info("session revoked while draining: %s: %s", reason, r.message)
            return _End(False, True, "revoked while draining")
        if r.reason == _SUPERSEDED:
            return _End(True, True, f"superseded by a newer definition of controller {self.name}: {r.message}", outdated=True)
        if r.reason == _UNIT_MOVED:  # the ring changed; an empty owner_address is "not yet known"
            redirect = Redirect(r.leader_identity, r.owner_address) if r.owner_address else None
            if redirect is not None:
                return _End(True, True, f"the controller moved: {r.message}", transient=True, redirect=redirect)
            moved_to = r.leader_identity or "another member"
            return _End(True, True, f"the controller moved to {moved_to} (address not yet known): {r.message}", transient=True)
        if r.reason in _TRANSIENT_REVOCATIONS:
            return _End(True, True, f"the manager ended the session ({reason}): {r.message}{leader}", transient=True)
        self.log.warning("session revoked: %s: %s%s", reason, r.message, leader)
        return _End(True, True, f"revoked ({reason}): {r.message}")

    def _rejected(self, session: _Session, r: registration_pb2.Rejected) -> _End:
        code = _CODES.get(r.code, grpc.StatusCode.UNKNOWN)
        field = f" (field {r.field})" if r.field else ""
        if session.draining:
            return _End(False, True, "rejected while draining")
        if r.outdated:
            return _End(True, session.registered, f"registration refused as outdated: {code.name}{field}: {r.message}", outdated=True)
        if code != grpc.StatusCode.UNAVAILABLE:  # a shutting-down or not-yet-ready manager: reconnecting, not "rejected"
            self.log.warning("rejected: %s%s: %s", code.name, field, r.message)
        redirect = Redirect(r.owner_identity, r.owner_address) if r.owner_address else None
        return _classify(code, r.message, session.registered, r.field, redirect=redirect)
