import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiException } from "@kubernetes/client-node";

import { failureOf, resultOf } from "../../src/action.js";
import { Action, RetryError, TerminalError } from "../../src/index.js";

test("actions become outcomes", () => {
  assert.equal(resultOf("1", Action.done())[0].outcome.case, "done");
  assert.equal(resultOf("1", undefined)[1], "done");
  const [r, label] = resultOf("7", Action.requeueAfter(1500));
  assert.equal(label, "requeue");
  assert.equal(r.id, "7");
  assert.equal(r.outcome.case, "requeueAfter");
  assert.deepEqual(
    r.outcome.case === "requeueAfter" ? [r.outcome.value.delay?.seconds, r.outcome.value.delay?.nanos] : [],
    [1n, 500_000_000],
  );
  assert.throws(() => Action.requeueAfter(-1), RangeError);
  assert.throws(() => resultOf("1", { nope: true } as unknown as Action), TypeError);
});

test("thrown errors become Error or Terminal", () => {
  const [t, tl] = failureOf("1", new TerminalError("bad spec"));
  assert.equal(tl, "terminal");
  assert.deepEqual(t.outcome.case === "terminal" && t.outcome.value.message, "bad spec");
  const [e] = failureOf("1", new RetryError("slow down", { retryAfterMs: 3000 }));
  assert.equal(e.outcome.case, "error");
  assert.equal(e.outcome.case === "error" && e.outcome.value.retryAfter?.seconds, 3n);
  const [plain, pl] = failureOf("1", new Error("boom"));
  assert.equal(pl, "error");
  assert.equal(plain.outcome.case === "error" && plain.outcome.value.retryAfter, undefined);
  assert.equal(failureOf("1", "a string")[0].outcome.value?.$typeName, "ctrlhub.v1.ReconcileResult.Error");
});

test("Kubernetes API errors map like the Rust SDK's", () => {
  const api = (code: number, headers: Record<string, string> = {}) => new ApiException(code, "msg", "body", headers);
  assert.equal(failureOf("1", api(422))[1], "terminal");
  assert.equal(failureOf("1", api(400))[1], "terminal");
  assert.equal(failureOf("1", api(409))[1], "error");
  assert.equal(failureOf("1", api(500))[1], "error");
  const [limited] = failureOf("1", api(429, { "Retry-After": "7" }));
  assert.equal(limited.outcome.case === "error" && limited.outcome.value.retryAfter?.seconds, 7n);
});
