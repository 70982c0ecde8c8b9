"""A controller's definition: what it registers (``ctrlhub.v1.Register``), from the keywords
of ``@reconcile`` / ``@on_event``, declared and documented once here (``Options`` and
``Definition``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypedDict, Unpack

from ._batches import MAX_BATCH
from ._config import revision_from_env
from ._types import Kind, KindLike, Owns, Predicate, Selector, SelectorLike, Watch, duration, seconds
from .v1 import registration_pb2

__all__ = ["Definition", "Mode", "Options", "default_name"]

Mode = Literal["reconcile", "events"]
"""``reconcile``: a handler per key (MODE_RECONCILE); ``events``: a handler per change
(MODE_EVENTS)."""

Namespaces = str | Sequence[str] | SelectorLike | None
Backoff = tuple[float | timedelta, float | timedelta]


class Options(TypedDict, total=False):
    """The keywords ``@reconcile``, ``@on_event``, ``Operator.reconcile``, ``Operator.on_event``
    and ``Controller`` take besides ``name``: declared, typed and documented here only, and
    held by ``Definition.options``. ``@on_event`` takes all but ``owns``, ``watches``,
    ``controller_wide_limit``, ``backoff`` and ``include_object``."""

    namespaces: Namespaces
    """One name, a list of names, or a label selector of namespaces; default all (within the
    manager's ``--watch-namespace`` ceiling, ``CTRLHUB_WATCH_NAMESPACE``)."""
    labels: SelectorLike | None
    """Only objects matching this label selector (a dict means matchLabels)."""
    predicate: Predicate | None
    """Only events passing this filter, evaluated by the manager."""
    owns: Iterable[KindLike | Owns]
    """Child kinds whose changes wake their owner; cached and readable in full unless
    ``Owns(kind, metadata_only=True)``."""
    watches: Iterable[Watch]
    """Other kinds mapped to primaries by a label, annotation or field path."""
    max_concurrent: int
    """Handlers running at once in this process (default 1)."""
    max_in_flight: int | None
    """This replica's credit (requests the manager may have outstanding on it); default
    ``max_concurrent``."""
    controller_wide_limit: int | None
    """Reconciles at once across all replicas."""
    deadline: float | timedelta | None
    """How long a handler may take (manager default 60 s); it is cancelled shortly before (5 %
    of the time, at most 0.5 s)."""
    resync: float | timedelta | None
    """How often every object is reconciled anyway (manager default 10 h; 0: off)."""
    backoff: Backoff | None
    """``(base, max)`` of the per-key retry backoff (manager default 5 ms, 1000 s)."""
    include_object: bool | None
    """Send the object with each request; default: whether the handler takes an argument that
    needs it."""
    revision: int | None
    """``Register.revision`` of this definition, for rolling upgrades (see the SDK's README);
    default ``CTRLHUB_REVISION``, else 0."""


_NOT_FOR_EVENTS = ("owns", "watches", "controller_wide_limit", "backoff", "include_object")


def default_name(fn: Callable[..., Any]) -> str:
    """A controller name from a function's name: lower case, ``_`` as ``-``."""
    return re.sub(r"[^a-z0-9-]+", "-", fn.__name__.lower()).strip("-") or "controller"


@dataclass(frozen=True)
class Definition:
    """What a controller registers with the manager: its name, primary kind, mode and the
    checked keywords (``Options``); ``to_register`` turns it into the ``Register`` message."""

    name: str
    """The controller's name (a DNS-1123 label, unique in your tenant, shared by replicas);
    the decorators default it to the function's name with ``_`` as ``-``."""
    kind: Kind
    """The primary kind: ``"v1/ConfigMap"``, ``"apps/v1/Deployment"`` or a ``Kind``."""
    mode: Mode = "reconcile"
    """``reconcile`` (``@reconcile``) or ``events`` (``@on_event``)."""
    options: Options = field(default_factory=lambda: Options())
    """The keywords as given (``owns`` and ``watches`` as tuples), documented on ``Options``."""

    @classmethod
    def of(cls, name: str, kind: KindLike, mode: Mode = "reconcile", **options: Unpack[Options]) -> Definition:
        """A checked definition from the decorators' keywords (``Options``)."""
        unknown = set(options) - set(Options.__annotations__)
        if unknown:
            raise TypeError(f"unknown controller option(s) {', '.join(sorted(unknown))}; the options are "
                            f"{', '.join(Options.__annotations__)}")
        if mode not in ("reconcile", "events"):
            raise ValueError(f"mode must be 'reconcile' or 'events', not {mode!r}")
        if mode == "events":
            given = [k for k in _NOT_FOR_EVENTS if options.get(k) not in (None, ())]
            if given:
                raise TypeError(f"an event handler takes no {', '.join(given)}: it sees every change of its own kind")
        checked = Options(**options)
        checked["owns"] = tuple(_owns(checked.get("owns", ())))
        checked["watches"] = tuple(checked.get("watches", ()))
        if checked.get("max_concurrent", 1) < 1:
            raise ValueError("max_concurrent must be at least 1")
        revision = checked.get("revision")
        if revision is not None and not 0 <= revision < 2**64:
            raise ValueError(f"revision must be from 0 to 2^64-1, not {revision}")
        return cls(name, Kind.of(kind), mode, checked)

    @property
    def max_concurrent(self) -> int:
        """``max_concurrent``, defaulting to 1."""
        return self.options.get("max_concurrent", 1)

    @property
    def credit(self) -> int:
        """``max_in_flight``, defaulting to ``max_concurrent``."""
        return self.options.get("max_in_flight") or self.max_concurrent

    @property
    def deadline_seconds(self) -> float | None:
        """``deadline`` in seconds."""
        deadline = self.options.get("deadline")
        return seconds(deadline) if deadline is not None else None

    def to_register(self, wants_object: bool, max_in_flight: int | None = None) -> registration_pb2.Register:
        """The ``Register`` message (``CTRLHUB_REVISION`` read now when ``revision`` is unset);
        ``wants_object``: whether the handler takes an argument that needs the object."""
        o, reconcile = self.options, self.mode == "reconcile"
        include = o.get("include_object")
        revision = o.get("revision")
        reg = registration_pb2.Register(
            controller_name=self.name,
            mode=registration_pb2.Register.MODE_RECONCILE if reconcile else registration_pb2.Register.MODE_EVENTS,
            primary=self.kind.to_proto(),
            owns=[w.to_proto() for w in _owns(o.get("owns", ()))],
            watches=[w.to_proto() for w in o.get("watches", ())],
            max_concurrent_reconciles=o.get("controller_wide_limit") or 0,
            include_object=(wants_object if include is None else include) if reconcile else True,
            # Reconcile results confirm that an attempt ended, also after its deadline. An
            # event has no such answer (an ack means processed), so EVENTS sessions keep the
            # older rule: an event not acknowledged by its deadline is simply sent again.
            exclusive_attempts=reconcile,
            max_in_flight=self.credit if max_in_flight is None else max_in_flight,
            revision=revision if revision is not None else revision_from_env(),
            # Work may come in batches; answers go in batches only if Registered echoes it.
            max_batch=MAX_BATCH,
        )
        _scope(reg, o.get("namespaces"))
        if (labels := o.get("labels")) is not None:
            reg.label_selector.CopyFrom(Selector.of(labels).to_proto())
        if (predicate := o.get("predicate")) is not None:
            reg.predicate.CopyFrom(predicate.to_proto())
        if (deadline := o.get("deadline")) is not None:
            reg.request_deadline.CopyFrom(duration(deadline))
        if (resync := o.get("resync")) is not None:
            reg.resync_period.CopyFrom(duration(resync))
        if (backoff := o.get("backoff")) is not None:
            reg.backoff.base.CopyFrom(duration(backoff[0]))
            reg.backoff.max.CopyFrom(duration(backoff[1]))
        return reg


def _owns(owns: Iterable[KindLike | Owns]) -> list[Owns]:
    """``owns`` entries as ``Owns`` (a bare kind is owned in full)."""
    return [o if isinstance(o, Owns) else Owns(o) for o in owns]


def _scope(reg: registration_pb2.Register, ns: Namespaces) -> None:
    """``reg.namespaces`` from the ``namespaces`` keyword (None: every namespace)."""
    if ns is None:
        return
    if isinstance(ns, str):
        reg.namespaces.names.names.append(ns)
    elif isinstance(ns, (Selector, dict)):
        reg.namespaces.label_selector.CopyFrom(Selector.of(ns).to_proto())
    else:
        reg.namespaces.names.names.extend(ns)
