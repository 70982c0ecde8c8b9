#!/usr/bin/env python3
"""config-rollout: rolls a Deployment when a ConfigMap it uses changes (stamps a hash of them into
its pod template), on the ctrlhub Python SDK, which owns sessions, retries, deadlines and Drain."""

import argparse
import hashlib
import json
import logging
import os
import threading
from datetime import UTC, datetime
from typing import Any

import ctrlhub
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

CONTROLLER_NAME, HASH_ANNOTATION, ROLLOUT_LABEL = "config-rollout", "ctrlhub.io/config-hash", "ctrlhub.io/rollout"
DEPLOYMENT = ctrlhub.Kind("apps", "v1", "Deployment", "deployments")
CONFIGMAP = ctrlhub.Kind("", "v1", "ConfigMap", "configmaps")
api: k8s.ApiClient | None = None  # the controller's own credentials: ctrlhub never proxies writes


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def mounted_configmaps(deployment: dict[str, Any]) -> list[str]:
    """Names of the ConfigMaps in the pod template: volumes (projected too), envFrom, env valueFrom."""
    pod = _get(deployment, "spec", "template", "spec")
    volumes = _dicts(_get(pod, "volumes"))
    refs = [_get(v, "configMap", "name") for v in volumes]
    refs += [_get(s, "configMap", "name") for v in volumes for s in _dicts(_get(v, "projected", "sources"))]
    for c in _dicts(_get(pod, "initContainers")) + _dicts(_get(pod, "containers")):
        refs += [_get(e, "configMapRef", "name") for e in _dicts(c.get("envFrom"))]
        refs += [_get(e, "valueFrom", "configMapKeyRef", "name") for e in _dicts(c.get("env"))]
    return sorted({r for r in refs if isinstance(r, str) and r})


def config_hash(configmaps: list[dict[str, Any]]) -> str:
    """sha256 of canonical JSON of sorted (name, data, binaryData): blind to order and metadata."""
    content = sorted((str(_get(c, "metadata", "name") or ""), c.get("data") or {}, c.get("binaryData") or {}) for c in configmaps)
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def current_hash(deployment: dict[str, Any]) -> str | None:
    value = _get(deployment, "spec", "template", "metadata", "annotations", HASH_ANNOTATION)
    return value if isinstance(value, str) else None


def hash_patch(new_hash: str) -> dict[str, Any]:
    return {"spec": {"template": {"metadata": {"annotations": {HASH_ANNOTATION: new_hash}}}}}


operator = ctrlhub.Operator()


@operator.reconcile(DEPLOYMENT, name=CONTROLLER_NAME, watches=[ctrlhub.Watch(CONFIGMAP, label=ROLLOUT_LABEL)],
                    include_object=True, max_concurrent=2)
def reconcile(key: ctrlhub.Key, obj: dict[str, Any] | None, reader: ctrlhub.SyncReader,
              deadline: datetime | None, cancelled: threading.Event, logger: logging.LoggerAdapter[logging.Logger]) -> None:
    """Make the Deployment's hash annotation match its ConfigMaps (sync: the SDK runs it in a thread)."""
    if obj is None:  # deleted, or no known state: nothing to roll
        return
    want = config_hash([cm for name in mounted_configmaps(obj) if (cm := read_configmap(reader, key.namespace, name))])
    if current_hash(obj) == want:
        return
    if cancelled.is_set():
        raise ctrlhub.TemporaryError("cancelled before the patch; not acting")
    timeout = (deadline - datetime.now(UTC)).total_seconds() if deadline else None
    try:
        k8s.AppsV1Api(api).patch_namespaced_deployment(key.name, key.namespace, hash_patch(want), _request_timeout=timeout,
                                                       _content_type="application/merge-patch+json")
    except ApiException as err:
        if ctrlhub.is_not_found(err):
            return  # deleted meanwhile; its tombstone follows
        raise ctrlhub.TemporaryError(f"patching deployment {key}: {err.status} {err.reason}") from err
    logger.info("rolled deployment %s: %s=%s", key, HASH_ANNOTATION, want)


def read_configmap(reader: ctrlhub.SyncReader, namespace: str, name: str) -> dict[str, Any] | None:
    """From the manager's cache, which holds watched ConfigMaps in full."""
    return reader.get(CONFIGMAP, namespace, name)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manager", default=os.environ.get("CTRLHUB_ADDR", "127.0.0.1:9090"), help="manager gRPC address (env CTRLHUB_ADDR)")
    p.add_argument("--token", default=os.environ.get("CTRLHUB_TOKEN", "dev"), help="bearer token (env CTRLHUB_TOKEN; default dev)")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="for writes; default in-cluster, then ~/.kube/config")
    p.add_argument("--token-file", default=os.environ.get("CTRLHUB_TOKEN_FILE"), help="token read on every connect; wins over --token")
    p.add_argument("--log-level", help="error, warn, info, debug or trace (default: env CTRLHUB_LOG, else info)")
    p.add_argument("--log-format", choices=["text", "json"], help="json: a JSON object per line (default: env CTRLHUB_LOG_FORMAT, else text)")
    args = p.parse_args(argv)
    global api
    try:  # --kubeconfig, else the pod's ServiceAccount inside a cluster, else KUBECONFIG or ~/.kube/config
        in_pod = not args.kubeconfig and "KUBERNETES_SERVICE_HOST" in os.environ and k8s_config.load_incluster_config() is None
        api = k8s.ApiClient() if in_pod else k8s_config.new_client_from_config(args.kubeconfig)
    except (k8s_config.ConfigException, OSError) as err:
        raise SystemExit(f"config-rollout: cannot load Kubernetes configuration: {err}") from None
    operator.api_client = api  # the SDK's write helpers (Events about failed reconciles) use it too
    config = ctrlhub.Config(addr=args.manager, token=args.token, token_file=args.token_file or None,
                            health_addr=os.environ.get("CTRLHUB_HEALTH_ADDR") or None)
    operator.run(config, log_level=args.log_level, log_format=args.log_format)


if __name__ == "__main__":
    main()
