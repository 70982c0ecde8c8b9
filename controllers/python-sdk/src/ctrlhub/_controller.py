"""A controller: its definition (``_definition``), its session loop (``_session``) and its
attempts (``_attempt``), with what the process can see of it (ready, outdated, running)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any, Unpack

from ._attempt import Attempts, _Attempt
from ._config import Config
from ._definition import Definition, Mode, Options
from ._events import EventRecorder
from ._fence import Watchdog
from ._logs import TracebackBudget
from ._request import EVENT_KWARGS, RECONCILE_KWARGS, Helpers, injection
from ._session import SessionLoop, _Session
from ._types import Form, Key, Kind, KindLike, Registration
from ._write import Kube
from .v1 import controller_pb2 as pb
from .v1 import registration_pb2

__all__ = ["Controller"]


class Controller(SessionLoop, Attempts):
    """One controller: a primary kind, what else wakes it, and the handler for its requests
    (``mode="reconcile"``) or events (``mode="events"``).

    Usually made by the ``Operator.reconcile`` / ``Operator.on_event`` decorators (or
    ``ctrlhub.reconcile`` / ``ctrlhub.on_event``); the keywords are documented on ``Options``."""

    _attempts: set[_Attempt]

    def __init__(self, name: str, kind: KindLike, handler: Callable[..., Any], *, mode: Mode = "reconcile",
                 **options: Unpack[Options]) -> None:
        self.definition = Definition.of(name, kind, mode, **options)
        """What this controller registers."""
        self.name = name
        self.kind: Kind = self.definition.kind
        self.handler = handler
        self.mode: str = mode
        self.is_async = inspect.iscoroutinefunction(handler)
        available = RECONCILE_KWARGS if mode == "reconcile" else EVENT_KWARGS
        self._kwargs, self._wants_object = injection(handler, available, "reconcile handler" if mode == "reconcile" else "event handler")
        self.max_concurrent = self.definition.max_concurrent
        self.max_in_flight = self.definition.credit
        self.deadline = self.definition.deadline_seconds
        self.revision = self.definition.options.get("revision")
        """``Register.revision``; None: ``CTRLHUB_REVISION``, else 0."""
        self.log = logging.getLogger(f"ctrlhub.{name}")
        self._slots = asyncio.Semaphore(self.max_concurrent)
        self._session: _Session | None = None
        self._keys: dict[Key, _Attempt] = {}
        self._attempts: set[_Attempt] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._watchdog: Watchdog | None = None
        self._grace_end: float | None = None
        self._drained = False
        self._on_registered: list[Callable[[Registration], Any]] = []
        self._readable_logged: dict[Kind, Form] | None = None
        self._helpers: Helpers | None = None
        self._tracebacks = TracebackBudget()
        self._not_ready = "not started"
        self.kube: Kube | None = None
        """This controller's writes (its field manager is its name), once it serves."""
        self.events: EventRecorder | None = None
        """This controller's Events recorder, once it serves."""
        self.effective: registration_pb2.Register | None = None
        """The registration as the manager echoed it (``Registered.effective``) last time."""
        self.registration: Registration | None = None
        """The live session's ``Registered`` answer, None between sessions."""
        self.outdated = False
        """True after ``Revoked(SUPERSEDED)`` or ``Rejected`` with ``outdated``: another
        definition of this controller runs under a higher (or equal) revision, and this replica
        takes no work until it registers again (every ``Config.outdated_retry`` seconds)."""
        self.unfinished = 0
        """Handlers still running when ``serve`` gave up waiting for them (``shutdown_grace``)."""

    def to_register(self) -> registration_pb2.Register:
        """The ``Register`` message this controller sends (``CTRLHUB_REVISION`` read now)."""
        return self.definition.to_register(self._wants_object, self.max_in_flight)

    def on_registered(self, callback: Callable[[Registration], Any]) -> Callable[[Registration], Any]:
        """Calls ``callback(registration)`` on the event loop every time a session registers
        (usable as a decorator); an exception it raises is logged and ignored."""
        self._on_registered.append(callback)
        return callback

    @property
    def session_id(self) -> str | None:
        """The live session's id, or None between sessions."""
        s = self._session
        return s.session_id if s is not None and s.registered and not s.closed else None

    @property
    def ready(self) -> bool:
        """Whether this replica takes work: a session is registered and neither draining nor
        outdated. ``CTRLHUB_HEALTH_ADDR`` serves it as ``/readyz``."""
        s = self._session
        return s is not None and s.registered and not s.closed and not s.draining and not self.outdated

    @property
    def not_ready_reason(self) -> str:
        """Why this replica takes no work (``""`` when ``ready``): connecting, reconnecting
        (and why), draining, outdated, stopping."""
        if self.ready:
            return ""
        return self._not_ready or "not registered"

    @property
    def running(self) -> int:
        """Handlers running now (or waiting for an earlier attempt of their key), in every
        session, those of ended sessions included."""
        return len(self._attempts)

    def set_max_in_flight(self, credit: int) -> None:
        """Change this replica's credit (how many requests the manager may have outstanding on
        it) now, with a ``Credit`` message, and for the sessions to come. 0 pauses dispatch
        without ending the session."""
        if credit < 0:
            raise ValueError("credit must not be negative")
        self.max_in_flight = credit
        s = self._session
        if s is not None and s.registered and not s.draining:
            s.send(pb.ControllerMessage(credit=pb.Credit(max_in_flight=credit)))

    async def serve(self, config: Config, stop: asyncio.Event, kube: Kube | None = None) -> None:
        """Run until ``stop`` is set (then drain and return once the handlers have finished)
        or the manager refuses the controller for good (raises ``FatalError``). ``kube``: the
        client for the handlers' writes (default: the controller's credentials, found on first
        use; see ``ctrlhub.Kube``)."""
        self.kube = kube if kube is not None else Kube(self.name)
        self.events = EventRecorder(self.name, self.kube)
        loop = asyncio.get_running_loop()
        self._helpers = Helpers(self.kube, self.events, loop)
        warming = loop.run_in_executor(None, self.kube.warm)
        try:
            await self._serve(config, stop)
        finally:
            await asyncio.gather(warming, return_exceptions=True)
