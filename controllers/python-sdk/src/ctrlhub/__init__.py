"""ctrlhub: write Kubernetes controllers in Python that run on a ctrlhub manager.

The manager owns the caches, leader election, namespace scoping, predicates and the work
queue; this package registers your handlers over gRPC, runs them (async, or sync in a thread)
with at most ``max_concurrent`` at once, answers each request with the handler's result,
keeps attempts of a key from overlapping (heartbeats, a handler cancelled at its deadline and
answered once it has returned, the process stopped before the manager may move its keys),
reconnects with backoff (honouring the manager's leader answers), waits out a newer
definition during a rollout, re-reads the token file on every connect, drains on SIGTERM, and
continues the manager's trace.

    import ctrlhub

    @ctrlhub.reconcile("v1/ConfigMap", labels={"example.com/stamp": "yes"})
    async def stamp(key: ctrlhub.Key, obj: dict | None) -> ctrlhub.Result:
        if obj is None:
            return None  # gone
        ...
        return ctrlhub.RequeueAfter(300)

    ctrlhub.run()  # CTRLHUB_ADDR, CTRLHUB_TOKEN or CTRLHUB_TOKEN_FILE, CTRLHUB_TLS_*, CTRLHUB_LOG

Writes go through the controller's own Kubernetes client: a handler's ``apply``,
``patch_status``, ``adopt``, ``finalizers`` and ``events`` (see ``Request``), and
``is_not_found`` / ``is_conflict`` for any client's errors. Helpers: ``ctrlhub.finalizers``,
``ctrlhub.conditions`` (``metav1.Condition`` with Kubernetes' transition rules) and
``ctrlhub.traces`` (OpenTelemetry). Logs: ``CTRLHUB_LOG`` and ``CTRLHUB_LOG_FORMAT``; health
probes: ``CTRLHUB_HEALTH_ADDR``. The generated wire types are in ``ctrlhub.v1``.
"""

from importlib.metadata import PackageNotFoundError, version

from . import conditions, finalizers, traces
from ._config import DEFAULT_ADDR, DEFAULT_TOKEN, TLS, Config, ConfigError
from ._controller import Controller
from ._definition import Definition, Options
from ._events import EventRecorder
from ._logs import TRACE, JsonFormatter, TextFormatter, configure_logging
from ._operator import Operator, on_event, reconcile, run, serve
from ._reader import CachedObject, MetadataOnlyError, ObjectMetadata, Reader, ReadError, SyncReader
from ._request import Event, Request, SyncEvent, SyncRequest
from ._types import (
    Done,
    EventType,
    FatalError,
    Form,
    Key,
    Kind,
    Owns,
    PermanentError,
    Predicate,
    Reason,
    Registration,
    RequeueAfter,
    Requirement,
    Result,
    Selector,
    TemporaryError,
    Watch,
)
from ._write import AdoptError, Kube, WriteError, adopt, is_conflict, is_not_found
from .finalizers import Finalizers, SyncFinalizers

try:
    __version__ = version("ctrlhub-sdk")
except PackageNotFoundError:  # pragma: no cover - run from a source tree
    __version__ = "0.0.0"

__all__ = [
    "DEFAULT_ADDR",
    "DEFAULT_TOKEN",
    "TLS",
    "TRACE",
    "AdoptError",
    "CachedObject",
    "Config",
    "ConfigError",
    "Controller",
    "Definition",
    "Done",
    "Event",
    "EventRecorder",
    "EventType",
    "FatalError",
    "Finalizers",
    "Form",
    "JsonFormatter",
    "Key",
    "Kind",
    "Kube",
    "MetadataOnlyError",
    "ObjectMetadata",
    "Operator",
    "Options",
    "Owns",
    "PermanentError",
    "Predicate",
    "ReadError",
    "Reader",
    "Reason",
    "Registration",
    "Request",
    "RequeueAfter",
    "Requirement",
    "Result",
    "Selector",
    "SyncEvent",
    "SyncFinalizers",
    "SyncReader",
    "SyncRequest",
    "TemporaryError",
    "TextFormatter",
    "Watch",
    "WriteError",
    "__version__",
    "adopt",
    "conditions",
    "configure_logging",
    "finalizers",
    "is_conflict",
    "is_not_found",
    "on_event",
    "reconcile",
    "run",
    "serve",
    "traces",
]
