// The parts of the write helpers, the Events recorder, the log settings and the health
// endpoint that need no cluster: adopt's refusals, error classification, client-go's
// correlation (series and the per-object rate limit), CTRLHUB_LOG*, and /healthz on a stuck loop.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";

import * as k8s from "@kubernetes/client-node";

import { Correlator } from "../../src/events.js";
import { Health, parseListen } from "../../src/health.js";
import {
  ConfigError,
  EVENT_BURST,
  EVENT_REFILL_MS,
  SERIES_WINDOW_MS,
  WriteError,
  adopt,
  apiStatus,
  isConflict,
  isNotFound,
  logSettingsFromEnv,
} from "../../src/index.js";
import { ReadError } from "../../src/reader.js";
import { waitFor } from "../support.js";

const owner = { apiVersion: "example.com/v1", kind: "Site", metadata: { name: "s", namespace: "web", uid: "u-1" } };

test("adopt sets the controller reference and the owner's namespace, replacing another controller", () => {
  const child = adopt<k8s.V1Service>(
    { apiVersion: "v1", kind: "Service", metadata: { name: "c", ownerReferences: [
      { apiVersion: "x/v1", kind: "Old", name: "o", uid: "u-0", controller: true },
      { apiVersion: "x/v1", kind: "Other", name: "p", uid: "u-2" },
    ] } },
    owner,
  );
  assert.equal(child.metadata?.namespace, "web");
  assert.deepEqual(child.metadata?.ownerReferences, [
    { apiVersion: "x/v1", kind: "Other", name: "p", uid: "u-2" },
    { apiVersion: "example.com/v1", kind: "Site", name: "s", uid: "u-1", controller: true, blockOwnerDeletion: true },
  ]);
  assert.equal(adopt(child, owner).metadata?.ownerReferences?.length, 2, "adopting again changes nothing");
});

test("adopt refuses an owner in another namespace, a namespaced owner of a cluster-scoped child, an owner never stored", () => {
  const reason = (f: () => unknown): string | undefined => {
    try {
      f();
      return undefined;
    } catch (err) {
      assert.ok(err instanceof WriteError);
      return err.reason;
    }
  };
  assert.equal(reason(() => adopt({ apiVersion: "v1", kind: "Service", metadata: { name: "c", namespace: "other" } }, owner)), "OwnerInAnotherNamespace");
  assert.equal(reason(() => adopt({ apiVersion: "v1", kind: "Namespace", metadata: { name: "n" } }, owner)), "ClusterScopedChild");
  assert.equal(reason(() => adopt({ apiVersion: "x/v1", kind: "Global", metadata: { name: "g", namespace: "" } }, owner)), "ClusterScopedChild");
  assert.equal(reason(() => adopt({ apiVersion: "v1", kind: "Service", metadata: { name: "c" } }, { ...owner, metadata: { name: "s", namespace: "web" } })), "OwnerWithoutUid");
  assert.equal(reason(() => adopt({ apiVersion: "v1", kind: "Service", metadata: { name: "c" } }, { metadata: { name: "s", uid: "u" } })), "MissingKind");
  // A cluster-scoped owner may own a namespaced child.
  const cluster = { apiVersion: "example.com/v1", kind: "Tenant", metadata: { name: "t", uid: "u-9" } };
  assert.equal(adopt({ apiVersion: "v1", kind: "Service", metadata: { name: "c", namespace: "any" } }, cluster).metadata.namespace, "any");
});

test("isNotFound and isConflict whatever the error type; a gRPC code is no HTTP status", () => {
  assert.equal(isNotFound(new k8s.ApiException(404, "not found", {}, {})), true);
  assert.equal(isConflict(new k8s.ApiException(409, "conflict", {}, {})), true);
  assert.equal(isNotFound(new k8s.ApiException(409, "conflict", {}, {})), false);
  assert.equal(isNotFound({ statusCode: 404 }), true);
  assert.equal(isConflict({ response: { statusCode: 409 } }), true);
  assert.equal(isNotFound({ body: '{"kind":"Status","code":404,"reason":"NotFound"}' }), true);
  assert.equal(isConflict(new Error("wrapped", { cause: new k8s.ApiException(409, "x", {}, {}) })), true);
  assert.equal(apiStatus(new ReadError(5, "gRPC NOT_FOUND")), undefined);
  assert.equal(isNotFound(new Error("404 somewhere in a message")), false);
  assert.equal(isNotFound(undefined), false);
  assert.equal(isConflict("409"), false);
});

test("Events: one series per object, type, reason and message within 10 minutes; 25 per object at once, then one per 5 minutes", () => {
  const c = new Correlator();
  const regarding = { apiVersion: "v1", kind: "ConfigMap", name: "a", namespace: "n", uid: "u" };
  const post = (reason: string, r = regarding) => ({ regarding: r, type: "Warning" as const, reason, note: "boom" });
  let now = 1_000_000;
  assert.deepEqual(c.decide(post("Failed"), now), { kind: "create" });
  c.created(post("Failed"), now, "n", "a.1");
  assert.deepEqual(c.decide(post("Failed"), now + 1), { kind: "increment", namespace: "n", name: "a.1", count: 2 });
  c.incremented(post("Failed"), now + 1, 2);
  assert.deepEqual(c.decide(post("Failed"), now + 2), { kind: "increment", namespace: "n", name: "a.1", count: 3 });
  c.incremented(post("Failed"), now + 2, 3);
  assert.deepEqual(c.decide(post("Failed"), now + 2 + SERIES_WINDOW_MS + 1), { kind: "create" }, "a new series after the window");

  // The bucket: 25 at once (4 spent above), then dropped; one more after 5 minutes.
  const d = new Correlator();
  const burst = Array.from({ length: EVENT_BURST + 5 }, (_, i) => d.decide(post(`R${i}`), now).kind);
  assert.equal(burst.filter((k) => k === "create").length, EVENT_BURST);
  assert.deepEqual(burst.slice(EVENT_BURST), ["drop", "drop", "drop", "drop", "drop"]);
  now += EVENT_REFILL_MS;
  assert.equal(d.decide(post("Later"), now).kind, "create");
  assert.equal(d.decide(post("Later2"), now).kind, "drop");
  assert.equal(d.decide(post("Other", { ...regarding, name: "b", uid: "v" }), now).kind, "create", "another object has its own bucket");
});

test("CTRLHUB_LOG and CTRLHUB_LOG_FORMAT: defaults, every level, and a ConfigError naming the variable", () => {
  assert.deepEqual(logSettingsFromEnv({}), { level: "info", format: "text" });
  assert.deepEqual(logSettingsFromEnv({ CTRLHUB_LOG: "TRACE", CTRLHUB_LOG_FORMAT: "json" }), { level: "trace", format: "json" });
  for (const level of ["error", "warn", "info", "debug", "trace"]) {
    assert.equal(logSettingsFromEnv({ CTRLHUB_LOG: level }).level, level);
  }
  assert.throws(() => logSettingsFromEnv({ CTRLHUB_LOG: "verbose" }), (e: unknown) => e instanceof ConfigError && /CTRLHUB_LOG=/.test(e.message));
  assert.throws(() => logSettingsFromEnv({ CTRLHUB_LOG_FORMAT: "yaml" }), (e: unknown) => e instanceof ConfigError && /CTRLHUB_LOG_FORMAT=/.test(e.message));
});

test("health addresses: host:port, [v6]:port, :port; anything else is a ConfigError", () => {
  assert.deepEqual(parseListen("0.0.0.0:8081"), { host: "0.0.0.0", port: 8081 });
  assert.deepEqual(parseListen("[::]:8081"), { host: "::", port: 8081 });
  assert.deepEqual(parseListen(":9000"), { host: "0.0.0.0", port: 9000 });
  for (const bad of ["8081", "host", "a:99999", "a:b"]) {
    assert.throws(() => parseListen(bad), ConfigError, bad);
  }
});

test("/healthz fails with the reason while the event loop is blocked, answered from the worker thread; /readyz says why it is not ready", async () => {
  const health = await Health.start({ address: "127.0.0.1:0", stuckAfterMs: 300 });
  try {
    const get = async (path: string): Promise<[number, string]> => {
      const res = await fetch(`http://127.0.0.1:${health.port}${path}`);
      return [res.status, (await res.text()).trim()];
    };
    assert.deepEqual(await get("/healthz"), [200, "ok"]);
    assert.deepEqual(await get("/readyz"), [503, "starting"]);
    health.ready(); // a message to the worker: it answers 200 once it has it
    await waitFor("/readyz 200", async () => ((await get("/readyz"))[0] === 200 ? true : undefined), 10_000);
    assert.deepEqual(await get("/readyz"), [200, "ok"]);
    health.notReady("reconnecting: the manager went away\nsecond line");
    const reason = await waitFor("/readyz 503", async () => { const r = await get("/readyz"); return r[0] === 503 ? r : undefined; }, 10_000);
    assert.deepEqual(reason, [503, "reconnecting: the manager went away"], "its first line");

    // Block this thread's loop for 600 ms, then ask synchronously from another process.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 600);
    const out = execFileSync(process.execPath, ["-e",
      `fetch("http://127.0.0.1:${health.port}/healthz").then(async (r) => console.log(r.status, await r.text()))`], { encoding: "utf8" });
    assert.match(out, /^500 stuck: the controller's event loop ran no tick/);
    await waitFor("/healthz 200 once the loop ticks again", async () => ((await get("/healthz"))[0] === 200 ? true : undefined), 10_000);
  } finally {
    await health.close();
  }
});
