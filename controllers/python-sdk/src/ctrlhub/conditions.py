"""``metav1.Condition`` helpers on plain dicts, with apimachinery's ``SetStatusCondition``
rules: ``lastTransitionTime`` changes only when ``status`` changes.

    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    if set_condition(conditions, "Ready", True, "Reconciled", "all good", observed_generation=gen):
        ...  # write the status back
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["Condition", "find_condition", "is_condition_true", "remove_condition", "set_condition"]

Condition = dict[str, Any]


def _status(value: bool | str) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if value not in ("True", "False", "Unknown"):
        raise ValueError(f"a condition status is True, False or Unknown, not {value!r}")
    return value


def _now() -> str:
    # Whole seconds, as Kubernetes serializes metav1.Time, so a written and re-read condition
    # compares equal.
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[Condition],
    type: str,
    status: bool | str,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: str | None = None,
) -> bool:
    """Sets the condition of ``type`` in ``conditions`` (in place) and reports whether anything
    changed. A new condition, or one whose status changed, gets ``lastTransitionTime`` = ``now``
    (default: the current time, RFC 3339 in whole seconds); otherwise the existing transition
    time is kept while reason, message and observedGeneration are updated."""
    new: Condition = {"type": type, "status": _status(status), "reason": reason, "message": message}
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    existing = find_condition(conditions, type)
    if existing is None:
        new["lastTransitionTime"] = now or _now()
        conditions.append(new)
        return True
    changed = False
    if existing.get("status") != new["status"]:
        existing["lastTransitionTime"] = now or _now()
        changed = True
    for field in ("status", "reason", "message", "observedGeneration"):
        if field in new and existing.get(field) != new[field]:
            existing[field] = new[field]
            changed = True
    if observed_generation is None and "observedGeneration" in existing:
        del existing["observedGeneration"]
        changed = True
    return changed


def find_condition(conditions: list[Condition], type: str) -> Condition | None:
    """The condition of ``type``, if present."""
    return next((c for c in conditions if c.get("type") == type), None)


def remove_condition(conditions: list[Condition], type: str) -> bool:
    """Removes the condition of ``type`` in place; reports whether it was there."""
    before = len(conditions)
    conditions[:] = [c for c in conditions if c.get("type") != type]
    return len(conditions) != before


def is_condition_true(conditions: list[Condition], type: str) -> bool:
    """Whether the condition of ``type`` is present with status ``"True"``."""
    c = find_condition(conditions, type)
    return c is not None and c.get("status") == "True"
