// One attempt of a key at a time within the process, across sessions, against real managers
// with a 30 s hold (so that a handler may overrun its session's end for several seconds
// without ending this test process), and the bound on how long a stop waits for handlers.
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, test } from "node:test";

import type { V1ConfigMap } from "@kubernetes/client-node";

import { Action, SessionEndedError, controller, kind } from "../../src/index.js";
import {
  type Cluster,
  type Manager,
  configMap,
  controllerStatus,
  freePort,
  namespace,
  runController,
  startDevcluster,
  startManager,
  waitFor,
} from "../support.js";

/** A 40 s Lease less a 10 s renew deadline: a 30 s hold (handlers must stop within 24 s). */
const LONG_HOLD = ["--lease-duration", "40s", "--renew-deadline", "10s", "--retry-period", "1s"];

let cluster: Cluster;

before(async () => {
  cluster = await startDevcluster();
});

after(async () => {
  await cluster?.proc.stop();
});

const ConfigMaps = kind<V1ConfigMap>("v1", "ConfigMap");

test("a key re-delivered on a new session waits for its attempt still running from the old one", async () => {
  await namespace(cluster, "handover");
  await configMap(cluster, "handover", "k");
  const port = await freePort();
  const first = await startManager(cluster, "ts-handover-1", LONG_HOLD, port);
  const attempts: Array<{ session: string; dispatched: number; start: number; end: number; reason?: unknown }> = [];
  const c = controller("handover")
    .for(ConfigMaps)
    .inNamespaces("handover")
    .concurrency(2)
    .reconcile(async (req) => {
      // The default 60 s deadline: the request was dispatched 60 s before it.
      const a: (typeof attempts)[number] = { session: req.sessionId, dispatched: req.deadline.getTime() - 60_000, start: Date.now(), end: 0 };
      attempts.push(a);
      if (attempts.length === 1) {
        // Ignores the end of its session for 8 s (well within 80 % of the 30 s hold).
        await new Promise((ok) => req.signal.addEventListener("abort", ok, { once: true }));
        a.reason = req.signal.reason;
        await sleep(8000);
      }
      a.end = Date.now();
      return Action.done();
    });
  const r = await runController(c, first.grpc);
  let second: Manager | undefined;
  try {
    await waitFor("the first attempt runs", () => attempts[0]);
    // A new manager (another Lease, so it leads at once) knows nothing of the old session's
    // attempt and hands the key out again as soon as the replica registers with it.
    first.proc.signal("SIGKILL");
    await first.proc.exited;
    second = await startManager(cluster, "ts-handover-2", [...LONG_HOLD, "--lease-name", "ts-handover-2"], port);
    await r.registered(2);
    await waitFor("both attempts ended", () => (attempts[0]?.end && attempts[1]?.end ? true : undefined), 30_000);
    const [a1, a2] = attempts as [(typeof attempts)[number], (typeof attempts)[number]];
    assert.ok(a1.reason instanceof SessionEndedError, "the first attempt was cancelled when its session ended");
    assert.notEqual(a1.session, a2.session);
    assert.ok(a2.dispatched < a1.end, "the new session got the key while the old attempt still ran");
    assert.ok(a2.start >= a1.end, `the second attempt started ${a1.end - a2.start} ms before the first ended`);
    const next = second;
    await waitFor("the second attempt's result counted", async () =>
      (await controllerStatus(next, "handover"))?.["done"] === 1 ? true : undefined,
    );
  } finally {
    await r.stop();
    await second?.proc.stop();
  }
});

test("a stop gives up on handlers that ignore their signal after stopGraceMs, and says so", async () => {
  await namespace(cluster, "grace");
  const manager = await startManager(cluster, "ts-grace", LONG_HOLD);
  let release: () => void = () => {};
  const held = new Promise<void>((ok) => (release = ok));
  const c = controller("grace")
    .for(ConfigMaps)
    .inNamespaces("grace")
    .reconcile(async () => {
      await Promise.race([held, sleep(4000)]); // ignores its signal
    });
  const r = await runController(c, manager, { stopGraceMs: 800 });
  try {
    await configMap(cluster, "grace", "stuck");
    await waitFor("in flight", async () => ((await controllerStatus(manager, "grace"))?.["inFlight"] === 1 ? true : undefined));
    const stopped = Date.now();
    c.stop();
    await assert.rejects(r.done, /1 handler\(s\) still run 800 ms after the stop/);
    assert.ok(Date.now() - stopped < 4000, "run() did not wait for the handler beyond the grace");
  } finally {
    release();
    await manager.proc.stop();
  }
});
