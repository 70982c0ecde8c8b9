// The health endpoint (/healthz, /readyz) against the real manager, and the reconnect backoff
// across two manager restarts in a row (a 2-pod rollout): it starts over at every Registered.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Action, controller, kinds } from "../../src/index.js";
import {
  type Cluster,
  configMap,
  freePort,
  namespace,
  recordingLogger,
  runController,
  startDevcluster,
  startManager,
  waitFor,
} from "../support.js";

let cluster: Cluster;

before(async () => {
  cluster = await startDevcluster();
});

after(async () => {
  await cluster?.proc.stop();
});

/** `GET http://127.0.0.1:port/path` as status and body, or the connection's error. */
async function probe(port: number, path: string): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: res.status, body: (await res.text()).trim() };
}

test("/healthz is 200 while the loop runs; /readyz 200 while registered, 503 with the reason while draining; the server stops with run()", async () => {
  await namespace(cluster, "health");
  const manager = await startManager(cluster, "ts-health");
  const port = await freePort();
  let release: () => void = () => {};
  const held = new Promise<void>((ok) => (release = ok));
  let started = false;
  const c = controller("health")
    .for(kinds.ConfigMap)
    .inNamespaces("health")
    .reconcile(async () => {
      started = true;
      await held;
      return Action.done();
    });
  const r = await runController(c, manager, { health: `127.0.0.1:${port}` });
  try {
    assert.deepEqual(await probe(port, "/healthz"), { status: 200, body: "ok" });
    await waitFor("/readyz 200 once registered", async () => ((await probe(port, "/readyz")).status === 200 ? true : undefined));
    assert.equal((await probe(port, "/nothing")).status, 404);

    await configMap(cluster, "health", "slow");
    await waitFor("the handler runs", () => (started ? true : undefined));
    const stopped = r.stop(); // drains: the handler still runs
    const draining = await waitFor("/readyz 503 while draining", async () => {
      const p = await probe(port, "/readyz");
      return p.status === 503 ? p : undefined;
    });
    assert.match(draining.body, /^draining/);
    assert.ok(!draining.body.includes("\n"), "one line");
    assert.deepEqual(await probe(port, "/healthz"), { status: 200, body: "ok" }, "live while draining");
    release();
    await stopped;
    await assert.rejects(probe(port, "/healthz"), "the endpoint stops with run()");
  } finally {
    release();
    await r.stop();
    await manager.proc.stop();
  }
});

test("two manager restarts in a row: /readyz says reconnecting meanwhile, and the backoff starts over after each Registered", async () => {
  await namespace(cluster, "backoff");
  const port = await freePort();
  const healthPort = await freePort();
  const log = recordingLogger();
  const initialMs = 200;
  let manager = await startManager(cluster, "ts-backoff-1", [], port);
  const c = controller("backoff").for(kinds.ConfigMap).inNamespaces("backoff").reconcile(() => Action.done());
  const r = await runController(c, manager, { logger: log, reconnect: { initialMs, maxMs: 10_000 }, health: `127.0.0.1:${healthPort}` });
  /** The reconnect lines logged so far: their delay and consecutive failures. */
  const reconnects = (): Array<{ delay: number; failures: unknown }> =>
    log.lines
      .map((l) => ({ m: /reconnecting in (\d+) ms/.exec(l.message), failures: l.fields["failures"] }))
      .filter((x) => x.m !== null)
      .map((x) => ({ delay: Number(x.m?.[1]), failures: x.failures }));
  try {
    // First restart: while no manager runs, failures pile up and the delay grows.
    await manager.proc.stop();
    await waitFor("three failed reconnects while no manager runs", () => (reconnects().length >= 4 ? true : undefined));
    const down = await waitFor("/readyz 503 while reconnecting", async () => {
      const p = await probe(healthPort, "/readyz");
      return p.status === 503 ? p : undefined;
    });
    assert.match(down.body, /^reconnecting: /);
    const grown = reconnects().at(-1);
    assert.ok((grown?.failures as number) >= 4 && (grown?.delay ?? 0) > initialMs, `the delay grew: ${JSON.stringify(reconnects())}`);
    manager = await startManager(cluster, "ts-backoff-2", [], port);
    await r.registered(2);
    await waitFor("/readyz 200 again", async () => ((await probe(healthPort, "/readyz")).status === 200 ? true : undefined));

    // Second restart right away (a session of well under 30 s): the first delay is the first step again.
    const before = reconnects().length;
    await manager.proc.stop();
    const first = await waitFor("the reconnect after the second restart", () => reconnects()[before]);
    assert.equal(first.failures, 1, `the backoff started over at Registered: ${JSON.stringify(reconnects().slice(before))}`);
    assert.ok(first.delay <= initialMs, `within the first backoff step (${initialMs} ms): ${first.delay} ms`);
    manager = await startManager(cluster, "ts-backoff-3", [], port);
    await r.registered(3);
  } finally {
    await r.stop();
    await manager.proc.stop();
  }
});
