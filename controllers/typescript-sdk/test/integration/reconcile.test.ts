import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import type { V1ConfigMap } from "@kubernetes/client-node";

import { Action, type ReconcileRequest, controller, kinds } from "../../src/index.js";
import { type Cluster, type Manager, configMap, namespace, startDevcluster, startManager, waitFor } from "../support.js";

let cluster: Cluster;
let manager: Manager;

before(async () => {
  cluster = await startDevcluster();
  manager = await startManager(cluster, "ts-reconcile");
});

after(async () => {
  await manager?.proc.stop();
  await cluster?.proc.stop();
});

describe("reconcile", () => {
  test("registers, receives the object and answers", async () => {
    await namespace(cluster, "basic");
    const seen: ReconcileRequest<V1ConfigMap>[] = [];
    const stop = new AbortController();
    const c = controller("basic")
      .for<V1ConfigMap>(kinds.ConfigMap)
      .inNamespaces("basic")
      .withLabels({ app: "x" })
      .includeObject()
      .reconcile(async (req) => {
        seen.push(req);
        return Action.done();
      });
    const running = c.run({ address: manager.grpc, signal: stop.signal, handleSignals: false });
    await configMap(cluster, "basic", "one", { k: "v" }, { app: "x" });
    await configMap(cluster, "basic", "other", {}, { app: "y" });
    const req = await waitFor("a request", () => seen.find((r) => r.name === "one"));
    assert.equal(req.namespace, "basic");
    assert.deepEqual(req.reasons, ["CREATED"]);
    assert.equal(req.object?.data?.["k"], "v");
    assert.equal(req.attempt, 1);
    assert.ok(req.deadline.getTime() > Date.now());
    stop.abort();
    await running;
    assert.ok(!seen.some((r) => r.name === "other"), "outside the label selector");
  });
});
