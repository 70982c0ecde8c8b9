"""The controller process against a scripted in-test manager (real gRPC) and a real
devcluster: exercises Register, Get, the merge patch, reconnect, Rejected and Drain
without waiting for the Rust manager."""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import rollout_controller as rc
from ctrlhub.v1 import controller_pb2 as pb
from ctrlhub.v1 import controller_pb2_grpc as pb_grpc
from ctrlhub.v1 import read_pb2, registration_pb2
from kubernetes.client.exceptions import ApiException
from rollout_support import (
    Cluster,
    Proc,
    configmap,
    controller_argv,
    deployment_mounting,
    read_json,
    template_annotation,
)

NS = "default"
TIMEOUT_S = 20.0
_END = object()


@dataclass
class Stream:
    """One Connect stream as seen by the fake manager."""

    metadata: dict[str, str]
    inbox: queue.Queue[Any] = field(default_factory=queue.Queue)  # from the controller
    outbox: queue.Queue[Any] = field(default_factory=queue.Queue)  # to the controller

    def recv(self, timeout: float = TIMEOUT_S) -> pb.ControllerMessage:
        try:
            msg = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"controller sent nothing within {timeout}s") from None
        assert msg is not _END, "controller closed its side of the stream"
        return msg

    def send(self, **kwargs: Any) -> None:
        self.outbox.put(pb.ManagerMessage(**kwargs))

    def end(self, code: grpc.StatusCode | None = None, details: str = "") -> None:
        self.outbox.put((_END, code, details))


class FakeManager(pb_grpc.ControllerManagerServicer):
    """A scripted manager: the test drives each stream; Get reads devcluster directly."""

    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster = cluster
        self.streams: queue.Queue[Stream] = queue.Queue()
        self.gets: list[tuple[str, str, str]] = []

    def next_stream(self, timeout: float = TIMEOUT_S) -> Stream:
        try:
            return self.streams.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"controller did not connect within {timeout}s") from None

    def Connect(self, request_iterator: Iterator[pb.ControllerMessage], context: grpc.ServicerContext) -> Iterator[pb.ManagerMessage]:
        stream = Stream(metadata=dict(context.invocation_metadata()))

        def pump() -> None:
            try:
                for msg in request_iterator:
                    stream.inbox.put(msg)
            except grpc.RpcError:
                pass  # the stream ended; the END marker below tells the test
            stream.inbox.put(_END)

        threading.Thread(target=pump, daemon=True).start()
        self.streams.put(stream)
        while True:
            item = stream.outbox.get()
            if isinstance(item, tuple) and item[0] is _END:
                if item[1] is not None:
                    context.abort(item[1], item[2])
                return
            yield item

    def Get(self, request: read_pb2.GetRequest, context: grpc.ServicerContext) -> read_pb2.GetResponse:
        self.gets.append((request.session_id, request.namespace, request.name))
        assert self.cluster is not None
        try:
            obj = read_json(self.cluster, request.resource.kind, request.namespace, request.name)
        except ApiException as err:
            if err.status == 404:
                context.abort(grpc.StatusCode.NOT_FOUND, f"{request.name} not found")
            raise
        return read_pb2.GetResponse(object_json=json.dumps(obj).encode(),
                                    resource_version=obj["metadata"]["resourceVersion"])


@pytest.fixture
def fake_manager(request: pytest.FixtureRequest) -> Iterator[tuple[FakeManager, str]]:
    cluster = request.getfixturevalue("devcluster") if "devcluster" in request.fixturenames else None
    servicer = FakeManager(cluster)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_ControllerManagerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def reconcile_request(req_id: str, name: str, obj: dict[str, Any] | None = None,
                      tombstone: dict[str, Any] | None = None, deadline_s: float = 30.0) -> pb.ReconcileRequest:
    req = pb.ReconcileRequest(id=req_id, attempt=1)
    req.key.namespace, req.key.name = NS, name
    if obj is not None:
        req.object_json = json.dumps(obj).encode()
    if tombstone is not None:
        req.tombstone.object_json = json.dumps(tombstone).encode()
    req.deadline.FromNanoseconds(int((time.time() + deadline_s) * 1e9))
    return req


def expect_register(stream: Stream) -> registration_pb2.Register:
    msg = stream.recv()
    assert msg.WhichOneof("message") == "register", msg
    assert stream.metadata.get("authorization") == "Bearer dev"
    return msg.register


def test_reconcile_reconnect_and_drain(devcluster: Cluster, fake_manager: tuple[FakeManager, str], tmp_path: Path) -> None:
    manager, addr = fake_manager
    devcluster.core.create_namespaced_config_map(NS, configmap("web-config", {"k": "v1"}, rollout="web"))
    devcluster.apps.create_namespaced_deployment(NS, deployment_mounting("web", "web-config"))
    controller = Proc("controller", controller_argv(addr, devcluster.kubeconfig), tmp_path)
    try:
        # First session: register, then kill the stream; the controller must come back.
        first = manager.next_stream()
        reg = expect_register(first)
        assert reg.controller_name == "config-rollout" and reg.include_object and reg.max_in_flight == 2
        first.end(grpc.StatusCode.UNAVAILABLE, "manager restarting")

        stream = manager.next_stream()
        expect_register(stream)
        stream.send(registered=registration_pb2.Registered(session_id="s-2", leader_identity="fake"))

        stream.send(reconcile=reconcile_request("r1", "web", obj=read_json(devcluster, "Deployment", NS, "web")))
        result = stream.recv().result
        assert (result.id, result.WhichOneof("outcome")) == ("r1", "done"), result
        assert ("s-2", NS, "web-config") in manager.gets, "ConfigMaps are read through the manager's Get"
        want = rc.config_hash([read_json(devcluster, "ConfigMap", NS, "web-config")])
        assert template_annotation(devcluster, NS, "web", rc.HASH_ANNOTATION) == want

        # A Deployment mounting a ConfigMap that does not exist: skipped, still Done.
        obj = read_json(devcluster, "Deployment", NS, "web")
        obj["spec"]["template"]["spec"]["volumes"].append({"name": "gone", "configMap": {"name": "missing"}})
        stream.send(reconcile=reconcile_request("r2", "web", obj=obj))
        result = stream.recv().result
        assert (result.id, result.WhichOneof("outcome")) == ("r2", "done"), result

        # Tombstones are Done without touching anything.
        stream.send(reconcile=reconcile_request("r3", "web", tombstone={"metadata": {"name": "web"}}))
        result = stream.recv().result
        assert (result.id, result.WhichOneof("outcome")) == ("r3", "done"), result

        # A Deployment deleted between dispatch and patch (the patch answers 404).
        ghost = read_json(devcluster, "Deployment", NS, "web")
        ghost["metadata"]["name"] = "ghost"
        ghost["spec"]["template"]["metadata"]["annotations"] = {}
        stream.send(reconcile=reconcile_request("r4", "ghost", obj=ghost))
        result = stream.recv().result
        assert result.id == "r4"
        # 404 on patch means "deleted meanwhile": Done, its tombstone follows.
        assert result.WhichOneof("outcome") == "done", result

        # SIGTERM: Drain, then exit 0 once the manager ends the stream.
        controller.popen.send_signal(15)
        assert stream.recv().WhichOneof("message") == "drain"
        stream.end()
        assert controller.popen.wait(timeout=TIMEOUT_S) == 0, controller.tail()
    finally:
        controller.stop()
    log = controller.stderr()
    assert re.search("reconcile start key=default/web reasons=\\S+ attempt=1", log)
    assert "reconcile end key=default/web attempt=1 outcome=success" in log


def test_rejected_exits_non_zero_with_the_message(fake_manager: tuple[FakeManager, str], tmp_path: Path) -> None:
    manager, addr = fake_manager
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    controller = Proc("controller", controller_argv(addr, kubeconfig), tmp_path)
    try:
        stream = manager.next_stream()
        expect_register(stream)
        stream.send(rejected=registration_pb2.Rejected(code=3, message="kind 'Deploymnt' not found",
                                                       field="register.primary.kind"))
        stream.end(grpc.StatusCode.INVALID_ARGUMENT, "kind 'Deploymnt' not found")
        code = controller.popen.wait(timeout=TIMEOUT_S)
    finally:
        controller.stop()
    assert code == 1
    # The SDK's one-line reason (its own suite covers refusals against the real manager).
    assert ("the manager refused the registration: INVALID_ARGUMENT (field register.primary.kind): "
            "kind 'Deploymnt' not found") in controller.stderr()
