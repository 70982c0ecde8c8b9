// The SDK against the real manager (target/debug/ctrlhub, static token) and devcluster: one
// cluster and one manager for this file, a namespace and a controller name per test.
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, test } from "node:test";

import type { V1ConfigMap } from "@kubernetes/client-node";

import {
  Action,
  DeadlineExceededError,
  type ObjectEvent,
  type ReconcileRequest,
  RegistrationRejectedError,
  RetryError,
  TerminalError,
  controller,
  kind,
  kinds,
} from "../../src/index.js";
import {
  type Cluster,
  type Manager,
  configMap,
  controllerStatus,
  mergePatch,
  metric,
  namespace,
  runController,
  startDevcluster,
  startManager,
  waitFor,
} from "../support.js";

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

const ConfigMaps = kind<V1ConfigMap>("v1", "ConfigMap");

test("requests carry the key, reasons and object; answers are recorded", async () => {
  await namespace(cluster, "basic");
  const seen: ReconcileRequest<V1ConfigMap>[] = [];
  const c = controller("basic")
    .for(ConfigMaps)
    .inNamespaces("basic")
    .withLabels({ app: "x" })
    .includeObject()
    .reconcile((req) => {
      seen.push(req);
    });
  const r = await runController(c, manager);
  try {
    await configMap(cluster, "basic", "other", {}, { app: "y" });
    await configMap(cluster, "basic", "one", { k: "v" }, { app: "x" });
    const created = await waitFor("CREATED", () => seen.find((q) => q.name === "one"));
    assert.deepEqual(created.reasons, ["CREATED"]);
    assert.equal(created.namespace, "basic");
    assert.equal(created.object?.data?.["k"], "v");
    assert.equal(created.attempt, 1);
    assert.equal(created.sessionId, r.registrations[0]?.sessionId);
    assert.ok(created.deadline.getTime() > Date.now() + 50_000, "the default 60 s deadline");
    await mergePatch(cluster, "basic", "one", { data: { k: "w" } });
    const updated = await waitFor("UPDATED", () => seen.find((q) => q.reasons.includes("UPDATED")));
    assert.equal(updated.object?.data?.["k"], "w");
    await cluster.core.deleteNamespacedConfigMap({ name: "one", namespace: "basic" });
    const deleted = await waitFor("DELETED", () => seen.find((q) => q.reasons.includes("DELETED")));
    assert.equal(deleted.object, undefined);
    assert.equal(deleted.tombstone?.object?.data?.["k"], "w");
    await waitFor("three results recorded", async () => ((await controllerStatus(manager, "basic"))?.["done"] === 3 ? true : undefined));
    assert.ok(!seen.some((q) => q.name === "other"), "outside the label selector");
  } finally {
    await r.stop();
  }
});

test("errors are retried with backoff, terminal errors are not, requeueAfter comes back", async () => {
  await namespace(cluster, "outcomes");
  const starts: Array<{ name: string; attempt: number; reasons: readonly string[]; at: number }> = [];
  const c = controller("outcomes")
    .for(ConfigMaps)
    .inNamespaces("outcomes")
    .includeObject()
    .backoff({ baseMs: 200, maxMs: 1000 })
    .concurrency(4)
    .reconcile((req) => {
      starts.push({ name: req.name, attempt: req.attempt, reasons: req.reasons, at: Date.now() });
      if (req.name === "flaky" && req.attempt < 3) {
        throw new Error(`attempt ${req.attempt} fails`);
      }
      if (req.name === "limited" && req.attempt === 1) {
        throw new RetryError("rate limited", { retryAfterMs: 1500 });
      }
      if (req.name === "broken") {
        throw new TerminalError("invalid spec");
      }
      if (req.name === "poll" && req.attempt === 1 && req.reasons.includes("CREATED")) {
        return Action.requeueAfter(700);
      }
      return Action.done();
    });
  const r = await runController(c, manager);
  try {
    for (const name of ["flaky", "limited", "broken", "poll"]) {
      await configMap(cluster, "outcomes", name);
    }
    const of = (name: string) => starts.filter((s) => s.name === name);
    await waitFor("flaky succeeds on attempt 3", () => (of("flaky").length === 3 ? true : undefined));
    const flaky = of("flaky");
    assert.deepEqual(flaky.map((s) => s.attempt), [1, 2, 3]);
    assert.ok(flaky[1]?.reasons.includes("RETRY"));
    assert.ok((flaky[2]?.at ?? 0) - (flaky[1]?.at ?? 0) >= 400 - 50, "the second retry waits about twice the base");
    await waitFor("limited retried", () => (of("limited").length === 2 ? true : undefined));
    const limited = of("limited");
    assert.ok((limited[1]?.at ?? 0) - (limited[0]?.at ?? 0) >= 1500 - 50, "retryAfterMs is honoured");
    await waitFor("poll requeued", () => (of("poll").length === 2 ? true : undefined));
    const poll = of("poll");
    assert.ok(poll[1]?.reasons.includes("REQUEUE"));
    assert.ok((poll[1]?.at ?? 0) - (poll[0]?.at ?? 0) >= 700 - 50);
    const status = await controllerStatus(manager, "outcomes");
    assert.equal(status?.["terminal"], 1);
    assert.equal(of("broken").length, 1, "a terminal error is not retried");
  } finally {
    await r.stop();
  }
});

test("a handler is aborted at its deadline; its late result only confirms that it ended", async () => {
  await namespace(cluster, "deadline");
  const aborts: Array<{ attempt: number; reason: unknown; at: number; deadline: number }> = [];
  const attempts: Array<{ attempt: number; reasons: readonly string[]; start: number; end: number }> = [];
  const c = controller("deadline")
    .for(ConfigMaps)
    .inNamespaces("deadline")
    .deadline(2000)
    .reconcile(async (req) => {
      const a = { attempt: req.attempt, reasons: req.reasons, start: Date.now(), end: 0 };
      attempts.push(a);
      if (req.attempt === 1) {
        req.signal.addEventListener("abort", () =>
          aborts.push({ attempt: req.attempt, reason: req.signal.reason, at: Date.now(), deadline: req.deadline.getTime() }),
        );
        // Ignores its signal and answers late: the manager takes it as the attempt's end.
        await sleep(3000);
      }
      a.end = Date.now();
      return Action.done();
    });
  const r = await runController(c, manager);
  try {
    await configMap(cluster, "deadline", "slow");
    await waitFor("attempt 2", () => attempts.find((a) => a.attempt === 2 && a.end > 0), 15_000);
    const [abort] = aborts;
    assert.ok(abort, "the signal aborted");
    assert.ok(abort.reason instanceof DeadlineExceededError);
    assert.ok(abort.at <= abort.deadline && abort.at >= abort.deadline - 600, `aborted ${abort.deadline - abort.at} ms before the deadline`);
    assert.ok(attempts[1]?.reasons.includes("REDELIVERY"));
    assert.ok((attempts[1]?.start ?? 0) >= (attempts[0]?.end ?? Infinity), "attempt 2 waited for attempt 1 to end");
    const status = await waitFor("attempt 2 counted", async () => {
      const s = await controllerStatus(manager, "deadline");
      return s?.["done"] === 1 ? s : undefined;
    });
    assert.equal(status["deadlineMisses"], 1);
    assert.equal(status["discarded"], 1, "the late result was discarded as an outcome");
    assert.equal(status["errors"], 0);
  } finally {
    await r.stop();
  }
});

test("cached reads go through the session that delivered the request", async () => {
  await namespace(cluster, "reads");
  await configMap(cluster, "reads", "target", { x: "1" }, { scope: "in" });
  await configMap(cluster, "reads", "hidden", { x: "2" }, { scope: "out" });
  const results: unknown[] = [];
  const c = controller("reads")
    .for(ConfigMaps)
    .inNamespaces("reads")
    .withLabels({ scope: "in" })
    .reconcile(async (req) => {
      if (req.name !== "reader") {
        return;
      }
      const target = await req.reader.get(ConfigMaps, { namespace: "reads", name: "target" });
      const hidden = await req.reader.get(ConfigMaps, { namespace: "reads", name: "hidden" });
      const missing = await req.reader.get(ConfigMaps, { namespace: "reads", name: "nope" });
      const all = await req.reader.list(ConfigMaps, { namespace: "reads", pageSize: 1 });
      const selected = await req.reader.list(ConfigMaps, { labels: { matchExpressions: [{ key: "role", operator: "Exists" }] } });
      const denied = await req.reader.get(kinds.Secret, { namespace: "reads", name: "x" }).catch((err: unknown) => err);
      results.push({ target: target?.data, hidden, missing, all: all.map((o) => o.metadata?.name), selected: selected.map((o) => o.metadata?.name), denied });
    });
  const r = await runController(c, manager);
  try {
    await configMap(cluster, "reads", "reader", {}, { scope: "in", role: "reader" });
    const [got] = await waitFor("the reads", () => (results.length > 0 ? results : undefined));
    const { denied, ...rest } = got as { denied: { name: string; code: number } };
    assert.deepEqual(rest, {
      target: { x: "1" },
      hidden: undefined,
      missing: undefined,
      all: ["reader", "target"],
      selected: ["reader"],
    });
    assert.equal(denied.name, "ReadError");
    assert.equal(denied.code, 9, "FAILED_PRECONDITION: a type the session did not register");
  } finally {
    await r.stop();
  }
});

test("stop() drains: in-flight work finishes and is answered, nothing new starts", async () => {
  await namespace(cluster, "drain");
  const ends: string[] = [];
  const starts: string[] = [];
  let release: () => void = () => {};
  const gate = new Promise<void>((ok) => (release = ok));
  const c = controller("drain")
    .for(ConfigMaps)
    .inNamespaces("drain")
    .concurrency(2)
    .reconcile(async (req) => {
      starts.push(req.name);
      if (req.name === "busy") {
        await gate;
      }
      ends.push(req.name);
      return Action.done();
    });
  const r = await runController(c, manager);
  await configMap(cluster, "drain", "busy");
  await waitFor("busy started", () => (starts.includes("busy") ? true : undefined));
  c.stop();
  await waitFor("the manager sees the session draining", async () => {
    const s = await controllerStatus(manager, "drain");
    const sessions = (s?.["sessionList"] as Array<{ draining: boolean }> | undefined) ?? [];
    return sessions.some((x) => x.draining) ? true : undefined;
  });
  await configMap(cluster, "drain", "late");
  const status = await controllerStatus(manager, "drain");
  assert.equal(status?.["inFlight"], 1);
  release();
  await r.done;
  assert.deepEqual(ends, ["busy"]);
  assert.ok(!starts.includes("late"), "nothing new after Drain");
  assert.equal(r.ends.at(-1)?.code, 0, "the manager ended the drained stream with OK");
});

test("setCredit pauses and resumes dispatch", async () => {
  await namespace(cluster, "credit");
  const seen: string[] = [];
  const c = controller("credit")
    .for(ConfigMaps)
    .inNamespaces("credit")
    .concurrency(2)
    .reconcile((req) => {
      seen.push(req.name);
    });
  const r = await runController(c, manager);
  try {
    c.setCredit(0);
    await waitFor("credit 0 at the manager", async () => {
      const s = await controllerStatus(manager, "credit");
      const sessions = (s?.["sessionList"] as Array<{ credits: number }> | undefined) ?? [];
      return sessions[0]?.credits === 0 ? true : undefined;
    });
    await configMap(cluster, "credit", "held");
    await waitFor("the key queued", async () => ((await controllerStatus(manager, "credit"))?.["queued"] === 1 ? true : undefined));
    await sleep(500);
    assert.equal(seen.length, 0, "nothing dispatched without credit");
    c.setCredit(3);
    await waitFor("dispatched after Credit", () => (seen.includes("held") ? true : undefined));
  } finally {
    await r.stop();
  }
});

test("a burst: every held-back key is reconciled once, and results that finish together go back as one ResultBatch", async (t) => {
  await namespace(cluster, "burst");
  const names = Array.from({ length: 12 }, (_, i) => `b${String(i).padStart(2, "0")}`);
  const seen: string[] = [];
  let releaseAll: () => void = () => {};
  const allStarted = new Promise<void>((ok) => (releaseAll = ok));
  const c = controller("burst")
    .for(ConfigMaps)
    .inNamespaces("burst")
    .concurrency(names.length)
    .reconcile(async (req) => {
      seen.push(req.name);
      if (seen.length === names.length) {
        releaseAll();
      }
      // Every handler ends in the turn the last one starts: their results are ready together.
      await allStarted;
    });
  const r = await runController(c, manager);
  try {
    assert.equal(r.registrations[0]?.effective?.maxBatch, 64, "the manager applies the SDK's max_batch");
    c.setCredit(0);
    await waitFor("credit 0 at the manager", async () => {
      const s = await controllerStatus(manager, "burst");
      const sessions = (s?.["sessionList"] as Array<{ credits: number }> | undefined) ?? [];
      return sessions[0]?.credits === 0 ? true : undefined;
    });
    await Promise.all(names.map((n) => configMap(cluster, "burst", n)));
    await waitFor("the burst queued", async () => ((await controllerStatus(manager, "burst"))?.["queued"] === names.length ? true : undefined));
    const batches = async (direction: string): Promise<{ count: number; pieces: number }> => ({
      count: await metric(manager, `ctrlhub_batch_size_count{direction="${direction}"}`),
      pieces: await metric(manager, `ctrlhub_batch_size_sum{direction="${direction}"}`),
    });
    const [receivedBefore, sentBefore] = [await batches("received"), await batches("sent")];
    c.setCredit(names.length);
    await waitFor("every result recorded", async () => ((await controllerStatus(manager, "burst"))?.["done"] === names.length ? true : undefined));
    assert.deepEqual([...seen].sort(), names, "each key once, however the manager grouped the requests");
    const received = await batches("received");
    assert.deepEqual(
      { count: received.count - receivedBefore.count, pieces: received.pieces - receivedBefore.pieces },
      { count: 1, pieces: names.length },
      "the results came back as one ResultBatch",
    );
    // How the manager grouped the requests depends on its threads' timing: shown, not asserted.
    const sent = await batches("sent");
    t.diagnostic(`${sent.pieces - sentBefore.pieces} of ${names.length} requests arrived in ${sent.count - sentBefore.count} WorkBatch(es)`);
  } finally {
    await r.stop();
  }
});

test("EVENTS mode: every change in order, acknowledged when the handler resolves", async () => {
  await namespace(cluster, "events");
  const events: ObjectEvent<V1ConfigMap>[] = [];
  let failOnce = true;
  const c = controller("events")
    .for(ConfigMaps)
    .inNamespaces("events")
    .deadline(1500)
    .onEvent(async (ev) => {
      if (ev.type === "MODIFIED" && failOnce) {
        failOnce = false;
        throw new Error("not yet");
      }
      events.push(ev);
    });
  const r = await runController(c, manager);
  try {
    await configMap(cluster, "events", "e", { v: "1" });
    await mergePatch(cluster, "events", "e", { data: { v: "2" } });
    await cluster.core.deleteNamespacedConfigMap({ name: "e", namespace: "events" });
    await waitFor("three events", () => (events.length === 3 ? true : undefined));
    assert.deepEqual(events.map((e) => e.type), ["ADDED", "MODIFIED", "DELETED"]);
    assert.equal(events[1]?.attempt, 2, "the failed event was sent again");
    assert.equal(events[1]?.object.data?.["v"], "2");
    assert.ok((events[2]?.sequence ?? 0n) > (events[0]?.sequence ?? 0n));
  } finally {
    await r.stop();
  }
});

test("a registration the manager refuses rejects run() with the field", async () => {
  const c = controller("refused").for(kind("example.com/v1", "NoSuchKind")).reconcile(() => undefined);
  await assert.rejects(
    c.run({ address: manager.grpc, handleSignals: false, logger: { debug() {}, info() {}, warn() {}, error() {} } }),
    (err: unknown) => err instanceof RegistrationRejectedError && err.code === 3 && err.field.startsWith("register.primary"),
  );
});

test("a wrong token is fatal", async () => {
  const wrong = controller("wrongtoken").for(kinds.ConfigMap).reconcile(() => undefined);
  await assert.rejects(
    wrong.run({ address: manager.grpc, token: "nope", handleSignals: false, logger: { debug() {}, info() {}, warn() {}, error() {} } }),
    (err: unknown) => err instanceof RegistrationRejectedError && err.code === 16,
  );
});

test("stop({ retire: true }) has the manager forget the controller at once; a plain stop keeps it for its grace", async () => {
  for (const retire of [false, true]) {
    const name = retire ? "retired" : "kept";
    const c = controller(name).for(kinds.ConfigMap).inNamespaces("basic").reconcile(() => undefined);
    const r = await runController(c, manager);
    await waitFor(`${name} listed`, async () => ((await controllerStatus(manager, name)) === undefined ? undefined : true));
    c.stop({ retire });
    await r.done;
    assert.equal(r.ends.at(-1)?.code, 0, "drained");
    const entry = await waitFor(`${name}: its session gone`, async () => {
      const s = await controllerStatus(manager, name);
      return s === undefined || s["sessions"] === 0 ? { entry: s } : undefined;
    });
    if (retire) {
      assert.equal(entry.entry, undefined, "a retired controller is forgotten");
    } else {
      assert.equal(entry.entry?.["sessions"], 0, "kept, without sessions, for --controller-grace");
    }
  }
});
