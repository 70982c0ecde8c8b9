// Logs an operator can run on, against the real manager: one INFO line per reconcile start and
// end (key, reasons, attempt, outcome, duration_ms), failures at WARN with a stack at most once
// per key per minute, the request's logger carrying key and request_id, JSON lines in the
// manager's shape with the trace's ids.
import assert from "node:assert/strict";
import { type Server, createServer } from "node:net";
import { after, before, test } from "node:test";

import { Action, TerminalError, consoleLogger, controller, kinds, parseTraceparent } from "../../src/index.js";
import { type Cluster, type Manager, configMap, namespace, runController, startDevcluster, startManager, waitFor } from "../support.js";

let cluster: Cluster;
let manager: Manager;
let collector: Server;

before(async () => {
  cluster = await startDevcluster();
  // The manager traces (and sends a traceparent) only with an OTLP endpoint: a sink that takes
  // connections and answers nothing (spans are exported in the background; a failed export
  // changes nothing).
  collector = createServer((socket) => socket.on("error", () => {}).resume());
  await new Promise<void>((ok) => collector.listen(0, "127.0.0.1", ok));
  const address = collector.address();
  const endpoint = `http://127.0.0.1:${typeof address === "object" && address !== null ? address.port : 0}`;
  manager = await startManager(cluster, "ts-logs", [], undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint });
});

after(async () => {
  await manager?.proc.stop();
  await cluster?.proc.stop();
  collector?.close();
});

interface JsonLine {
  timestamp: string;
  level: string;
  target: string;
  fields: Record<string, unknown> & { message: string };
  span?: Record<string, unknown>;
}

test("JSON lines: reconcile start and end at INFO, failures at WARN with one stack per key, the handler's lines carry key and request_id", async () => {
  await namespace(cluster, "logs");
  const raw: string[] = [];
  const traceparents = new Map<string, string>();
  let failures = 0;
  const c = controller("logs")
    .for(kinds.ConfigMap)
    .inNamespaces("logs")
    .reconcile((req) => {
      traceparents.set(req.id, req.traceparent);
      req.log.info("handling it", { extra: 1n }); // a bigint never breaks a line
      if (req.name === "fails" && failures++ < 3) {
        throw new Error("boom");
      }
      if (req.name === "terminal") {
        throw new TerminalError("bad spec");
      }
      return req.name === "later" ? Action.requeueAfter(60_000) : Action.done();
    });
  const logger = consoleLogger("logs", { level: "info", format: "json", write: (l) => raw.push(l) });
  const r = await runController(c, manager, { logger });
  const lines = (): JsonLine[] => raw.join("").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as JsonLine);
  const ends = (key: string): JsonLine[] => lines().filter((l) => l.fields.message === "reconcile end" && l.fields["key"] === key);
  try {
    for (const name of ["ok", "later", "fails", "terminal"]) {
      await configMap(cluster, "logs", name);
    }
    await waitFor("every key's last end line", () =>
      ends("logs/ok").length >= 1 && ends("logs/later").length >= 1 && ends("logs/terminal").length >= 1 &&
      ends("logs/fails").some((l) => l.fields["outcome"] === "success") ? true : undefined,
    );
    for (const l of lines()) {
      assert.match(l.timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
      assert.equal(l.target, "@ctrlhub/sdk");
      assert.equal(typeof l.fields.message, "string");
    }
    const start = lines().find((l) => l.fields.message === "reconcile start" && l.fields["key"] === "logs/ok");
    assert.equal(start?.level, "INFO");
    assert.equal(start?.fields["reasons"], "CREATED");
    assert.equal(start?.fields["attempt"], 1);
    const ok = ends("logs/ok")[0];
    assert.equal(ok?.level, "INFO");
    assert.equal(ok?.fields["outcome"], "success");
    assert.equal(typeof ok?.fields["duration_ms"], "number");
    assert.equal(ends("logs/later")[0]?.fields["outcome"], "requeue_after");
    assert.equal(ends("logs/later")[0]?.fields["requeue_after_ms"], 60_000);
    const terminal = ends("logs/terminal")[0];
    assert.equal(terminal?.level, "WARN");
    assert.equal(terminal?.fields["outcome"], "terminal");
    assert.match(String(terminal?.fields["error"]), /bad spec/);

    const failed = ends("logs/fails").filter((l) => l.fields["outcome"] === "error");
    assert.equal(failed.length, 3);
    assert.ok(failed.every((l) => l.level === "WARN" && /boom/.test(String(l.fields["error"]))), JSON.stringify(failed));
    assert.deepEqual(failed.map((l) => l.fields["attempt"]), [1, 2, 3]);
    assert.equal(failed.filter((l) => typeof l.fields["stack"] === "string").length, 1, "one stack per key per minute");
    assert.match(String(failed[0]?.fields["stack"]), /boom\n\s+at /);

    // The handler's own line: in the request's span, with its key, request id and trace.
    const mine = lines().filter((l) => l.fields.message === "handling it" && l.span?.["key"] === "logs/ok");
    assert.equal(mine.length, 1);
    const span = mine[0]?.span ?? {};
    assert.equal(mine[0]?.fields["extra"], "1");
    assert.equal(span["name"], "reconcile");
    assert.equal(span["controller"], "logs");
    assert.equal(span["attempt"], 1);
    assert.equal(typeof span["session_id"], "string");
    const traceparent = traceparents.get(String(span["request_id"]));
    assert.ok(traceparent, `request_id ${String(span["request_id"])} is the request's id`);
    assert.equal(span["trace_id"], parseTraceparent(traceparent)?.traceId);
    assert.equal(span["span_id"], parseTraceparent(traceparent)?.spanId);
  } finally {
    await r.stop();
  }
});
