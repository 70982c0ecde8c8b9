import assert from "node:assert/strict";
import { test } from "node:test";

import { Backoff, Limiter } from "../../src/backoff.js";

// The delays and the reset are cases of tests/conformance/helpers.json (helpers.test.ts).
test("a backoff needs 0 < initial <= max", () => {
  assert.throws(() => new Backoff(0, 1), RangeError);
  assert.throws(() => new Backoff(10, 5), RangeError);
});

test("a reset (a registered session redirected to the owner) makes the next failure wait the first delay", () => {
  const b = new Backoff(100, 10_000, () => 1);
  assert.deepEqual([b.next(false), b.next(false), b.next(false)], [100, 200, 400]);
  b.reset();
  assert.equal(b.attempts, 0);
  assert.equal(b.next(false), 100);
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
