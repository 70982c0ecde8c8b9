"""What the session loop (``_session``) may do to a running attempt (``_attempt``): stop it, and
why. Both import this module and neither imports the other's internals for it, so the session
does not depend on the attempt (the attempt depends on the session it answers on)."""

from __future__ import annotations

from typing import Protocol

from ._types import Key

__all__ = ["DEADLINE", "SESSION_ENDED", "SHUTDOWN", "Stoppable"]

DEADLINE = "its deadline is near"
SESSION_ENDED = "its session ended"
SHUTDOWN = "the shutdown grace is over"


class Stoppable(Protocol):
    """A running attempt as the session loop sees it."""

    @property
    def key(self) -> Key:
        """The object key it reconciles."""
        ...

    def stop(self, why: str) -> None:
        """Cancel it (``why``: one of the reasons above); it answers once it has really stopped."""
        ...
