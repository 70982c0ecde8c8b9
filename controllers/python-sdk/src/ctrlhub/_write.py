"""Writes with the controller's own Kubernetes client: server-side apply, status patches,
finalizer patches and Events, on plain Kubernetes JSON (dicts), for built-ins and custom
resources alike.

The client is the official ``kubernetes`` package's ``ApiClient`` (the one most Python
operators already use; its ``ApiException`` is what ``is_not_found`` / ``is_conflict`` also
understand), with the controller's credentials: ``KUBECONFIG``, else in a pod its
ServiceAccount, else ``~/.kube/config`` (controller-runtime's order), or the ``ApiClient`` you
give ``Operator(api_client=...)``. ctrlhub serves reads; writes never go through the manager.
Calls block, so the SDK makes them on the handler's own thread (sync handlers) or on a worker
thread (async handlers), never on the event loop.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

__all__ = [
    "AdoptError",
    "Kube",
    "SharedClient",
    "WriteError",
    "adopt",
    "default_api_client",
    "is_conflict",
    "is_not_found",
]

Obj = dict[str, Any]

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON = "application/json"


class WriteError(Exception):
    """A write to the API server failed: ``status`` is its HTTP status (404 Not Found, 409
    Conflict, 422 Invalid, ...; None when no answer came: no credentials, no connection) and
    ``reason`` the API's reason (``NotFound``, ``Conflict``, ``Invalid``, ...)."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class AdoptError(WriteError):
    """``adopt`` refused an ownership Kubernetes does not allow: an owner in another namespace
    than the child, or a namespaced owner of a cluster-scoped child (the garbage collector
    would delete such a child at once), or an owner without apiVersion, kind, name or uid."""


def _status(err: BaseException) -> int | None:
    if isinstance(err, WriteError):
        return err.status
    root = type(err).__module__.split(".", 1)[0]
    status = getattr(err, "status", None)
    if root in ("kubernetes", "kubernetes_asyncio") and isinstance(status, int):
        return status
    code = getattr(getattr(err, "response", None), "status_code", None)  # httpx, requests
    if isinstance(code, int):
        return code
    return None


def is_not_found(err: BaseException) -> bool:
    """Whether ``err`` is the API server's 404 Not Found: a ``WriteError`` of the SDK's helpers,
    the ``kubernetes`` client's ``ApiException`` (or ``kubernetes_asyncio``'s), or an HTTP
    error carrying a response with that status."""
    return _status(err) == 404


def is_conflict(err: BaseException) -> bool:
    """Whether ``err`` is the API server's 409 Conflict (a stale ``resourceVersion``, or an
    object that already exists); the same errors as ``is_not_found``."""
    return _status(err) == 409


# ---- scope: namespaced or cluster-scoped -------------------------------------------------------

# Built-in kinds that are cluster-scoped, by (group, kind), so that ``adopt`` knows them before
# any discovery; custom resources are learnt from discovery (``Kube.resource``).
_CLUSTER_SCOPED = {
    ("", "Namespace"), ("", "Node"), ("", "PersistentVolume"), ("", "ComponentStatus"),
    ("rbac.authorization.k8s.io", "ClusterRole"), ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"), ("apiregistration.k8s.io", "APIService"),
    ("storage.k8s.io", "StorageClass"), ("storage.k8s.io", "CSIDriver"), ("storage.k8s.io", "CSINode"),
    ("storage.k8s.io", "VolumeAttachment"), ("scheduling.k8s.io", "PriorityClass"),
    ("networking.k8s.io", "IngressClass"), ("node.k8s.io", "RuntimeClass"),
    ("certificates.k8s.io", "CertificateSigningRequest"),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"), ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
}
_learnt_scopes: dict[tuple[str, str], bool] = {}  # (group, kind) -> namespaced, from discovery


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def namespaced(api_version: str, kind: str) -> bool | None:
    """Whether objects of this kind live in namespaces: True, False, or None when unknown (a
    custom resource the process has not discovered yet)."""
    group, _ = _group_version(api_version)
    if (group, kind) in _learnt_scopes:
        return _learnt_scopes[(group, kind)]
    if (group, kind) in _CLUSTER_SCOPED:
        return False
    if group == "" or "." not in group or group.endswith(".k8s.io"):
        return True  # the other built-ins are namespaced
    return None


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def adopt(child: Obj, owner: Mapping[str, Any]) -> Obj:
    """Makes ``owner`` the controller of ``child`` (kopf's ``adopt``): sets, in place, an owner
    reference with ``controller: true`` and ``blockOwnerDeletion: true`` (replacing one to the
    same owner and any other controller reference), and the owner's namespace on a child that
    has none; returns ``child``. Raises ``AdoptError`` for an owner without apiVersion, kind,
    name or uid, an owner in another namespace than the child, or a namespaced owner of a
    cluster-scoped child. A custom resource's scope is known once the process has discovered
    its kind (any write of it does); until then a child without a namespace is taken to be
    namespaced."""
    meta = _meta(owner)
    ref = {"apiVersion": owner.get("apiVersion"), "kind": owner.get("kind"), "name": meta.get("name"), "uid": meta.get("uid")}
    missing = [k for k, v in ref.items() if not isinstance(v, str) or not v]
    if missing:
        raise AdoptError(f"cannot adopt {_describe(child)}: the owner has no {', '.join(missing)} (pass the owner as read from the API)")
    ref.update(controller=True, blockOwnerDeletion=True)
    owner_ns = meta.get("namespace") or ""
    child_meta = child.setdefault("metadata", {})
    child_ns = child_meta.get("namespace") or ""
    if owner_ns:
        scoped = namespaced(str(child.get("apiVersion") or ""), str(child.get("kind") or ""))
        if scoped is False:
            raise AdoptError(f"cannot adopt {_describe(child)}: it is cluster-scoped and its owner "
                             f"{ref['kind']} {owner_ns}/{ref['name']} is namespaced; Kubernetes deletes such a child at once")
        if child_ns and child_ns != owner_ns:
            raise AdoptError(f"cannot adopt {_describe(child)}: its owner {ref['kind']} {owner_ns}/{ref['name']} is in another "
                             "namespace; owner references never cross namespaces")
        child_meta["namespace"] = owner_ns
    refs = [r for r in child_meta.get("ownerReferences") or [] if isinstance(r, dict)]
    child_meta["ownerReferences"] = [r for r in refs if r.get("uid") != ref["uid"] and not r.get("controller")] + [ref]
    return child


def _describe(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{obj.get('kind') or 'an object'} {where}{meta.get('name') or '(no name)'}"


# ---- the client ----------------------------------------------------------------------------------


def default_api_client() -> Any:
    """A ``kubernetes.client.ApiClient`` with the controller's credentials, found as
    controller-runtime finds them: ``KUBECONFIG``, else the pod's ServiceAccount, else
    ``~/.kube/config``. Raises ``WriteError`` when there are none."""
    try:
        from kubernetes import client, config
    except ImportError as err:  # pragma: no cover - a dependency of the package
        raise WriteError(f"the kubernetes package is not installed: {err}") from err
    try:
        if os.environ.get("KUBECONFIG"):
            return config.new_client_from_config()  # type: ignore[no-untyped-call]
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        if not (Path.home() / ".kube" / "config").is_file():
            raise WriteError("no Kubernetes credentials for the controller's writes: set KUBECONFIG, run in a pod with a "
                             "ServiceAccount, or give Operator(api_client=...)")
        return config.new_client_from_config()  # type: ignore[no-untyped-call]
    except config.ConfigException as err:
        raise WriteError(f"cannot load the Kubernetes credentials for the controller's writes: {err}") from err


class SharedClient:
    """One ``ApiClient`` for every controller of a process: the one given, or
    ``factory()`` made on first use."""

    def __init__(self, api_client: Any = None, factory: Callable[[], Any] = default_api_client) -> None:
        self._client = api_client
        self._factory = factory
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The client (made now if need be; raises ``WriteError`` without credentials)."""
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client


class Kube:
    """The blocking writes of one controller (its field manager), on a shared ``ApiClient``
    made on first use. Thread-safe."""

    def __init__(self, field_manager: str, api_client: Any = None,
                 factory: Callable[[], Any] = default_api_client) -> None:
        self.field_manager = field_manager
        self._client = api_client
        self._factory = factory
        self._lock = threading.Lock()
        self._resources: dict[tuple[str, str], tuple[float, dict[str, tuple[str, bool]]]] = {}

    @property
    def api_client(self) -> Any:
        """The ``kubernetes.client.ApiClient`` the writes use (made now if need be)."""
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def warm(self) -> None:
        """Makes the client now (on a worker thread, so that no handler pays for importing the
        ``kubernetes`` package and reading the credentials on the event loop); without
        credentials nothing happens until a write needs them."""
        try:
            _ = self.api_client
        except WriteError as err:
            logging.getLogger("ctrlhub").debug("no Kubernetes client yet: %s", err)

    # ---- raw requests

    def request(self, method: str, path: str, body: Any = None, content_type: str = JSON,
                query: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
        """One API call; the decoded JSON answer. Raises ``WriteError`` (with the API's status
        and reason) on failure."""
        api = self.api_client
        from kubernetes.client.exceptions import ApiException

        if query:
            path = f"{path}?{urlencode(query)}"
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            method, url, headers, body, _ = api.param_serialize(method=method, resource_path=path, header_params=headers,
                                                               body=body, auth_settings=["BearerToken"])
            resp = api.call_api(method, url, header_params=headers, body=body,
                                _request_timeout=None if timeout is None else max(timeout, 0.5))
            data = resp.read()
        except ApiException as err:
            raise _api_error(method, path, err.status, err.reason, err.body) from err
        except Exception as err:  # urllib3's connection errors and the like
            raise WriteError(f"{method} {path}: {type(err).__name__}: {err}") from err
        if not 200 <= resp.status <= 299:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            raise _api_error(method, path, resp.status, resp.reason, text, ApiException(http_resp=resp, body=text))
        try:
            return json.loads(data) if data else None
        except ValueError as err:
            raise WriteError(f"{method} {path}: the API server answered with something that is not JSON: {err}") from err

    # ---- discovery

    def resource(self, api_version: str, kind: str, timeout: float | None = None) -> tuple[str, bool]:
        """``(plural, namespaced)`` of a kind, from discovery (cached; looked up again when a
        kind is missing, at most every 10 s per group-version)."""
        group, version = _group_version(api_version)
        if not version or not kind:
            raise WriteError(f"an object needs apiVersion and kind to be written (got {api_version!r}, {kind!r})")
        key = (group, version)
        cached = self._resources.get(key)
        if cached is None or (kind not in cached[1] and time.monotonic() - cached[0] > 10):
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            answer = self.request("GET", path, timeout=timeout) or {}
            kinds: dict[str, tuple[str, bool]] = {}
            for r in answer.get("resources") or []:
                if isinstance(r, dict) and "/" not in str(r.get("name", "")) and r.get("kind"):
                    kinds[str(r["kind"])] = (str(r["name"]), bool(r.get("namespaced")))
                    _learnt_scopes[(group, str(r["kind"]))] = bool(r.get("namespaced"))
            cached = (time.monotonic(), kinds)
            self._resources[key] = cached
        found = cached[1].get(kind)
        if found is None:
            raise WriteError(f"the API server serves no kind {kind} in {api_version}", 404, "NotFound")
        return found

    def path(self, obj: Mapping[str, Any], subresource: str = "", timeout: float | None = None) -> str:
        """The API path of ``obj`` (which names its apiVersion, kind and name)."""
        api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
        meta = _meta(obj)
        name, ns = meta.get("name"), meta.get("namespace") or ""
        if not isinstance(name, str) or not name:
            raise WriteError(f"{_describe(obj)}: metadata.name is required to write it")
        plural, scoped = self.resource(api_version, kind, timeout)
        if scoped and not ns:
            raise WriteError(f"{_describe(obj)}: {kind} is namespaced; set metadata.namespace (adopt() sets the owner's)")
        if not scoped and ns:
            raise WriteError(f"{_describe(obj)}: {kind} is cluster-scoped; it has no namespace (nor a namespaced owner)")
        group, version = _group_version(api_version)
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        where = f"/namespaces/{quote(ns, safe='')}" if scoped else ""
        return f"{base}{where}/{plural}/{quote(name, safe='')}" + (f"/{subresource}" if subresource else "")

    # ---- writes

    def apply(self, obj: Mapping[str, Any], timeout: float | None = None) -> Obj:
        """Server-side apply of ``obj`` (a full object), as field manager ``field_manager``,
        forcing conflicts; the object as stored."""
        body = dict(obj)
        meta = dict(_meta(obj))
        meta.pop("managedFields", None)  # the API server refuses an apply that carries them
        body["metadata"] = meta
        path = self.path(body, timeout=timeout)
        return self.request("PATCH", path, body, APPLY, {"fieldManager": self.field_manager, "force": "true"},  # type: ignore[no-any-return]
                            timeout=timeout)

    def patch_status(self, obj: Mapping[str, Any], status: Mapping[str, Any], timeout: float | None = None) -> Obj:
        """A JSON merge patch of ``obj``'s status subresource; the object as stored."""
        return self.request("PATCH", self.path(obj, "status", timeout), {"status": status}, MERGE,  # type: ignore[no-any-return]
                            timeout=timeout)

    def merge_patch(self, obj: Mapping[str, Any], patch: Mapping[str, Any], timeout: float | None = None) -> Obj:
        """A JSON merge patch of ``obj``; the object as stored."""
        return self.request("PATCH", self.path(obj, timeout=timeout), patch, MERGE, timeout=timeout)  # type: ignore[no-any-return]


def _api_error(method: str, path: str, status: int | None, reason: Any, body: Any, cause: BaseException | None = None) -> WriteError:
    message, api_reason = str(reason or ""), ""
    try:
        parsed = json.loads(body) if isinstance(body, (str, bytes)) and body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        message = str(parsed.get("message") or message)
        api_reason = str(parsed.get("reason") or "")
    err = WriteError(f"{method} {path}: {status} {api_reason or reason}: {message}", status, api_reason)
    if cause is not None:
        err.__cause__ = cause
    return err
