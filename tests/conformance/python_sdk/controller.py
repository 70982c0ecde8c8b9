#!/usr/bin/env python3
"""The ctrlhub conformance controller on the Python SDK (controllers/python-sdk).

Written from tests/conformance/README.md sections 1-4: the environment, the registration, the
ConfigMap directives and the report. Everything in section 5 (sessions, deadlines, reconnect,
token file, Drain, Revoked, cached reads, traces) is the SDK's job, so none of it is here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import ctrlhub

env = os.environ
REPLICA = env["CONFORMANCE_REPLICA"]
REPORT = os.open(env["CONFORMANCE_REPORT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


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


def deadline_us(request: ctrlhub.Request) -> int:
    return int(request.deadline.timestamp() * 1_000_000) if request.deadline else 0


@ctrlhub.reconcile(
    "v1/ConfigMap",
    name=env["CONFORMANCE_CONTROLLER"],
    namespaces=[env["CONFORMANCE_NAMESPACE"]],
    labels={"conformance.ctrlhub.io/scope": "in"},
    include_object=True,
    resync=0,
    deadline=int(env["CONFORMANCE_DEADLINE_MS"]) / 1000,
    backoff=(int(env["CONFORMANCE_BACKOFF_BASE_MS"]) / 1000, int(env["CONFORMANCE_BACKOFF_MAX_MS"]) / 1000),
    max_concurrent=int(env["CONFORMANCE_MAX_IN_FLIGHT"]),
)
async def conformance(request: ctrlhub.Request, reader: ctrlhub.Reader) -> ctrlhub.Result:
    body = request.object or request.tombstone
    data = (body or {}).get("data") or {}
    base = {"key": str(request.key), "id": request.id, "attempt": request.attempt}
    report({
        "event": "start", **base,
        "reasons": [r.name if isinstance(r, ctrlhub.Reason) else r for r in request.reasons],
        "object": "object" if request.object is not None else "tombstone" if request.tombstone is not None else "none",
        "rv": str(((body or {}).get("metadata") or {}).get("resourceVersion", "")),
        "deadline_us": deadline_us(request),
        "traceparent": request.traceparent,
        "span_traceparent": request.span_traceparent,
    })
    end: dict[str, Any] = {"event": "end", **base, "outcome": "cancelled"}
    try:
        await asyncio.sleep(int(entry(data, "sleep_ms", request.attempt) or 0) / 1000)
        if data.get("read"):
            end["reads"] = await reads(reader, request.key.namespace, str(data["read"]))
    except asyncio.CancelledError:  # the deadline is near, or the session ended
        report(end)
        raise
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


async def reads(reader: ctrlhub.Reader, namespace: str, name: str) -> dict[str, Any]:
    try:
        got = await reader.get("v1/ConfigMap", namespace, name)
        listed = await reader.list("v1/ConfigMap", namespace)
    except ctrlhub.ReadError as err:
        return {"error": str(err)}
    get = {"name": name, "found": False} if got is None else {"name": name, "found": True, "data": got.get("data") or {}}
    return {"get": get, "list": sorted(o["metadata"]["name"] for o in listed)}


if __name__ == "__main__":
    ctrlhub.run()
    sys.exit(0)
