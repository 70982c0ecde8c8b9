import assert from "node:assert/strict";
import { test } from "node:test";

import { ConfigError, Predicate, controller, kind, kinds } from "../../src/index.js";
import { Register_Mode } from "../../src/proto.js";

test("the fluent definition becomes a Register", () => {
  const r = controller("web")
    .for(kind("example.com/v1", "Widget", "widgets"))
    .inNamespaces("a", "b")
    .withLabels({ matchLabels: { app: "web" }, matchExpressions: [{ key: "tier", operator: "In", values: ["x"] }] })
    .where(Predicate.generationChanged().or(Predicate.deleting()).and(Predicate.hasFinalizer("f").not()))
    .owns(kinds.Deployment)
    .watches(kinds.Secret, { label: "example.com/owner" })
    .includeObject()
    .concurrency(4)
    .maxConcurrentReconciles(8)
    .deadline(30_000)
    .resync(0)
    .backoff({ baseMs: 200, maxMs: 5_000 })
    .reconcile(() => undefined)
    .registration();
  assert.equal(r.controllerName, "web");
  assert.equal(r.mode, Register_Mode.RECONCILE);
  assert.deepEqual([r.primary?.group, r.primary?.version, r.primary?.kind, r.primary?.plural], ["example.com", "v1", "Widget", "widgets"]);
  assert.deepEqual(r.namespaces?.scope.case === "names" && r.namespaces.scope.value.names, ["a", "b"]);
  assert.deepEqual(r.labelSelector?.matchLabels, { app: "web" });
  assert.equal(r.labelSelector?.matchExpressions[0]?.values[0], "x");
  assert.equal(r.predicate?.predicate.case, "allOf");
  assert.equal(r.owns[0]?.controllerOnly, true);
  assert.deepEqual(r.watches[0]?.mapping, { case: "labelKey", value: "example.com/owner" });
  assert.equal(r.maxInFlight, 4);
  assert.equal(r.maxConcurrentReconciles, 8);
  assert.equal(r.requestDeadline?.seconds, 30n);
  assert.ok(r.resyncPeriod !== undefined && r.resyncPeriod.seconds === 0n && r.resyncPeriod.nanos === 0, "explicit zero: resync off");
  assert.equal(r.backoff?.base?.nanos, 200_000_000);
  assert.equal(r.includeObject, true);
});

test("defaults are left to the manager", () => {
  const r = controller("plain").for(kinds.ConfigMap).reconcile(() => undefined).registration();
  assert.equal(r.namespaces, undefined);
  assert.equal(r.requestDeadline, undefined);
  assert.equal(r.resyncPeriod, undefined);
  assert.equal(r.backoff, undefined);
  assert.equal(r.maxInFlight, 1);
});

test("bad definitions fail with a clear error before connecting", () => {
  assert.throws(() => controller("Bad_Name").for(kinds.ConfigMap).reconcile(() => undefined), /DNS-1123 label/);
  assert.throws(() => controller("x".repeat(64)).for(kinds.ConfigMap).reconcile(() => undefined), /DNS-1123 label/);
  assert.throws(() => controller("nokind").reconcile(() => undefined), /no primary type: call \.for\(kind\) first/);
  assert.throws(() => controller("c").concurrency(0), /positive integer/);
  assert.throws(() => controller("c").backoff({ baseMs: 10, maxMs: 1 }), ConfigError);
  assert.throws(() => controller("c").inNamespaces(), /at least one name/);
  assert.throws(() => kind("apps/v1/x", "Deployment"), /invalid apiVersion/);
  assert.throws(() => kind("v1", "configmap"), /PascalCase/);
  assert.throws(
    () => controller("ev").for(kinds.ConfigMap).owns(kinds.Secret).backoff({ baseMs: 1, maxMs: 2 }).onEvent(() => undefined),
    /onEvent\(\) cannot be combined with owns\(\), backoff\(\)/,
  );
  const events = controller("ev").for(kinds.ConfigMap).onEvent(() => undefined).registration();
  assert.equal(events.mode, Register_Mode.EVENTS);
});

test("run refuses a bad address before connecting", async () => {
  const c = controller("addr").for(kinds.ConfigMap).reconcile(() => undefined);
  await assert.rejects(c.run({ address: "localhost", handleSignals: false }), /the port is missing/);
});

test("owns and watches entries ask for metadata only when told; reconcilers set exclusive attempts", () => {
  const r = controller("forms")
    .for(kinds.ConfigMap)
    .owns(kinds.Deployment)
    .owns(kinds.Secret, { metadataOnly: true })
    .watches(kinds.Pod, { label: "x" }, { metadataOnly: true })
    .reconcile(() => undefined)
    .registration();
  assert.deepEqual(r.owns.map((o) => o.metadataOnly), [false, true], "children in full by default");
  assert.equal(r.watches[0]?.metadataOnly, true);
  assert.equal(r.exclusiveAttempts, true);
  const events = controller("ev").for(kinds.ConfigMap).onEvent(() => undefined).registration();
  assert.equal(events.exclusiveAttempts, false, "an event has no negative acknowledgement");
});

test("the revision comes from the option, else CTRLHUB_REVISION, else 0; a bad one says what to change", () => {
  const of = (env: NodeJS.ProcessEnv, revision?: number | bigint) => {
    const saved = process.env["CTRLHUB_REVISION"];
    try {
      if (env["CTRLHUB_REVISION"] === undefined) {
        delete process.env["CTRLHUB_REVISION"];
      } else {
        process.env["CTRLHUB_REVISION"] = env["CTRLHUB_REVISION"];
      }
      const b = controller("rev").for(kinds.ConfigMap);
      return (revision === undefined ? b : b.revision(revision)).reconcile(() => undefined).registration().revision;
    } finally {
      if (saved === undefined) {
        delete process.env["CTRLHUB_REVISION"];
      } else {
        process.env["CTRLHUB_REVISION"] = saved;
      }
    }
  };
  assert.equal(of({}), 0n);
  assert.equal(of({ CTRLHUB_REVISION: " 42 " }), 42n);
  assert.equal(of({ CTRLHUB_REVISION: "18446744073709551615" }), 2n ** 64n - 1n);
  assert.equal(of({ CTRLHUB_REVISION: "42" }, 7), 7n, "the option wins");
  assert.throws(() => of({ CTRLHUB_REVISION: "v2" }), /CTRLHUB_REVISION must be a non-negative integer.*not "v2"/);
  assert.throws(() => of({ CTRLHUB_REVISION: "18446744073709551616" }), ConfigError);
  assert.throws(() => controller("rev").revision(-1), /revision must be a non-negative integer/);
  assert.throws(() => controller("rev").revision(1.5), ConfigError);
});
