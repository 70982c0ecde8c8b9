import assert from "node:assert/strict";
import { test } from "node:test";

import { Backoff, Limiter } from "../../src/backoff.js";

test("backoff doubles to its cap with equal jitter, reset by a registered session", () => {
  const low = new Backoff(100, 1000, () => 0);
  assert.deepEqual([1, 2, 3, 4, 5, 6].map(() => low.next(false)), [50, 100, 200, 400, 500, 500]);
  assert.equal(low.next(true), 50, "a session that registered resets it");
  const high = new Backoff(100, 1000, () => 0.999999);
  assert.ok(Math.abs(high.next(false) - 100) < 0.01);
  assert.ok(Math.abs(high.next(false) - 200) < 0.01);
  assert.throws(() => new Backoff(0, 1), RangeError);
  assert.throws(() => new Backoff(10, 5), RangeError);
});

test("the limiter admits up to its limit and can be resized", async () => {
  const l = new Limiter(2);
  const a = await l.acquire();
  const b = await l.acquire();
  let third = false;
  const c = l.acquire().then((release) => {
    third = true;
    return release;
  });
  await new Promise((r) => setImmediate(r));
  assert.equal(third, false);
  a();
  a(); // releasing twice frees one slot only
  const releaseC = await c;
  assert.equal(third, true);
  assert.equal(l.inUse, 2);
  l.resize(1);
  b();
  releaseC();
  assert.equal(l.inUse, 0);
  const d = await l.acquire();
  let fifth = false;
  void l.acquire().then(() => (fifth = true));
  await new Promise((r) => setImmediate(r));
  assert.equal(fifth, false, "limit 1 after the resize");
  l.resize(2);
  await new Promise((r) => setImmediate(r));
  assert.equal(fifth, true);
  d();
});
