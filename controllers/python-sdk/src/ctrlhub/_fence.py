"""Exclusive attempts, the replica's side (docs/protocol.md, "Exclusive attempts").

The manager echoes every heartbeat of a session; the session's *anchor* is when this process
sent the last heartbeat the manager echoed (by this process's monotonic clock). The first
heartbeat goes out with ``Registered`` and no handler of the session starts before its echo
(about a round trip), so every handler runs under an anchor the manager has answered. The manager
hands the session's unfinished keys to other replicas no earlier than ``hold`` after its last
echo, which came after the anchor; so this process is safe as long as every handler of the
session has stopped within ``hold`` of the anchor. It acts at two points:

- at half the hold without a new anchor, the manager may be gone (a partition, say): cancel
  every handler of the session, take no more work from it and end it (then reconnect);
- at 80 % of the hold, if a handler of the session still runs (a sync handler that ignores its
  ``cancelled`` event, an async one that swallows its cancellation or blocks the event loop):
  log one ERROR line and exit the process, so that Kubernetes restarts it before the key moves.

The watchdog is a thread, not a task, so that it fires also when a handler blocks the event
loop.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["EXIT_AT", "EXIT_STATUS", "EXPIRE_AT", "Fence", "Verdict", "Watchdog", "exit_stuck"]

log = logging.getLogger("ctrlhub")

EXPIRE_AT = 0.5
"""Fraction of the hold without a new anchor after which a session is ended."""
EXIT_AT = 0.8
"""Fraction of the hold after which a handler of the session must not run any more."""
EXIT_STATUS = 70
"""The process's exit status when a handler outlives the hold (EX_SOFTWARE)."""


class Verdict(enum.Enum):
    """What the watchdog must do about a fence now."""

    OK = "ok"
    EXPIRE = "expire"
    EXIT = "exit"


class Fence:
    """The heartbeat bookkeeping and the handler count of one session."""

    def __init__(self, hold: float, interval: float, since: float) -> None:
        self.hold = hold
        """``Registered.hold`` in seconds."""
        self.interval = interval
        """``Registered.heartbeat_interval`` in seconds."""
        self.since = since
        """When (``time.monotonic()``) the fence started: ``Registered`` arrived."""
        self.anchor: float | None = None
        """When (``time.monotonic()``) this process sent the last heartbeat the manager
        echoed; None before the first echo (no handler runs before it)."""
        self.running = 0
        """Handlers of the session that have not stopped yet (threads included)."""
        self.live = True
        """False once the session has ended (its handlers were cancelled then)."""
        self.expired = False
        """Half the hold passed without a new anchor: the session is being ended."""
        self._sent: dict[int, float] = {}
        self._nonce = 0

    def beat(self, now: float) -> int:
        """A new heartbeat's nonce, sent at ``now``."""
        self._nonce += 1
        self._sent[self._nonce] = now
        return self._nonce

    def answered(self, nonce: int) -> bool:
        """The manager echoed ``nonce``: the anchor moves to when it was sent. Unknown or older
        nonces are ignored."""
        sent = self._sent.pop(nonce, None)
        if sent is None:
            return False
        for older in [n for n in self._sent if n < nonce]:
            del self._sent[older]
        self.anchor = sent if self.anchor is None else max(self.anchor, sent)
        return True

    def age(self, now: float) -> float:
        """Seconds since the anchor (since the fence started, before the first echo)."""
        return now - (self.since if self.anchor is None else self.anchor)

    def verdict(self, now: float) -> Verdict:
        """EXIT when a handler still runs at 80 % of the hold after the anchor; EXPIRE (once)
        when a live session reaches half of it; else OK."""
        age = self.age(now)
        if self.running > 0 and age >= EXIT_AT * self.hold:
            return Verdict.EXIT
        if self.live and not self.expired and age >= EXPIRE_AT * self.hold:
            return Verdict.EXPIRE
        return Verdict.OK

    def done(self) -> bool:
        """Nothing left to watch: the session ended and its handlers stopped."""
        return not self.live and self.running == 0


def exit_stuck(what: str) -> None:
    """Log ``what`` as one ERROR line and end the process at once with ``EXIT_STATUS``: a
    handler thread that ignores cancellation cannot be stopped any other way."""
    log.error("%s", what)
    for handler in logging.getLogger().handlers + log.handlers:
        try:
            handler.flush()
        except Exception:  # exiting anyway
            pass
    try:
        sys.stderr.flush()
    finally:
        os._exit(EXIT_STATUS)


class Watchdog:
    """A thread that looks at every watched fence a few dozen times per hold."""

    def __init__(self, name: str, exit: Callable[[str], None] = exit_stuck) -> None:
        self._name = name
        self._exit = exit
        self._lock = threading.Lock()
        self._fences: dict[Fence, tuple[str, Callable[[], None]]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def watch(self, fence: Fence, session_id: str, expire: Callable[[], None]) -> None:
        """Watch ``fence``; ``expire`` is called (from the watchdog's thread) once, at half the
        hold."""
        with self._lock:
            self._fences[fence] = (session_id, expire)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"ctrlhub-watchdog-{self._name}", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None:
            thread.join(timeout=5)

    def _tick(self) -> float:
        with self._lock:
            holds = [f.hold for f in self._fences]
        return min([0.1, *(h / 50 for h in holds)]) if holds else 0.5

    def _run(self) -> None:
        while True:
            self._wake.wait(self._tick())
            self._wake.clear()
            with self._lock:
                if self._stop:
                    return
                fences = list(self._fences.items())
            now = time.monotonic()
            for fence, (session_id, expire) in fences:
                verdict = fence.verdict(now)
                if verdict is Verdict.EXPIRE:
                    fence.expired = True
                    expire()
                elif verdict is Verdict.EXIT:
                    self._exit(
                        f"controller {self._name}: {fence.running} handler(s) of session {session_id} still running "
                        f"{fence.age(now):.1f} s after the last heartbeat the manager answered (hold "
                        f"{fence.hold:.1f} s), although cancelled: the manager hands their keys to other replicas "
                        f"once the hold is over, so this process exits now (status {EXIT_STATUS}) and Kubernetes "
                        "restarts it. A sync handler must return soon after its `cancelled` event is set; an async "
                        "one must not block the event loop nor swallow asyncio.CancelledError"
                    )
                    return
                if fence.done():
                    with self._lock:
                        self._fences.pop(fence, None)
