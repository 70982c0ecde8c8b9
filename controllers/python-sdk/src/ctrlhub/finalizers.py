"""Finalizers on plain Kubernetes JSON, for any Kubernetes client.

The SDK does not write to the API server itself (the manager is not a write proxy, and
controllers use their own client and credentials): the helpers build JSON merge patches
guarded by ``metadata.resourceVersion`` (the API server answers 409 Conflict if the object
changed since it was read), and ``finalize`` takes the function that sends one.

    async def patch(body):
        return await api.patch_namespaced_config_map(name, namespace, body)

    return await finalize(obj, "example.com/cleanup", patch, apply=ensure_children, cleanup=delete_external)
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Union

from ._types import Done, Result

Obj = dict[str, Any]
Step = Callable[[Obj], Union[Result, Awaitable[Result]]]
Patch = Callable[[Obj], Union[Obj, None, Awaitable[Union[Obj, None]]]]


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def has_finalizer(obj: Obj, name: str) -> bool:
    """Whether ``obj`` carries finalizer ``name``."""
    return name in (_meta(obj).get("finalizers") or [])


def is_deleting(obj: Obj) -> bool:
    """Whether ``obj`` has a ``deletionTimestamp`` (deletion waits for its finalizers)."""
    return bool(_meta(obj).get("deletionTimestamp"))


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


async def _call(fn: Callable[[Obj], Any], arg: Obj) -> Any:
    value = fn(arg)
    return await value if inspect.isawaitable(value) else value


async def finalize(obj: Obj, name: str, patch: Patch, *, apply: Step, cleanup: Step) -> Result:
    """Runs a reconcile under finalizer ``name`` (like kube-rs' ``finalizer``):

    - live object without the finalizer: add it (``patch``), then ``apply`` the stored object;
    - live object with it: ``apply``;
    - deleting object with it: ``cleanup``, then remove the finalizer; returns cleanup's result;
    - deleting object without it: nothing to do.

    ``patch(body)`` sends a JSON merge patch of the object and returns the stored object (or
    None); ``apply`` and ``cleanup`` take the object and return a result like a handler, sync
    or async. A conflict while patching is the client's exception, which the SDK retries like
    any other error, so ``cleanup`` must be idempotent."""
    deleting = is_deleting(obj)
    present = has_finalizer(obj, name)
    if not deleting:
        if not present:
            body = add_patch(obj, name)
            assert body is not None
            stored = await _call(patch, body)
            obj = stored if isinstance(stored, dict) else obj
        return await _call(apply, obj)  # type: ignore[no-any-return]
    if not present:
        return Done()
    result = await _call(cleanup, obj)
    body = remove_patch(obj, name)
    assert body is not None
    await _call(patch, body)
    return result  # type: ignore[no-any-return]
