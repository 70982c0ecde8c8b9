// The write helpers of a request (adopt, apply, patchStatus, finalizers), isNotFound and
// isConflict on client-node's errors, and the Events recorder, against devcluster through the
// real manager: one cluster and one manager for this file, a namespace and a controller per test.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import * as k8s from "@kubernetes/client-node";

import { Action, type Condition, controller, isConflict, isNotFound, kind, kinds, withSignal } from "../../src/index.js";
import { type Cluster, type Manager, REPO, configMap, namespace, runController, startDevcluster, startManager, waitFor } from "../support.js";

let cluster: Cluster;
let manager: Manager;

interface Website extends k8s.KubernetesObject {
  spec?: { image?: string; replicas?: number };
  status?: { conditions?: Condition[]; readyReplicas?: number; observedGeneration?: number };
}
const Websites = kind<Website>("example.ctrlhub.io/v1", "Website", "websites");

before(async () => {
  cluster = await startDevcluster();
  const crd = k8s.loadYaml<k8s.V1CustomResourceDefinition>(readFileSync(join(REPO, "deploy/examples/website/crd.yaml"), "utf8"));
  await cluster.kc.makeApiClient(k8s.ApiextensionsV1Api).createCustomResourceDefinition({ body: crd });
  manager = await startManager(cluster, "ts-writes");
});

after(async () => {
  await manager?.proc.stop();
  await cluster?.proc.stop();
});

test("apply, adopt and patchStatus on a custom resource and on built-ins; isNotFound and isConflict on client-node's errors", async () => {
  await namespace(cluster, "writes");
  const checks: Record<string, unknown> = {};
  const c = controller("writes")
    .for(kinds.ConfigMap)
    .inNamespaces("writes")
    .includeObject()
    .reconcile(async (req) => {
      const cm = req.object;
      if (cm === undefined) return Action.done();
      // A custom resource, adopted by the ConfigMap, applied, and its status patched.
      const site = await req.apply(req.adopt<Website>({ apiVersion: "example.ctrlhub.io/v1", kind: "Website", metadata: { name: `${req.name}-site` },
        spec: { replicas: 3 } }, cm));
      checks["site"] = await req.patchStatus(site, { readyReplicas: 2, observedGeneration: site.metadata?.generation ?? 0 });
      // A built-in (typed by client-node's model), adopted by the custom resource; its status patched.
      const labels = { app: req.name };
      const deployment = await req.apply(req.adopt<k8s.V1Deployment>({ apiVersion: "apps/v1", kind: "Deployment", metadata: { name: req.name, labels },
        spec: { replicas: 1, selector: { matchLabels: labels }, template: { metadata: { labels }, spec: { containers: [{ name: "c", image: "x:1" }] } } },
      }, site));
      checks["deployment"] = deployment;
      checks["deploymentStatus"] = await req.patchStatus(deployment, { readyReplicas: 1, replicas: 1 });
      // NotFound and Conflict from client-node 1.x's own calls, cancellable with withSignal.
      const core = req.kubeConfig.makeApiClient(k8s.CoreV1Api);
      try {
        await core.readNamespacedConfigMap({ name: "missing", namespace: req.namespace }, withSignal(req.signal));
        checks["notFound"] = "no error";
      } catch (err) {
        checks["notFound"] = [isNotFound(err), isConflict(err)];
      }
      try {
        await core.createNamespacedConfigMap({ namespace: req.namespace, body: { metadata: { name: req.name } } }, withSignal(req.signal));
        checks["conflict"] = "no error";
      } catch (err) {
        checks["conflict"] = [isConflict(err), isNotFound(err)];
      }
      return Action.done();
    });
  const r = await runController(c, manager, { kubeConfig: cluster.kc });
  try {
    await configMap(cluster, "writes", "one");
    await waitFor("the handler's checks", () => (checks["conflict"] !== undefined ? true : undefined));
    const custom = cluster.kc.makeApiClient(k8s.CustomObjectsApi);
    const site = (await custom.getNamespacedCustomObject({ group: "example.ctrlhub.io", version: "v1", plural: "websites",
      namespace: "writes", name: "one-site" })) as Website;
    const owner = await cluster.core.readNamespacedConfigMap({ name: "one", namespace: "writes" });
    assert.deepEqual(site.metadata?.ownerReferences, [
      { apiVersion: "v1", kind: "ConfigMap", name: "one", uid: owner.metadata?.uid, controller: true, blockOwnerDeletion: true },
    ]);
    assert.equal(site.metadata?.namespace, "writes", "the owner's namespace");
    assert.equal(site.spec?.replicas, 3);
    assert.equal(site.status?.readyReplicas, 2, "the custom resource's status subresource was patched");
    assert.equal((checks["site"] as Website).status?.readyReplicas, 2, "patchStatus returns the stored object");
    assert.ok(site.metadata?.managedFields?.some((f) => f.manager === "writes" && f.operation === "Apply"), "field manager = the controller");

    const apps = cluster.kc.makeApiClient(k8s.AppsV1Api);
    const deployment = await apps.readNamespacedDeployment({ name: "one", namespace: "writes" });
    assert.equal(deployment.metadata?.ownerReferences?.[0]?.kind, "Website");
    assert.equal(deployment.metadata?.ownerReferences?.[0]?.uid, site.metadata?.uid);
    assert.equal(deployment.status?.readyReplicas, 1, "a built-in's status was patched");
    const returned = checks["deployment"] as k8s.V1Deployment;
    assert.ok(returned.metadata?.creationTimestamp instanceof Date, "apply returns a built-in typed as client-node's model");
    assert.equal((checks["deploymentStatus"] as k8s.V1Deployment).status?.readyReplicas, 1);
    assert.deepEqual(checks["notFound"], [true, false], "a 404 is NotFound, not Conflict");
    assert.deepEqual(checks["conflict"], [true, false], "a 409 (AlreadyExists) is Conflict, not NotFound");

    // A hand edit of the applied child is put back by the next apply (force, same field manager).
    await apps.patchNamespacedDeployment({ name: "one", namespace: "writes", body: { spec: { replicas: 9 } } },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch));
    delete checks["conflict"];
    await cluster.core.patchNamespacedConfigMap({ name: "one", namespace: "writes", body: { data: { again: "1" } } },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch));
    await waitFor("the second round", () => (checks["conflict"] !== undefined ? true : undefined));
    assert.equal((await apps.readNamespacedDeployment({ name: "one", namespace: "writes" })).spec?.replicas, 1, "repaired");
  } finally {
    await r.stop();
  }
});

test("finalizers: ensure adds one once; finalize runs the cleanup once on deletion, removes it, and the object goes", async () => {
  await namespace(cluster, "fin");
  const FIN = "example.com/cleanup";
  const ensured: boolean[] = [];
  const cleaned: string[] = [];
  const finalized: boolean[] = [];
  const c = controller("fin")
    .for(Websites)
    .inNamespaces("fin")
    .includeObject()
    .reconcile(async (req) => {
      const site = req.object;
      if (site === undefined) return Action.done();
      const ran = await req.finalizers.finalize(site, FIN, (s) => {
        cleaned.push(s.metadata?.name ?? "");
      });
      finalized.push(ran);
      if (ran || site.metadata?.deletionTimestamp !== undefined) return Action.done();
      ensured.push(await req.finalizers.ensure(site, FIN));
      return Action.done();
    });
  const r = await runController(c, manager, { kubeConfig: cluster.kc });
  const custom = cluster.kc.makeApiClient(k8s.CustomObjectsApi);
  const sites = { group: "example.ctrlhub.io", version: "v1", plural: "websites", namespace: "fin" };
  const get = async (): Promise<Website> => (await custom.getNamespacedCustomObject({ ...sites, name: "s" })) as Website;
  try {
    await custom.createNamespacedCustomObject({ ...sites, body: { apiVersion: "example.ctrlhub.io/v1", kind: "Website", metadata: { name: "s" }, spec: {} } });
    await waitFor("the finalizer added", async () => ((await get()).metadata?.finalizers?.includes(FIN) ? true : undefined));
    // Its own patch wakes it again (UPDATED): the second ensure changes nothing.
    await waitFor("a second reconcile", () => (ensured.length >= 2 ? true : undefined));
    assert.deepEqual(ensured.slice(0, 2), [true, false]);
    assert.deepEqual(cleaned, []);

    await custom.deleteNamespacedCustomObject({ ...sites, name: "s" });
    await waitFor("the Website gone", async () => {
      try {
        await get();
        return undefined;
      } catch (err) {
        return isNotFound(err) ? true : undefined;
      }
    });
    assert.deepEqual(cleaned, ["s"], "the cleanup ran once");
    // finalize() resolves once its patch is answered, which can be after the object is gone.
    await waitFor("finalize() reported that it ran", () => (finalized.includes(true) ? true : undefined));
  } finally {
    await r.stop();
  }
});

/** The `events.k8s.io/v1` Events about `name` in `ns`. */
async function eventsAbout(ns: string, name: string): Promise<k8s.EventsV1Event[]> {
  const list = await cluster.kc.makeApiClient(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns });
  return list.items.filter((e) => e.regarding?.name === name);
}

test("Events: a handler failure is posted as ReconcileFailed; repeats are aggregated into one series; info is the handler's", async () => {
  await namespace(cluster, "events");
  const attempts = new Map<string, number>();
  const c = controller("events")
    .for(kinds.ConfigMap)
    .inNamespaces("events")
    .includeObject()
    .reconcile((req) => {
      const cm = req.object;
      if (cm === undefined) return Action.done();
      const n = (attempts.get(req.name) ?? 0) + 1;
      attempts.set(req.name, n);
      if (req.name === "bad" && n <= 3) {
        throw new Error("boom: the registry is down");
      }
      if (req.name === "good" && n <= 2) {
        req.events.info(cm, "Synced", "all children applied");
        return Action.requeueAfter(10);
      }
      return Action.done();
    });
  const r = await runController(c, manager, { kubeConfig: cluster.kc });
  try {
    const bad = await configMap(cluster, "events", "bad");
    await configMap(cluster, "events", "good");
    const failed = await waitFor("one ReconcileFailed Event counting the three failures", async () => {
      const events = (await eventsAbout("events", "bad")).filter((e) => e.reason === "ReconcileFailed");
      return events.length === 1 && events[0]?.series?.count === 3 ? events : undefined;
    });
    const e = failed[0] as k8s.EventsV1Event;
    assert.equal(e.type, "Warning");
    assert.match(e.note ?? "", /boom: the registry is down/);
    assert.equal(e.reportingController, "ctrlhub.io/events");
    assert.ok((e.reportingInstance ?? "") !== "", "reportingInstance is the host name");
    assert.equal(e.regarding?.kind, "ConfigMap");
    assert.equal(e.regarding?.uid, bad.metadata?.uid);

    const synced = await waitFor("one Synced Event counting both", async () => {
      const events = (await eventsAbout("events", "good")).filter((x) => x.reason === "Synced");
      return events.length === 1 && events[0]?.series?.count === 2 ? events : undefined;
    });
    assert.equal(synced[0]?.type, "Normal");
    assert.equal(synced[0]?.note, "all children applied");
    assert.equal((await eventsAbout("events", "good")).filter((x) => x.reason === "ReconcileFailed").length, 0);
  } finally {
    await r.stop();
  }
});

test("withSignal cancels a client-node 1.x call when its signal aborts", async () => {
  const core = cluster.kc.makeApiClient(k8s.CoreV1Api);
  const live = new AbortController();
  const listed = await core.listNamespace({}, withSignal(live.signal));
  assert.ok(listed.items.length > 0, "a live signal changes nothing");
  const aborted = new AbortController();
  aborted.abort(new Error("stop now"));
  await assert.rejects(core.listNamespace({}, withSignal(aborted.signal)), (err: unknown) => {
    const e = err as { name?: string; message?: string };
    return e.name === "AbortError" || /abort|stop now/i.test(String(e.message));
  });
});
