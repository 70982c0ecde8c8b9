#!/usr/bin/env python3
"""config-rollout: a ctrlhub controller that rolls a Deployment when a ConfigMap it uses changes.

It registers with a ctrlhub manager over gRPC (the stubs come from gen.py), reconciles
apps/v1 Deployments, and is woken up by core/v1 ConfigMaps labelled
``ctrlhub.io/rollout: <deployment name>``. For each Deployment it hashes the content of
every ConfigMap the pod template uses and stamps the hash into
``spec.template.metadata.annotations["ctrlhub.io/config-hash"]``; a changed template
makes the Deployment controller roll the pods.

Run ``python gen.py`` once first; see README.md for the flags.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
STUBS_ROOT = HERE / "ctrlhub_v1"

CONTROLLER_NAME = "config-rollout"
HASH_ANNOTATION = "ctrlhub.io/config-hash"
ROLLOUT_LABEL = "ctrlhub.io/rollout"
MAX_IN_FLIGHT = 2
# Stop this long before the manager's deadline: a result that arrives late is discarded
# anyway, and the manager's clock and ours may differ a little.
DEADLINE_MARGIN_S = 0.5
BACKOFF_START_S = 0.1
BACKOFF_MAX_S = 5.0
# After Drain the manager closes the stream once nothing is in flight; if it never does
# (an old manager, a network split), give up after this long so SIGTERM still ends us.
DRAIN_CLOSE_GRACE_S = 10.0
# Upper bound on waiting for in-flight reconciles during a drain (they are also bounded
# by their request deadlines, 1 minute unless the registration says otherwise).
DRAIN_WORK_TIMEOUT_S = 90.0

log = logging.getLogger("config-rollout")


# --------------------------------------------------------------------------------------
# Pure logic: no network, unit tested in tests/test_rollout_logic.py.
# --------------------------------------------------------------------------------------


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The dict elements of a JSON list (tolerates null/missing/malformed fields)."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, dict)]


def _get(obj: Any, *path: str) -> Any:
    """obj[path[0]][path[1]]...; None as soon as a step is missing or not an object."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def mounted_configmaps(deployment: Mapping[str, Any]) -> list[str]:
    """Names of the ConfigMaps a Deployment's pod template uses, sorted and deduplicated.

    Covers volumes[].configMap, projected volume sources, and for every container
    (init containers included, since they read config too) envFrom[].configMapRef and
    env[].valueFrom.configMapKeyRef.
    """
    pod_spec = _get(deployment, "spec", "template", "spec")
    if not isinstance(pod_spec, dict):
        return []
    names: set[str] = set()

    def add(name: Any) -> None:
        if isinstance(name, str) and name:
            names.add(name)

    for volume in _dicts(pod_spec.get("volumes")):
        add(_get(volume, "configMap", "name"))
        for source in _dicts(_get(volume, "projected", "sources")):
            add(_get(source, "configMap", "name"))
    for key in ("initContainers", "containers"):
        for container in _dicts(pod_spec.get(key)):
            for env_from in _dicts(container.get("envFrom")):
                add(_get(env_from, "configMapRef", "name"))
            for env in _dicts(container.get("env")):
                add(_get(env, "valueFrom", "configMapKeyRef", "name"))
    return sorted(names)


def config_hash(configmaps: list[Mapping[str, Any]]) -> str:
    """sha256 (hex) over the (name, data, binaryData) of the given ConfigMaps.

    Canonical JSON (sorted keys, ConfigMaps sorted by name, fixed separators) makes the
    hash independent of list order, map order and of metadata such as resourceVersion
    or labels, so only a change to the content a pod can see rolls the Deployment.
    """
    content = sorted(
        (
            str(_get(cm, "metadata", "name") or ""),
            _get(cm, "data") or {},
            _get(cm, "binaryData") or {},
        )
        for cm in configmaps
    )
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def current_hash(deployment: Mapping[str, Any]) -> Optional[str]:
    """The hash annotation currently on the pod template, if any."""
    annotations = _get(deployment, "spec", "template", "metadata", "annotations")
    if not isinstance(annotations, dict):
        return None
    value = annotations.get(HASH_ANNOTATION)
    return value if isinstance(value, str) else None


def hash_patch(new_hash: str) -> dict[str, Any]:
    """JSON merge patch (RFC 7386) that stamps new_hash and touches nothing else."""
    return {"spec": {"template": {"metadata": {"annotations": {HASH_ANNOTATION: new_hash}}}}}


# --------------------------------------------------------------------------------------
# Generated stubs and the Kubernetes client (imported here so the pure logic above has
# no dependency a reader must install to understand it).
# --------------------------------------------------------------------------------------

if str(STUBS_ROOT) not in sys.path:
    sys.path.insert(0, str(STUBS_ROOT))
try:
    import grpc
    import urllib3
    from google.protobuf import text_format
    from ctrlhub.v1 import controller_pb2 as pb
    from ctrlhub.v1 import controller_pb2_grpc as pb_grpc
    from ctrlhub.v1 import read_pb2, registration_pb2, resource_pb2
except ImportError as _exc:  # pragma: no cover - exercised by hand only
    raise SystemExit(
        f"config-rollout: cannot import the ctrlhub.v1 stubs ({_exc}); "
        f"run `python {HERE / 'gen.py'}` after `pip install -r {HERE / 'requirements.txt'}`"
    ) from _exc

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

DEPLOYMENT = resource_pb2.ResourceType(group="apps", version="v1", kind="Deployment", plural="deployments")
CONFIGMAP = resource_pb2.ResourceType(group="", version="v1", kind="ConfigMap", plural="configmaps")


def registration() -> registration_pb2.Register:
    """The Register message: what this controller reconciles and what wakes it up."""
    return registration_pb2.Register(
        controller_name=CONTROLLER_NAME,
        mode=registration_pb2.Register.MODE_RECONCILE,
        primary=DEPLOYMENT,
        watches=[registration_pb2.WatchedResource(resource=CONFIGMAP, label_key=ROLLOUT_LABEL)],
        # The Deployment arrives with the request: saves a Get per reconcile.
        include_object=True,
        max_in_flight=MAX_IN_FLIGHT,
    )


class FatalError(Exception):
    """The manager refused us in a way retrying cannot fix; exit non-zero."""


class ReconcileError(Exception):
    """A transient failure, reported as ReconcileResult.Error (retried with backoff)."""


@dataclass
class Deadline:
    """A request's deadline on our monotonic clock (immune to wall-clock jumps mid-run)."""

    at_monotonic: float

    @classmethod
    def from_request(cls, req: pb.ReconcileRequest) -> "Deadline":
        if not req.HasField("deadline"):
            return cls(float("inf"))
        remaining = req.deadline.ToNanoseconds() / 1e9 - time.time()
        return cls(time.monotonic() + remaining - DEADLINE_MARGIN_S)

    def remaining(self) -> float:
        """Seconds left; raises ReconcileError when none are (callers then stop acting)."""
        left = self.at_monotonic - time.monotonic()
        if left <= 0:
            raise ReconcileError("request deadline passed")
        return left


class Session:
    """One Connect stream: its outgoing queue, registration state and in-flight count.

    Results for a request must go back on the session that delivered it; once that
    session is gone the manager re-delivers the key, so a late result is dropped.
    """

    _CLOSE = object()

    def __init__(self) -> None:
        self.outbox: "queue.Queue[Any]" = queue.Queue()
        self.session_id = ""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._registered = False
        self._drain_wanted = False
        self._drained = False
        self._in_flight = 0
        self._call: Optional[Any] = None

    def messages(self) -> Iterator[pb.ControllerMessage]:
        """The request iterator gRPC consumes on its own thread."""
        while True:
            item = self.outbox.get()
            if item is Session._CLOSE:
                return
            yield item

    def send(self, msg: pb.ControllerMessage) -> bool:
        """Queue msg for the stream; False when the stream has already ended."""
        with self._lock:
            if self._closed:
                return False
            self.outbox.put(msg)
            return True

    def attach_call(self, call: Any) -> None:
        """Remember the Connect call so close() can cancel it (even if closed already)."""
        with self._lock:
            self._call = call
            closed = self._closed
        if closed:
            call.cancel()

    def close(self) -> None:
        """End the stream from our side: no more sends, and cancel the call."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.outbox.put(Session._CLOSE)
            call = self._call
            self._idle.notify_all()
        if call is not None:
            call.cancel()

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    @property
    def registered(self) -> bool:
        with self._lock:
            return self._registered

    def mark_registered(self, session_id: str) -> None:
        with self._lock:
            self.session_id = session_id
            self._registered = True
            self._send_drain_locked()

    def drain(self) -> bool:
        """Ask the manager to drain this session. Returns False if it is not registered
        yet (there is then nothing in flight, so the caller may simply close it); a
        Drain is then still sent should Registered arrive in the meantime."""
        with self._lock:
            self._drain_wanted = True
            self._send_drain_locked()
            return self._registered

    def _send_drain_locked(self) -> None:
        # Drain is only meaningful after Registered, and must be sent at most once.
        if self._drain_wanted and self._registered and not self._drained and not self._closed:
            self._drained = True
            self.outbox.put(pb.ControllerMessage(drain=pb.Drain()))

    def started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until none of this session's requests is being worked on."""
        with self._lock:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def wait_closed(self, timeout: float) -> bool:
        with self._lock:
            return self._idle.wait_for(lambda: self._closed, timeout)


@dataclass
class Options:
    manager: str
    token: str
    kubeconfig: Optional[str]
    # Read anew on every connect (a projected ServiceAccount token the kubelet rotates).
    token_file: Optional[str] = None


def grpc_target(address: str) -> str:
    """The gRPC target for a manager address given as ``host:port`` or ``http://host:port``
    (the form every ctrlhub SDK and example accepts). This controller speaks plaintext only."""
    if address.startswith("https://"):
        raise ValueError(f"{address}: this controller has no TLS; use host:port or http://host:port")
    target = address.removeprefix("http://").rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address}: expected host:port, e.g. ctrlhub.ctrlhub-system.svc:9090")
    return target


class RolloutController:
    """Owns the gRPC channel, the Kubernetes client, the worker pool and the session loop."""

    def __init__(self, opts: Options, api_client: k8s.ApiClient) -> None:
        self.opts = opts
        # HTTP/2 keepalive so a dead manager is noticed and we reconnect promptly
        # (the proto asks for ~30 s).
        self.channel = grpc.insecure_channel(
            grpc_target(opts.manager),
            options=[("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000)],
        )
        self.stub = pb_grpc.ControllerManagerStub(self.channel)
        self.apps = k8s.AppsV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="reconcile")
        self.stopping = threading.Event()
        self._session_lock = threading.Lock()
        self._session: Optional[Session] = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The bearer token, from --token-file as it is now when one is given."""
        token = self.opts.token
        if self.opts.token_file:
            token = Path(self.opts.token_file).read_text().strip()
        return (("authorization", f"Bearer {token}"),)

    # ---- signal handling -------------------------------------------------------------

    def request_stop(self) -> None:
        """Called from the signal handler: only sets a flag (safe in a handler); the
        drainer thread does the actual sending."""
        self.stopping.set()

    def _drainer(self) -> None:
        """On SIGTERM: Drain the live session, let in-flight work finish, then make sure
        the stream ends even if the manager never closes it."""
        self.stopping.wait()
        with self._session_lock:
            session = self._session
        if session is None:
            return  # between sessions: run() sees `stopping` and returns
        if not session.drain():
            session.close()  # not registered yet, so nothing is in flight
            return
        log.info("SIGTERM: sent Drain; answering in-flight requests before exiting")
        # Each request is bounded by its deadline (1 min by default), hence the bound.
        if not session.wait_idle(DRAIN_WORK_TIMEOUT_S):
            log.warning("in-flight requests still running after %.0fs; abandoning them", DRAIN_WORK_TIMEOUT_S)
        # The manager ends the stream once it has our results; don't wait forever for it.
        if not session.wait_closed(DRAIN_CLOSE_GRACE_S):
            log.warning("manager did not end the stream %.0fs after Drain; closing it", DRAIN_CLOSE_GRACE_S)
            session.close()

    # ---- main loop -------------------------------------------------------------------

    def run(self) -> int:
        """Connect, serve, reconnect with backoff; returns the process exit code."""
        threading.Thread(target=self._drainer, name="drainer", daemon=True).start()
        backoff = BACKOFF_START_S
        try:
            while not self.stopping.is_set():
                session = Session()
                try:
                    self._run_session(session)
                except grpc.RpcError as err:
                    code, details = _rpc_status(err)
                    if self.stopping.is_set() and code == grpc.StatusCode.CANCELLED:
                        break  # we cancelled it ourselves while shutting down
                    if code in _FATAL_BEFORE_REGISTERED and not session.registered:
                        raise FatalError(
                            f"manager at {self.opts.manager} refused the stream: {code.name}: {details}"
                        ) from err
                    log.warning(
                        "stream to %s failed: %s: %s", self.opts.manager, code.name if code else "?", details
                    )
                if self.stopping.is_set():
                    break
                if session.registered:
                    backoff = BACKOFF_START_S  # a session that got going resets the backoff
                log.info("reconnecting in %.1fs", backoff)
                if self.stopping.wait(backoff):
                    break
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        except FatalError as err:
            log.error("%s", err)
            return 1
        finally:
            # Let running reconciles finish (each is bounded by its deadline) before exit.
            self.pool.shutdown(wait=True)
            self.channel.close()
        log.info("stopped")
        return 0

    def _run_session(self, session: Session) -> None:
        """One Connect stream, from Register until it ends.

        Returns when the stream ends normally, after Revoked, or after Rejected with
        UNAVAILABLE (a standby manager replica: reconnect). Raises grpc.RpcError on
        stream errors and FatalError on any other Rejected and on Revoked(SUPERSEDED),
        which must not re-register in a loop.
        """
        session.send(pb.ControllerMessage(register=registration()))
        with self._session_lock:
            self._session = session
        try:
            if self.stopping.is_set():
                return  # SIGTERM arrived while we were (re)connecting
            responses = self.stub.Connect(session.messages(), metadata=self.metadata)
            session.attach_call(responses)
            for msg in responses:
                kind = msg.WhichOneof("message")
                if kind == "registered":
                    self._on_registered(session, msg.registered)
                elif kind == "rejected":
                    r = msg.rejected
                    text = f"registration rejected: code={r.code} field={r.field or '-'}: {r.message}"
                    if r.code == grpc.StatusCode.UNAVAILABLE.value[0]:
                        log.warning("%s (standby manager replica; reconnecting)", text)
                        return
                    raise FatalError(text)
                elif kind == "reconcile":
                    if not session.registered:
                        log.warning("reconcile request before Registered; ignoring id=%s", msg.reconcile.id)
                        continue
                    session.started()
                    self.pool.submit(self._handle, session, msg.reconcile)
                elif kind == "revoked":
                    r = msg.revoked
                    text = f"session revoked: {_enum_name(registration_pb2.Revoked.Reason, r.reason)} code={r.code}: {r.message}"
                    if r.reason == registration_pb2.Revoked.REASON_SUPERSEDED:
                        raise FatalError(f"{text}; this replica runs an outdated registration")
                    log.warning("%s", text)
                    return
                else:
                    # A newer manager's message: the proto says log and ignore.
                    log.info("ignoring unknown manager message %r", kind)
            log.info("manager ended the stream")
        finally:
            session.close()
            with self._session_lock:
                if self._session is session:
                    self._session = None

    def _on_registered(self, session: Session, reg: registration_pb2.Registered) -> None:
        log.info(
            "registered: session=%s leader=%s effective={%s}",
            reg.session_id,
            reg.leader_identity or "-",
            text_format.MessageToString(reg.effective, as_one_line=True),
        )
        for readable in reg.readable:
            if readable.metadata_only and readable.resource.kind == "ConfigMap":
                log.info("ConfigMaps are cached metadata-only; their data will be read from the API server")
        # Also sends the Drain a SIGTERM asked for while we were registering.
        session.mark_registered(reg.session_id)

    # ---- one request -----------------------------------------------------------------

    def _handle(self, session: Session, req: pb.ReconcileRequest) -> None:
        key = f"{req.key.namespace}/{req.key.name}"
        log.info("reconcile start key=%s attempt=%d", key, req.attempt)
        try:
            result = pb.ReconcileResult(id=req.id)
            try:
                self.reconcile(session, req, Deadline.from_request(req))
                result.done.SetInParent()
                outcome = "done"
            except ReconcileError as err:
                result.error.message = str(err)
                outcome = "error"
                log.warning("reconcile key=%s failed: %s", key, err)
            except Exception as err:  # noqa: BLE001 - a bug must not kill the worker or stall the key
                log.exception("reconcile key=%s crashed", key)
                result.error.message = f"controller bug: {type(err).__name__}: {err}"
                outcome = "error"
            log.info("reconcile end key=%s outcome=%s", key, outcome)
            if not session.send(pb.ControllerMessage(result=result)):
                log.info("session ended before key=%s was answered; the manager re-delivers it", key)
        finally:
            session.finished()

    def reconcile(self, session: Session, req: pb.ReconcileRequest, deadline: Deadline) -> None:
        """Make the Deployment's hash annotation match its ConfigMaps. Raises ReconcileError."""
        which = req.WhichOneof("object")
        if which != "object_json":
            # A tombstone (deleted / left scope) or no known state: nothing to roll.
            return
        try:
            deployment = json.loads(req.object_json)
        except ValueError as err:
            raise ReconcileError(f"object_json is not valid JSON: {err}") from err

        namespace = req.key.namespace
        configmaps = []
        for name in mounted_configmaps(deployment):
            cm = self.read_configmap(session, namespace, name, deadline)
            if cm is not None:
                configmaps.append(cm)
        want = config_hash(configmaps)
        if current_hash(deployment) == want:
            return

        if session.closed:
            # The contract: stop acting once the session is gone (the key is re-delivered).
            raise ReconcileError("session ended before the patch; not acting")
        try:
            self.apps.patch_namespaced_deployment(
                req.key.name,
                namespace,
                hash_patch(want),
                _content_type="application/merge-patch+json",
                _request_timeout=deadline.remaining(),
            )
        except ApiException as err:
            if err.status == 404:
                return  # deleted meanwhile; its tombstone follows
            raise ReconcileError(f"patching deployment {namespace}/{req.key.name}: {_api_error(err)}") from err
        except urllib3.exceptions.HTTPError as err:  # connection refused, timeouts, TLS
            raise ReconcileError(f"patching deployment {namespace}/{req.key.name}: {err}") from err
        log.info("rolled deployment %s/%s: %s=%s", namespace, req.key.name, HASH_ANNOTATION, want)

    def read_configmap(self, session: Session, namespace: str, name: str, deadline: Deadline) -> Optional[dict[str, Any]]:
        """A ConfigMap from the manager's cache (None if it does not exist).

        Watched types may be cached metadata-only; then the cache has no data and we
        read that one ConfigMap from the API server instead.
        """
        try:
            resp = self.stub.Get(
                read_pb2.GetRequest(session_id=session.session_id, resource=CONFIGMAP, namespace=namespace, name=name),
                metadata=self.metadata,
                timeout=deadline.remaining(),
            )
        except grpc.RpcError as err:
            code, details = _rpc_status(err)
            if code == grpc.StatusCode.NOT_FOUND:
                return None
            raise ReconcileError(f"Get configmap {namespace}/{name}: {code.name if code else '?'}: {details}") from err
        if not resp.metadata_only:
            try:
                return json.loads(resp.object_json)
            except ValueError as err:
                raise ReconcileError(f"Get configmap {namespace}/{name}: invalid JSON: {err}") from err
        try:
            # Raw JSON rather than the typed model: the hash must see exactly the
            # field names and values the API server (and the cache) use.
            raw = self.core.read_namespaced_config_map(
                name, namespace, _preload_content=False, _request_timeout=deadline.remaining()
            )
            return json.loads(raw.data)
        except ApiException as err:
            if err.status == 404:
                return None
            raise ReconcileError(f"reading configmap {namespace}/{name}: {_api_error(err)}") from err
        except urllib3.exceptions.HTTPError as err:
            raise ReconcileError(f"reading configmap {namespace}/{name}: {err}") from err
        except ValueError as err:
            raise ReconcileError(f"reading configmap {namespace}/{name}: invalid JSON: {err}") from err


_FATAL_BEFORE_REGISTERED = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
}


def _rpc_status(err: grpc.RpcError) -> tuple[Optional[grpc.StatusCode], str]:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    return code, details or ""


def _api_error(err: ApiException) -> str:
    """'<status> <reason>: <Status.message>' from a Kubernetes API error."""
    message = ""
    if err.body:
        try:
            message = json.loads(err.body).get("message", "")
        except (ValueError, AttributeError):
            message = str(err.body)[:200]
    return f"{err.status} {err.reason}: {message}".rstrip(": ")


def _enum_name(enum: Any, value: int) -> str:
    """Enum value name, or the number for a value newer than our stubs."""
    try:
        return str(enum.Name(value))
    except ValueError:
        return str(value)


def kubernetes_client(kubeconfig: Optional[str]) -> k8s.ApiClient:
    """A client from --kubeconfig/KUBECONFIG, else in-cluster config, else ~/.kube/config."""
    if kubeconfig:
        return k8s_config.new_client_from_config(config_file=kubeconfig)
    configuration = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
        return k8s.ApiClient(configuration)
    except k8s_config.ConfigException:
        return k8s_config.new_client_from_config()


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--manager",
        default=os.environ.get("CTRLHUB_ADDR", "127.0.0.1:9090"),
        help="manager gRPC address host:port or http://host:port (env CTRLHUB_ADDR; default 127.0.0.1:9090; plaintext)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("CTRLHUB_TOKEN", "dev"),
        help="bearer token sent as `authorization: Bearer <token>` (env CTRLHUB_TOKEN; default dev)",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("CTRLHUB_TOKEN_FILE") or None,
        help="file holding the bearer token, read on every connect (env CTRLHUB_TOKEN_FILE); takes precedence over --token",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or None,
        help="kubeconfig for writing Deployments (env KUBECONFIG; default in-cluster, then ~/.kube/config)",
    )
    p.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("LOG_FORMAT", "text"),
        help="log lines as text or one JSON object per line (env LOG_FORMAT; default text)",
    )
    return p.parse_args(argv)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger and message."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "timestamp": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "target": record.name,
            "fields": {"message": record.getMessage()},
        }
        if record.exc_info:
            line["fields"]["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(message)s",
    )
    if args.log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    try:
        grpc_target(args.manager)
    except ValueError as err:
        log.error("--manager: %s", err)
        return 2
    try:
        api_client = kubernetes_client(args.kubeconfig)
    except (k8s_config.ConfigException, OSError) as err:
        log.error("cannot load Kubernetes configuration: %s", err)
        return 2
    controller = RolloutController(
        Options(manager=args.manager, token=args.token, kubeconfig=args.kubeconfig, token_file=args.token_file),
        api_client,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signo, _frame: controller.request_stop())
    log.info("config-rollout starting: manager=%s", args.manager)
    return controller.run()


if __name__ == "__main__":
    sys.exit(main())
