#!/usr/bin/env python3
"""A ctrlhub conformance controller on the raw grpcio stubs, with no SDK.

Written from tests/conformance/README.md (sections 1-5) and the proto alone, to show that the
interface is language-neutral and how much a controller author must implement without an SDK:
sessions on a fresh channel each, per-request tasks, cancellation at the deadline and at the
end of a session, reconnecting with backoff, the token file re-read on every connect, Drain on
SIGTERM, cached reads and trace context. The stubs come from controllers/python/gen.py.

The numbered comments (B1..B9) point at the rules of README section 5.
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
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "controllers" / "python" / "ctrlhub_v1"))

import grpc  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402

from ctrlhub.v1 import controller_pb2 as pb  # noqa: E402
from ctrlhub.v1 import controller_pb2_grpc as pb_grpc  # noqa: E402
from ctrlhub.v1 import read_pb2, registration_pb2, resource_pb2  # noqa: E402

log = logging.getLogger("conformance-python-raw")

SCOPE_LABEL = "conformance.ctrlhub.io/scope"
CONFIGMAP = resource_pb2.ResourceType(group="", version="v1", kind="ConfigMap")
# B5: first delay 100 ms (jittered to 50-100 ms), doubling, at most 2 s.
BACKOFF_BASE_S = 0.1
BACKOFF_MAX_S = 2.0
# B3: stop 5 % of the time left before the deadline, at most 500 ms.
DEADLINE_MARGIN = 0.05
DEADLINE_MARGIN_MAX_S = 0.5
# B7: how long to wait for the manager to end a drained stream once our work is done.
DRAIN_CLOSE_GRACE_S = 10.0
# B6: statuses that need a human when they come before Registered.
FATAL_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}
EXIT_FATAL = 3


class Fatal(Exception):
    """Registering again cannot help (superseded, or refused in a way that needs a human)."""


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

    @classmethod
    def from_env(cls) -> "Settings":
        env = os.environ
        addr = env["CTRLHUB_ADDR"]
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


def registration(s: Settings) -> registration_pb2.Register:
    """README section 2."""
    return registration_pb2.Register(
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
    )


# ---- one request --------------------------------------------------------------------------


def request_object(req: pb.ReconcileRequest) -> tuple[str, dict[str, Any]]:
    """('object' | 'tombstone' | 'none', the object as JSON)."""
    which = req.WhichOneof("object")
    raw = {"object_json": req.object_json, "tombstone": req.tombstone.object_json}.get(which or "")
    if raw is None:
        return "none", {}
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = {}
    return ("object" if which == "object_json" else "tombstone"), obj if isinstance(obj, dict) else {}


@dataclass
class Directives:
    """A ConfigMap's instructions (README section 3)."""

    data: dict[str, str]

    def entry(self, key: str, attempt: int) -> Optional[str]:
        if key not in self.data:
            return None
        items = [v.strip() for v in str(self.data[key]).split(",")]
        return items[min(max(attempt, 1), len(items)) - 1]

    def sleep_s(self, attempt: int) -> float:
        value = self.entry("sleep_ms", attempt)
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


# ---- one session --------------------------------------------------------------------------


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
        self.outbox: asyncio.Queue[Optional[pb.ControllerMessage]] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(settings.max_in_flight)
        self.session_id = ""
        self.registered = False
        self.closed = False
        self.drained = False
        self.abandoned = False
        self.ended = asyncio.Event()
        self.call: Optional[Any] = None

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
        """B4: the session is over; cancel its handlers, their results are never sent."""
        self.closed = True
        self.outbox.put_nowait(None)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        self.ended.set()
        await self.channel.close()


class Controller:
    """The session loop: connect, serve, reconnect with backoff, drain on SIGTERM."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.report = Report(settings.report, settings.replica)
        self.stopping = asyncio.Event()
        self.session: Optional[Session] = None
        self.failures = 0

    def on_sigterm(self) -> None:
        """B7: drain the live session; between sessions, just stop."""
        log.info("SIGTERM: draining")
        self.stopping.set()
        session = self.session
        if session is None:
            return
        if session.registered:
            session.drain()
            asyncio.get_running_loop().create_task(self.drain_watch(session))
        else:
            session.abandon()  # nothing is in flight before Registered

    async def drain_watch(self, session: Session) -> None:
        """B7: once our work is done, give the manager a while to end the stream."""
        while session.tasks:
            await asyncio.wait(set(session.tasks))
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
            if self.stopping.is_set():
                break
            await self.back_off(registered)
        self.report.write({"event": "exit", "ok": True})
        return 0

    async def back_off(self, registered: bool) -> None:
        """B5: exponential backoff with equal jitter, reset after a session that registered."""
        self.failures = 1 if registered else self.failures + 1
        step = min(BACKOFF_BASE_S * 2 ** (self.failures - 1), BACKOFF_MAX_S)
        delay = random.uniform(step / 2, step)
        log.info("reconnecting in %.0f ms", delay * 1000)
        try:
            await asyncio.wait_for(self.stopping.wait(), delay)
        except TimeoutError:
            pass

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
            if kind == "registered":
                session.registered = True
                session.session_id = msg.registered.session_id
                self.report.write({"event": "registered", "session_id": session.session_id})
                if self.stopping.is_set():
                    self.on_sigterm()
            elif kind == "reconcile":
                task = asyncio.create_task(self.handle(session, msg.reconcile))
                session.tasks.add(task)
                task.add_done_callback(session.tasks.discard)
            elif kind == "rejected":
                self.rejected(session, msg.rejected)
                return
            elif kind == "revoked":
                self.revoked(msg.revoked)
                return
            else:
                log.info("ignoring a manager message of kind %r", kind)
        log.info("the manager ended the stream")

    def rejected(self, session: Session, r: registration_pb2.Rejected) -> None:
        code = grpc.StatusCode.UNKNOWN
        for c in grpc.StatusCode:
            if c.value[0] == r.code:
                code = c
        log.warning("rejected: %s field=%s: %s", code.name, r.field or "-", r.message)
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
            raise Fatal(f"superseded: {r.message}")  # B6

    # ---- one request ----------------------------------------------------------------------

    async def handle(self, session: Session, req: pb.ReconcileRequest) -> None:
        """B2-B4: start line, the directives under the deadline, end line, the result."""
        async with session.slots:
            kind, obj = request_object(req)
            data = obj.get("data") if isinstance(obj.get("data"), dict) else {}
            directives = Directives(data or {})
            key = f"{req.key.namespace}/{req.key.name}"
            self.report.write({
                "event": "start", "key": key, "id": req.id, "attempt": req.attempt,
                "reasons": reason_names(req), "object": kind,
                "rv": str((obj.get("metadata") or {}).get("resourceVersion", "")),
                "deadline_us": deadline_us(req), "traceparent": req.traceparent,
                "span_traceparent": child_traceparent(req.traceparent),
            })
            end: dict[str, Any] = {"event": "end", "key": key, "id": req.id, "attempt": req.attempt, "outcome": "cancelled"}
            try:
                async with asyncio.timeout(self.time_left(req)):
                    reads = await self.work(session, req, directives)
            except TimeoutError:  # B3: the deadline is near; the manager re-delivers the key
                self.report.write(end)
                return
            except asyncio.CancelledError:  # B4: the session ended
                self.report.write(end)
                raise
            result, end["outcome"] = directives.result(req.id, req.attempt)
            if reads is not None:
                end["reads"] = reads
            self.report.write(end)
            session.send(pb.ControllerMessage(result=result))

    def time_left(self, req: pb.ReconcileRequest) -> float:
        if req.HasField("deadline"):
            remaining = deadline_us(req) / 1e6 - time.time()
        else:
            remaining = self.s.deadline_ms / 1000
        return max(0.0, remaining - min(remaining * DEADLINE_MARGIN, DEADLINE_MARGIN_MAX_S))

    async def work(self, session: Session, req: pb.ReconcileRequest, d: Directives) -> Optional[dict[str, Any]]:
        await asyncio.sleep(d.sleep_s(req.attempt))
        name = d.data.get("read")
        return await self.reads(session, req.key.namespace, str(name)) if name else None

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
