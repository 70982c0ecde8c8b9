"""A session's outbound messages, in order, as the stream takes them; answers (results and
event acknowledgements) that are ready together leave as one ``ResultBatch`` (docs/protocol.md,
"Batches").

Nothing waits to fill a batch: the writer takes the next message when the previous write has
finished, and only the answers already queued right behind it join it. So batching costs an
answer no time; it saves the per-message cost (grpcio's stream write, a frame, the manager's
wake-up and decode) when answers come faster than one message each can carry them."""

from __future__ import annotations

import asyncio
from collections import deque

from .v1 import controller_pb2 as pb

__all__ = ["MAX_BATCH", "Outbox"]

MAX_BATCH = 64
"""The most answers one message carries, and what the SDK asks for in ``Register.max_batch``
(the manager's own limit for the other direction)."""

_ANSWERS = frozenset({"result", "event_ack"})


class Outbox:
    """What one session sends. ``put`` never blocks; ``get`` returns the next message, with the
    answers queued right behind it merged into one batch once ``limit`` allows it. Any other
    message (a heartbeat, a credit, a drain) ends a batch and keeps its place."""

    __slots__ = ("_queue", "_waiter", "limit")

    def __init__(self) -> None:
        self._queue: deque[pb.ControllerMessage] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.limit = 1
        """The most answers one message may carry: 1 (every answer alone) until ``Registered``
        shows the manager takes batches; an older manager would end the stream on one."""

    def __len__(self) -> int:
        return len(self._queue)

    def allow(self, max_batch: int) -> None:
        """Batch at most ``max_batch`` answers per message (``Registered.effective.max_batch``:
        0 or 1 from a manager without batches)."""
        self.limit = max(1, min(max_batch, MAX_BATCH))

    def put(self, msg: pb.ControllerMessage) -> None:
        """Queue ``msg`` behind everything queued before it."""
        self._queue.append(msg)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> pb.ControllerMessage:
        """The next message to write, once there is one."""
        while not self._queue:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.take()

    def take(self) -> pb.ControllerMessage:
        """The next message (the queue must not be empty): an answer with the answers right
        behind it, up to ``limit``, as one ``ResultBatch``; anything else, or an answer alone,
        as it was queued."""
        queue = self._queue
        first = queue.popleft()
        if self.limit < 2 or not queue or not _is_answer(first) or not _is_answer(queue[0]):
            return first
        batch = pb.ResultBatch()
        _add(batch, first)
        count = 1
        while count < self.limit and queue and _is_answer(queue[0]):
            _add(batch, queue.popleft())
            count += 1
        return pb.ControllerMessage(results=batch)


def _is_answer(msg: pb.ControllerMessage) -> bool:
    return msg.WhichOneof("message") in _ANSWERS


def _add(batch: pb.ResultBatch, answer: pb.ControllerMessage) -> None:
    if answer.HasField("result"):
        batch.results.append(answer.result)
    else:
        batch.acks.append(answer.event_ack)
