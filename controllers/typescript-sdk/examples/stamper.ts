// Stamps every ConfigMap labelled example.com/stamp=true with who stamped it and when.
// Run it against `ctrlhub dev`: CTRLHUB_ADDR=127.0.0.1:9090 KUBECONFIG=.ctrlhub-dev/kubeconfig
import * as k8s from "@kubernetes/client-node";
import { Action, controller, kinds } from "@ctrlhub/sdk";

const kc = new k8s.KubeConfig();
kc.loadFromDefault(); // KUBECONFIG, ~/.kube/config or the pod's ServiceAccount
const core = kc.makeApiClient(k8s.CoreV1Api);
const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

await controller("stamper")
  .for<k8s.V1ConfigMap>(kinds.ConfigMap)
  .withLabels({ "example.com/stamp": "true" })
  .includeObject() // deliver the ConfigMap with each request
  .concurrency(4)
  .reconcile(async (req) => {
    const cm = req.object;
    if (cm === undefined || cm.metadata?.annotations?.["example.com/stamped-by"]) {
      return Action.done(); // deleted, or already stamped
    }
    const annotations = { "example.com/stamped-by": "stamper", "example.com/stamped-at": new Date().toISOString() };
    await core.patchNamespacedConfigMap(
      { name: req.name, namespace: req.namespace, body: { metadata: { annotations } } },
      mergePatch,
    );
    req.log.info(`stamped ${req.namespace}/${req.name}`);
    return Action.done();
  })
  .run(); // until SIGTERM or Ctrl-C, which drain
