"""Following a ring member's redirect (the README's section of that name, and docs/sdks.md), against
fake ``ControllerManager`` servers on loopback built from the generated stubs, with no manager
process (the rules are the SDK's own). Each fake answers a ``Register`` as its test scripts it
(a redirect, or ``Registered`` and then work, a ``Revoked(UNIT_MOVED)``, a cached read) and
records each ``Register`` it saw, with when, on a timeline the fakes of a test share.

The configured reconnect backoff is long (at least ``BACKOFF_FLOOR``) wherever a test proves
that a redirect is followed without it."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ctrlhub
import grpc
import pytest
import trustme
from conftest import Running, eventually
from ctrlhub._redirect import MAX_REDIRECTS, Redirect, Redirects
from ctrlhub.v1 import controller_pb2 as pb
from ctrlhub.v1 import controller_pb2_grpc as pb_grpc
from ctrlhub.v1 import read_pb2, registration_pb2, resource_pb2

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
BACKOFF_FLOOR = 5.0  # with reconnect_initial=10 s: any backoff waits at least this long
CONFIGMAPS = resource_pb2.ResourceType(group="", version="v1", kind="ConfigMap")


@dataclass
class Seen:
    """One ``Register`` a fake server received."""

    server: str
    at: float
    authorization: str


@dataclass
class FakeSession:
    """A session a fake accepted: what to send on it, and what came back."""

    session_id: str
    outgoing: asyncio.Queue[pb.ManagerMessage | None] = field(default_factory=asyncio.Queue)
    results: list[pb.ReconcileResult] = field(default_factory=list)

    def reconcile(self, request_id: str, namespace: str, name: str) -> None:
        key = resource_pb2.ObjectKey(namespace=namespace, name=name)
        reasons = [pb.ReconcileRequest.REASON_INITIAL_LIST]
        self.outgoing.put_nowait(pb.ManagerMessage(reconcile=pb.ReconcileRequest(id=request_id, key=key, attempt=1, reasons=reasons)))

    def move_to(self, owner: str, address: str) -> None:
        """Ends the session as a ring member does when the controller moved."""
        revoked = registration_pb2.Revoked(reason=registration_pb2.Revoked.REASON_UNIT_MOVED, code=UNAVAILABLE,
                                           message="the ring changed", leader_identity=owner, owner_address=address)
        self.outgoing.put_nowait(pb.ManagerMessage(revoked=revoked))


class FakeMember(pb_grpc.ControllerManagerServicer):
    """A ring member on a loopback port: it redirects each ``Register`` to ``redirect_to`` (an
    ``(identity, address)``) while that is set (only the first ``redirects_left`` when that
    is), and accepts the others."""

    def __init__(self, name: str, timeline: list[Seen]) -> None:
        self.name = name
        self.timeline = timeline
        self.redirect_to: tuple[str, str] | None = None
        self.rejected_too = True  # False: the redirect is the status's trailers alone
        self.redirects_left: int | None = None  # how many Registers to redirect (None: all)
        self.sessions: list[FakeSession] = []
        self.reads: list[read_pb2.GetRequest] = []
        self.addr = ""
        self._server: grpc.aio.Server | None = None

    @property
    def registers(self) -> int:
        return sum(1 for s in self.timeline if s.server == self.name)

    async def start(self, cert: trustme.LeafCert | None = None) -> FakeMember:
        """Listens on loopback, with TLS when given a certificate."""
        self._server = grpc.aio.server()
        pb_grpc.add_ControllerManagerServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        if cert is None:
            port = self._server.add_insecure_port("127.0.0.1:0")
        else:
            pair = (cert.private_key_pem.bytes(), cert.cert_chain_pems[0].bytes())
            port = self._server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([pair]))
        await self._server.start()
        self.addr = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        first = await context.read()
        if first is grpc.aio.EOF or first.WhichOneof("message") != "register":
            return
        metadata = dict(context.invocation_metadata() or ())
        self.timeline.append(Seen(self.name, time.monotonic(), str(metadata.get("authorization", ""))))
        if self.redirect_to is not None and self.redirects_left != 0:
            if self.redirects_left is not None:
                self.redirects_left -= 1
            owner, address = self.redirect_to
            rejected = registration_pb2.Rejected(code=UNAVAILABLE, message=f"{self.name} does not own this controller",
                                                 owner_identity=owner, owner_address=address)
            if self.rejected_too:
                await context.write(pb.ManagerMessage(rejected=rejected))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{owner} owns this controller",
                                (("ctrlhub-leader", owner), ("ctrlhub-owner", owner), ("ctrlhub-owner-addr", address)))
        session = FakeSession(f"{self.name}-{len(self.sessions) + 1}")
        self.sessions.append(session)
        readable = [registration_pb2.ReadableResource(resource=CONFIGMAPS)]
        await context.write(pb.ManagerMessage(registered=registration_pb2.Registered(
            session_id=session.session_id, leader_identity=self.name, member_identity=self.name, readable=readable)))
        reading = asyncio.create_task(self._read(context, session))
        try:
            while (msg := await session.outgoing.get()) is not None:
                await context.write(msg)
                if msg.WhichOneof("message") == "revoked":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the controller moved",
                                        (("ctrlhub-owner", msg.revoked.leader_identity),
                                         ("ctrlhub-owner-addr", msg.revoked.owner_address)))
        finally:
            reading.cancel()

    async def _read(self, context: grpc.aio.ServicerContext[Any, Any], session: FakeSession) -> None:
        """Records results; ends the session (status OK) on a Drain or when the client goes."""
        while (msg := await context.read()) is not grpc.aio.EOF:
            kind = msg.WhichOneof("message")
            if kind == "result":
                session.results.append(msg.result)
            elif kind == "results":
                session.results.extend(msg.results.results)
            elif kind == "drain":
                break
        session.outgoing.put_nowait(None)

    async def Get(self, request: read_pb2.GetRequest, context: grpc.aio.ServicerContext[Any, Any]) -> read_pb2.GetResponse:
        self.reads.append(request)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"{request.namespace}/{request.name} is not in {self.name}'s cache")
        raise AssertionError("unreachable")


@pytest.fixture
async def members() -> AsyncIterator[Callable[[int], Any]]:
    """``members(n)``: n fake ring members sharing one timeline of Registers, stopped at the end."""
    started: list[FakeMember] = []

    async def start(n: int) -> tuple[list[Seen], list[FakeMember]]:
        timeline: list[Seen] = []
        for name in ("A", "B", "C")[:n]:
            started.append(await FakeMember(name, timeline).start())
        return timeline, started[-n:]

    yield start
    for m in started:
        await m.stop()


def config(addr: str, initial: float = 10.0, maximum: float = 10.0) -> ctrlhub.Config:
    return ctrlhub.Config(addr=addr, reconnect_initial=initial, reconnect_max=maximum, drain_grace=2.0, shutdown_grace=2.0)


def dead_addr() -> str:
    """A loopback address where nothing listens (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def gaps(timeline: list[Seen]) -> list[float]:
    return [b.at - a.at for a, b in itertools.pairwise(timeline)]


# ---- the counting rule, driven directly ------------------------------------------------------


def test_redirects_are_followed_at_most_three_in_a_row() -> None:
    r = Redirects()
    to_b, to_a = Redirect("b", "b:1"), Redirect("a", "a:1")
    assert [r.follow(False, to_b), r.follow(False, to_a), r.follow(False, to_b)] == [True, True, True]
    assert r.target == "b:1" and r.in_a_row == MAX_REDIRECTS
    assert not r.follow(False, to_a), "the 4th in a row is not followed"
    assert r.target is None and r.in_a_row == 0, "back to the configured address, counting again"
    assert r.follow(False, to_b) and r.target == "b:1"


def test_registered_resets_the_count_and_other_ends_go_back() -> None:
    r = Redirects()
    for _ in range(MAX_REDIRECTS):
        assert r.follow(False, Redirect("b", "b:1"))
    assert r.follow(True, Redirect("a", "a:1")), "a session that registered (then moved) starts a new count"
    assert r.in_a_row == 1 and r.target == "a:1"
    assert not r.follow(False, None) and r.target is None, "a failure at the owner: back to the configured address"
    assert not r.follow(True, None) and r.target is None


# ---- the session against fake ring members -----------------------------------------------------


@pytest.mark.parametrize("rejected_too", [True, False], ids=["rejected-and-trailers", "trailers-alone"])
async def test_a_register_redirected_to_the_owner_registers_there_at_once_and_reads_there(
    members: Callable[[int], Any], serve: Callable[..., Running], caplog: pytest.LogCaptureFixture, rejected_too: bool
) -> None:
    timeline, (a, b) = await members(2)
    a.redirect_to, a.rejected_too = ("B", b.addr), rejected_too
    op = ctrlhub.Operator()
    seen: list[tuple[str, Any]] = []

    @op.reconcile("v1/ConfigMap", name="redirected")
    async def handler(name: str, reader: ctrlhub.Reader) -> None:
        seen.append((name, await reader.get("v1/ConfigMap", "ns", name)))

    caplog.set_level(logging.INFO, logger="ctrlhub")
    running = serve(op, config(a.addr))
    session = await eventually("a session at B", lambda: b.sessions and b.sessions[0])
    assert [s.server for s in timeline] == ["A", "B"]
    assert gaps(timeline)[0] < BACKOFF_FLOOR, f"no backoff before following a redirect: {gaps(timeline)}"
    session.reconcile("r1", "ns", "x")
    await eventually("the result at B", lambda: session.results)
    assert session.results[0].id == "r1" and session.results[0].WhichOneof("outcome") == "done"
    assert seen == [("x", None)]
    assert [(g.session_id, g.name) for g in b.reads] == [(session.session_id, "x")] and not a.reads, "the read reached the owner"
    redirected = [r for r in caplog.records if r.getMessage().startswith("redirected to B at ")]
    assert len(redirected) == 1 and redirected[0].levelno == logging.INFO and b.addr in redirected[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a redirect is not a failure"
    await running.stop()


async def test_a_redirect_over_tls_keeps_the_token_and_verifies_the_owners_host(
    serve: Callable[..., Running], tmp_path: Path
) -> None:
    """The configured address's certificate names a.example (``TLS.server_name``), the owner's
    names only localhost, the host of the redirect: the owner's name is what is verified."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    timeline: list[Seen] = []
    a = await FakeMember("A", timeline).start(ca.issue_cert("a.example"))
    b = await FakeMember("B", timeline).start(ca.issue_cert("localhost"))
    try:
        a.redirect_to = ("B", f"localhost:{b.addr.rpartition(':')[2]}")
        op = ctrlhub.Operator()
        op.reconcile("v1/ConfigMap", name="tls-redirected")(lambda: None)
        tls = ctrlhub.TLS(ca_file=tmp_path / "ca.pem", server_name="a.example")
        running = serve(op, ctrlhub.Config(addr=a.addr, tls=tls, token="s3cret", reconnect_initial=10, reconnect_max=10))
        await eventually("a session at B over TLS", lambda: b.sessions)
        assert [(s.server, s.authorization) for s in timeline] == [("A", "Bearer s3cret"), ("B", "Bearer s3cret")]
        await running.stop()
    finally:
        await a.stop()
        await b.stop()


async def test_a_moved_controller_cancels_its_handlers_and_registers_at_the_new_owner_at_once(
    members: Callable[[int], Any], serve: Callable[..., Running]
) -> None:
    timeline, (a, b) = await members(2)
    op = ctrlhub.Operator()
    started: list[str] = []
    cancelled: list[str] = []

    @op.reconcile("v1/ConfigMap", name="moved")
    async def handler(name: str, request: ctrlhub.Request) -> None:
        started.append(f"{request.session_id}/{name}")
        if name == "slow":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(f"{request.session_id}/{name}")
                raise

    running = serve(op, config(b.addr))
    at_b = await eventually("a session at B", lambda: b.sessions and b.sessions[0])
    at_b.reconcile("r1", "ns", "slow")
    await eventually("the slow handler to start", lambda: started)
    at_b.move_to("A", a.addr)
    at_a = await eventually("a session at A", lambda: a.sessions and a.sessions[0])
    assert [s.server for s in timeline] == ["B", "A"]
    moved_at = timeline[1].at - timeline[0].at
    assert moved_at < BACKOFF_FLOOR, f"no backoff before registering at the new owner ({moved_at:.2f} s)"
    await eventually("the old session's handler cancelled", lambda: cancelled == [f"{at_b.session_id}/slow"])
    assert not at_b.results, "an ended session's handler is never answered"
    at_a.reconcile("r1", "ns", "fast")
    await eventually("the result at A", lambda: at_a.results)
    assert started[-1] == f"{at_a.session_id}/fast"
    await running.stop()


async def test_a_moved_controller_with_no_owner_address_reconnects_through_the_configured_address(
    members: Callable[[int], Any], serve: Callable[..., Running]
) -> None:
    timeline, (a,) = await members(1)
    op = ctrlhub.Operator()

    @op.reconcile("v1/ConfigMap", name="moved-nowhere")
    async def handler() -> None:
        return None

    running = serve(op, config(a.addr, initial=0.4, maximum=0.4))
    await eventually("a session at A", lambda: a.sessions)
    a.sessions[0].move_to("B", "")
    await eventually("a second session at A", lambda: len(a.sessions) == 2)
    assert [s.server for s in timeline] == ["A", "A"] and gaps(timeline)[0] >= 0.2, "the normal backoff (at least half of 0.4 s)"
    await running.stop()


async def test_members_redirecting_to_each_other_are_left_after_three_redirects_with_backoff(
    members: Callable[[int], Any], serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    timeline, (a, b, c) = await members(3)
    a.redirect_to, b.redirect_to, c.redirect_to = ("B", b.addr), ("A", a.addr), ("A", a.addr)
    op = ctrlhub.Operator()

    @op.reconcile("v1/ConfigMap", name="bounced")
    async def handler() -> None:
        return None

    caplog.set_level(logging.INFO, logger="ctrlhub")
    running = serve(op, config(c.addr, initial=0.4, maximum=0.8))  # C, the configured address, sends it to A
    await eventually("three rounds from the configured address", lambda: c.registers >= 3)
    await running.stop()
    rounds = [timeline[i:i + 4] for i in range(0, len(timeline), 4)]
    assert all([s.server for s in r] == ["C", "A", "B", "A"][:len(r)] for r in rounds), [s.server for s in timeline]
    between = gaps(timeline)
    backoffs = between[3::4]
    assert len(backoffs) >= 2 and min(backoffs) >= 0.2, f"back to C after the normal backoff (at least half of 0.4 s): {between}"
    assert len(timeline) <= 4 * c.registers, "bounded: each round ends at the 4th redirect"
    refused = [r for r in caplog.records if r.getMessage().startswith("not following the redirect")]
    assert len(refused) >= 2 and all(r.levelno == logging.WARNING and c.addr in r.getMessage() for r in refused)


async def test_a_redirect_to_an_address_where_nothing_listens_goes_back_to_the_configured_one(
    members: Callable[[int], Any], serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    timeline, (a,) = await members(1)
    nowhere = dead_addr()
    a.redirect_to, a.redirects_left = ("B", nowhere), 1
    op = ctrlhub.Operator()

    @op.reconcile("v1/ConfigMap", name="nowhere")
    async def handler() -> None:
        return None

    caplog.set_level(logging.INFO, logger="ctrlhub")
    running = serve(op, config(a.addr, initial=0.4, maximum=0.4))
    await eventually("a session at the configured address", lambda: a.sessions)
    assert [s.server for s in timeline] == ["A", "A"] and gaps(timeline)[0] >= 0.2, "the normal backoff (at least half of 0.4 s)"
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"redirected to B at {nowhere} ") for m in messages), "the redirect was followed"
    assert any(m.startswith("session ended: manager unavailable") for m in messages), "then the owner's address failed"
    await running.stop()
