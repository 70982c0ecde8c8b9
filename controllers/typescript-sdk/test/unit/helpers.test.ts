import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  Backoff,
  type Condition,
  addFinalizerPatch,
  consoleLogger,
  findCondition,
  finalizerStep,
  finalizersPatch,
  hasFinalizer,
  isDeleting,
  isConditionTrue,
  removeCondition,
  removeFinalizerPatch,
  setCondition,
} from "../../src/index.js";
import { runFor } from "../../src/attempt.js";

// The helper semantics every ctrlhub SDK shares: tests/conformance/helpers.json at the
// repository's root (from dist/test/unit/ when compiled), every case run.
type Json = any;
const table: Json = JSON.parse(readFileSync(new URL("../../../../../tests/conformance/helpers.json", import.meta.url), "utf8"));

function cases(section: string): Json[] {
  const all: Json[] = table[section];
  assert.ok(all.length > 0, `helpers.json has ${section} cases`);
  return all;
}

/** A condition as JSON: lastTransitionTime in RFC 3339, whole seconds. */
function asJson(c: Condition): Json {
  const t = c.lastTransitionTime;
  const time = t instanceof Date ? t.toISOString().replace(/\.\d{3}Z$/, "Z") : t;
  return { ...c, lastTransitionTime: time };
}

for (const c of cases("conditions")) {
  test(`conditions: ${c.name}`, () => {
    const cs: Condition[] = structuredClone(c.given);
    c.steps.forEach((step: Json, i: number) => {
      const changed =
        step.remove !== undefined
          ? removeCondition(cs, step.remove)
          : setCondition(cs, step.set, () => new Date(step.now));
      assert.equal(changed, step.changed, `step ${i}`);
    });
    assert.deepEqual(cs.map(asJson), c.want);
    assert.deepEqual(
      cs.filter((x) => isConditionTrue(cs, x.type)).map((x) => x.type),
      c.true,
    );
  });
}

for (const c of cases("finalizers")) {
  test(`finalizers: ${c.name}`, () => {
    assert.equal(hasFinalizer(c.object, c.finalizer), c.has);
    assert.equal(isDeleting(c.object), c.deleting);
    assert.equal(finalizerStep(c.object, c.finalizer), c.step);
    assert.deepEqual(addFinalizerPatch(c.object, c.finalizer) ?? null, c.add_patch);
    assert.deepEqual(removeFinalizerPatch(c.object, c.finalizer) ?? null, c.remove_patch);
  });
}

for (const c of cases("backoff")) {
  test(`backoff: ${c.name}`, () => {
    const low = new Backoff(c.initial_ms, c.max_ms, () => 0);
    const high = new Backoff(c.initial_ms, c.max_ms, () => 1);
    c.sessions.forEach((s: Json, i: number) => {
      assert.ok(Math.abs(low.next(s.registered) - s.min_ms) <= 1, `session ${i}: least`);
      assert.ok(Math.abs(high.next(s.registered) - s.max_ms) <= 1, `session ${i}: most`);
    });
  });
}

test("deadline: the margin before the manager's deadline", () => {
  for (const c of cases("deadline")) {
    assert.ok(Math.abs(runFor(c.remaining_ms) - c.run_ms) < 1e-6, `${c.remaining_ms} ms left`);
  }
});

// TypeScript's own: explicit transition times, findCondition, finalizersPatch of nothing.
test("an explicit lastTransitionTime is kept; find and the empty patch", () => {
  const cs: Condition[] = [];
  setCondition(cs, { type: "Late", status: false, reason: "X", lastTransitionTime: "2020-01-01T00:00:00Z" }, () => new Date(900_000));
  assert.deepEqual(findCondition(cs, "Late")?.lastTransitionTime, new Date("2020-01-01T00:00:00Z"));
  assert.equal(findCondition(cs, "Ready"), undefined);
  assert.deepEqual(finalizersPatch({}, []), { metadata: { finalizers: [] } });
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
