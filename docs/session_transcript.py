#!/usr/bin/env python3
"""Record one real ctrlhub session, message by message, for docs/protocol.md.

Run it against a manager with its static token (e.g. ``cargo run -p ctrlhub -- dev``, whose
kubeconfig is ``.ctrlhub-dev/kubeconfig``) from the repository's virtualenv::

    .venv/bin/python docs/session_transcript.py [--addr 127.0.0.1:9090] [--token dev] \
        [--kubeconfig .ctrlhub-dev/kubeconfig]

It is a raw controller written against the stubs grpcio-tools generates from proto/ (no SDK):
it registers for ConfigMaps in ``default`` with batches, creates one, answers its requests
(RequeueAfter, then Done), sends a stale result (discarded), pauses its credit while two more
are created so that they wait for the stream together (a batch) and answers both in one
message, drains, and prints everything that crossed the stream in protobuf text format.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from google.protobuf import text_format

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "controllers" / "python"))
import gen  # noqa: E402  (generates the stubs on first use)

sys.path.insert(0, str(gen.generate()))
from ctrlhub.v1 import (  # noqa: E402
    controller_pb2,
    controller_pb2_grpc,
    read_pb2,
    registration_pb2,
    resource_pb2,
)


def show(arrow: str, message) -> None:
    text = text_format.MessageToString(message, as_one_line=True)
    print(f"{arrow} {text}", flush=True)


def kubectl(kubeconfig: str, *args: str) -> None:
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], check=True, capture_output=True)


def apply(kubeconfig: str, name: str) -> None:
    """Creates ConfigMap ``name`` in ``default`` with the label the transcript selects."""
    manifest = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"
        "  namespace: default\n  labels:\n    transcript: \"yes\"\ndata:\n  k: v\n"
    )
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-"],
                   input=manifest.encode(), check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:9090")
    parser.add_argument("--token", default="dev")
    parser.add_argument("--kubeconfig", default=str(REPO / ".ctrlhub-dev" / "kubeconfig"))
    args = parser.parse_args()

    outbox: queue.Queue = queue.Queue()

    def send(message: controller_pb2.ControllerMessage) -> None:
        show("→", message)
        outbox.put(message)

    def requests():
        while (message := outbox.get()) is not None:
            yield message

    register = registration_pb2.Register(
        controller_name="transcript",
        primary=resource_pb2.ResourceType(version="v1", kind="ConfigMap"),
        namespaces=registration_pb2.NamespaceScope(
            names=registration_pb2.NamespaceScope.Names(names=["default"])
        ),
        label_selector=resource_pb2.LabelSelector(match_labels={"transcript": "yes"}),
        max_in_flight=2,
        max_batch=8,
    )
    send(controller_pb2.ControllerMessage(register=register))
    channel = grpc.insecure_channel(args.addr)
    stub = controller_pb2_grpc.ControllerManagerStub(channel)
    stream = stub.Connect(requests(), metadata=[("authorization", f"Bearer {args.token}")])
    replies = iter(stream)

    def show_registered(message) -> str:
        show("←", message)
        return message.registered.session_id

    session_id = show_registered(next(replies))
    threading.Thread(target=apply, args=(args.kubeconfig, "transcript-demo"), daemon=True).start()
    first = next(replies)
    show("←", first)
    request = first.reconcile
    send(controller_pb2.ControllerMessage(result=controller_pb2.ReconcileResult(
        id=request.id,
        requeue_after=controller_pb2.ReconcileResult.RequeueAfter(delay={"nanos": 500_000_000}),
    )))
    again = next(replies)
    show("←", again)
    send(controller_pb2.ControllerMessage(result=controller_pb2.ReconcileResult(
        id=again.reconcile.id, done=controller_pb2.ReconcileResult.Done())))
    # A result for a request that is no longer in flight: discarded and counted, not an error.
    send(controller_pb2.ControllerMessage(result=controller_pb2.ReconcileResult(
        id=request.id, done=controller_pb2.ReconcileResult.Done())))
    # No credit while two more are created: once both wait in the manager's queue, credit for
    # two lets them out together, as one batch.
    send(controller_pb2.ControllerMessage(credit=controller_pb2.Credit(max_in_flight=0)))
    for name in ("transcript-b", "transcript-c"):
        apply(args.kubeconfig, name)
    wait_cached(stub, session_id, args.token, {"transcript-demo", "transcript-b", "transcript-c"})
    send(controller_pb2.ControllerMessage(credit=controller_pb2.Credit(max_in_flight=2)))
    batch = next(replies)
    show("←", batch)
    send(controller_pb2.ControllerMessage(results=controller_pb2.ResultBatch(results=[
        controller_pb2.ReconcileResult(id=r.id, done=controller_pb2.ReconcileResult.Done())
        for r in batch.batch.requests
    ])))
    send(controller_pb2.ControllerMessage(drain=controller_pb2.Drain()))
    outbox.put(None)
    try:
        for message in replies:
            show("←", message)
        print("← (stream ends) status OK")
    except grpc.RpcError as e:
        print(f"← (stream ends) status {e.code().name}: {e.details()}")
    kubectl(args.kubeconfig, "delete", "configmap", "transcript-demo", "transcript-b", "transcript-c",
            "-n", "default")
    return 0


def wait_cached(stub, session_id: str, token: str, names: set[str]) -> None:
    """Waits until the session's cache holds every one of ``names`` (their keys are then queued)."""
    request = read_pb2.ListRequest(
        session_id=session_id,
        resource=resource_pb2.ResourceType(version="v1", kind="ConfigMap"),
        namespace="default",
    )
    for _ in range(600):
        listed = stub.List(request, metadata=[("authorization", f"Bearer {token}")])
        if names <= {json.loads(item.object_json)["metadata"]["name"] for item in listed.items}:
            return
        time.sleep(0.05)
    raise SystemExit(f"the manager's cache never held {sorted(names)}")


if __name__ == "__main__":
    sys.exit(main())
