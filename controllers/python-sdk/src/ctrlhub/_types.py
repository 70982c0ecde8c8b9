"""The vocabulary of a controller definition and of a handler's answer."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, NamedTuple

from google.protobuf import duration_pb2

from .v1 import controller_pb2 as pb
from .v1 import registration_pb2, resource_pb2

__all__ = ["Done", "EventType", "FatalError", "Form", "Key", "Kind", "KindLike", "Owns", "PermanentError", "Predicate", "Reason",
           "Registration", "RequeueAfter", "Requirement", "Result", "Selector", "SelectorLike", "TemporaryError", "Watch",
           "duration", "names", "outcome", "seconds"]


def seconds(value: float | timedelta) -> float:
    """Seconds from a number of seconds or a ``timedelta``."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def duration(value: float | timedelta) -> duration_pb2.Duration:
    """A ``google.protobuf.Duration`` from seconds or a ``timedelta``."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds(value) * 1e9))
    return d


@dataclass(frozen=True)
class Kind:
    """A Kubernetes type: group (``""`` for core), version and kind; the manager looks up
    the plural unless given.

    Wherever a kind is expected a string works too: ``"v1/ConfigMap"`` or
    ``"apps/v1/Deployment"`` (group/version/kind, like an apiVersion followed by the kind).
    """

    group: str
    version: str
    kind: str
    plural: str = ""

    @classmethod
    def parse(cls, text: str) -> Kind:
        """``"v1/ConfigMap"`` or ``"apps/v1/Deployment"``."""
        parts = text.strip().split("/")
        if len(parts) == 2 and all(parts):
            return cls("", parts[0], parts[1])
        if len(parts) == 3 and parts[1] and parts[2]:
            return cls(parts[0], parts[1], parts[2])
        raise ValueError(f"invalid kind {text!r}: expected version/Kind or group/version/Kind, e.g. v1/ConfigMap or apps/v1/Deployment")

    @classmethod
    def of(cls, value: KindLike) -> Kind:
        """A ``Kind`` from a ``Kind`` or its string form."""
        return value if isinstance(value, Kind) else cls.parse(value)

    def to_proto(self) -> resource_pb2.ResourceType:
        return resource_pb2.ResourceType(group=self.group, version=self.version, kind=self.kind, plural=self.plural)

    @classmethod
    def from_proto(cls, msg: resource_pb2.ResourceType) -> Kind:
        """The kind a ``ResourceType`` names, without its plural (so it equals ``Kind.of``)."""
        return cls(msg.group, msg.version, msg.kind)

    def __str__(self) -> str:
        return f"{self.group}/{self.version}/{self.kind}" if self.group else f"{self.version}/{self.kind}"


KindLike = Kind | str


class Key(NamedTuple):
    """A primary object's key; ``str(key)`` is ``namespace/name`` (``name`` when
    cluster-scoped)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


# A selector requirement's operator by the name Kubernetes gives it.
_OPERATORS = {
    "In": resource_pb2.LabelSelectorRequirement.OPERATOR_IN,
    "NotIn": resource_pb2.LabelSelectorRequirement.OPERATOR_NOT_IN,
    "Exists": resource_pb2.LabelSelectorRequirement.OPERATOR_EXISTS,
    "DoesNotExist": resource_pb2.LabelSelectorRequirement.OPERATOR_DOES_NOT_EXIST,
}


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry: ``operator`` is ``In``, ``NotIn``, ``Exists`` or
    ``DoesNotExist``."""

    key: str
    operator: str
    values: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.operator not in _OPERATORS:
            raise ValueError(f"invalid label selector operator {self.operator!r}: one of {', '.join(_OPERATORS)}")

    def to_proto(self) -> resource_pb2.LabelSelectorRequirement:
        return resource_pb2.LabelSelectorRequirement(key=self.key, operator=_OPERATORS[self.operator], values=list(self.values))


@dataclass(frozen=True)
class Selector:
    """A Kubernetes label selector. A plain ``{"label": "value"}`` dict works wherever a
    selector is expected."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: Sequence[Requirement] = ()

    @classmethod
    def of(cls, value: SelectorLike) -> Selector:
        return value if isinstance(value, Selector) else cls(match_labels=dict(value))

    def to_proto(self) -> resource_pb2.LabelSelector:
        return resource_pb2.LabelSelector(
            match_labels=dict(self.match_labels),
            match_expressions=[r.to_proto() for r in self.match_expressions],
        )


SelectorLike = Selector | Mapping[str, str]


class Predicate:
    """An event filter the manager evaluates before an event may enqueue anything.
    Combine with ``|``, ``&`` and ``~``::

        Predicate.generation_changed() | Predicate.deleting()
    """

    __slots__ = ("_proto",)

    def __init__(self, proto: registration_pb2.Predicate) -> None:
        self._proto = proto

    @classmethod
    def generation_changed(cls) -> Predicate:
        """Updates where ``metadata.generation`` changed (creations, deletions, resyncs pass)."""
        return cls(registration_pb2.Predicate(generation_changed=registration_pb2.Predicate.GenerationChanged()))

    @classmethod
    def labels_changed(cls) -> Predicate:
        """Updates where ``metadata.labels`` changed."""
        return cls(registration_pb2.Predicate(labels_changed=registration_pb2.Predicate.LabelsChanged()))

    @classmethod
    def annotations_changed(cls) -> Predicate:
        """Updates where ``metadata.annotations`` changed."""
        return cls(registration_pb2.Predicate(annotations_changed=registration_pb2.Predicate.AnnotationsChanged()))

    @classmethod
    def resource_version_changed(cls) -> Predicate:
        """Updates where ``metadata.resourceVersion`` changed."""
        return cls(registration_pb2.Predicate(resource_version_changed=registration_pb2.Predicate.ResourceVersionChanged()))

    @classmethod
    def deleting(cls) -> Predicate:
        """Objects with ``metadata.deletionTimestamp`` set."""
        return cls(registration_pb2.Predicate(deleting=registration_pb2.Predicate.Deleting()))

    @classmethod
    def has_finalizer(cls, name: str) -> Predicate:
        """Objects whose finalizers contain ``name``."""
        return cls(registration_pb2.Predicate(has_finalizer=registration_pb2.Predicate.HasFinalizer(name=name)))

    @classmethod
    def labels(cls, selector: SelectorLike) -> Predicate:
        """Objects whose labels match ``selector``."""
        return cls(registration_pb2.Predicate(label_selector=Selector.of(selector).to_proto()))

    def __or__(self, other: Predicate) -> Predicate:
        return Predicate(registration_pb2.Predicate(any_of=registration_pb2.Predicate.AnyOf(predicates=[self._proto, other._proto])))

    def __and__(self, other: Predicate) -> Predicate:
        return Predicate(registration_pb2.Predicate(all_of=registration_pb2.Predicate.AllOf(predicates=[self._proto, other._proto])))

    def __invert__(self) -> Predicate:
        return Predicate(registration_pb2.Predicate(negate=self._proto))

    def to_proto(self) -> registration_pb2.Predicate:
        return self._proto

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Predicate) and self._proto == other._proto

    def __hash__(self) -> int:
        return hash(self._proto.SerializeToString(deterministic=True))

    def __repr__(self) -> str:
        return f"Predicate({self._proto})"


@dataclass(frozen=True)
class Owns:
    """Children of ``kind``: a change to one enqueues its owner. ``controller_only`` follows
    only the controller owner reference (``ownerReferences[].controller``).

    Children are cached, and readable through ``reader.get``/``list``, in full (spec and
    status). ``metadata_only=True`` caches only their metadata, a fraction of the memory; it
    takes effect when every ``owns``/``watches`` entry of the kind asks for it, and then the
    kind is read with ``reader.get_metadata``/``list_metadata`` (``reader.get`` raises
    ``MetadataOnlyError``)."""

    kind: KindLike
    controller_only: bool = True
    predicate: Predicate | None = None
    metadata_only: bool = False

    def to_proto(self) -> registration_pb2.OwnedResource:
        msg = registration_pb2.OwnedResource(resource=Kind.of(self.kind).to_proto(), controller_only=self.controller_only,
                                             metadata_only=self.metadata_only)
        if self.predicate is not None:
            msg.predicate.CopyFrom(self.predicate.to_proto())
        return msg


@dataclass(frozen=True)
class Watch:
    """Objects of ``kind`` that name the primary they concern, by exactly one of: a label whose
    value is the primary's name (same namespace), an annotation holding ``namespace/name`` or
    ``name``, or a dot-separated field path holding either (or a list of them).

    Watched objects are cached, and read, in full unless ``metadata_only=True`` (see ``Owns``;
    a ``field_path`` mapping always needs the full object)."""

    kind: KindLike
    label: str | None = None
    annotation: str | None = None
    field_path: str | None = None
    predicate: Predicate | None = None
    metadata_only: bool = False

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.label, self.annotation, self.field_path)) != 1:
            raise ValueError(f"Watch({self.kind}): give exactly one of label=, annotation= or field_path=")

    def to_proto(self) -> registration_pb2.WatchedResource:
        msg = registration_pb2.WatchedResource(resource=Kind.of(self.kind).to_proto(), metadata_only=self.metadata_only)
        if self.label is not None:
            msg.label_key = self.label
        elif self.annotation is not None:
            msg.annotation_key = self.annotation
        elif self.field_path is not None:
            msg.field_path = self.field_path
        if self.predicate is not None:
            msg.predicate.CopyFrom(self.predicate.to_proto())
        return msg


class Reason(enum.IntEnum):
    """Why a key was enqueued (informational: reconcile the current state whatever it says)."""

    UNSPECIFIED = 0
    CREATED = 1
    UPDATED = 2
    DELETED = 3
    OWNED_CHANGED = 4
    WATCHED_CHANGED = 5
    RESYNC = 6
    REQUEUE = 7
    RETRY = 8
    REDELIVERY = 9
    INITIAL_LIST = 10
    LEFT_SCOPE = 11

    @classmethod
    def of(cls, value: int) -> Reason | int:
        """The reason, or the bare number for one newer than this SDK."""
        try:
            return cls(value)
        except ValueError:
            return value


class EventType(enum.IntEnum):
    """What happened to an object (MODE_EVENTS)."""

    UNSPECIFIED = 0
    ADDED = 1
    MODIFIED = 2
    DELETED = 3
    SYNC = 4


# ---- what a handler answers -------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """Reconciled; nothing more to do until the key changes. Returning ``None`` means the same."""


@dataclass(frozen=True)
class RequeueAfter:
    """Reconciled; reconcile again no earlier than ``delay`` (seconds or a ``timedelta``),
    earlier only if the key changes."""

    delay: float | timedelta = 0.0


Result = Done | RequeueAfter | None
"""What a reconcile handler returns."""


class TemporaryError(Exception):
    """A transient failure: the key is retried with its backoff, or after ``delay`` seconds when
    given (whichever is later). Any other exception a handler raises counts as one too."""

    def __init__(self, message: str = "", delay: float | timedelta | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """A failure retrying cannot fix (an invalid spec, say): the key is not retried until it
    changes."""


Form = Literal["full", "metadata"]
"""How the manager caches a readable kind: ``full`` objects, or their ``metadata`` only."""


@dataclass(frozen=True)
class Registration:
    """What the manager answered a session's Register with (``Registered``)."""

    session_id: str
    """The session's id (``Registered.session_id``); it changes on every reconnect."""
    leader: str
    """The identity of the manager replica that leads."""
    revision: int
    """The ``Register.revision`` this replica sent."""
    readable: Mapping[Kind, Form]
    """Every kind the session may read (primary, owned, watched), each once, with its form."""
    heartbeat_interval: float | None
    """Seconds between heartbeats (None: the manager does not fence this session's attempts)."""
    hold: float | None
    """How long after its last answered heartbeat every handler of the session must have
    stopped (None as above)."""
    effective: registration_pb2.Register
    """The registration as the manager completed it with its defaults."""

    def describe_readable(self) -> str:
        """``v1/ConfigMap (full), coordination.k8s.io/v1/Lease (metadata)``."""
        return ", ".join(f"{k} ({form})" for k, form in self.readable.items()) or "nothing"


class FatalError(Exception):
    """The manager refused this controller in a way only a human can fix (a registration
    rejected as INVALID_ARGUMENT or PERMISSION_DENIED, or a token refused as UNAUTHENTICATED,
    before ``Registered``); ``run`` ends with it instead of reconnecting. Neither a newer
    definition superseding this replica (see ``Controller.outdated``) nor a name another identity
    of the tenant holds (ALREADY_EXISTS: asked again every ``outdated_retry``) is fatal."""

    def __init__(self, message: str, code: str = "", field: str = "") -> None:
        super().__init__(message)
        self.code = code
        """The gRPC status code name, e.g. ``INVALID_ARGUMENT``."""
        self.field = field
        """The offending Register field, when the manager named one."""


def outcome(result: pb.ReconcileResult, value: object) -> str:
    """Fill ``result``'s outcome from a handler's return value or exception; returns its name,
    as the manager and the other SDKs say it (``success``, ``requeue`` (no delay),
    ``requeue_after``, ``error`` or ``terminal``)."""
    if value is None or isinstance(value, Done):
        result.done.SetInParent()
        return "success"
    if isinstance(value, RequeueAfter):
        result.requeue_after.delay.CopyFrom(duration(value.delay))
        return "requeue_after" if seconds(value.delay) > 0 else "requeue"
    if isinstance(value, PermanentError):
        result.terminal.message = str(value) or type(value).__name__
        return "terminal"
    if isinstance(value, TemporaryError):
        result.error.message = str(value) or type(value).__name__
        if value.delay is not None:
            result.error.retry_after.CopyFrom(duration(value.delay))
        return "error"
    if isinstance(value, BaseException):
        result.error.message = f"{type(value).__name__}: {value}"
        return "error"
    result.error.message = f"the handler returned {value!r}; return None, ctrlhub.Done() or ctrlhub.RequeueAfter(seconds)"
    return "error"


def names(values: Iterable[Reason | int]) -> list[str]:
    """Reason names (``CREATED``, ...), or numbers for unknown ones, as strings."""
    return [v.name if isinstance(v, Reason) else str(v) for v in values]
