"""Pure timing logic: reconnect backoff and deadline margins (unit-tested with a fixed clock
and random source)."""

from __future__ import annotations

import random
from collections.abc import Callable

DEADLINE_MARGIN = 0.05
"""Stop this fraction of the time left before a request's deadline ..."""
DEADLINE_MARGIN_MAX = 0.5
"""... but at most this many seconds early."""


class Backoff:
    """Exponential reconnect backoff with equal jitter: after the n-th consecutive failure wait
    a random time in ``[d/2, d]`` where ``d = min(initial * 2**(n-1), maximum)``. A session that
    registered and lasted at least ``reset_after`` seconds resets the sequence (its end counts as
    the first failure); a shorter one counts as a failure, so a manager that accepts and at once
    revokes (a quota, say) is not reconnected to in a tight loop."""

    def __init__(self, initial: float = 0.1, maximum: float = 5.0, rng: Callable[[], float] = random.random,
                 reset_after: float = 1.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.reset_after = reset_after
        self.failures = 0
        self._rng = rng

    def base_delay(self, failures: int) -> float:
        """The un-jittered delay after ``failures`` (≥ 1) consecutive failures."""
        return min(self.initial * 2.0 ** min(max(failures, 1) - 1, 62), self.maximum)

    def next_delay(self, registered: bool, lasted: float = float("inf")) -> float:
        """Records the end of a session (``registered``: it got going; ``lasted``: for how many
        seconds) and returns how long to wait before connecting again."""
        self.failures = 1 if registered and lasted >= self.reset_after else self.failures + 1
        d = self.base_delay(self.failures)
        return d / 2 + self._rng() * d / 2


def time_left(deadline: float | None, now: float, fallback: float) -> float:
    """Seconds a handler may run: until ``deadline`` (Unix seconds, the manager's clock) less a
    margin of 5 % of the time left, at most 0.5 s, for latency and clock skew; ``fallback``
    seconds when the request carries no deadline. Never negative."""
    remaining = fallback if deadline is None else deadline - now
    return max(0.0, remaining - min(max(remaining, 0.0) * DEADLINE_MARGIN, DEADLINE_MARGIN_MAX))
