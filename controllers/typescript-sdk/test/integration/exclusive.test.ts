// Exclusive attempts against the real manager with a 2 s hold (a 4 s Lease, 2 s renew
// deadline, as the conformance suite runs it): heartbeats, results of handlers that overran
// their deadline, a replica cut off from the manager, and stopping while a handler runs.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, test } from "node:test";

import type { V1ConfigMap } from "@kubernetes/client-node";

import { Action, DeadlineExceededError, controller, kind } from "../../src/index.js";
import {
  type Cluster,
  type Manager,
  REPO,
  SHORT_HOLD,
  TcpProxy,
  configMap,
  controllerStatus,
  namespace,
  recordingLogger,
  runController,
  start,
  startDevcluster,
  startManager,
  tempDir,
  waitFor,
} from "../support.js";

let cluster: Cluster;
let manager: Manager;

before(async () => {
  cluster = await startDevcluster();
  manager = await startManager(cluster, "ts-exclusive", SHORT_HOLD);
});

after(async () => {
  await manager?.proc.stop();
  await cluster?.proc.stop();
});

const ConfigMaps = kind<V1ConfigMap>("v1", "ConfigMap");

/** Waits until `signal` aborts, then works `ms` more whatever it says (a promise ignoring it). */
async function overrun(signal: AbortSignal, ms: number): Promise<void> {
  await new Promise((ok) => signal.addEventListener("abort", ok, { once: true }));
  await sleep(ms);
}

test("a handler that overruns its deadline answers when it has really ended, and only then does its key go out again", async () => {
  await namespace(cluster, "overrun");
  const spans: Array<{ attempt: number; reasons: readonly string[]; start: number; end: number; reason?: unknown }> = [];
  const c = controller("overrun")
    .for(ConfigMaps)
    .inNamespaces("overrun")
    .deadline(2000)
    .backoff({ baseMs: 100, maxMs: 1000 })
    .concurrency(2)
    .reconcile(async (req) => {
      const span = { attempt: req.attempt, reasons: req.reasons, start: Date.now(), end: 0 } as (typeof spans)[number];
      spans.push(span);
      if (req.attempt === 1) {
        await overrun(req.signal, 1500); // ends 1.5 s after the abort, past the deadline
        span.reason = req.signal.reason;
      }
      span.end = Date.now();
      return Action.done();
    });
  const r = await runController(c, manager);
  try {
    assert.equal(r.registrations[0]?.holdMs, 2000, "Registered.hold of a 4 s Lease and a 2 s renew deadline");
    await configMap(cluster, "overrun", "slow");
    await waitFor("attempt 2 done", () => (spans[1]?.end ? true : undefined), 30_000);
    const [first, second] = spans as [(typeof spans)[number], (typeof spans)[number]];
    assert.ok(first.reason instanceof DeadlineExceededError, "attempt 1 was cancelled at its deadline");
    assert.ok(second.start >= first.end, `attempt 2 started ${first.end - second.start} ms before attempt 1 ended`);
    assert.ok(second.reasons.includes("REDELIVERY"), `attempt 2's reasons: ${second.reasons.join(",")}`);
    const status = await waitFor("the outcome counted", async () => {
      const s = await controllerStatus(manager, "overrun");
      return s?.["done"] === 1 ? s : undefined;
    });
    assert.equal(status["deadlineMisses"], 1, "a missed deadline, not an error");
    assert.equal(status["errors"], 0, "the late result is the attempt's end, not an outcome");
    assert.equal(r.registrations.length, 1, "heartbeats kept the one session alive throughout");
    assert.equal(r.ends.length, 0);
  } finally {
    await r.stop();
  }
});

test("stop() drains and resolves only once a handler past its deadline has ended", async () => {
  await namespace(cluster, "stopwait");
  const log = recordingLogger();
  let ended = 0;
  const c = controller("stopwait")
    .for(ConfigMaps)
    .inNamespaces("stopwait")
    .deadline(2000)
    .reconcile(async (req) => {
      await overrun(req.signal, 1000);
      ended = Date.now();
    });
  const r = await runController(c, manager, { logger: log });
  await configMap(cluster, "stopwait", "busy");
  await waitFor("in flight", async () => ((await controllerStatus(manager, "stopwait"))?.["inFlight"] === 1 ? true : undefined));
  c.stop();
  await r.done;
  const resolved = Date.now();
  assert.ok(ended > 0 && resolved >= ended, "run() resolved after the handler ended");
  const stopped = log.lines.findIndex((l) => /controller stopped/.test(l.message));
  assert.ok(stopped >= 0, JSON.stringify(log.lines.map((l) => l.message)));
  assert.match(log.lines[stopped]?.message ?? "", /session drained/);
  assert.equal(r.ends.at(-1)?.code, 0, "the manager ended the drained stream once the late result came");
});

/** Runs fixtures/stubborn.ts through `proxy`, collecting the JSON lines it prints. */
function stubborn(ns: string, proxy: TcpProxy) {
  const dir = tempDir("stubborn");
  const log = join(dir, "stubborn.log");
  const proc = start(
    process.execPath,
    [join(REPO, "controllers/typescript-sdk/dist/fixtures/stubborn.js")],
    { ...process.env, CTRLHUB_ADDR: proxy.address, CTRLHUB_TOKEN: "dev", NAMESPACE: ns, CONTROLLER: ns, CTRLHUB_LOG: "info" },
    log,
    true,
  );
  const lines: Array<Record<string, unknown>> = [];
  createInterface({ input: proc.child.stdout as NodeJS.ReadableStream }).on("line", (l) => lines.push(JSON.parse(l) as Record<string, unknown>));
  return { proc, log, lines };
}

test("cut off from the manager, a replica cancels its handlers at half the hold and gives the session up", async () => {
  await namespace(cluster, "partition");
  const proxy = await TcpProxy.start(manager.grpc);
  const s = stubborn("partition", proxy);
  try {
    await waitFor(`registered (log ${s.log})`, () => s.lines.find((l) => l["event"] === "registered"));
    await configMap(cluster, "partition", "waits", { mode: "cancellable" });
    await waitFor("started", () => s.lines.find((l) => l["event"] === "start"));
    const frozen = Date.now();
    proxy.freeze();
    const end = await waitFor("the handler cancelled", () => s.lines.find((l) => l["event"] === "end"), 10_000);
    assert.equal(end["cancelled"], true);
    const after = (end["at"] as number) - frozen;
    assert.ok(after < 2000, `cancelled ${after} ms after the freeze, not within the 2 s hold`);
    await waitFor("the session given up", () => s.lines.find((l) => l["event"] === "session_end"));
    await sleep(1500); // past 80 % of the hold: nothing runs, so nothing exits
    assert.ok(s.proc.running, "a replica whose handlers stopped keeps running (and reconnects)");
  } finally {
    await s.proc.stop();
    proxy.close();
  }
});

test("a handler that ignores its AbortSignal when the replica is cut off ends the process before the hold is over", async () => {
  await namespace(cluster, "stuck");
  const proxy = await TcpProxy.start(manager.grpc);
  const s = stubborn("stuck", proxy);
  try {
    await waitFor(`registered (log ${s.log})`, () => s.lines.find((l) => l["event"] === "registered"));
    await configMap(cluster, "stuck", "ignores", { mode: "stubborn", ms: "20000" });
    await waitFor("started", () => s.lines.find((l) => l["event"] === "start"));
    const frozen = Date.now();
    proxy.freeze();
    const code = await Promise.race([s.proc.exited, sleep(10_000).then(() => "still running")]);
    const after = Date.now() - frozen;
    assert.equal(code, 70, `exit status (log ${s.log})`);
    assert.ok(after < 2000 + 500, `exited ${after} ms after the freeze; the hold is 2 s`);
    assert.ok(!s.lines.some((l) => l["event"] === "end"), "the handler never ended");
    assert.match(readFileSync(s.log, "utf8"), /ERROR .*ignore their AbortSignal\. Exiting/);
  } finally {
    await s.proc.stop();
    proxy.close();
  }
});
