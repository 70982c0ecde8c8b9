"""Reconnect backoff (pure; unit-tested with a fixed random source)."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """Exponential reconnect backoff with equal jitter: after the n-th consecutive failure wait
    a random time in ``[d/2, d]`` where ``d = min(initial * 2**(n-1), maximum)``.

    A session that registered (``Registered`` arrived) resets the sequence, however short it
    was: its end counts as the first failure. So two leader changes in a row (a 2-pod rollout
    of the manager) each cost one first step, never a multi-second wait; connection attempts
    that fail before registering double the delay."""

    def __init__(self, initial: float = 0.1, maximum: float = 5.0, rng: Callable[[], float] = random.random) -> None:
        self.initial = initial
        self.maximum = maximum
        self.failures = 0
        self._rng = rng

    def base_delay(self, failures: int) -> float:
        """The un-jittered delay after ``failures`` (≥ 1) consecutive failures."""
        return min(self.initial * 2.0 ** min(max(failures, 1) - 1, 62), self.maximum)

    def next_delay(self, registered: bool) -> float:
        """Records the end of a session (``registered``: it got ``Registered``) and returns how
        long to wait before connecting again."""
        self.failures = 1 if registered else self.failures + 1
        d = self.base_delay(self.failures)
        return d / 2 + self._rng() * d / 2
