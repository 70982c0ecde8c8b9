// The Website operator (deploy/examples/website/crd.yaml): a Deployment and a Service per
// Website, a finalizer that keeps the site's entry in the ConfigMap `website-registry`, and a
// Ready condition. Reads come from the manager's cache; writes go to the API server.
// Run it against `ctrlhub dev`: CTRLHUB_ADDR=127.0.0.1:9090 KUBECONFIG=.ctrlhub-dev/kubeconfig
import type * as k8s from "@kubernetes/client-node";
import { Action, type Condition, type ReconcileRequest, controller, kind, kinds, setCondition } from "@ctrlhub/sdk";

interface Website extends k8s.KubernetesObject {
  spec?: { image?: string; replicas?: number };
  status?: { conditions?: Condition[]; readyReplicas?: number; observedGeneration?: number };
}

const FINALIZER = "example.ctrlhub.io/registry";

/** Sets (without `image`: removes) this site's entry in its namespace's registry ConfigMap. */
async function register(req: ReconcileRequest<Website>, image?: string): Promise<void> {
  // Applied with the site's own field manager: an apply that leaves the entry out removes it.
  const data = image === undefined ? {} : { [req.name]: image };
  const registry = { apiVersion: "v1", kind: "ConfigMap", metadata: { name: "website-registry", namespace: req.namespace }, data };
  await req.apply(registry, { fieldManager: `website-${req.name}` });
}

await controller("website")
  .for(kind<Website>("example.ctrlhub.io/v1", "Website", "websites"))
  .owns(kinds.Deployment) // children are cached in full: their status is readable
  .owns(kinds.Service)
  .includeObject()
  .reconcile(async (req) => {
    const site = req.object;
    // No object: deleted (the finalizer already cleaned up) or not in the cache. Never clean up here.
    if (site === undefined) return Action.done();
    // Being deleted: the entry goes first, exactly once, then the finalizer (and the object).
    if (await req.finalizers.finalize(site, FINALIZER, () => register(req))) return Action.done();
    if (site.metadata?.deletionTimestamp !== undefined) return Action.done();
    await req.finalizers.ensure(site, FINALIZER);
    const [image, replicas] = [site.spec?.image ?? "nginx:1.27", site.spec?.replicas ?? 1];
    await register(req, image);
    // Server-side apply with force, owned by the site: a hand-edited or deleted child is put back.
    const labels = { "app.kubernetes.io/name": req.name };
    const container = { name: "web", image, ports: [{ containerPort: 8080 }] };
    await req.apply(req.adopt({ apiVersion: "apps/v1", kind: "Deployment", metadata: { name: req.name, labels },
      spec: { replicas, selector: { matchLabels: labels }, template: { metadata: { labels }, spec: { containers: [container] } } },
    } satisfies k8s.V1Deployment, site));
    await req.apply(req.adopt({ apiVersion: "v1", kind: "Service", metadata: { name: req.name, labels },
      spec: { selector: labels, ports: [{ port: 80, targetPort: 8080 }] } } satisfies k8s.V1Service, site));
    // Ready once the Deployment's pods are: its status comes from the manager's cache.
    const deployment = await req.reader.get(kinds.Deployment, { namespace: req.namespace, name: req.name });
    const ready = deployment?.status?.readyReplicas ?? 0;
    const [conditions, generation] = [[...(site.status?.conditions ?? [])], site.metadata?.generation ?? 0];
    const changed = setCondition(conditions, { type: "Ready", status: ready >= replicas, observedGeneration: generation,
      reason: ready >= replicas ? "ReplicasReady" : "ReplicasNotReady", message: `${ready}/${replicas} replicas ready` });
    if (changed || site.status?.readyReplicas !== ready || site.status?.observedGeneration !== generation) {
      await req.patchStatus(site, { conditions, readyReplicas: ready, observedGeneration: generation });
      if (changed) req.events.info(site, ready >= replicas ? "Ready" : "NotReady", `${ready}/${replicas} replicas ready`);
    }
    return Action.done();
  })
  .run();
