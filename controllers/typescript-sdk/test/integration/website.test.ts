// The Website operator (examples/website.ts) as its own process against `ctrlhub dev`:
// children created and repaired, the registry entry kept across a restart and removed on
// deletion, Ready once the Deployment's pods are (devcluster runs no pods: the test plays the
// kubelet by patching the Deployment's status).
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import * as k8s from "@kubernetes/client-node";

import { type Proc, REPO, binary, freePort, start, tempDir, waitFor } from "../support.js";

let dev: Proc;
let kc: k8s.KubeConfig;
let kubeconfig: string;
let grpc: string;
let http: string;

before(async () => {
  const dir = tempDir("website");
  const [g, h] = [await freePort(), await freePort()];
  grpc = `127.0.0.1:${g}`;
  http = `http://127.0.0.1:${h}`;
  dev = start(
    binary("ctrlhub"),
    ["dev", "--grpc-addr", grpc, "--http-addr", `127.0.0.1:${h}`, "--state-dir", dir],
    { ...process.env, RUST_LOG: "info" },
    join(dir, "ctrlhub-dev.log"),
  );
  kubeconfig = join(dir, "kubeconfig");
  await waitFor(`ctrlhub dev leads (log ${dev.log})`, async () => {
    if (!dev.running) {
      throw new Error(`ctrlhub dev exited; see ${dev.log}`);
    }
    const status = (await (await fetch(`${http}/status`)).json()) as Record<string, unknown>;
    return existsSync(kubeconfig) && status["leading"] === true ? true : undefined;
  });
  kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  const crd = k8s.loadYaml<k8s.V1CustomResourceDefinition>(readFileSync(join(REPO, "deploy/examples/website/crd.yaml"), "utf8"));
  await kc.makeApiClient(k8s.ApiextensionsV1Api).createCustomResourceDefinition({ body: crd });
});

after(async () => {
  await dev?.stop();
});

function operator(env: NodeJS.ProcessEnv = {}): Proc {
  const log = join(tempDir("website-operator"), "website.log");
  const base: NodeJS.ProcessEnv = { ...process.env };
  delete base["CTRLHUB_LOG"];
  delete base["CTRLHUB_LOG_FORMAT"];
  return start(
    process.execPath,
    [join(REPO, "controllers/typescript-sdk/dist/examples/website.js")],
    { ...base, KUBECONFIG: kubeconfig, CTRLHUB_ADDR: grpc, CTRLHUB_TOKEN: "dev", ...env },
    log,
  );
}

/** The JSON lines of a log written with CTRLHUB_LOG_FORMAT=json (each line must parse). */
function jsonLines(log: string): Array<{ level: string; fields: Record<string, unknown>; span?: Record<string, unknown> }> {
  return readFileSync(log, "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => {
      try {
        return JSON.parse(l) as { level: string; fields: Record<string, unknown>; span?: Record<string, unknown> };
      } catch {
        throw new Error(`not a JSON line: ${l}`);
      }
    });
}

interface Website {
  metadata?: k8s.V1ObjectMeta;
  spec?: { image?: string; replicas?: number };
  status?: { readyReplicas?: number; observedGeneration?: number; conditions?: Array<{ type: string; status: string; reason: string }> };
}

test("the Website operator: children, registry, Ready, a restart, repairs and deletion", async () => {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const apps = kc.makeApiClient(k8s.AppsV1Api);
  const custom = kc.makeApiClient(k8s.CustomObjectsApi);
  const sites = { group: "example.ctrlhub.io", version: "v1", plural: "websites", namespace: "web" };
  const site = async (): Promise<Website> => (await custom.getNamespacedCustomObject({ ...sites, name: "site" })) as Website;
  const registry = async (): Promise<Record<string, string>> =>
    (await core.readNamespacedConfigMap({ name: "website-registry", namespace: "web" })).data ?? {};
  const ready = (w: Website) => w.status?.conditions?.find((c) => c.type === "Ready")?.status;
  const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

  await core.createNamespace({ body: { metadata: { name: "web" } } });
  // The first run logs everything (the Registered message, every wire message) as JSON: no
  // level changes what the operator does; the restarted one logs at the default level, as text.
  let op = operator({ CTRLHUB_LOG: "trace", CTRLHUB_LOG_FORMAT: "json" });
  const traced = op.log;
  try {
    await custom.createNamespacedCustomObject({
      ...sites,
      body: { apiVersion: "example.ctrlhub.io/v1", kind: "Website", metadata: { name: "site" }, spec: { replicas: 2 } },
    });
    const deployment = await waitFor(`the Deployment (log ${op.log})`, () => apps.readNamespacedDeployment({ name: "site", namespace: "web" }));
    assert.equal(deployment.spec?.replicas, 2);
    assert.equal(deployment.spec?.template.spec?.containers[0]?.image, "nginx:1.27", "the CRD's default image");
    assert.deepEqual(deployment.spec?.selector.matchLabels, { "app.kubernetes.io/name": "site" });
    assert.equal(deployment.metadata?.ownerReferences?.[0]?.kind, "Website");
    const service = await waitFor("the Service", () => core.readNamespacedService({ name: "site", namespace: "web" }));
    assert.deepEqual(service.spec?.selector, { "app.kubernetes.io/name": "site" });
    assert.equal(service.spec?.ports?.[0]?.port, 80);
    assert.equal(service.spec?.ports?.[0]?.targetPort, 8080);
    assert.equal((await waitFor("the registry entry", async () => (await registry())["site"])), "nginx:1.27");
    assert.deepEqual((await site()).metadata?.finalizers, ["example.ctrlhub.io/registry"]);
    await waitFor("Ready False while no replica is ready", async () => (ready(await site()) === "False" ? true : undefined));

    // The kubelet's part: both replicas become ready.
    await apps.patchNamespacedDeploymentStatus(
      { name: "site", namespace: "web", body: { status: { replicas: 2, readyReplicas: 2, availableReplicas: 2 } } },
      mergePatch,
    );
    const readySite = await waitFor("Ready True", async () => {
      const w = await site();
      return ready(w) === "True" ? w : undefined;
    });
    assert.equal(readySite.status?.readyReplicas, 2);
    assert.equal(readySite.status?.observedGeneration, readySite.metadata?.generation);

    // A restart: the new process starts from the caches; nothing is taken for a deletion.
    assert.equal(await op.stop(), 0, "SIGTERM drains and exits 0");
    const lines = jsonLines(traced);
    assert.ok(lines.some((l) => l.level === "TRACE"), "trace lines were written");
    assert.ok(lines.some((l) => l.level === "DEBUG" && l.fields["message"] === "effective registration"), "the Registered message at debug");
    assert.ok(lines.some((l) => l.fields["message"] === "registered with manager"));
    assert.ok(lines.some((l) => l.fields["message"] === "reconcile end" && l.fields["outcome"] === "success" && l.span?.["key"] === "web/site"));
    assert.deepEqual(lines.filter((l) => l.level === "ERROR" || l.level === "WARN"), [], "nothing failed at trace level");
    assert.ok(lines.some((l) => l.fields["message"] === "session drained; controller stopped"), "the drain completed");
    op = operator();
    await waitFor(`the restarted operator registered (log ${op.log})`, () =>
      readFileSync(op.log, "utf8").includes("registered with manager") ? true : undefined,
    );

    // Hand edits are repaired on the next reconcile: the restarted operator does it.
    await apps.patchNamespacedDeployment(
      { name: "site", namespace: "web", body: { spec: { replicas: 5, template: { spec: { containers: [{ name: "web", image: "evil:1" }] } } } } },
      mergePatch,
    );
    await waitFor("the Deployment repaired", async () => {
      const d = await apps.readNamespacedDeployment({ name: "site", namespace: "web" });
      return d.spec?.replicas === 2 && d.spec.template.spec?.containers[0]?.image === "nginx:1.27" ? true : undefined;
    });
    await core.deleteNamespacedService({ name: "site", namespace: "web" });
    await waitFor("the Service recreated", () => core.readNamespacedService({ name: "site", namespace: "web" }));
    assert.equal((await registry())["site"], "nginx:1.27", "the registry entry survived the restart");
    // Converged: its own writes (no-op applies, an unchanged status) wake it no more.
    const dispatched = async (): Promise<unknown> => {
      const status = (await (await fetch(`${http}/status`)).json()) as { controllers: Array<Record<string, unknown>> };
      return status.controllers.find((c) => c["name"] === "website")?.["dispatched"];
    };
    // The recreated Service is an owned change, so one more reconcile may still be on its way:
    // what a loop cannot do is stop. Settled: the count holds still for 1.5 s (a loop on its own
    // writes never does, and this wait then times out).
    let seen = await dispatched();
    assert.equal(typeof seen, "number");
    await waitFor("no reconcile loop on its own writes (the dispatched count holds still)", async () => {
      await new Promise((ok) => setTimeout(ok, 1500));
      const now = await dispatched();
      const still = now === seen;
      seen = now;
      return still ? true : undefined;
    });
    assert.equal((await site()).metadata?.deletionTimestamp, undefined);

    // Deletion: the entry goes, then the finalizer, then the object.
    await custom.deleteNamespacedCustomObject({ ...sites, name: "site" });
    await waitFor("the registry entry removed", async () => ((await registry())["site"] === undefined ? true : undefined));
    await waitFor("the Website gone", async () => {
      try {
        await site();
        return undefined;
      } catch (err) {
        return err instanceof k8s.ApiException && err.code === 404 ? true : undefined;
      }
    });
    assert.ok(!readFileSync(op.log, "utf8").includes("ERROR"), readFileSync(op.log, "utf8"));
  } finally {
    await op.stop();
  }
});
