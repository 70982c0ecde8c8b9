"""Finalizers: keep an object from going until your cleanup of external state has run.

A handler receives ``finalizers`` (also ``request.finalizers``), bound to the controller's
client: ``Finalizers`` in an async handler, ``SyncFinalizers`` in a sync one (same methods,
blocking). The usual reconcile::

    if finalizers.finalize(obj, "example.com/cleanup", delete_external) or finalizers.is_deleting(obj):
        return None                       # cleaned up (the object goes now), or not ours to clean
    finalizers.ensure(obj, "example.com/cleanup")
    ...                                   # create or repair what the object asks for

Both write JSON merge patches of ``metadata.finalizers`` guarded by ``metadata.resourceVersion``
(the API server answers 409 Conflict if the object changed since it was read; the handler
fails and is retried with the new object), and update ``obj``'s metadata in place from the
answer. ``cleanup`` may be sync or async, in either kind of handler: a sync one never runs on
the event loop (in an async handler it runs on a worker thread, and the handler counts as
stopped only once it has returned); it must be idempotent, since a conflict after it ran
retries the whole reconcile.

The pure helpers (``has_finalizer``, ``is_deleting``, ``step``, ``add_patch``, ``remove_patch``)
build the same patches for any other client, with the semantics every ctrlhub SDK shares
(``tests/conformance/helpers.json``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal

__all__ = [
    "Cleanup",
    "Finalizers",
    "Step",
    "SyncFinalizers",
    "add_patch",
    "finalizers_patch",
    "has_finalizer",
    "is_deleting",
    "remove_patch",
    "step",
]

Obj = dict[str, Any]
Cleanup = Callable[[Obj], Any]
"""``cleanup(obj)``: sync or async; its return value is ignored, an exception it raises fails
the reconcile (retried) and leaves the finalizer in place."""


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def has_finalizer(obj: Obj, name: str) -> bool:
    """Whether ``obj`` carries finalizer ``name``."""
    return name in (_meta(obj).get("finalizers") or [])


def is_deleting(obj: Obj) -> bool:
    """Whether ``obj`` has a ``deletionTimestamp`` (deletion waits for its finalizers)."""
    return bool(_meta(obj).get("deletionTimestamp"))


Step = Literal["add", "apply", "cleanup", "none"]
"""What the finalizer flow does with an object: ``add`` (live, without the finalizer: add it,
then reconcile), ``apply`` (live, with it: reconcile), ``cleanup`` (being deleted, with it:
clean up, then remove it), ``none`` (being deleted without it: nothing to do)."""


def step(obj: Obj, name: str) -> Step:
    """The ``Step`` for ``obj`` and finalizer ``name``: ``ensure`` patches only on ``add``,
    ``finalize`` cleans up only on ``cleanup``."""
    has = has_finalizer(obj, name)
    if is_deleting(obj):
        return "cleanup" if has else "none"
    return "apply" if has else "add"


def _ensure_patch(obj: Obj, name: str) -> Obj | None:
    return add_patch(obj, name) if step(obj, name) == "add" else None


def _finalize_patch(obj: Obj, name: str) -> Obj | None:
    return remove_patch(obj, name) if step(obj, name) == "cleanup" else None


def finalizers_patch(finalizers: list[str], resource_version: str | None) -> Obj:
    """The merge patch setting ``metadata.finalizers``, guarded by ``resource_version``."""
    meta: Obj = {"finalizers": list(finalizers)}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def add_patch(obj: Obj, name: str) -> Obj | None:
    """The patch adding ``name`` to ``obj``'s finalizers, or None if it is there."""
    if has_finalizer(obj, name):
        return None
    current = list(_meta(obj).get("finalizers") or [])
    return finalizers_patch([*current, name], _meta(obj).get("resourceVersion"))


def remove_patch(obj: Obj, name: str) -> Obj | None:
    """The patch removing ``name`` from ``obj``'s finalizers, or None if it is not there."""
    if not has_finalizer(obj, name):
        return None
    current = [f for f in _meta(obj).get("finalizers") or [] if f != name]
    return finalizers_patch(current, _meta(obj).get("resourceVersion"))


def _refresh(obj: Obj, stored: Any) -> None:
    """``obj``'s finalizers and resourceVersion as the API server stored them."""
    meta = obj.setdefault("metadata", {})
    new = _meta(stored) if isinstance(stored, dict) else {}
    for field in ("finalizers", "resourceVersion"):
        if field in new:
            meta[field] = new[field]
        elif field == "finalizers":
            meta.pop(field, None)


class Finalizers:
    """Finalizer steps for async handlers (``await``). ``patch(obj, body)`` sends a merge patch
    of ``obj`` and returns the stored object; ``blocking(fn, obj)`` runs a sync function off
    the event loop (the SDK passes both)."""

    def __init__(self, patch: Callable[[Obj, Obj], Awaitable[Obj]],
                 blocking: Callable[[Callable[[Obj], Any], Obj], Awaitable[Any]]) -> None:
        self._patch = patch
        self._blocking = blocking

    is_deleting = staticmethod(is_deleting)
    has_finalizer = staticmethod(has_finalizer)

    async def ensure(self, obj: Obj, name: str) -> bool:
        """Adds finalizer ``name`` to ``obj`` unless it is there (or ``obj`` is being deleted:
        Kubernetes takes no new finalizer then); returns whether it did."""
        body = _ensure_patch(obj, name)
        if body is None:
            return False
        _refresh(obj, await self._patch(obj, body))
        return True

    async def finalize(self, obj: Obj, name: str, cleanup: Cleanup) -> bool:
        """When ``obj`` is being deleted and holds finalizer ``name``: runs ``cleanup(obj)``
        (a sync one on a worker thread), then removes the finalizer; returns whether it did
        (False: not deleting, or not holding the finalizer)."""
        body = _finalize_patch(obj, name)
        if body is None:
            return False
        if inspect.iscoroutinefunction(cleanup):
            await cleanup(obj)
        else:
            value = await self._blocking(cleanup, obj)
            if inspect.isawaitable(value):
                await value
        _refresh(obj, await self._patch(obj, body))
        return True


class SyncFinalizers:
    """Finalizer steps for sync handlers (blocking, on the handler's thread). ``patch(obj,
    body)`` sends a merge patch and returns the stored object; ``run_async(coro)`` waits for a
    coroutine on the SDK's event loop (for an async ``cleanup``)."""

    def __init__(self, patch: Callable[[Obj, Obj], Obj], run_async: Callable[[Awaitable[Any]], Any]) -> None:
        self._patch = patch
        self._run_async = run_async

    is_deleting = staticmethod(is_deleting)
    has_finalizer = staticmethod(has_finalizer)

    def ensure(self, obj: Obj, name: str) -> bool:
        """See ``Finalizers.ensure``."""
        body = _ensure_patch(obj, name)
        if body is None:
            return False
        _refresh(obj, self._patch(obj, body))
        return True

    def finalize(self, obj: Obj, name: str, cleanup: Cleanup) -> bool:
        """See ``Finalizers.finalize``; a sync ``cleanup`` runs on this thread, an async one on
        the SDK's event loop."""
        body = _finalize_patch(obj, name)
        if body is None:
            return False
        value = cleanup(obj)
        if inspect.isawaitable(value):
            self._run_async(value)
        _refresh(obj, self._patch(obj, body))
        return True
