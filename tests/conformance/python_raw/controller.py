#!/usr/bin/env python3
"""A ctrlhub conformance controller on the raw grpcio stubs, with no SDK.

Written from tests/conformance/README.md (sections 1-5), docs/protocol.md and the proto alone,
to show that the interface is language-neutral and how much a controller author must implement
without an SDK: sessions on a fresh channel each, per-request tasks, heartbeats with the anchor
and the hold (exclusive attempts), cancellation at the deadline and at the end of a session with
the result sent once the handler has really stopped, one attempt of a key at a time, reconnecting
with backoff, waiting out a newer definition, the token file re-read on every connect, Drain on
SIGTERM, cached reads and trace context. The stubs come from controllers/python/gen.py.

The numbered comments (B1..B11) point at the rules of README section 5.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import secrets
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "controllers" / "python" / "ctrlhub_v1"))

import grpc  # noqa: E402
from ctrlhub.v1 import controller_pb2 as pb  # noqa: E402
from ctrlhub.v1 import controller_pb2_grpc as pb_grpc  # noqa: E402
from ctrlhub.v1 import read_pb2, registration_pb2, resource_pb2  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402

log = logging.getLogger("conformance-python-raw")

SCOPE_LABEL = "conformance.ctrlhub.io/scope"
CONFIGMAP = resource_pb2.ResourceType(group="", version="v1", kind="ConfigMap")
LEASE = resource_pb2.ResourceType(group="coordination.k8s.io", version="v1", kind="Lease")
# B5: first delay 100 ms (jittered to 50-100 ms), doubling, at most 2 s.
BACKOFF_BASE_S = 0.1
BACKOFF_MAX_S = 2.0
# B6: how long an outdated replica waits before registering again.
OUTDATED_WAIT_S = 30.0
# B3: stop 5 % of the time left before the deadline, at most 500 ms.
DEADLINE_MARGIN = 0.05
DEADLINE_MARGIN_MAX_S = 0.5
# B7: how long to wait for the manager to end a drained stream once our work is done.
DRAIN_CLOSE_GRACE_S = 10.0
# B10: end a session whose anchor is this much of the hold old; exit if a handler still runs
# when it is that much old.
EXPIRE_AT = 0.5
EXIT_AT = 0.8
# B6: statuses that need a human when they come before Registered.
FATAL_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}
EXIT_FATAL = 3
EXIT_STUCK = 4


class Fatal(Exception):
    """Registering again cannot help: refused in a way that needs a human."""


class Outdated(Exception):
    """B6: a newer (or conflicting) definition runs; wait, then register again."""


@dataclass(frozen=True)
class Settings:
    """The environment of README section 1."""

    target: str
    token_file: Path
    controller: str
    namespace: str
    max_in_flight: int
    deadline_ms: int
    backoff_base_ms: int
    backoff_max_ms: int
    report: Path
    replica: str
    owns: str
    revision: int

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        addr = env["CTRLHUB_ADDR"]
        owns = env.get("CONFORMANCE_OWNS", "")
        if owns not in ("", "leases", "leases-metadata"):
            raise ValueError(f"CONFORMANCE_OWNS={owns!r}: expected leases or leases-metadata")
        return cls(
            target=addr.removeprefix("http://"),
            token_file=Path(env["CTRLHUB_TOKEN_FILE"]),
            controller=env["CONFORMANCE_CONTROLLER"],
            namespace=env["CONFORMANCE_NAMESPACE"],
            max_in_flight=int(env["CONFORMANCE_MAX_IN_FLIGHT"]),
            deadline_ms=int(env["CONFORMANCE_DEADLINE_MS"]),
            backoff_base_ms=int(env["CONFORMANCE_BACKOFF_BASE_MS"]),
            backoff_max_ms=int(env["CONFORMANCE_BACKOFF_MAX_MS"]),
            report=Path(env["CONFORMANCE_REPORT"]),
            replica=env["CONFORMANCE_REPLICA"],
            owns=owns,
            revision=int(env.get("CTRLHUB_REVISION") or 0),
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The authorization metadata, with the token file read now (B5)."""
        token = self.token_file.read_text().strip()
        return (("authorization", f"Bearer {token}"),)


class Report:
    """The JSON-lines report: one os.write per line, so concurrent lines never interleave."""

    def __init__(self, path: Path, replica: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._replica = replica

    def write(self, line: dict[str, Any]) -> None:
        line["ts_us"] = time.time_ns() // 1000
        line["replica"] = self._replica
        os.write(self._fd, (json.dumps(line) + "\n").encode())


def millis(ms: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(ms)
    return d


def seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def registration(s: Settings) -> registration_pb2.Register:
    """README section 2."""
    reg = registration_pb2.Register(
        controller_name=s.controller,
        mode=registration_pb2.Register.MODE_RECONCILE,
        primary=CONFIGMAP,
        namespaces=registration_pb2.NamespaceScope(
            names=registration_pb2.NamespaceScope.Names(names=[s.namespace])
        ),
        label_selector=resource_pb2.LabelSelector(match_labels={SCOPE_LABEL: "in"}),
        include_object=True,
        resync_period=duration_pb2.Duration(),  # set, and zero: resync off
        request_deadline=millis(s.deadline_ms),
        backoff=registration_pb2.Backoff(base=millis(s.backoff_base_ms), max=millis(s.backoff_max_ms)),
        max_in_flight=s.max_in_flight,
        exclusive_attempts=True,
        revision=s.revision,
    )
    if s.owns:
        reg.owns.append(registration_pb2.OwnedResource(
            resource=LEASE, controller_only=True, metadata_only=s.owns == "leases-metadata"))
    return reg


# ---- one request --------------------------------------------------------------------------


def request_object(req: pb.ReconcileRequest) -> tuple[str, dict[str, Any]]:
    """('object' | 'tombstone' | 'none', the object as JSON; {} when empty or not JSON)."""
    which = req.WhichOneof("object")
    raw = {"object_json": req.object_json, "tombstone": req.tombstone.object_json}.get(which or "")
    if raw is None:
        return "none", {}
    try:
        obj = json.loads(raw) if raw else {}
    except ValueError:
        obj = {}
    return ("object" if which == "object_json" else "tombstone"), obj if isinstance(obj, dict) else {}


@dataclass
class Directives:
    """A ConfigMap's instructions (README section 3)."""

    data: dict[str, str]

    def entry(self, key: str, attempt: int) -> str | None:
        if key not in self.data:
            return None
        items = [v.strip() for v in str(self.data[key]).split(",")]
        return items[min(max(attempt, 1), len(items)) - 1]

    def millis(self, key: str, attempt: int) -> float:
        value = self.entry(key, attempt)
        return int(value) / 1000 if value else 0.0

    def result(self, req_id: str, attempt: int) -> tuple[pb.ReconcileResult, str]:
        result = pb.ReconcileResult(id=req_id)
        entry = self.entry("outcome", attempt) or "done"
        if entry == "error":
            result.error.message = "error directive"
            return result, "error"
        if entry == "terminal":
            result.terminal.message = "terminal directive"
            return result, "terminal"
        if entry.startswith("requeue:"):
            result.requeue_after.delay.FromMilliseconds(int(entry.removeprefix("requeue:")))
            return result, "requeue"
        result.done.SetInParent()
        return result, "done"


def reason_names(req: pb.ReconcileRequest) -> list[Any]:
    names: list[Any] = []
    for value in req.reasons:
        try:
            names.append(pb.ReconcileRequest.Reason.Name(value).removeprefix("REASON_"))
        except ValueError:
            names.append(value)  # newer than our stubs
    return names


def child_traceparent(traceparent: str) -> str:
    """B9: a span of ours under the request's: same trace id and flags, a new span id."""
    parts = traceparent.split("-")
    if len(parts) != 4 or parts[0] != "00":
        return ""
    return f"00-{parts[1]}-{secrets.token_hex(8)}-{parts[3]}"


def deadline_us(req: pb.ReconcileRequest) -> int:
    if not req.HasField("deadline"):
        return 0
    return req.deadline.seconds * 1_000_000 + req.deadline.nanos // 1000


async def blocking_sleep(seconds: float) -> bool:
    """`block_ms`: a blocking sleep on a thread of its own, which no cancellation interrupts;
    returns once it is over, and whether the task was cancelled meanwhile. (A daemon thread:
    it must not keep the process alive at exit.)"""
    loop = asyncio.get_running_loop()
    over = loop.create_future()

    def sleep() -> None:
        time.sleep(seconds)
        try:
            loop.call_soon_threadsafe(lambda: over.done() or over.set_result(None))
        except RuntimeError:
            pass  # the loop is gone: the process is exiting

    threading.Thread(target=sleep, daemon=True).start()
    cancelled = False
    while not over.done():
        try:
            await asyncio.shield(over)
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


# ---- one session --------------------------------------------------------------------------


class Fence:
    """B10: heartbeats, the anchor and the hold of one session."""

    def __init__(self, hold: float, interval: float) -> None:
        self.hold = hold
        self.interval = interval
        self.since = time.monotonic()  # Registered; no handler starts before the first echo
        self.anchor: float | None = None  # when we sent the last heartbeat the manager echoed
        self.sent: dict[int, float] = {}
        self.nonce = 0
        self.running = 0  # handlers of the session that have not stopped

    def beat(self) -> int:
        self.nonce += 1
        self.sent[self.nonce] = time.monotonic()  # before it is written: an earlier anchor is safe
        return self.nonce

    def echoed(self, nonce: int) -> bool:
        sent = self.sent.pop(nonce, None)
        if sent is None:
            return False
        for older in [n for n in self.sent if n < nonce]:
            del self.sent[older]
        self.anchor = sent if self.anchor is None else max(self.anchor, sent)
        return True

    def age(self) -> float:
        return time.monotonic() - (self.since if self.anchor is None else self.anchor)


class Session:
    """One Connect stream on its own channel, and the handlers it started (B1, B4)."""

    def __init__(self, settings: Settings) -> None:
        # B1: a new connection per session, so the Service routes it to the current leader.
        # gRPC shares connections between channels to the same target through a process-wide
        # subchannel pool: without a local pool this "new" channel would reuse the connection
        # to the manager that just stepped down.
        self.channel = grpc.aio.insecure_channel(
            settings.target,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
            ],
        )
        self.stub = pb_grpc.ControllerManagerStub(self.channel)
        self.outbox: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
        self.requests: set[asyncio.Task[None]] = set()  # one per request: answers it (B2)
        self.handlers: set[asyncio.Task[Any]] = set()  # the handlers those run (B3, B4)
        self.session_id = ""
        self.registered = False
        self.closed = False
        self.drained = False
        self.abandoned = False
        self.expired = False
        self.ended = asyncio.Event()
        self.echoed = asyncio.Event()  # the first heartbeat was answered: handlers may start
        self.fence: Fence | None = None
        self.call: Any | None = None

    async def messages(self) -> AsyncIterator[pb.ControllerMessage]:
        while (msg := await self.outbox.get()) is not None:
            yield msg

    def send(self, msg: pb.ControllerMessage) -> bool:
        """Queue msg on this stream; False once the session is over (B4: never elsewhere)."""
        if self.closed:
            return False
        self.outbox.put_nowait(msg)
        return True

    def drain(self) -> None:
        if self.registered and not self.drained:
            self.drained = True
            self.send(pb.ControllerMessage(drain=pb.Drain()))

    def abandon(self) -> None:
        """End the stream from our side."""
        self.abandoned = True
        if self.call is not None:
            self.call.cancel()

    async def close(self) -> None:
        """B4: the session is over; cancel its handlers (their results are never sent). They
        may take a while to stop (a blocking call): B10 and B11 cover that, not a wait here."""
        self.closed = True
        self.outbox.put_nowait(None)
        for task in list(self.handlers):
            task.cancel()
        self.ended.set()
        await self.channel.close()


class Controller:
    """The session loop: connect, serve, reconnect with backoff, drain on SIGTERM."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.report = Report(settings.report, settings.replica)
        self.stopping = asyncio.Event()
        self.session: Session | None = None
        self.failures = 0
        # B2: at most max_in_flight handlers at once in the process, of any session.
        self.slots = asyncio.Semaphore(settings.max_in_flight)
        # B11: the attempt of each key that runs in this process (set when it has ended).
        self.running: dict[str, asyncio.Event] = {}
        self.background: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def on_sigterm(self) -> None:
        """B7: drain the live session; between sessions, just stop."""
        log.info("SIGTERM: draining")
        self.stopping.set()
        session = self.session
        if session is None:
            return
        if session.registered:
            session.drain()
            self.spawn(self.drain_watch(session))
        else:
            session.abandon()  # nothing is in flight before Registered

    async def drain_watch(self, session: Session) -> None:
        """B7: once our work is done, give the manager a while to end the stream."""
        while session.requests:
            await asyncio.wait(set(session.requests))
        try:
            await asyncio.wait_for(session.ended.wait(), DRAIN_CLOSE_GRACE_S)
        except TimeoutError:
            log.warning("the manager did not end the drained stream; closing it")
            session.abandon()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.on_sigterm)
        while not self.stopping.is_set():
            try:
                registered = await self.one_session()
            except Fatal as err:
                log.error("giving up: %s", err)
                self.report.write({"event": "exit", "ok": False})
                return EXIT_FATAL
            except Outdated as err:  # B6: no exit; wait, then try again
                log.warning("%s; taking no work, registering again in %.0f s", err, OUTDATED_WAIT_S)
                await self.pause(OUTDATED_WAIT_S)
                continue
            if self.stopping.is_set():
                break
            await self.back_off(registered)
        self.report.write({"event": "exit", "ok": True})
        if self.running:
            # Handlers of an ended session still blocking: leaving asyncio.run would wait for
            # them (it cancels every task and waits). Their keys are fenced by the hold anyway.
            log.warning("exiting with %d handler(s) still blocked: %s", len(self.running), ", ".join(self.running))
            logging.shutdown()
            os._exit(0)
        return 0

    async def pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            pass

    async def back_off(self, registered: bool) -> None:
        """B5: exponential backoff with equal jitter, reset after a session that registered."""
        self.failures = 1 if registered else self.failures + 1
        step = min(BACKOFF_BASE_S * 2 ** (self.failures - 1), BACKOFF_MAX_S)
        delay = random.uniform(step / 2, step)
        log.info("reconnecting in %.0f ms", delay * 1000)
        await self.pause(delay)

    async def one_session(self) -> bool:
        """One Connect stream, from Register until it ends. Returns whether it registered."""
        session = Session(self.s)
        self.session = session
        try:
            session.send(pb.ControllerMessage(register=registration(self.s)))
            session.call = session.stub.Connect(session.messages(), metadata=self.s.metadata())
            await self.serve(session)
        except grpc.aio.AioRpcError as err:
            if err.code() in FATAL_CODES and not session.registered:
                raise Fatal(f"{err.code().name}: {err.details()}") from err
            log.warning("stream ended: %s: %s", err.code().name, err.details())
        except asyncio.CancelledError:
            if not session.abandoned:
                raise
        except OSError as err:  # the token file could not be read: retry, it may appear
            log.warning("cannot connect: %s", err)
        finally:
            self.session = None
            await session.close()
        return session.registered

    async def serve(self, session: Session) -> None:
        assert session.call is not None
        async for msg in session.call:
            kind = msg.WhichOneof("message")
            if kind == "reconcile":
                task = asyncio.create_task(self.request(session, msg.reconcile))
                session.requests.add(task)
                task.add_done_callback(session.requests.discard)
            elif kind == "heartbeat":
                if session.fence is not None and session.fence.echoed(msg.heartbeat.nonce):
                    session.echoed.set()
            elif kind == "registered":
                self.registered(session, msg.registered)
                if self.stopping.is_set():
                    self.on_sigterm()
            elif kind == "rejected":
                self.rejected(session, msg.rejected)
                return
            elif kind == "revoked":
                self.revoked(msg.revoked)
                return
            else:
                log.info("ignoring a manager message of kind %r", kind)
        log.info("the manager ended the stream")

    def registered(self, session: Session, r: registration_pb2.Registered) -> None:
        session.registered = True
        session.session_id = r.session_id
        readable = {x.resource.kind: "metadata" if x.metadata_only else "full" for x in r.readable}
        log.info("registered: session %s, readable %s, hold %.1f s", r.session_id, readable, seconds(r.hold))
        self.report.write({"event": "registered", "session": r.session_id, "revision": self.s.revision, "readable": readable})
        if seconds(r.hold) > 0 and seconds(r.heartbeat_interval) > 0:
            session.fence = Fence(seconds(r.hold), seconds(r.heartbeat_interval))
            self.spawn(self.heartbeats(session, session.fence))
            self.spawn(self.watch(session, session.fence))
        else:
            session.echoed.set()  # a manager without exclusive attempts

    async def heartbeats(self, session: Session, fence: Fence) -> None:
        """B10: a heartbeat now, then every heartbeat_interval, while the session lives."""
        while not session.closed:
            session.send(pb.ControllerMessage(heartbeat=pb.Heartbeat(nonce=fence.beat())))
            await asyncio.sleep(fence.interval)

    async def watch(self, session: Session, fence: Fence) -> None:
        """B10: end the session at half the hold without a new anchor; exit if a handler of it
        still runs at 80 % of the hold. Watches until the session ended and its handlers
        stopped."""
        while not (session.closed and fence.running == 0):
            age = fence.age()
            if fence.running > 0 and age >= EXIT_AT * fence.hold:
                log.error(
                    "a handler of session %s still runs %.2f s after the last heartbeat the manager answered "
                    "(hold %.1f s): the manager may hand its key to another replica now; exiting",
                    session.session_id, age, fence.hold,
                )
                self.report.write({"event": "exit", "ok": False, "why": "a handler outlived the hold"})
                os._exit(EXIT_STUCK)
            if not session.closed and not session.expired and age >= EXPIRE_AT * fence.hold:
                session.expired = True
                log.warning("no heartbeat answer for %.2f s (hold %.1f s): ending session %s", age, fence.hold, session.session_id)
                for task in list(session.handlers):
                    task.cancel()
                session.abandon()
            await asyncio.sleep(fence.hold / 50)

    def rejected(self, session: Session, r: registration_pb2.Rejected) -> None:
        code = grpc.StatusCode.UNKNOWN
        for c in grpc.StatusCode:
            if c.value[0] == r.code:
                code = c
        log.warning("rejected: %s field=%s outdated=%s: %s", code.name, r.field or "-", r.outdated, r.message)
        self.report.write({"event": "rejected", "code": code.name, "outdated": r.outdated})
        if r.outdated:
            raise Outdated(f"registration refused as outdated: {r.message}")
        if code in FATAL_CODES and not session.registered:
            raise Fatal(f"registration rejected: {code.name}: {r.message}")

    def revoked(self, r: registration_pb2.Revoked) -> None:
        try:
            reason = registration_pb2.Revoked.Reason.Name(r.reason)
        except ValueError:
            reason = str(r.reason)  # newer than our stubs: reconnect
        self.report.write({"event": "revoked", "reason": reason, "code": r.code})
        log.warning("revoked: %s code=%d: %s", reason, r.code, r.message)
        if r.reason == registration_pb2.Revoked.REASON_SUPERSEDED:
            raise Outdated(f"superseded by a newer definition: {r.message}")  # B6

    # ---- one request ----------------------------------------------------------------------

    async def request(self, session: Session, req: pb.ReconcileRequest) -> None:
        """B2, B3: run the handler under the deadline; answer once it has really stopped, on
        this session only."""
        started: list[bool] = []
        handler = asyncio.create_task(self.attempt(session, req, started))
        session.handlers.add(handler)
        handler.add_done_callback(session.handlers.discard)
        if session.closed:
            handler.cancel()
        at_deadline: list[bool] = []

        def deadline() -> None:
            at_deadline.append(True)
            handler.cancel()

        timer = asyncio.get_running_loop().call_at(self.stop_at(req), deadline)
        try:
            await asyncio.wait((handler,))  # not a timeout: a cancelled handler may still run
        finally:
            timer.cancel()
        if handler.cancelled():
            # B3: the handler stopped (or never started): the attempt is over. The manager keeps
            # the key until this result, discards it as an outcome and hands the key out again.
            result = pb.ReconcileResult(id=req.id)
            result.error.message = "cancelled" if started else "not started before the deadline: an earlier attempt still ran"
            if at_deadline:
                # Sent once the deadline has passed, so that it confirms the end of an attempt
                # whose deadline the manager counts as missed (REDELIVERY next), rather than
                # reporting an error (RETRY next).
                await asyncio.sleep(max(0.0, deadline_us(req) / 1e6 + 0.02 - time.time()))
        else:
            result = handler.result()
        session.send(pb.ControllerMessage(result=result))

    def stop_at(self, req: pb.ReconcileRequest) -> float:
        """B3: when to cancel, on the event loop's clock."""
        if req.HasField("deadline"):
            remaining = deadline_us(req) / 1e6 - time.time()
        else:
            remaining = self.s.deadline_ms / 1000
        remaining = max(0.0, remaining - min(max(remaining, 0.0) * DEADLINE_MARGIN, DEADLINE_MARGIN_MAX_S))
        return asyncio.get_running_loop().time() + remaining

    async def attempt(self, session: Session, req: pb.ReconcileRequest, started: list[bool]) -> pb.ReconcileResult:
        """B11: wait for the key's earlier attempt (of any session) and a slot, then run."""
        key = f"{req.key.namespace}/{req.key.name}"
        await session.echoed.wait()
        while (earlier := self.running.get(key)) is not None:
            await earlier.wait()
        ended = asyncio.Event()
        self.running[key] = ended
        try:
            async with self.slots:
                started.append(True)
                fence = session.fence
                if fence is not None:
                    fence.running += 1
                try:
                    return await self.handle(session, req, key)
                finally:
                    if fence is not None:
                        fence.running -= 1
        finally:
            del self.running[key]
            ended.set()

    async def handle(self, session: Session, req: pb.ReconcileRequest, key: str) -> pb.ReconcileResult:
        """README section 3: start line, sleep, block, reads, end line."""
        kind, obj = request_object(req)
        data = obj.get("data") if isinstance(obj.get("data"), dict) else {}
        directives = Directives(data or {})
        base = {"key": key, "id": req.id, "attempt": req.attempt, "session": session.session_id}
        self.report.write({
            "event": "start", **base, "reasons": reason_names(req), "object": kind,
            "rv": str((obj.get("metadata") or {}).get("resourceVersion", "")),
            "deadline_us": deadline_us(req), "traceparent": req.traceparent,
            "span_traceparent": child_traceparent(req.traceparent),
        })
        end: dict[str, Any] = {"event": "end", **base, "outcome": "cancelled"}
        try:
            await asyncio.sleep(directives.millis("sleep_ms", req.attempt))
            block = directives.millis("block_ms", req.attempt)
            if block and await blocking_sleep(block):
                raise asyncio.CancelledError()  # cancelled while it blocked: it ends cancelled now
            if directives.data.get("read"):
                end["reads"] = await self.reads(session, req.key.namespace, str(directives.data["read"]))
            if directives.data.get("read_child"):
                end["child"] = await self.child(session, req.key.namespace, str(directives.data["read_child"]))
        except asyncio.CancelledError:  # B3, B4, B10: the deadline, the session's end, silence
            end.pop("reads", None)
            end.pop("child", None)
            self.report.write(end)
            raise
        result, end["outcome"] = directives.result(req.id, req.attempt)
        self.report.write(end)
        return result

    async def reads(self, session: Session, namespace: str, name: str) -> dict[str, Any]:
        """B8: Get and List through the manager's cache, on this session."""
        try:
            got = await self.get(session, namespace, name)
            names: list[str] = []
            token = ""
            while True:
                page = await session.stub.List(
                    read_pb2.ListRequest(session_id=session.session_id, resource=CONFIGMAP, namespace=namespace, page_token=token),
                    metadata=self.s.metadata(),
                )
                names += [json.loads(item.object_json)["metadata"]["name"] for item in page.items]
                token = page.next_page_token
                if not token:
                    break
            return {"get": got, "list": sorted(names)}
        except grpc.aio.AioRpcError as err:
            return {"error": f"{err.code().name}: {err.details()}"}

    async def get(self, session: Session, namespace: str, name: str) -> dict[str, Any]:
        try:
            resp = await session.stub.Get(
                read_pb2.GetRequest(session_id=session.session_id, resource=CONFIGMAP, namespace=namespace, name=name),
                metadata=self.s.metadata(),
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return {"name": name, "found": False}
            raise
        return {"name": name, "found": True, "data": json.loads(resp.object_json).get("data") or {}}

    async def child(self, session: Session, namespace: str, name: str) -> dict[str, Any]:
        """`read_child`: Get the owned Lease through the session."""
        try:
            resp = await session.stub.Get(
                read_pb2.GetRequest(session_id=session.session_id, resource=LEASE, namespace=namespace, name=name),
                metadata=self.s.metadata(),
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return {"name": name, "found": False, "metadata_only": False, "holder": ""}
            return {"error": f"{err.code().name}: {err.details()}"}
        lease = json.loads(resp.object_json)
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        return {"name": name, "found": True, "metadata_only": resp.metadata_only, "holder": holder}


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_env()
    except (KeyError, ValueError) as err:
        log.error("bad environment: %s", err)
        return 2
    return asyncio.run(Controller(settings).run())


if __name__ == "__main__":
    sys.exit(main())
