"""Batches (docs/protocol.md, "Batches"): the outbox driven directly (what leaves together, in
what order, and only once the manager said it takes batches), a WorkBatch handled piece by
piece, and a burst against the real manager, whose metrics count the batches both ways."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import ctrlhub
from conftest import Cluster, Manager, Running, eventually
from ctrlhub._batches import MAX_BATCH, Outbox
from ctrlhub._session import _Session
from ctrlhub.v1 import controller_pb2 as pb


def result(id: str) -> pb.ControllerMessage:
    return pb.ControllerMessage(result=pb.ReconcileResult(id=id))


def ack(id: str) -> pb.ControllerMessage:
    return pb.ControllerMessage(event_ack=pb.EventAck(id=id))


def beat() -> pb.ControllerMessage:
    return pb.ControllerMessage(heartbeat=pb.Heartbeat(nonce=7))


def drain() -> pb.ControllerMessage:
    return pb.ControllerMessage(drain=pb.Drain())


def shape(msg: pb.ControllerMessage) -> tuple[str, ...]:
    """What a message carries: its kind, with the ids of its answers."""
    kind = msg.WhichOneof("message")
    if kind == "result":
        return ("result", msg.result.id)
    if kind == "event_ack":
        return ("event_ack", msg.event_ack.id)
    if kind == "results":
        return ("results", *(r.id for r in msg.results.results), *(f"ack:{a.id}" for a in msg.results.acks))
    return (str(kind),)


def outbox(*msgs: pb.ControllerMessage, max_batch: int = MAX_BATCH) -> Outbox:
    box = Outbox()
    box.allow(max_batch)
    for m in msgs:
        box.put(m)
    return box


def taken(box: Outbox) -> list[tuple[str, ...]]:
    out = []
    while len(box):
        out.append(shape(box.take()))
    return out


def test_ready_results_leave_together_and_other_messages_keep_their_place() -> None:
    box = outbox(result("a"), result("b"), beat(), result("c"), result("d"), drain(), result("e"))
    assert taken(box) == [("results", "a", "b"), ("heartbeat",), ("results", "c", "d"), ("drain",), ("result", "e")]


def test_a_result_alone_goes_as_a_plain_result() -> None:
    assert taken(outbox(result("a"))) == [("result", "a")]
    assert taken(outbox(beat(), result("a"), beat())) == [("heartbeat",), ("result", "a"), ("heartbeat",)]


def test_without_the_managers_consent_every_result_goes_alone() -> None:
    assert taken(outbox(result("a"), result("b"), max_batch=0)) == [("result", "a"), ("result", "b")]
    assert taken(outbox(result("a"), result("b"), max_batch=1)) == [("result", "a"), ("result", "b")]
    fresh = Outbox()  # before Registered
    fresh.put(result("a"))
    fresh.put(result("b"))
    assert taken(fresh) == [("result", "a"), ("result", "b")]


def test_a_batch_stops_at_the_limit_and_the_limit_at_64() -> None:
    box = outbox(*(result(str(i)) for i in range(MAX_BATCH + 1)), max_batch=1000)
    assert [len(m) - 1 for m in taken(box)] == [MAX_BATCH, 1]
    box = outbox(*(result(str(i)) for i in range(5)), max_batch=2)
    assert taken(box) == [("results", "0", "1"), ("results", "2", "3"), ("result", "4")]


def test_event_acknowledgements_batch_too() -> None:
    assert taken(outbox(ack("x"), ack("y"), beat())) == [("results", "ack:x", "ack:y"), ("heartbeat",)]


async def test_get_waits_for_a_message_and_takes_what_came_in_the_same_turn() -> None:
    box = outbox()
    getting = asyncio.ensure_future(box.get())
    await asyncio.sleep(0)
    assert not getting.done()
    box.put(result("a"))
    box.put(result("b"))  # the same event-loop turn: the writer has not run yet
    assert shape(await getting) == ("results", "a", "b")


class _SlowCall:
    """A stream whose first write lasts until the test releases it: what the write loop sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, ...]] = []
        self.writing = asyncio.Event()
        self.release = asyncio.Event()

    async def write(self, msg: pb.ControllerMessage) -> None:
        self.sent.append(shape(msg))
        self.writing.set()
        await self.release.wait()


async def test_results_ready_during_a_write_leave_together_after_it() -> None:
    call = _SlowCall()
    session = _Session(call, None, logging.getLogger("test-batches"))  # type: ignore[arg-type]
    session.outbox.allow(MAX_BATCH)
    writer = asyncio.create_task(session.write_loop())
    try:
        session.send(result("first"))
        await call.writing.wait()
        for m in (result("a"), result("b"), result("c"), drain(), result("d")):
            session.send(m)  # while "first" is being written
        call.release.set()
        await eventually("everything to be written", lambda: len(call.sent) == 4, timeout=5)
        assert call.sent == [("result", "first"), ("results", "a", "b", "c"), ("drain",), ("result", "d")]
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


def cfg(m: Manager) -> ctrlhub.Config:
    return ctrlhub.Config(addr=f"http://{m.addr}", reconnect_initial=0.05, reconnect_max=0.5)


async def test_a_burst_is_reconciled_and_answered_in_batches(
    devcluster: Cluster, manager: Manager, ns: str, serve: Callable[..., Running]
) -> None:
    """Credit 0 while a burst queues, then credit for all of it: every key is reconciled once,
    and the handlers, released together, answer in one batch (the manager counts it). Whether
    the manager grouped the requests depends on its threads, so that is reported, not
    asserted: the outbox tests above and the WorkBatch test below prove both sides' logic."""
    burst = 24
    op = ctrlhub.Operator()
    seen: list[str] = []
    gate = asyncio.Event()

    @op.reconcile("v1/ConfigMap", name=ns, namespaces=ns, max_concurrent=burst)
    async def handler(name: str) -> None:
        seen.append(name)
        if len(seen) == burst:  # all running: release them together, on the next turn
            asyncio.get_running_loop().call_soon(gate.set)
        await gate.wait()

    serve(op, cfg(manager))
    controller = op.controllers[0]
    await eventually("registration", lambda: controller.session_id)
    controller.set_max_in_flight(0)
    await eventually("the credit to reach the manager", lambda: (manager.controller(ns) or {}).get("effectiveConcurrency") == 0)
    before = manager.metrics()
    for i in range(burst):
        devcluster.configmap(ns, f"c{i}")
    await eventually("the burst to queue", lambda: (manager.controller(ns) or {}).get("queued") == burst)
    controller.set_max_in_flight(burst)
    await eventually("every key reconciled and answered", lambda: (c := manager.controller(ns)) and c.get("inFlight") == 0
                     and c.get("queued") == 0 and len(seen) == burst)
    assert sorted(seen) == sorted(f"c{i}" for i in range(burst))
    after = manager.metrics()

    def batches(direction: str) -> tuple[float, float]:
        """(pieces, batches) that went in batches in ``direction`` during the burst."""
        sum_, count = (f'ctrlhub_batch_size_{x}{{direction="{direction}"}}' for x in ("sum", "count"))
        return after.get(sum_, 0) - before.get(sum_, 0), after.get(count, 0) - before.get(count, 0)

    answers, answer_batches = batches("received")
    assert answer_batches >= 1 and answers >= burst // 2, (answers, answer_batches)
    requests, request_batches = batches("sent")
    print(f"answers: {answers:.0f} of {burst} in {answer_batches:.0f} batch(es); "
          f"requests: {requests:.0f} in {request_batches:.0f} batch(es)")


class _Stream:
    """A Connect stream that delivers the given manager messages, then ends."""

    def __init__(self, *msgs: pb.ManagerMessage) -> None:
        self.msgs = msgs

    async def __aiter__(self) -> Any:
        for m in self.msgs:
            yield m


async def test_a_work_batch_is_dispatched_piece_by_piece_as_if_each_came_alone(caplog: Any) -> None:
    controller = ctrlhub.Controller("batch-unit", "v1/ConfigMap", lambda: None)
    dispatched: list[tuple[str, str]] = []
    controller._dispatch = lambda session, piece: dispatched.append((type(piece).__name__, piece.id))  # type: ignore[method-assign]
    stream = _Stream(
        pb.ManagerMessage(reconcile=pb.ReconcileRequest(id="alone")),
        pb.ManagerMessage(batch=pb.WorkBatch(requests=[pb.ReconcileRequest(id="r1"), pb.ReconcileRequest(id="r2")])),
        pb.ManagerMessage(batch=pb.WorkBatch(events=[pb.Event(id="e1"), pb.Event(id="e2")])),
    )
    session = _Session(stream, None, controller.log)  # type: ignore[arg-type]
    caplog.set_level(ctrlhub.TRACE, logger=controller.log.name)
    end = await controller._read(session, None)  # type: ignore[arg-type]
    assert end.retry and "ended the stream" in end.reason
    assert dispatched == [("ReconcileRequest", "alone"), ("ReconcileRequest", "r1"), ("ReconcileRequest", "r2"),
                          ("Event", "e1"), ("Event", "e2")]
    received = [r.getMessage() for r in caplog.records if r.getMessage().startswith("received ")]
    assert [m.split(" id=")[0] for m in received] == ["received reconcile"] * 3 + ["received event"] * 2, received
    assert received[1].endswith("(2 in a batch)"), received
