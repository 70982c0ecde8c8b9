"""The Website operator: a Deployment and a Service per Website, a registry entry kept under a
finalizer, and a Ready condition (deploy/examples/website/crd.yaml holds the CRD)."""
import ctrlhub
from ctrlhub import conditions, finalizers
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

FINALIZER, REGISTRY, MANAGER = "example.ctrlhub.io/registry", "website-registry", "website-operator"
WEBSITE = ctrlhub.Kind("example.ctrlhub.io", "v1", "Website")
config.load_kube_config()  # KUBECONFIG: the operator's own credentials; ctrlhub serves reads only
core, apps, custom = client.CoreV1Api(), client.AppsV1Api(), client.CustomObjectsApi()
MERGE = {"_content_type": "application/merge-patch+json"}
APPLY = {"_content_type": "application/apply-patch+yaml", "field_manager": MANAGER, "force": True}


def patch_website(ns: str, name: str, body: dict, subresource: str = "") -> None:
    patch = custom.patch_namespaced_custom_object_status if subresource else custom.patch_namespaced_custom_object
    patch("example.ctrlhub.io", "v1", ns, "websites", name, body, **MERGE)


def set_registry(ns: str, name: str, image: str | None) -> None:
    """``data.<name>`` of the registry ConfigMap: the site's image, or removed (None)."""
    try:
        core.patch_namespaced_config_map(REGISTRY, ns, {"data": {name: image}}, **MERGE)
    except ApiException as err:
        if err.status != 404:
            raise  # retried with backoff, as any exception
        if image is not None:
            core.create_namespaced_config_map(ns, {"metadata": {"name": REGISTRY}, "data": {name: image}})


def children(site: dict, image: str, replicas: int) -> tuple[dict, dict]:
    meta = site["metadata"]
    owner = {"apiVersion": "example.ctrlhub.io/v1", "kind": "Website", "name": meta["name"], "uid": meta["uid"], "controller": True}
    labels = {"app.kubernetes.io/name": meta["name"]}
    common = {"name": meta["name"], "namespace": meta["namespace"], "labels": labels, "ownerReferences": [owner]}
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": image, "ports": [{"containerPort": 8080}]}]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": common,
                  "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": common,
               "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}}
    return deployment, service


@ctrlhub.reconcile(WEBSITE, owns=["apps/v1/Deployment", "v1/Service"], max_concurrent=4)
def website(key: ctrlhub.Key, obj: dict | None, reader: ctrlhub.SyncReader) -> ctrlhub.Result:
    if obj is None:
        return None  # gone, or not in the cache: a deletion always comes first as a deleting object
    ns, name = key.namespace, key.name
    if finalizers.is_deleting(obj):
        if finalizers.has_finalizer(obj, FINALIZER):
            set_registry(ns, name, None)  # external state: cleaned up before the finalizer goes
            patch_website(ns, name, finalizers.remove_patch(obj, FINALIZER))
        return None
    if not finalizers.has_finalizer(obj, FINALIZER):
        patch_website(ns, name, finalizers.add_patch(obj, FINALIZER))
        return None  # the update wakes us again
    spec = obj.get("spec") or {}
    image, replicas = spec.get("image", "nginx:1.27"), spec.get("replicas", 1)
    set_registry(ns, name, image)
    deployment, service = children(obj, image, replicas)
    current = reader.get("apps/v1/Deployment", ns, name)  # children are cached in full
    pod = ((current or {}).get("spec") or {}).get("template", {}).get("spec", {})
    if current is None or current["spec"].get("replicas") != replicas or [c.get("image") for c in pod.get("containers", [])] != [image]:
        apps.patch_namespaced_deployment(name, ns, deployment, **APPLY)  # created, or repaired
    if reader.get("v1/Service", ns, name) is None:
        core.patch_namespaced_service(name, ns, service, **APPLY)
    ready = ((current or {}).get("status") or {}).get("readyReplicas") or 0
    status = dict(obj.get("status") or {})
    conds = [dict(c) for c in status.get("conditions") or []]
    generation = obj["metadata"].get("generation")
    changed = conditions.set_condition(conds, "Ready", ready >= replicas, "ReplicasReady" if ready >= replicas else "Waiting",
                                       f"{ready}/{replicas} replicas ready", observed_generation=generation)
    if changed or status.get("readyReplicas") != ready or status.get("observedGeneration") != generation:
        patch_website(ns, name, {"status": {"conditions": conds, "readyReplicas": ready, "observedGeneration": generation}}, "status")
    return None


if __name__ == "__main__":
    ctrlhub.run()  # CTRLHUB_ADDR (default 127.0.0.1:9090), CTRLHUB_TOKEN (default dev); SIGTERM drains
