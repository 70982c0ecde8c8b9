"""An operator: the controllers of one process, run together until SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from ._config import Config, ConfigError
from ._controller import Controller
from ._types import FatalError, KindLike, Owns, Predicate, SelectorLike, Watch

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("ctrlhub")


def _default_name(fn: Callable[..., Any]) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", fn.__name__.lower()).strip("-") or "controller"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, in the manager's ``--log-format json`` shape: ``timestamp``,
    ``level``, ``target`` (the logger) and ``fields.message``, so one log pipeline parses both."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, str] = {"message": record.getMessage()}
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        stamp = self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}"
        return json.dumps({"timestamp": stamp, "level": record.levelname, "target": record.name, "fields": fields})


class Operator:
    """The controllers of one process. Declare them with the decorators, then ``run()``.

    ``ctrlhub.reconcile``, ``ctrlhub.on_event`` and ``ctrlhub.run`` use a default operator, so
    a single-file controller needs no ``Operator`` of its own."""

    def __init__(self) -> None:
        self.controllers: list[Controller] = []

    def add(self, controller: Controller) -> Controller:
        """Adds a controller made by hand."""
        if any(c.name == controller.name for c in self.controllers):
            raise ValueError(f"a controller named {controller.name!r} is already declared")
        self.controllers.append(controller)
        return controller

    def reconcile(
        self,
        kind: KindLike,
        *,
        name: str | None = None,
        namespaces: str | Sequence[str] | SelectorLike | None = None,
        labels: SelectorLike | None = None,
        predicate: Predicate | None = None,
        owns: Iterable[KindLike | Owns] = (),
        watches: Iterable[Watch] = (),
        max_concurrent: int = 1,
        max_in_flight: int | None = None,
        controller_wide_limit: int | None = None,
        deadline: float | timedelta | None = None,
        resync: float | timedelta | None = None,
        backoff: tuple[float | timedelta, float | timedelta] | None = None,
        include_object: bool | None = None,
        revision: int | None = None,
    ) -> Callable[[F], F]:
        """Declares the decorated function as the reconcile handler of ``kind``.

        The handler (``async def`` or plain ``def``, which runs in a thread) takes, by name,
        any of: ``key``, ``name``, ``namespace``, ``obj`` (the object, None when it is gone),
        ``body`` (the same), ``tombstone``, ``spec``, ``status``, ``meta``, ``labels``,
        ``annotations``, ``attempt``, ``reasons``, ``reader`` (cached Get/List), ``logger``,
        ``cancelled`` (a ``threading.Event`` set when it must stop), ``deadline`` and
        ``request`` (all of it), or ``**kwargs``. It returns None or ``Done()``, or
        ``RequeueAfter(seconds)``; it raises ``TemporaryError`` (retried with backoff, as is any
        other exception) or ``PermanentError`` (not retried until the object changes).

        ``obj`` is None both when the object is gone and when the manager's cache does not hold
        it (NotFound); only a ``tombstone`` says the manager saw it deleted. Clean up external
        state under a finalizer (``ctrlhub.finalizers``), not on a missing object.

        Attempts of a key never overlap: not across replicas (the manager), and not in this
        process either, even when a handler overruns its deadline. A handler is cancelled
        shortly before its deadline (an async one with ``asyncio.CancelledError``, a sync one
        through ``cancelled``) and its request is answered once it has returned; the key's
        next attempt starts only then.

        Parameters:
            kind: ``"v1/ConfigMap"``, ``"apps/v1/Deployment"`` or a ``Kind``.
            name: the controller's name (a DNS-1123 label, unique in your tenant, shared by
                replicas); default: the function's name with ``_`` as ``-``.
            namespaces: one name, a list of names, or a label selector of namespaces;
                default all (or the manager's ``WATCH_NAMESPACE``).
            labels: only objects matching this label selector (a dict means matchLabels).
            predicate: only events passing this filter, evaluated by the manager.
            owns: child kinds whose changes wake their owner; cached and readable in full
                unless ``Owns(kind, metadata_only=True)``.
            watches: other kinds mapped to primaries by a label, annotation or field path.
            max_concurrent: handlers running at once in this process (default 1).
            max_in_flight: this replica's credit; default ``max_concurrent``.
            controller_wide_limit: reconciles at once across all replicas.
            deadline: how long a handler may take (manager default 60 s); it is cancelled
                shortly before (5 % of the time, at most 0.5 s).
            resync: how often every object is reconciled anyway (manager default 10 h; 0: off).
            backoff: ``(base, max)`` of the per-key retry backoff (manager default 5 ms, 1000 s).
            include_object: send the object with each request; default: whether the handler
                takes an argument that needs it.
            revision: ``Register.revision`` of this definition, for rolling upgrades (see the
                SDK's README); default ``CTRLHUB_REVISION``, else 0.
        """

        def decorate(fn: F) -> F:
            self.add(
                Controller(
                    name or _default_name(fn), kind, fn, mode="reconcile", namespaces=namespaces, labels=labels,
                    predicate=predicate, owns=owns, watches=watches, max_concurrent=max_concurrent,
                    max_in_flight=max_in_flight, controller_wide_limit=controller_wide_limit, deadline=deadline,
                    resync=resync, backoff=backoff, include_object=include_object, revision=revision,
                )
            )
            return fn

        return decorate

    def on_event(
        self,
        kind: KindLike,
        *,
        name: str | None = None,
        namespaces: str | Sequence[str] | SelectorLike | None = None,
        labels: SelectorLike | None = None,
        predicate: Predicate | None = None,
        max_concurrent: int = 1,
        max_in_flight: int | None = None,
        deadline: float | timedelta | None = None,
        resync: float | timedelta | None = None,
        revision: int | None = None,
    ) -> Callable[[F], F]:
        """Declares the decorated function as the event handler of ``kind`` (MODE_EVENTS): it
        sees every change (``type``: ADDED, MODIFIED, DELETED, SYNC), in order per key and at
        least once. Returning acknowledges the event; raising leaves it unacknowledged, so the
        manager sends it again after its deadline. It takes, by name, ``event``, ``type``,
        ``obj``/``body``, ``key``, ``name``, ``namespace``, ``sequence``, ``attempt``, ``spec``,
        ``status``, ``meta``, ``labels``, ``annotations``, ``reader``, ``logger``,
        ``cancelled``, ``deadline``, or ``**kwargs``. Other parameters as for ``reconcile``."""

        def decorate(fn: F) -> F:
            self.add(
                Controller(
                    name or _default_name(fn), kind, fn, mode="events", namespaces=namespaces, labels=labels,
                    predicate=predicate, max_concurrent=max_concurrent, max_in_flight=max_in_flight,
                    deadline=deadline, resync=resync, include_object=True, revision=revision,
                )
            )
            return fn

        return decorate

    @property
    def ready(self) -> bool:
        """Whether every controller takes work (``Controller.ready``): for a readiness probe."""
        return bool(self.controllers) and all(c.ready for c in self.controllers)

    async def serve(self, config: Config | None = None, stop: asyncio.Event | None = None) -> None:
        """Runs every controller until ``stop`` is set (each drains: in-flight handlers finish
        and answer, within ``Config.shutdown_grace``) and returns; raises ``FatalError`` when the
        manager refuses one for good, after draining the others."""
        if not self.controllers:
            raise ValueError("no controllers declared: decorate a handler with @reconcile or @on_event")
        config = Config.from_env() if config is None else config
        stop = asyncio.Event() if stop is None else stop
        tasks = [asyncio.create_task(c.serve(config, stop), name=f"ctrlhub-{c.name}") for c in self.controllers]
        fatal: BaseException | None = None
        try:
            for done in asyncio.as_completed(tasks):
                try:
                    await done
                except FatalError as err:
                    fatal = fatal or err
                    stop.set()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if fatal is not None:
            raise fatal

    def run(self, config: Config | None = None, *, log_level: int | str | None = logging.INFO,
            log_format: str = "text") -> None:
        """Runs the controllers as the process's main loop: SIGTERM or SIGINT drains and
        returns once every handler has returned (at most ``Config.shutdown_grace``, 25 s by
        default). Exits the process with status 1 and a one-line reason on a ``FatalError``, a
        ``ConfigError`` (e.g. a bad ``CTRLHUB_ADDR``), or when a handler would not return after
        the grace; with status 70 when a handler outlives the hold of its session (see
        ``Registration.hold``). Configures logging to stderr at
        ``log_level`` unless the root logger already has handlers (None: leave it alone);
        ``log_format="json"`` writes one JSON object per line (see ``JsonFormatter``)."""
        if log_format not in ("text", "json"):
            raise ValueError(f"log_format must be 'text' or 'json', not {log_format!r}")
        if log_level is not None and not logging.getLogger().handlers:
            logging.basicConfig(stream=sys.stderr, level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            if log_format == "json":
                for handler in logging.getLogger().handlers:
                    handler.setFormatter(JsonFormatter())
        try:
            asyncio.run(self._main(config))
        except (FatalError, ConfigError) as err:
            log.error("%s", err)
            raise SystemExit(1) from None
        if any(c.unfinished for c in self.controllers):
            raise SystemExit(1)  # the reason was logged; the daemon threads end with the process

    async def _main(self, config: Config | None) -> None:
        config = Config.from_env() if config is None else config
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.serve(config, stop)


default = Operator()
"""The operator behind ``ctrlhub.reconcile``, ``ctrlhub.on_event`` and ``ctrlhub.run``."""
reconcile = default.reconcile
on_event = default.on_event
run = default.run
serve = default.serve
