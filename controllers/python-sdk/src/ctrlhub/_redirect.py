"""Following a ring member's redirect (pure; unit-tested without a network).

A manager run as one member of a ring (``ctrlhub run --mode ring``) that does not own a
controller answers its ``Register`` with ``Rejected`` (UNAVAILABLE) naming the owner, and a
member whose controller moved ends the session with ``Revoked(REASON_UNIT_MOVED)`` naming the
new one. The next session dials the owner's address at once, on a new connection with the same
credentials; ``Redirects`` decides whether to, and counts, so that members whose views of the
ring briefly differ cannot bounce a controller between them forever."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_REDIRECTS", "OWNER_ADDR_TRAILER", "OWNER_TRAILER", "Redirect", "Redirects"]

MAX_REDIRECTS = 3
"""Redirects followed in a row without reaching ``Registered``; the next one is not followed."""
OWNER_TRAILER = "ctrlhub-owner"
"""The trailer of a redirecting member's UNAVAILABLE status naming the owner's identity."""
OWNER_ADDR_TRAILER = "ctrlhub-owner-addr"
"""The trailer naming the owner's address (``host:port``, no scheme)."""


@dataclass(frozen=True)
class Redirect:
    """Where a ring member said this controller's owner is."""

    owner: str
    """The owner's identity (for logs; may be empty)."""
    address: str
    """The owner's gRPC address, ``host:port`` (never empty)."""

    def __str__(self) -> str:
        return f"{self.owner or 'another member'} at {self.address}"


class Redirects:
    """Where the next session dials: the configured address (``target`` None), or the address
    of the owner a redirect named.

    At most ``limit`` redirects are followed in a row without a session reaching
    ``Registered``; the one after is not followed, and the next session dials the configured
    address again after the normal reconnect backoff, where the count starts again. Every other
    end of a session (a failure, a session that ends without naming an owner) goes back to the
    configured address too."""

    def __init__(self, limit: int = MAX_REDIRECTS) -> None:
        self.limit = limit
        self.in_a_row = 0
        """Redirects followed since the last ``Registered`` or the last dial of the configured
        address."""
        self.target: str | None = None
        """The address the next session dials; None: the configured one."""

    def follow(self, registered: bool, redirect: Redirect | None) -> bool:
        """Records how a session ended (``registered``: it got ``Registered``; ``redirect``:
        the owner it was sent to, if any). True: the next session dials ``redirect.address`` at
        once (no backoff, not a failed attempt). False: it dials the configured address after
        the normal backoff."""
        if registered:
            self.in_a_row = 0
        if redirect is None or self.in_a_row >= self.limit:
            self.target = None
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        self.target = redirect.address
        return True
