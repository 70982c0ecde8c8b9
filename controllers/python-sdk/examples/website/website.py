"""The Website operator: a Deployment and a Service per Website, a registry entry kept under a
finalizer, and a Ready condition (deploy/examples/website/crd.yaml holds the CRD)."""
import ctrlhub
from ctrlhub import conditions
from kubernetes import client

FINALIZER, REGISTRY = "example.ctrlhub.io/registry", "website-registry"
WEBSITE = ctrlhub.Kind("example.ctrlhub.io", "v1", "Website")


def set_registry(api: client.ApiClient, ns: str, name: str, image: str | None) -> None:
    """``data.<name>`` of the registry ConfigMap (the external state): the image, or removed."""
    core = client.CoreV1Api(api)
    try:
        core.patch_namespaced_config_map(REGISTRY, ns, {"data": {name: image}}, _content_type="application/merge-patch+json")
    except Exception as err:
        if not ctrlhub.is_not_found(err):
            raise  # retried with backoff, as any exception
        if image is not None:
            core.create_namespaced_config_map(ns, {"metadata": {"name": REGISTRY}, "data": {name: image}})


def children(site: dict, image: str, replicas: int) -> list[dict]:
    labels = {"app.kubernetes.io/name": site["metadata"]["name"]}
    meta = {"name": site["metadata"]["name"], "labels": labels}
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": image, "ports": [{"containerPort": 8080}]}]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                  "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": dict(meta),
               "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}}
    return [deployment, service]


@ctrlhub.reconcile(WEBSITE, owns=["apps/v1/Deployment", "v1/Service"], max_concurrent=4)
def website(obj: dict | None, request: ctrlhub.SyncRequest) -> ctrlhub.Result:
    if obj is None:
        return None  # gone, or not in the cache: a deletion always comes first as a deleting object
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    finalizers = request.finalizers
    if finalizers.finalize(obj, FINALIZER, lambda site: set_registry(request.api_client, ns, name, None)):
        return None  # the entry is gone, then the finalizer: the Website goes now
    if finalizers.is_deleting(obj):
        return None
    finalizers.ensure(obj, FINALIZER)
    spec = obj.get("spec") or {}
    image, replicas = spec.get("image", "nginx:1.27"), spec.get("replicas", 1)
    set_registry(request.api_client, ns, name, image)
    for child in children(obj, image, replicas):
        request.apply(request.adopt(child, obj))  # created, or hand edits repaired; unchanged: a no-op
    deployment = request.reader.get("apps/v1/Deployment", ns, name) or {}  # children are cached in full
    ready = (deployment.get("status") or {}).get("readyReplicas") or 0
    status = obj.get("status") or {}
    conds = [dict(c) for c in status.get("conditions") or []]
    generation = obj["metadata"].get("generation")
    changed = conditions.set_condition(conds, "Ready", ready >= replicas, "ReplicasReady" if ready >= replicas else "Waiting",
                                       f"{ready}/{replicas} replicas ready", observed_generation=generation)
    if changed or status.get("readyReplicas") != ready or status.get("observedGeneration") != generation:
        request.patch_status(obj, {"conditions": conds, "readyReplicas": ready, "observedGeneration": generation})
        if changed:
            request.events.info(obj, "Ready" if ready >= replicas else "Waiting", f"{ready}/{replicas} replicas ready")
    return None


if __name__ == "__main__":
    ctrlhub.run()  # CTRLHUB_ADDR (default 127.0.0.1:9090), CTRLHUB_TOKEN (default dev), KUBECONFIG; SIGTERM drains
