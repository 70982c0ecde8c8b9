// What a registration declares, against the real manager: revisions for rolling upgrades,
// children cached in full or metadata only, requests that carry no object, and startup
// without phantom deletions.
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, test } from "node:test";

import * as k8s from "@kubernetes/client-node";

import {
  Action,
  type Controller,
  type ReconcileRequest,
  ReadError,
  SessionEndedError,
  consoleLogger,
  controller,
  kind,
  kinds,
} from "../../src/index.js";
import {
  type Cluster,
  type Manager,
  type Running,
  configMap,
  controllerStatus,
  namespace,
  recordingLogger,
  runController,
  startDevcluster,
  startManager,
  waitFor,
} from "../support.js";

let cluster: Cluster;
let manager: Manager;

before(async () => {
  cluster = await startDevcluster();
  manager = await startManager(cluster, "ts-definitions");
});

after(async () => {
  await manager?.proc.stop();
  await cluster?.proc.stop();
});

const ConfigMaps = kind<k8s.V1ConfigMap>("v1", "ConfigMap");
const Secrets = kind<k8s.V1Secret>("v1", "Secret");

/** A Secret owned (controller: true) by ConfigMap `owner`. */
async function ownedSecret(ns: string, name: string, owner: k8s.V1ConfigMap, data: Record<string, string>): Promise<void> {
  await cluster.core.createNamespacedSecret({
    namespace: ns,
    body: {
      metadata: {
        name,
        ownerReferences: [{ apiVersion: "v1", kind: "ConfigMap", name: owner.metadata?.name ?? "", uid: owner.metadata?.uid ?? "", controller: true }],
      },
      data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v).toString("base64")])),
    },
  });
}

test("a newer revision supersedes a running definition: the old replica stops taking work, is not ready and registers again later without exiting", async () => {
  await namespace(cluster, "rollout");
  const seen: Array<{ by: string; name: string; session: string }> = [];
  let hung = false;
  const handler = (by: string) => async (req: ReconcileRequest<k8s.V1ConfigMap>) => {
    seen.push({ by, name: req.name, session: req.sessionId });
    if (req.name === "hang" && !hung) {
      hung = true; // the first attempt hangs until its session ends; later ones do not
      await new Promise((ok) => req.signal.addEventListener("abort", ok, { once: true }));
      throw req.signal.reason;
    }
    return Action.done();
  };
  const aborted: unknown[] = [];
  process.env["CTRLHUB_REVISION"] = "1";
  let old: Controller<k8s.V1ConfigMap>;
  try {
    old = controller("rollout")
      .for(ConfigMaps)
      .inNamespaces("rollout")
      .reconcile(async (req) => {
        req.signal.addEventListener("abort", () => aborted.push(req.signal.reason));
        return handler("old")(req);
      });
  } finally {
    delete process.env["CTRLHUB_REVISION"];
  }
  assert.equal(old.registration().revision, 1n, "CTRLHUB_REVISION");
  const log = recordingLogger();
  const first = await runController(old, manager, { logger: log, outdatedRetryMs: 3000 });
  let second: Running | undefined;
  try {
    assert.equal(first.registrations[0]?.revision, 1n);
    assert.equal(old.ready, true);
    await configMap(cluster, "rollout", "hang");
    await waitFor("in flight", async () => ((await controllerStatus(manager, "rollout"))?.["inFlight"] === 1 ? true : undefined));

    // The rollout: a different definition (includeObject) at revision 2.
    const newer = controller("rollout").for(ConfigMaps).inNamespaces("rollout").includeObject().revision(2).reconcile(handler("new"));
    second = await runController(newer, manager);
    await waitFor("the old handler aborted", () => aborted[0]);
    assert.ok(aborted[0] instanceof SessionEndedError);
    await waitFor("the old replica not ready", () => (old.ready ? undefined : true));
    const warned = log.lines.find((l) => l.level === "warn" && /superseded/.test(l.message));
    assert.match(warned?.message ?? "", /takes no work and reports not ready, and registers again in 3 s/);

    // A lower revision meanwhile is refused as outdated: it waits, it does not exit.
    const lower = controller("rollout").for(ConfigMaps).inNamespaces("rollout").resync(0).revision(1).reconcile(handler("lower"));
    const lowerLog = recordingLogger();
    const refused = lower.run({ address: manager.grpc, handleSignals: false, logger: lowerLog, outdatedRetryMs: 60_000 });
    try {
      await waitFor("the lower revision refused", () => lowerLog.lines.find((l) => /outdated/.test(l.message) && /registers again in 60 s/.test(l.message)));
      assert.equal(lower.ready, false);
    } finally {
      lower.stop();
      await refused; // stopping while it waits resolves at once
    }

    await configMap(cluster, "rollout", "after");
    await waitFor("the new definition reconciles", () => seen.find((s) => s.name === "after"));
    await sleep(1000);
    assert.equal(first.registrations.length, 1, "the superseded replica did not register within its wait");
    assert.ok(!seen.some((s) => s.by === "old" && s.name === "after"));

    // The newer definition's replicas are gone: the old one is accepted again after its wait.
    await second.stop();
    second = undefined;
    await first.registered(2);
    assert.equal(old.ready, true);
    await configMap(cluster, "rollout", "later");
    await waitFor("the old replica works again", () => seen.find((s) => s.by === "old" && s.name === "later"));
  } finally {
    await second?.stop();
    await first.stop();
  }
});

test("owned children are cached and readable in full by default; metadataOnly ones are read as PartialObjectMetadata", async () => {
  await namespace(cluster, "children");
  const owner = await configMap(cluster, "children", "owner");
  await ownedSecret("children", "child", owner, { password: "s3cret" });
  for (const metadataOnly of [false, true]) {
    const reads: unknown[] = [];
    const log = recordingLogger();
    const name = metadataOnly ? "children-meta" : "children-full";
    const c = controller(name)
      .for(ConfigMaps)
      .inNamespaces("children")
      .owns(Secrets, { metadataOnly })
      .reconcile(async (req) => {
        if (req.name !== "owner") {
          return;
        }
        const options = { namespace: req.namespace, name: "child" };
        const got = await req.reader.get(Secrets, options).catch((err: unknown) => err);
        const meta = await req.reader.getMetadata(Secrets, options);
        const raw = await req.reader.read(Secrets, options);
        const listed = await req.reader.listMetadata(Secrets, { namespace: req.namespace });
        const list = await req.reader.list(Secrets, { namespace: req.namespace }).catch((err: unknown) => err);
        reads.push({ got, meta, raw, listed, list });
      });
    const r = await runController(c, manager, { logger: log });
    try {
      const readable = r.registrations[0]?.readable.map((k) => `${k.kind}=${k.metadataOnly ? "metadata" : "full"}`).sort();
      assert.deepEqual(readable, ["ConfigMap=full", metadataOnly ? "Secret=metadata" : "Secret=full"]);
      const registered = log.lines.filter((l) => l.level === "info" && /registered with manager/.test(l.message));
      assert.equal(registered.length, 1);
      assert.match(String(registered[0]?.fields["readable"]), metadataOnly ? /Secret\(v1\)=metadata/ : /Secret\(v1\)=full/);
      const [got] = await waitFor("the reads", () => (reads.length > 0 ? reads : undefined));
      const { got: full, meta, raw, listed, list } = got as {
        got: unknown;
        meta: { kind: string; metadata: { name: string; ownerReferences?: unknown[] } } & Record<string, unknown>;
        raw: { metadataOnly: boolean; object: Record<string, unknown> };
        listed: Array<{ metadata: { name: string } }>;
        list: unknown;
      };
      assert.equal(meta.kind, "Secret");
      assert.equal(meta["data"], undefined, "metadata only");
      assert.equal(meta.metadata.name, "child");
      assert.equal(meta.metadata.ownerReferences?.length, 1);
      assert.deepEqual(listed.map((o) => o.metadata.name), ["child"]);
      assert.equal(raw.metadataOnly, metadataOnly);
      if (metadataOnly) {
        assert.ok(full instanceof ReadError && full.code === 9, String(full));
        assert.match((full as ReadError).message, /cached metadata only .* getMetadata\(\)/);
        assert.ok(list instanceof ReadError && list.code === 9);
        assert.equal(raw.object["data"], undefined, "no data in a metadata-only object");
      } else {
        assert.equal(Buffer.from((full as k8s.V1Secret).data?.["password"] ?? "", "base64").toString(), "s3cret");
        assert.equal((list as k8s.V1Secret[]).length, 1);
      }
    } finally {
      await r.stop();
    }
  }
});

test("a request without an object is NotFound: the handler runs and its answer counts", async () => {
  await namespace(cluster, "ghosts");
  const seen: Array<ReconcileRequest<k8s.V1ConfigMap>> = [];
  const c = controller("ghosts")
    .for(ConfigMaps)
    .inNamespaces("ghosts")
    .includeObject()
    .watches(Secrets, { label: "example.com/for" })
    .reconcile((req) => {
      seen.push(req);
    });
  const r = await runController(c, manager);
  try {
    // A Secret naming a primary that never existed: the manager holds no state for the key.
    await cluster.core.createNamespacedSecret({ namespace: "ghosts", body: { metadata: { name: "s", labels: { "example.com/for": "nobody" } } } });
    const req = await waitFor("the request for the missing primary", () => seen.find((q) => q.name === "nobody"));
    assert.equal(req.object, undefined);
    assert.equal(req.tombstone, undefined, "no tombstone: nothing was deleted");
    await waitFor("answered done", async () => ((await controllerStatus(manager, "ghosts"))?.["done"] === 1 ? true : undefined));
    assert.equal((await controllerStatus(manager, "ghosts"))?.["terminal"], 0);
  } finally {
    await r.stop();
  }
});

test("restarting a controller that owns children never delivers its keys as deleted, and each key once per start", async () => {
  await namespace(cluster, "restarts");
  for (let i = 0; i < 4; i++) {
    const owner = await configMap(cluster, "restarts", `owner-${i}`);
    await ownedSecret("restarts", `child-${i}`, owner, { i: String(i) });
  }
  for (let run = 0; run < 3; run++) {
    const seen: Array<ReconcileRequest<k8s.V1ConfigMap>> = [];
    const c = controller("restarts")
      .for(ConfigMaps)
      .inNamespaces("restarts")
      .includeObject()
      .owns(Secrets)
      .reconcile((req) => {
        seen.push(req);
      });
    const r = await runController(c, manager);
    try {
      await waitFor(`run ${run}: every key`, () => (new Set(seen.map((q) => q.name)).size === 4 ? true : undefined));
      await sleep(500);
      for (const q of seen) {
        assert.ok(q.object !== undefined && q.tombstone === undefined, `${q.name}: ${q.reasons.join(",")} without its object`);
        assert.ok(!q.reasons.includes("DELETED"), `${q.name}: DELETED at startup`);
      }
      assert.equal(seen.length, 4, `each key once: ${seen.map((q) => `${q.name}:${q.reasons.join("+")}`).join(" ")}`);
    } finally {
      await r.stop();
    }
  }
});

test("debug logging prints the effective registration (a revision is a bigint) without failing", async () => {
  await namespace(cluster, "debuglog");
  const written: string[] = [];
  const write = process.stderr.write.bind(process.stderr);
  process.stderr.write = ((chunk: string | Uint8Array) => {
    written.push(String(chunk));
    return true;
  }) as typeof process.stderr.write;
  try {
    const c = controller("debuglog").for(kinds.ConfigMap).inNamespaces("debuglog").revision(7).reconcile(() => undefined);
    const r = await runController(c, manager, { logger: consoleLogger("debuglog", "debug") });
    await r.stop();
  } finally {
    process.stderr.write = write;
  }
  const effective = written.find((l) => l.includes("DEBUG ctrlhub[debuglog] effective registration"));
  assert.ok(effective, written.join(""));
  assert.match(effective, /"revision":"7"/);
  assert.match(effective, /"exclusiveAttempts":true/);
  assert.ok(!written.some((l) => /handling a manager message failed/.test(l)), written.join(""));
});
