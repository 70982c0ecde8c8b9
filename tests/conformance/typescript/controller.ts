// The conformance controller of the `typescript` column, on @ctrlhub/sdk, written from
// tests/conformance/README.md sections 1-5. Everything the raw controller (python_raw) does by
// hand -- sessions on fresh connections, credits, deadlines, heartbeats and the hold, late
// results confirmed after the deadline, one attempt of a key at a time, reconnecting with
// backoff, re-reading the token file, Drain on SIGTERM, waiting out a newer definition,
// CTRLHUB_REVISION -- is the SDK's; what is left is the README's directives and report lines.
import { closeSync, openSync, writeSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import {
  Action,
  type ReconcileRequest,
  RegistrationRejectedError,
  RetryError,
  TerminalError,
  controller,
  kind,
} from "@ctrlhub/sdk";
import { trace } from "@opentelemetry/api";
import { BasicTracerProvider } from "@opentelemetry/sdk-trace-base";

interface ConfigMap {
  metadata?: { name?: string; resourceVersion?: string };
  data?: Record<string, string>;
}

interface Lease {
  spec?: { holderIdentity?: string };
}

const ConfigMaps = kind<ConfigMap>("v1", "ConfigMap");
const Leases = kind<Lease>("coordination.k8s.io/v1", "Lease");

function env(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") {
    console.error(`missing environment variable ${name}`);
    process.exit(2);
  }
  return value;
}

function int(name: string): number {
  const n = Number(env(name));
  if (!Number.isInteger(n)) {
    console.error(`${name} must be an integer`);
    process.exit(2);
  }
  return n;
}

const replica = env("CONFORMANCE_REPLICA");
const namespace = env("CONFORMANCE_NAMESPACE");
const report = openSync(env("CONFORMANCE_REPORT"), "a");

/** One JSON line, written with a single write(2) so concurrent lines never interleave. */
function line(fields: Record<string, unknown>): void {
  writeSync(report, `${JSON.stringify({ ...fields, ts_us: Date.now() * 1000, replica })}\n`);
}

/** Entry `attempt` (1-based, clamped to the last) of a comma-separated directive. */
function entry(data: Record<string, string>, key: string, attempt: number): string | undefined {
  const items = data[key]?.split(",").map((s) => s.trim());
  return items === undefined ? undefined : items[Math.min(Math.max(attempt, 1), items.length) - 1];
}

// Real spans (no exporter needed: the report carries the span's traceparent).
trace.setGlobalTracerProvider(new BasicTracerProvider());

const owns = process.env["CONFORMANCE_OWNS"] ?? "";
if (owns !== "" && owns !== "leases" && owns !== "leases-metadata") {
  console.error(`CONFORMANCE_OWNS must be unset, leases or leases-metadata, not ${owns}`);
  process.exit(2);
}

const definition = controller(env("CONFORMANCE_CONTROLLER"))
  .for(ConfigMaps)
  .inNamespaces(namespace)
  .withLabels({ "conformance.ctrlhub.io/scope": "in" })
  .includeObject()
  .resync(0)
  .deadline(int("CONFORMANCE_DEADLINE_MS"))
  .backoff({ baseMs: int("CONFORMANCE_BACKOFF_BASE_MS"), maxMs: int("CONFORMANCE_BACKOFF_MAX_MS") })
  .concurrency(int("CONFORMANCE_MAX_IN_FLIGHT"));
if (owns !== "") {
  definition.owns(Leases, { controllerOnly: true, metadataOnly: owns === "leases-metadata" });
}

const conformance = definition.reconcile(async (req: ReconcileRequest<ConfigMap>) => {
  const obj = req.object ?? req.tombstone?.object;
  const data = obj?.data ?? {};
  const ids = { session: req.sessionId, key: `${req.namespace}/${req.name}`, id: req.id, attempt: req.attempt };
  line({
    event: "start",
    ...ids,
    reasons: req.reasons,
    object: req.object ? "object" : req.tombstone ? "tombstone" : "none",
    rv: obj?.metadata?.resourceVersion ?? "",
    deadline_us: req.deadline.getTime() * 1000,
    traceparent: req.parentTraceparent,
    span_traceparent: req.traceparent,
  });
  let reads: unknown;
  let child: unknown;
  try {
    await sleep(Number(entry(data, "sleep_ms", req.attempt) ?? 0), undefined, { signal: req.signal });
    // README 3 `block_ms`: work that ignores cancellation (a promise that never looks at
    // req.signal); the event loop stays free, so heartbeats go on meanwhile.
    const block = Number(entry(data, "block_ms", req.attempt) ?? 0);
    if (block > 0) {
      await sleep(block);
    }
    req.signal.throwIfAborted();
    const name = data["read"];
    if (name !== undefined) {
      reads = await read(req, name);
    }
    const lease = data["read_child"];
    if (lease !== undefined) {
      child = await readChild(req, lease);
    }
    req.signal.throwIfAborted();
  } catch (err) {
    if (req.signal.aborted) {
      line({ event: "end", ...ids, outcome: "cancelled" });
    }
    throw err;
  }
  const outcome = entry(data, "outcome", req.attempt) ?? "done";
  const end = (label: string): void =>
    line({ event: "end", ...ids, outcome: label, ...(reads === undefined ? {} : { reads }), ...(child === undefined ? {} : { child }) });
  if (outcome === "error") {
    end("error");
    throw new RetryError("error directive");
  }
  if (outcome === "terminal") {
    end("terminal");
    throw new TerminalError("terminal directive");
  }
  if (outcome.startsWith("requeue:")) {
    end("requeue");
    return Action.requeueAfter(Number(outcome.slice("requeue:".length)));
  }
  end("done");
  return Action.done();
});

/** README 3 `read_child`: Get the owned Lease through the session, in whatever form it is cached. */
async function readChild(req: ReconcileRequest<ConfigMap>, name: string): Promise<unknown> {
  try {
    const got = await req.reader.read(Leases, { namespace: req.namespace, name, signal: req.signal });
    if (got === undefined) {
      return { name, found: false, metadata_only: false, holder: "" };
    }
    const holder = got.metadataOnly ? "" : (got.object.spec?.holderIdentity ?? "");
    return { name, found: true, metadata_only: got.metadataOnly, holder };
  } catch (err) {
    if (req.signal.aborted) {
      throw err;
    }
    return { error: err instanceof Error ? err.message : String(err) };
  }
}

/** README 3 `read`: Get and List through the manager's cache, on the delivering session. */
async function read(req: ReconcileRequest<ConfigMap>, name: string): Promise<unknown> {
  try {
    const got = await req.reader.get(ConfigMaps, { namespace: req.namespace, name, signal: req.signal });
    const all = await req.reader.list(ConfigMaps, { namespace: req.namespace, signal: req.signal });
    return {
      get: got === undefined ? { name, found: false } : { name, found: true, data: got.data ?? {} },
      list: all.map((o) => o.metadata?.name ?? "").sort(),
    };
  } catch (err) {
    if (req.signal.aborted) {
      throw err;
    }
    return { error: err instanceof Error ? err.message : String(err) };
  }
}

let code = 0;
try {
  await conformance.run({
    address: env("CTRLHUB_ADDR"),
    tokenFile: env("CTRLHUB_TOKEN_FILE"),
    reconnect: { initialMs: 100, maxMs: 5_000 },
    onRegistered: (r) =>
      line({
        event: "registered",
        session: r.sessionId,
        revision: Number(r.revision),
        readable: Object.fromEntries(r.readable.map((k) => [k.kind, k.metadataOnly ? "metadata" : "full"])),
      }),
    onSessionEnd: (e) => line({ event: "session_end", session: e.sessionId, code: e.code, reason: e.reason }),
  });
} catch (err) {
  if (!(err instanceof RegistrationRejectedError)) {
    console.error(err);
  }
  code = 3;
}
line({ event: "exit", ok: code === 0 });
closeSync(report);
process.exit(code);
