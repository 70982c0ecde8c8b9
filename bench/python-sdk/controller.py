"""The Python SDK's bench controller: a no-op reconciler on the bench Widget CRD.

The harness (bench/src/python_sdk.rs) runs it as

    <venv>/bin/python controller.py --addr HOST:PORT --name NAME --namespace NS --concurrency N

Each reconcile start is reported on stdout as ``R <namespace>/<name> <latency-us>`` (latency
from the load generator's timestamp annotation to the handler's start, -1 without one), the
report format of the Rust bench controllers. Lines are gathered and written once per event-loop
turn, so a report costs no write(2) of its own. SIGTERM drains and exits.
"""

import argparse
import asyncio
import os
import time

import ctrlhub

TS_ANNOTATION = "bench.ctrlhub.io/ts"

args = argparse.ArgumentParser()
args.add_argument("--addr", required=True)
args.add_argument("--name", default="bench")
args.add_argument("--namespace", default="")
args.add_argument("--concurrency", type=int, default=16)
opts = args.parse_args()

pending: list[str] = []


def flush() -> None:
    data = "".join(pending).encode()
    pending.clear()
    os.write(1, data)


operator = ctrlhub.Operator()


@operator.reconcile(
    "bench.ctrlhub.io/v1/Widget",
    name=opts.name,
    namespaces=[opts.namespace] if opts.namespace else None,
    max_concurrent=opts.concurrency,
)
async def noop(key: ctrlhub.Key, annotations: dict[str, str]) -> None:
    try:
        latency = max(0, time.time_ns() // 1000 - int(annotations[TS_ANNOTATION]))
    except (KeyError, ValueError):
        latency = -1
    if not pending:
        asyncio.get_running_loop().call_soon(flush)
    pending.append(f"R {key} {latency}\n")


operator.run(ctrlhub.Config(addr=opts.addr, token="dev"), log_level="WARNING")
