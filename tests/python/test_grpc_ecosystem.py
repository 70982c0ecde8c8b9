"""The manager's gRPC port as standard gRPC tooling sees it, with nothing from ctrlhub's repo:
the ``grpc.health.v1`` service (what Kubernetes gRPC probes and load balancers ask) and server
reflection (what grpcurl and grpcui use to list, describe and call services without the
.proto files). Uses the grpcio-health-checking and grpcio-reflection packages, real
``ctrlhub run`` processes and devcluster."""

from __future__ import annotations

import os
import pathlib
import random
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVICE = "ctrlhub.v1.ControllerManager"
PATIENCE = 60.0


def ctrlhub_binary() -> pathlib.Path:
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / "ctrlhub"


def free_port() -> int:
    """A free loopback port for a process started next, below Linux's ephemeral range
    (32768-60999), where no outgoing connection or bind(0) of another process can take it
    before that process binds; picked at random so suites running side by side rarely meet."""
    for _ in range(64):
        port = random.randrange(20000, 32768)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, check, timeout: float = PATIENCE):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as e:  # report the last failure on timeout
            last = e
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what} (last error: {last!r})")


@contextmanager
def manager(kubeconfig: pathlib.Path, identity: str, tmp: pathlib.Path) -> Iterator[str]:
    """A ``ctrlhub run`` process; yields its gRPC address once /healthz answers."""
    grpc_port, http_port = free_port(), free_port()
    log = open(tmp / f"{identity}.log", "w")
    proc = subprocess.Popen(
        [
            str(ctrlhub_binary()),
            "run",
            "--kubeconfig", str(kubeconfig),
            "--grpc-addr", f"127.0.0.1:{grpc_port}",
            "--http-addr", f"127.0.0.1:{http_port}",
            "--identity", identity,
            "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "RUST_LOG": "info"},
    )
    try:
        wait_until(
            f"{identity} /healthz",
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=2).status == 200,
        )
        yield f"127.0.0.1:{grpc_port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_health_is_serving_on_the_leader_and_not_on_a_standby(devcluster, tmp_path):
    if not ctrlhub_binary().exists():
        pytest.fail(f"{ctrlhub_binary()} not found; run `cargo build --workspace --bins` first")
    with manager(devcluster.kubeconfig, "leader", tmp_path) as leader:
        for service in ("", SERVICE):
            wait_until(
                f"the leader to report SERVING for {service!r}",
                lambda: health(leader, service) == health_pb2.HealthCheckResponse.SERVING,
            )
        with manager(devcluster.kubeconfig, "standby", tmp_path) as standby:
            for service in ("", SERVICE):
                assert health(standby, service) == health_pb2.HealthCheckResponse.NOT_SERVING
            # An unknown service is NOT_FOUND, as the health protocol says.
            with pytest.raises(grpc.RpcError) as err:
                health(standby, "no.such.Service")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_describes_and_calls_the_service(devcluster, tmp_path):
    with manager(devcluster.kubeconfig, "reflected", tmp_path) as address:
        with grpc.insecure_channel(address) as channel:
            db = ProtoReflectionDescriptorDatabase(channel)
            services = db.get_services()
            assert SERVICE in services, services
            assert "grpc.health.v1.Health" in services, services
            pool = descriptor_pool.DescriptorPool(db)
            described = pool.FindServiceByName(SERVICE)
            assert {m.name for m in described.methods} == {"Connect", "Get", "List"}
            # Call Get with a request built from the reflected descriptors alone: the manager
            # decodes it and answers that the session is unknown, so the call went through.
            get = described.methods_by_name["Get"]
            request_class = message_factory.GetMessageClass(get.input_type)
            response_class = message_factory.GetMessageClass(get.output_type)
            call = channel.unary_unary(
                f"/{SERVICE}/Get",
                request_serializer=request_class.SerializeToString,
                response_deserializer=response_class.FromString,
            )
            request = request_class(session_id="none", namespace="default", name="x")
            with pytest.raises(grpc.RpcError) as err:
                call(request, metadata=[("authorization", "Bearer dev")], timeout=10)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "session_id" in err.value.details()
