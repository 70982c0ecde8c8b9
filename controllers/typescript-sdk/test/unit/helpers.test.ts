import assert from "node:assert/strict";
import { test } from "node:test";

import {
  type Condition,
  addFinalizerPatch,
  consoleLogger,
  findCondition,
  finalizerStep,
  finalizersPatch,
  hasFinalizer,
  isConditionTrue,
  removeCondition,
  removeFinalizerPatch,
  setCondition,
} from "../../src/index.js";

const at = (s: number) => () => new Date(s * 1000 + 123);

test("a new condition gets now, truncated to seconds", () => {
  const cs: Condition[] = [];
  assert.equal(setCondition(cs, { type: "Ready", status: true, reason: "Ok", message: "fine", observedGeneration: 1 }, at(100)), true);
  assert.deepEqual(cs, [
    { type: "Ready", status: "True", reason: "Ok", message: "fine", observedGeneration: 1, lastTransitionTime: new Date(100_000) },
  ]);
});

test("the same status keeps the transition time", () => {
  const cs: Condition[] = [];
  setCondition(cs, { type: "Ready", status: true, reason: "Ok", message: "a", observedGeneration: 1 }, at(100));
  assert.equal(setCondition(cs, { type: "Ready", status: "True", reason: "Ok", message: "a", observedGeneration: 1 }, at(200)), false);
  assert.equal(setCondition(cs, { type: "Ready", status: true, reason: "Ok", message: "b", observedGeneration: 2 }, at(300)), true);
  assert.deepEqual(cs[0]?.lastTransitionTime, new Date(100_000));
  assert.equal(cs[0]?.message, "b");
  assert.equal(cs[0]?.observedGeneration, 2);
});

test("a status change moves the transition time; explicit times are kept", () => {
  const cs: Condition[] = [];
  setCondition(cs, { type: "Ready", status: true, reason: "Ok" }, at(100));
  setCondition(cs, { type: "Other", status: false, reason: "No" }, at(100));
  assert.equal(setCondition(cs, { type: "Ready", status: "Unknown", reason: "Hmm" }, at(500)), true);
  assert.equal(cs[0]?.status, "Unknown");
  assert.deepEqual(cs[0]?.lastTransitionTime, new Date(500_000));
  assert.deepEqual(cs[1]?.lastTransitionTime, new Date(100_000));
  setCondition(cs, { type: "Late", status: false, reason: "X", lastTransitionTime: "2020-01-01T00:00:00Z" }, at(900));
  assert.deepEqual(findCondition(cs, "Late")?.lastTransitionTime, new Date("2020-01-01T00:00:00Z"));
  assert.equal(isConditionTrue(cs, "Ready"), false);
  assert.equal(removeCondition(cs, "Ready"), true);
  assert.equal(removeCondition(cs, "Ready"), false);
  assert.equal(findCondition(cs, "Ready"), undefined);
});

test("finalizer patches carry the resourceVersion precondition", () => {
  const live = { metadata: { name: "a", resourceVersion: "42", finalizers: ["x/y"] } };
  assert.equal(hasFinalizer(live, "x/y"), true);
  assert.deepEqual(addFinalizerPatch(live, "a/b"), { metadata: { finalizers: ["x/y", "a/b"], resourceVersion: "42" } });
  assert.equal(addFinalizerPatch(live, "x/y"), undefined);
  assert.deepEqual(removeFinalizerPatch(live, "x/y"), { metadata: { finalizers: [], resourceVersion: "42" } });
  assert.equal(removeFinalizerPatch(live, "a/b"), undefined);
  assert.deepEqual(finalizersPatch({}, []), { metadata: { finalizers: [] } });
});

test("the finalizer flow's steps", () => {
  const f = "example.com/cleanup";
  assert.equal(finalizerStep({ metadata: {} }, f), "add");
  assert.equal(finalizerStep({ metadata: { finalizers: [f] } }, f), "apply");
  assert.equal(finalizerStep({ metadata: { finalizers: [f], deletionTimestamp: new Date() } }, f), "cleanup");
  assert.equal(finalizerStep({ metadata: { deletionTimestamp: "2024-01-01T00:00:00Z" } }, f), "none");
});

test("the console logger writes bigints and cycles as text instead of throwing", () => {
  const written: string[] = [];
  const write = process.stderr.write.bind(process.stderr);
  process.stderr.write = ((chunk: string | Uint8Array) => {
    written.push(String(chunk));
    return true;
  }) as typeof process.stderr.write;
  try {
    const cyclic: Record<string, unknown> = {};
    cyclic["self"] = cyclic;
    const log = consoleLogger("x", "debug");
    log.debug("effective", { effective: { revision: 5n, nested: [1n] } });
    log.info("cycle", { cyclic });
  } finally {
    process.stderr.write = write;
  }
  assert.match(written[0] ?? "", /effective effective=\{"revision":"5","nested":\["1"\]\}/);
  assert.match(written[1] ?? "", /cycle cyclic=\[object Object\]/);
});
