// The Website operator (deploy/examples/website/crd.yaml): a Deployment and a Service per
// Website, a finalizer that keeps the site's entry in the ConfigMap `website-registry`, and a
// Ready condition. Reads come from the manager's cache; writes go to the API server.
// Run it against `ctrlhub dev`: CTRLHUB_ADDR=127.0.0.1:9090 KUBECONFIG=.ctrlhub-dev/kubeconfig
import * as k8s from "@kubernetes/client-node";
import { Action, type Condition, controller, kind, kinds, setCondition } from "@ctrlhub/sdk";
import { finalize } from "@ctrlhub/sdk/kubernetes";

interface Website extends k8s.KubernetesObject {
  spec?: { image?: string; replicas?: number };
  status?: { conditions?: Condition[]; readyReplicas?: number; observedGeneration?: number };
}

const Deployments = kind<k8s.V1Deployment>("apps/v1", "Deployment");
const kc = new k8s.KubeConfig();
kc.loadFromDefault();
const objects = k8s.KubernetesObjectApi.makeApiClient(kc);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
const apply = (obj: k8s.KubernetesObject) => objects.patch(obj, undefined, undefined, "website", true, k8s.PatchStrategy.ServerSideApply);

/** Sets (or with `null` removes) this site's entry in the namespace's registry ConfigMap. */
async function register(namespace: string, name: string, image: string | null): Promise<void> {
  const registry = { apiVersion: "v1", kind: "ConfigMap", metadata: { name: "website-registry", namespace } };
  await objects.patch({ ...registry, data: { [name]: image } }, undefined, undefined, "website", undefined, k8s.PatchStrategy.MergePatch)
    .catch(async (err: unknown) => {
      if (!(err instanceof k8s.ApiException && err.code === 404)) throw err;
      if (image !== null) await objects.create({ ...registry, data: { [name]: image } });
    });
}

await controller("website")
  .for(kind<Website>("example.ctrlhub.io/v1", "Website", "websites"))
  .owns(Deployments) // children are cached in full: their status is readable
  .owns(kinds.Service)
  .includeObject()
  .reconcile(async (req) => {
    // No object: deleted (the finalizer already cleaned up) or not in the cache. Never clean up here.
    if (req.object === undefined) return Action.done();
    return finalize(objects, req.object, "example.ctrlhub.io/registry", {
      cleanup: () => register(req.namespace, req.name, null), // before the finalizer goes, exactly once
      apply: async (site) => {
        const [image, replicas] = [site.spec?.image ?? "nginx:1.27", site.spec?.replicas ?? 1];
        await register(req.namespace, req.name, image);
        const labels = { "app.kubernetes.io/name": req.name };
        const metadata = { name: req.name, namespace: req.namespace, labels, ownerReferences: [
          { apiVersion: "example.ctrlhub.io/v1", kind: "Website", name: req.name, uid: site.metadata?.uid ?? "", controller: true, blockOwnerDeletion: true },
        ] };
        // Server-side apply with force: a hand-edited or deleted child is put back.
        await apply({ apiVersion: "apps/v1", kind: "Deployment", metadata, spec: { replicas, selector: { matchLabels: labels },
          template: { metadata: { labels }, spec: { containers: [{ name: "web", image, ports: [{ containerPort: 8080 }] }] } } } } as k8s.V1Deployment);
        await apply({ apiVersion: "v1", kind: "Service", metadata, spec: { selector: labels, ports: [{ port: 80, targetPort: 8080 }] } } as k8s.V1Service);
        const deployment = await req.reader.get(Deployments, { namespace: req.namespace, name: req.name });
        const ready = deployment?.status?.readyReplicas ?? 0;
        const conditions = [...(site.status?.conditions ?? [])];
        const generation = site.metadata?.generation ?? 0;
        const changed = setCondition(conditions, { type: "Ready", status: ready >= replicas, observedGeneration: generation,
          reason: ready >= replicas ? "ReplicasReady" : "ReplicasNotReady", message: `${ready}/${replicas} replicas ready` });
        if (changed || site.status?.readyReplicas !== ready || site.status?.observedGeneration !== generation) {
          await custom.patchNamespacedCustomObjectStatus({ group: "example.ctrlhub.io", version: "v1", plural: "websites",
            namespace: req.namespace, name: req.name, body: { status: { conditions, readyReplicas: ready, observedGeneration: generation } } }, mergePatch);
        }
        return Action.done();
      },
    });
  })
  .run();
