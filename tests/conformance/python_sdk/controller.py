#!/usr/bin/env python3
"""The ctrlhub conformance controller on the Python SDK (controllers/python-sdk).

Written from tests/conformance/README.md sections 1-4: the environment, the registration, the
ConfigMap directives and the report. Everything in section 5 (sessions, heartbeats and the
hold, deadlines, one attempt of a key at a time, reconnect, token file, Drain, Revoked and
outdated definitions, cached reads, traces) is the SDK's job, so none of it is here. The
handler is a sync one, so that `block_ms` is what it is for Python users: a blocking call on
the handler's thread that no cancellation interrupts.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import ctrlhub

env = os.environ
REPLICA = env["CONFORMANCE_REPLICA"]
REPORT = os.open(env["CONFORMANCE_REPORT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
LEASE = ctrlhub.Kind("coordination.k8s.io", "v1", "Lease")
OWNS = env.get("CONFORMANCE_OWNS", "")


def report(line: dict[str, Any]) -> None:
    """One JSON line, written with one write(2) so concurrent handlers never interleave."""
    line.update(ts_us=time.time_ns() // 1000, replica=REPLICA)
    os.write(REPORT, (json.dumps(line) + "\n").encode())


def entry(data: dict[str, Any], key: str, attempt: int) -> str | None:
    """Entry min(attempt, length) of a comma-separated directive."""
    if key not in data:
        return None
    items = [v.strip() for v in str(data[key]).split(",")]
    return items[min(max(attempt, 1), len(items)) - 1]


def millis(data: dict[str, Any], key: str, attempt: int) -> float:
    return int(entry(data, key, attempt) or 0) / 1000


operator = ctrlhub.Operator()


@operator.reconcile(
    "v1/ConfigMap",
    name=env["CONFORMANCE_CONTROLLER"],
    namespaces=[env["CONFORMANCE_NAMESPACE"]],
    labels={"conformance.ctrlhub.io/scope": "in"},
    include_object=True,
    resync=0,
    deadline=int(env["CONFORMANCE_DEADLINE_MS"]) / 1000,
    backoff=(int(env["CONFORMANCE_BACKOFF_BASE_MS"]) / 1000, int(env["CONFORMANCE_BACKOFF_MAX_MS"]) / 1000),
    max_concurrent=int(env["CONFORMANCE_MAX_IN_FLIGHT"]),
    owns=[ctrlhub.Owns(LEASE, metadata_only=OWNS == "leases-metadata")] if OWNS else [],
)
def conformance(request: ctrlhub.SyncRequest, reader: ctrlhub.SyncReader, cancelled: threading.Event) -> ctrlhub.Result:
    body = request.object or request.tombstone or {}
    data = body.get("data") or {}
    base = {"key": str(request.key), "id": request.id, "attempt": request.attempt, "session": request.session_id}
    report({
        "event": "start", **base,
        "reasons": [r.name if isinstance(r, ctrlhub.Reason) else r for r in request.reasons],
        "object": "object" if request.object is not None else "tombstone" if request.tombstone is not None else "none",
        "rv": str((body.get("metadata") or {}).get("resourceVersion", "")),
        "deadline_us": int(request.deadline.timestamp() * 1_000_000) if request.deadline else 0,
        "traceparent": request.traceparent,
        "span_traceparent": request.span_traceparent,
    })
    end: dict[str, Any] = {"event": "end", **base, "outcome": "cancelled"}
    if not cancelled.wait(millis(data, "sleep_ms", request.attempt)):  # wakes at once when cancelled
        time.sleep(millis(data, "block_ms", request.attempt))  # deaf to cancellation
    if not cancelled.is_set() and data.get("read"):
        end["reads"] = reads(reader, request.key.namespace, str(data["read"]))
    if not cancelled.is_set() and data.get("read_child"):
        end["child"] = child(reader, request.key.namespace, str(data["read_child"]))
    if cancelled.is_set():  # the deadline is near, the session ended, or the manager went silent
        report(end)
        raise ctrlhub.TemporaryError("cancelled")
    outcome = entry(data, "outcome", request.attempt) or "done"
    end["outcome"] = outcome.partition(":")[0]
    report(end)
    if outcome == "error":
        raise ctrlhub.TemporaryError("error directive")
    if outcome == "terminal":
        raise ctrlhub.PermanentError("terminal directive")
    if outcome.startswith("requeue:"):
        return ctrlhub.RequeueAfter(int(outcome.removeprefix("requeue:")) / 1000)
    return ctrlhub.Done()


def reads(reader: ctrlhub.SyncReader, namespace: str, name: str) -> dict[str, Any]:
    try:
        got = reader.get("v1/ConfigMap", namespace, name)
        listed = reader.list("v1/ConfigMap", namespace)
    except ctrlhub.ReadError as err:
        return {"error": str(err)}
    get = {"name": name, "found": False} if got is None else {"name": name, "found": True, "data": got.get("data") or {}}
    return {"get": get, "list": sorted(o["metadata"]["name"] for o in listed)}


def child(reader: ctrlhub.SyncReader, namespace: str, name: str) -> dict[str, Any]:
    try:
        got = reader.get_raw(LEASE, namespace, name)
    except ctrlhub.ReadError as err:
        return {"error": str(err)}
    if got is None:
        return {"name": name, "found": False, "metadata_only": False, "holder": ""}
    holder = (got.object.get("spec") or {}).get("holderIdentity") or ""
    return {"name": name, "found": True, "metadata_only": got.metadata_only, "holder": holder}


@operator.controllers[0].on_registered
def registered(r: ctrlhub.Registration) -> None:
    report({"event": "registered", "session": r.session_id, "revision": r.revision,
            "readable": {k.kind: form for k, form in r.readable.items()}})


if __name__ == "__main__":
    operator.run()
    sys.exit(0)
