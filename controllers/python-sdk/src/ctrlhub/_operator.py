"""An operator: the controllers of one process, run together until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any, TypeVar, Unpack

from ._config import Config, ConfigError
from ._controller import Controller
from ._definition import Options, default_name
from ._health import HealthServer
from ._logs import configure_logging
from ._types import FatalError, KindLike
from ._write import Kube, SharedClient

__all__ = ["Operator", "default", "on_event", "reconcile", "run", "serve"]

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("ctrlhub")


class Operator:
    """The controllers of one process. Declare them with the decorators, then ``run()``.

    ``ctrlhub.reconcile``, ``ctrlhub.on_event`` and ``ctrlhub.run`` use a default operator, so
    a single-file controller needs no ``Operator`` of its own. ``api_client`` (a
    ``kubernetes.client.ApiClient``) is what the handlers' writes use; by default one is made
    on first use from the controller's credentials (``KUBECONFIG``, else in a pod its
    ServiceAccount, else ``~/.kube/config``)."""

    def __init__(self, api_client: Any = None) -> None:
        self.controllers: list[Controller] = []
        self.api_client = api_client
        """The ``kubernetes.client.ApiClient`` for the handlers' writes (None: made on first
        use)."""
        self.health: HealthServer | None = None
        """The health endpoint while ``serve`` runs with ``Config.health_addr``."""

    def add(self, controller: Controller) -> Controller:
        """Adds a controller made by hand."""
        if any(c.name == controller.name for c in self.controllers):
            raise ValueError(f"a controller named {controller.name!r} is already declared")
        self.controllers.append(controller)
        return controller

    def reconcile(self, kind: KindLike, *, name: str | None = None, **options: Unpack[Options]) -> Callable[[F], F]:
        """Declares the decorated function as the reconcile handler of ``kind``
        (``"v1/ConfigMap"``, ``"apps/v1/Deployment"`` or a ``Kind``); ``name`` is the
        controller's (default: the function's name with ``_`` as ``-``) and the other keywords
        are ``Options``' (each typed and documented there).

        The handler (``async def``, or plain ``def``, which runs in a thread of its own) takes,
        by name, any of: ``key``, ``name``, ``namespace``, ``obj`` (the object, None when it is
        gone), ``body`` (the same), ``tombstone``, ``spec``, ``status``, ``meta``, ``labels``,
        ``annotations``, ``attempt``, ``reasons``, ``reader`` (cached Get/List), ``logger``
        (its lines carry the key and request id), ``cancelled`` (a ``threading.Event`` set when
        it must stop), ``deadline``, ``apply``, ``patch_status``, ``adopt``, ``finalizers``,
        ``events``, and ``request`` (all of it: a ``Request``, or a ``SyncRequest`` in a sync
        handler), or ``**kwargs``. It returns None or ``Done()``, or ``RequeueAfter(seconds)``;
        it raises ``TemporaryError`` (retried with backoff, as is any other exception) or
        ``PermanentError`` (not retried until the object changes). A failure is posted as a
        Warning Event ``ReconcileFailed`` about the object.

        ``obj`` is None both when the object is gone and when the manager's cache does not hold
        it (NotFound); only a ``tombstone`` says the manager saw it deleted. Clean up external
        state under a finalizer (``finalizers``), not on a missing object.

        Attempts of a key never overlap: not across replicas (the manager), and not in this
        process either, even when a handler overruns its deadline. A handler is cancelled
        shortly before its deadline (an async one with ``asyncio.CancelledError``, a sync one
        through ``cancelled``) and its request is answered once it has returned; the key's
        next attempt starts only then."""

        def decorate(fn: F) -> F:
            self.add(Controller(name or default_name(fn), kind, fn, mode="reconcile", **options))
            return fn

        return decorate

    def on_event(self, kind: KindLike, *, name: str | None = None, **options: Unpack[Options]) -> Callable[[F], F]:
        """Declares the decorated function as the event handler of ``kind`` (MODE_EVENTS): it
        sees every change (``type``: ADDED, MODIFIED, DELETED, SYNC), in order per key and at
        least once. Returning acknowledges the event; raising leaves it unacknowledged, so the
        manager sends it again after its deadline. It takes, by name, ``event`` (an ``Event``,
        or a ``SyncEvent`` in a sync handler), ``type``, ``obj``/``body``, ``key``, ``name``,
        ``namespace``, ``sequence``, ``attempt``, ``spec``, ``status``, ``meta``, ``labels``,
        ``annotations``, ``reader``, ``logger``, ``cancelled``, ``deadline``, ``apply``,
        ``patch_status``, ``adopt``, ``finalizers``, ``events``, or ``**kwargs``. The keywords
        are ``Options``' but ``owns``, ``watches``, ``controller_wide_limit``, ``backoff`` and
        ``include_object``."""

        def decorate(fn: F) -> F:
            self.add(Controller(name or default_name(fn), kind, fn, mode="events", **options))
            return fn

        return decorate

    @property
    def ready(self) -> bool:
        """Whether every controller takes work (``Controller.ready``): ``/readyz``."""
        return bool(self.controllers) and all(c.ready for c in self.controllers)

    def not_ready_reason(self) -> str:
        """Why the process is not ready, on one line (``""`` when it is)."""
        reasons = [f"controller {c.name}: {c.not_ready_reason}" for c in self.controllers if not c.ready]
        return "; ".join(reasons) if self.controllers else "no controllers declared"

    async def serve(self, config: Config | None = None, stop: asyncio.Event | None = None) -> None:
        """Runs every controller until ``stop`` is set (each drains: in-flight handlers finish
        and answer, within ``Config.shutdown_grace``) and returns; raises ``FatalError`` when the
        manager refuses one for good, after draining the others. Serves ``/healthz`` and
        ``/readyz`` on ``Config.health_addr`` when set (``CTRLHUB_HEALTH_ADDR``)."""
        if not self.controllers:
            raise ValueError("no controllers declared: decorate a handler with @reconcile or @on_event")
        config = Config.from_env() if config is None else config
        stop = asyncio.Event() if stop is None else stop
        shared = SharedClient(self.api_client)
        health = HealthServer(config.health_addr, self.not_ready_reason, config.health_stuck_after) if config.health_addr else None
        self.health = health
        ticker = asyncio.create_task(health.ticker()) if health is not None else None
        tasks = [asyncio.create_task(c.serve(config, stop, Kube(c.name, factory=shared.get)), name=f"ctrlhub-{c.name}")
                 for c in self.controllers]
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
            if ticker is not None:
                ticker.cancel()
            if health is not None:
                health.close()
                self.health = None
        if fatal is not None:
            raise fatal

    def run(self, config: Config | None = None, *, log_level: int | str | None = None, log_format: str | None = None) -> None:
        """Runs the controllers as the process's main loop: SIGTERM or SIGINT drains and
        returns once every handler has returned (at most ``Config.shutdown_grace``, 25 s by
        default). Exits the process with status 1 and a one-line reason on a ``FatalError``, a
        ``ConfigError`` (e.g. a bad ``CTRLHUB_ADDR`` or ``CTRLHUB_LOG``), or when a handler
        would not return after the grace; with status 70 when a handler outlives the hold of
        its session (see ``Registration.hold``).

        Logs to stderr (unless the program configured logging itself) at ``log_level``, else
        ``CTRLHUB_LOG`` (``error``, ``warn``, ``info``, ``debug``, ``trace``; default
        ``info``), in ``log_format``, else ``CTRLHUB_LOG_FORMAT`` (``text`` or ``json``: one
        JSON object per line in the manager's shape, see ``JsonFormatter``)."""
        try:
            configure_logging(log_level, log_format)
            asyncio.run(self._main(config))
        except (FatalError, ConfigError) as err:
            if not logging.getLogger().handlers:
                configure_logging(logging.INFO, "text")
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
