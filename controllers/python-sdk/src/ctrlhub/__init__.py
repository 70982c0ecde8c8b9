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

    ctrlhub.run()  # CTRLHUB_ADDR, CTRLHUB_TOKEN or CTRLHUB_TOKEN_FILE, CTRLHUB_TLS_*

Helpers: ``ctrlhub.finalizers`` (add/remove a finalizer, the finalize flow),
``ctrlhub.conditions`` (``metav1.Condition`` with Kubernetes' transition rules) and
``ctrlhub.traces`` (OpenTelemetry). The generated wire types are in ``ctrlhub.v1``.
"""

from ._config import DEFAULT_ADDR, DEFAULT_TOKEN, TLS, Config, ConfigError
from ._controller import Controller
from ._operator import JsonFormatter, Operator, on_event, reconcile, run, serve
from ._reader import CachedObject, MetadataOnlyError, ObjectMetadata, Reader, ReadError, SyncReader
from ._request import Event, Request
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

__all__ = [
    "DEFAULT_ADDR",
    "DEFAULT_TOKEN",
    "TLS",
    "CachedObject",
    "Config",
    "ConfigError",
    "Controller",
    "Done",
    "Event",
    "EventType",
    "FatalError",
    "Form",
    "JsonFormatter",
    "Key",
    "Kind",
    "MetadataOnlyError",
    "ObjectMetadata",
    "Operator",
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
    "SyncReader",
    "TemporaryError",
    "Watch",
    "on_event",
    "reconcile",
    "run",
    "serve",
]
