"""Cached reads (Get/List) through the manager's shared caches."""

from __future__ import annotations

import asyncio
import builtins
import json
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from ._config import Config
from ._types import Form, Kind, KindLike, Selector, SelectorLike
from .v1 import controller_pb2_grpc as pb_grpc
from .v1 import read_pb2

__all__ = ["CachedObject", "MetadataOnlyError", "ObjectMetadata", "ReadError", "Reader", "SyncReader"]

T = TypeVar("T")


class ReadError(Exception):
    """A cached read failed: the manager refused it (``code`` says why, e.g.
    ``FAILED_PRECONDITION`` for a type the session did not register or an ended session,
    ``PERMISSION_DENIED``) or it could not be made."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class MetadataOnlyError(ReadError):
    """``get``/``list`` of a kind the session reads as metadata only (every ``owns``/``watches``
    entry of it set ``metadata_only=True``): read it with ``get_metadata``/``list_metadata``,
    or drop ``metadata_only`` to have it cached, and read, in full."""


def _metadata_only(kind: KindLike, what: str) -> MetadataOnlyError:
    return MetadataOnlyError(
        f"{what}: {kind} is readable as metadata only, because every owns/watches entry of it sets "
        "metadata_only=True; read it with reader.get_metadata()/list_metadata(), or drop metadata_only "
        "to read it in full",
        "METADATA_ONLY",
    )


@dataclass(frozen=True)
class CachedObject:
    """One object from the cache."""

    object: dict[str, Any]
    """The object as Kubernetes JSON (a PartialObjectMetadata when ``metadata_only``)."""
    resource_version: str
    """``metadata.resourceVersion``."""
    metadata_only: bool
    """Whether the manager caches the type metadata-only."""


@dataclass(frozen=True)
class ObjectMetadata:
    """The metadata of a cached object: what ``get_metadata``/``list_metadata`` return, for a
    kind read in full or as metadata only (``meta.k8s.io/v1`` PartialObjectMetadata)."""

    api_version: str
    """``apiVersion`` of the object (``meta.k8s.io/v1`` for a PartialObjectMetadata)."""
    kind: str
    """``kind`` of the object (``PartialObjectMetadata`` for one)."""
    metadata: dict[str, Any]
    """``metadata`` as Kubernetes JSON."""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectMetadata:
        """The metadata part of a Kubernetes object or PartialObjectMetadata."""
        meta = obj.get("metadata")
        return cls(str(obj.get("apiVersion") or ""), str(obj.get("kind") or ""), dict(meta) if isinstance(meta, dict) else {})

    def _text(self, field: str) -> str:
        value = self.metadata.get(field)
        return value if isinstance(value, str) else ""

    def _strings(self, field: str) -> dict[str, str]:
        value = self.metadata.get(field)
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return self._text("name")

    @property
    def namespace(self) -> str:
        """``metadata.namespace`` (``""`` when cluster-scoped)."""
        return self._text("namespace")

    @property
    def uid(self) -> str:
        """``metadata.uid``."""
        return self._text("uid")

    @property
    def resource_version(self) -> str:
        """``metadata.resourceVersion``."""
        return self._text("resourceVersion")

    @property
    def generation(self) -> int | None:
        """``metadata.generation``, when set."""
        value = self.metadata.get("generation")
        return value if isinstance(value, int) else None

    @property
    def labels(self) -> dict[str, str]:
        """``metadata.labels``."""
        return self._strings("labels")

    @property
    def annotations(self) -> dict[str, str]:
        """``metadata.annotations``."""
        return self._strings("annotations")

    @property
    def owner_references(self) -> list[dict[str, Any]]:
        """``metadata.ownerReferences``."""
        value = self.metadata.get("ownerReferences")
        return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []

    @property
    def finalizers(self) -> list[str]:
        """``metadata.finalizers``."""
        value = self.metadata.get("finalizers")
        return [str(f) for f in value] if isinstance(value, list) else []

    @property
    def deletion_timestamp(self) -> str | None:
        """``metadata.deletionTimestamp`` (RFC 3339), when the object is being deleted."""
        return self._text("deletionTimestamp") or None


class Reader:
    """Reads the manager's caches through one session (``Registered.session_id``): only the
    types that session registered (primary, owned, watched), within its namespaces and label
    selector. Reads are eventually consistent; read the API server to see your own writes.

    A handler receives the reader of the session that delivered its request (``reader``).
    Kinds are read in full (``get``, ``list``) unless every ``owns``/``watches`` entry of a
    kind asked for ``metadata_only``; ``readable`` says which, and ``get_metadata`` /
    ``list_metadata`` read the metadata of either form."""

    def __init__(self, stub: pb_grpc.ControllerManagerStub, config: Config, session_id: str,
                 readable: Mapping[Kind, Form] | None = None) -> None:
        self._stub = stub
        self._config = config
        self.session_id = session_id
        """The session this reader reads through."""
        self.readable: Mapping[Kind, Form] = dict(readable or {})
        """Every kind the session may read, with its form (``Registered.readable``)."""

    def form(self, kind: KindLike) -> Form | None:
        """``full`` or ``metadata`` for a kind the session reads; None for one it does not."""
        k = Kind.of(kind)
        return self.readable.get(Kind(k.group, k.version, k.kind))

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        try:
            return self._config.metadata()
        except ValueError as err:
            raise ReadError(str(err)) from err

    async def get_raw(self, kind: KindLike, namespace: str, name: str, *, timeout: float | None = None) -> CachedObject | None:
        """One object of a registered type, or None when it does not exist (or is out of the
        session's scope)."""
        req = read_pb2.GetRequest(session_id=self.session_id, resource=Kind.of(kind).to_proto(), namespace=namespace, name=name)
        try:
            resp = await self._stub.Get(req, metadata=self._metadata(), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise ReadError(f"Get {kind} {namespace}/{name}: {err.code().name}: {err.details()}", err.code().name) from err
        return CachedObject(_decode(resp.object_json), resp.resource_version, resp.metadata_only)

    async def get(self, kind: KindLike, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any] | None:
        """One full object, or None when it does not exist (or is out of the session's scope).
        Raises ``MetadataOnlyError`` for a kind read as metadata only."""
        if self.form(kind) == "metadata":
            raise _metadata_only(kind, f"get {namespace}/{name}")
        got = await self.get_raw(kind, namespace, name, timeout=timeout)
        if got is None:
            return None
        if got.metadata_only:
            raise _metadata_only(kind, f"get {namespace}/{name}")
        return got.object

    async def get_metadata(self, kind: KindLike, namespace: str, name: str, *, timeout: float | None = None) -> ObjectMetadata | None:
        """The metadata of one object of a kind read in either form, or None when it does not
        exist."""
        got = await self.get_raw(kind, namespace, name, timeout=timeout)
        return None if got is None else ObjectMetadata.of(got.object)

    async def list_raw(
        self, kind: KindLike, namespace: str | None = None, labels: SelectorLike | None = None, *, timeout: float | None = None
    ) -> builtins.list[CachedObject]:
        """Every object of a registered type in ``namespace`` (every namespace in scope when
        None), optionally filtered by a label selector; all pages, in key order."""
        items: list[CachedObject] = []
        token = ""
        resource = Kind.of(kind).to_proto()
        selector = Selector.of(labels).to_proto() if labels is not None else None
        while True:
            req = read_pb2.ListRequest(session_id=self.session_id, resource=resource, namespace=namespace or "", page_token=token)
            if selector is not None:
                req.label_selector.CopyFrom(selector)
            try:
                resp = await self._stub.List(req, metadata=self._metadata(), timeout=timeout)
            except grpc.aio.AioRpcError as err:
                raise ReadError(f"List {kind} in {namespace or 'all namespaces'}: {err.code().name}: {err.details()}", err.code().name) from err
            items.extend(CachedObject(_decode(i.object_json), i.resource_version, resp.metadata_only) for i in resp.items)
            token = resp.next_page_token
            if not token:
                return items

    async def list(
        self, kind: KindLike, namespace: str | None = None, labels: SelectorLike | None = None, *, timeout: float | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Full objects, like ``list_raw``. Raises ``MetadataOnlyError`` for a kind read as
        metadata only."""
        if self.form(kind) == "metadata":
            raise _metadata_only(kind, "list")
        items = await self.list_raw(kind, namespace, labels, timeout=timeout)
        if any(i.metadata_only for i in items):
            raise _metadata_only(kind, "list")
        return [i.object for i in items]

    async def list_metadata(
        self, kind: KindLike, namespace: str | None = None, labels: SelectorLike | None = None, *, timeout: float | None = None
    ) -> builtins.list[ObjectMetadata]:
        """The metadata of every object, like ``list_raw``, for a kind read in either form."""
        return [ObjectMetadata.of(i.object) for i in await self.list_raw(kind, namespace, labels, timeout=timeout)]


class SyncReader:
    """The blocking face of a ``Reader``, for sync handlers (which run in a thread): each call
    runs on the controller's event loop and waits at most until the request's deadline."""

    def __init__(self, reader: Reader, loop: asyncio.AbstractEventLoop, deadline: float | None = None) -> None:
        self._reader = reader
        self._loop = loop
        self._deadline = deadline  # time.monotonic()
        self.session_id = reader.session_id
        self.readable = reader.readable
        self.form = reader.form

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        timeout = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise ReadError("the request's deadline passed during a cached read", "DEADLINE_EXCEEDED") from None

    def get_raw(self, kind: KindLike, namespace: str, name: str) -> CachedObject | None:
        """See ``Reader.get_raw``."""
        return self._wait(self._reader.get_raw(kind, namespace, name))

    def get(self, kind: KindLike, namespace: str, name: str) -> dict[str, Any] | None:
        """See ``Reader.get``."""
        return self._wait(self._reader.get(kind, namespace, name))

    def get_metadata(self, kind: KindLike, namespace: str, name: str) -> ObjectMetadata | None:
        """See ``Reader.get_metadata``."""
        return self._wait(self._reader.get_metadata(kind, namespace, name))

    def list_metadata(self, kind: KindLike, namespace: str | None = None, labels: SelectorLike | None = None) -> builtins.list[ObjectMetadata]:
        """See ``Reader.list_metadata``."""
        return self._wait(self._reader.list_metadata(kind, namespace, labels))

    def list_raw(self, kind: KindLike, namespace: str | None = None, labels: SelectorLike | None = None) -> builtins.list[CachedObject]:
        """See ``Reader.list_raw``."""
        return self._wait(self._reader.list_raw(kind, namespace, labels))

    def list(self, kind: KindLike, namespace: str | None = None, labels: SelectorLike | None = None) -> builtins.list[dict[str, Any]]:
        """See ``Reader.list``."""
        return self._wait(self._reader.list(kind, namespace, labels))


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError as err:
        raise ReadError(f"the manager sent an object that is not JSON: {err}") from err
    if not isinstance(obj, dict):
        raise ReadError("the manager sent an object that is not a JSON object")
    return obj
