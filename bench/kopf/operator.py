"""The kopf reference operator of the throughput benchmark: a no-op handler for Widgets.

The harness (bench/src/scenarios/throughput.rs) runs it as

    <venv>/bin/python -m kopf run --standalone --quiet --namespace NS operator.py

with KUBECONFIG pointing at devcluster and CTRLHUB_BENCH_KOPF_MODE choosing the handler:

* ``event`` (default): ``@kopf.on.event``, which writes nothing back to the API server. This is
  the like-for-like peer of the no-op reconcilers of ctrlhub and kube-rs.
* ``create``: ``@kopf.on.create``, kopf's usual change-detecting mode. After the handler
  succeeds kopf merge-patches the object with its ``last-handled-configuration`` annotation, so
  every object costs one extra write and one extra watch event.

For every object the handler sees (once per object and mode) it prints one line to stdout,
``R <namespace>/<name> <latency-us>``: the report format of the Rust bench controllers, parsed
by ``ctrlhub_bench::env::parse_report``. The latency is from the load generator's timestamp
annotation to the handler's start, or -1 without one.
"""

import os
import sys
import time

import kopf

GROUP = "bench.ctrlhub.io"
VERSION = "v1"
PLURAL = "widgets"
TS_ANNOTATION = "bench.ctrlhub.io/ts"
MODE = os.environ.get("CTRLHUB_BENCH_KOPF_MODE", "event")


def report(namespace, name, annotations):
    """Print the report line of one reconcile start."""
    try:
        latency = max(0, time.time_ns() // 1000 - int(annotations[TS_ANNOTATION]))
    except (KeyError, TypeError, ValueError):
        latency = -1
    # The handlers are coroutines, so they all run on the event loop's one thread and each line
    # is written whole. (Sync handlers run in a thread pool, where concurrent print() calls
    # interleave their text and newline and lines get lost.) Flushing each line keeps the
    # harness' clock honest: it times the last new line it reads.
    sys.stdout.write(f"R {namespace}/{name} {latency}\n")
    sys.stdout.flush()


if MODE == "event":

    @kopf.on.event(GROUP, VERSION, PLURAL)
    async def widget_event(event, name, namespace, annotations, **_):
        """Every watch event; the initial listing arrives with type None."""
        if event.get("type") != "DELETED":
            report(namespace, name, annotations)

elif MODE == "create":

    @kopf.on.create(GROUP, VERSION, PLURAL)
    async def widget_created(name, namespace, annotations, **_):
        """Once per object; kopf records success in an annotation afterwards."""
        report(namespace, name, annotations)

else:
    sys.exit(f"CTRLHUB_BENCH_KOPF_MODE must be 'event' or 'create', not {MODE!r}")
