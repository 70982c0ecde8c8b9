// The sample controller (examples/stamper.ts) as its own process, writing through
// @kubernetes/client-node to devcluster, registered with the real manager.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import {
  type Cluster,
  type Manager,
  REPO,
  configMap,
  controllerStatus,
  namespace,
  start,
  startDevcluster,
  startManager,
  tempDir,
  waitFor,
} from "../support.js";

let cluster: Cluster;
let manager: Manager;

before(async () => {
  cluster = await startDevcluster();
  manager = await startManager(cluster, "ts-stamper");
});

after(async () => {
  await manager?.proc.stop();
  await cluster?.proc.stop();
});

test("the stamper stamps labelled ConfigMaps only, and drains on SIGTERM", async () => {
  await namespace(cluster, "stamps");
  await configMap(cluster, "stamps", "before", {}, { "example.com/stamp": "true" });
  const log = join(tempDir("stamper"), "stamper.log");
  const stamper = start(
    process.execPath,
    [join(REPO, "controllers/typescript-sdk/dist/examples/stamper.js")],
    { ...process.env, KUBECONFIG: cluster.kubeconfig, CTRLHUB_ADDR: manager.grpc, CTRLHUB_TOKEN: "dev" },
    log,
  );
  try {
    await configMap(cluster, "stamps", "plain");
    await configMap(cluster, "stamps", "after", {}, { "example.com/stamp": "true" });
    for (const name of ["before", "after"]) {
      const stamped = await waitFor(`${name} stamped (log ${log})`, async () => {
        const cm = await cluster.core.readNamespacedConfigMap({ name, namespace: "stamps" });
        return cm.metadata?.annotations?.["example.com/stamped-by"];
      });
      assert.equal(stamped, "stamper");
    }
    // Each stamp is a change to the object, which comes back once and is found stamped.
    await waitFor("the stamps' own updates reconciled", async () => ((await controllerStatus(manager, "stamper"))?.["done"] === 4 ? true : undefined));
    const plain = await cluster.core.readNamespacedConfigMap({ name: "plain", namespace: "stamps" });
    assert.equal(plain.metadata?.annotations?.["example.com/stamped-by"], undefined);
    assert.equal(await stamper.stop(), 0, "SIGTERM drains and exits 0");
    // The process ends right after its last line: nothing (a timer, a socket) keeps it alive.
    const exitedAt = Date.now();
    const last = await waitFor("the log flushed", () => {
      const line = readFileSync(stamper.log, "utf8").split("\n").find((l) => l.includes("controller stopped"));
      return line === undefined ? undefined : Date.parse(line.slice(0, line.indexOf(" ")));
    }, 5_000);
    assert.ok(exitedAt - last < 1_000, `the process lingered ${exitedAt - last} ms after "controller stopped"`);
  } finally {
    await stamper.stop();
  }
});

test("a fatal run() error (a wrong token) ends the process, reported once", async () => {
  const log = join(tempDir("stamper-fatal"), "stamper.log");
  const stamper = start(
    process.execPath,
    [join(REPO, "controllers/typescript-sdk/dist/examples/stamper.js")],
    { ...process.env, KUBECONFIG: cluster.kubeconfig, CTRLHUB_ADDR: manager.grpc, CTRLHUB_TOKEN: "not-the-token" },
    log,
  );
  const timer = setTimeout(() => stamper.signal("SIGKILL"), 60_000);
  try {
    assert.notEqual(await stamper.exited, 0, "a nonzero exit status");
  } finally {
    clearTimeout(timer);
  }
  const text = readFileSync(log, "utf8");
  const reports = text.split("\n").filter((l) => l.includes("RegistrationRejectedError"));
  assert.ok(reports.length >= 1, text);
  assert.equal(text.match(/UNAUTHENTICATED/g)?.length, 1, `the error is printed once:\n${text}`);
});
