// The session against a scripted manager on loopback gRPC (the generated ctrlhub.v1 types on
// a grpc-js server), for what the real manager does not send on purpose: empty or undecodable
// objects, and exact timings of heartbeat answers and deadlines.
import assert from "node:assert/strict";
import { test } from "node:test";

import { type MessageInitShape, create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import * as grpc from "@grpc/grpc-js";

import { type ReconcileRequest, controller, kinds } from "../../src/index.js";
import {
  type ControllerMessage,
  ControllerMessageSchema,
  type ManagerMessage,
  ManagerMessageSchema,
  type ReconcileRequest as ReconcileRequestMessage,
  ReconcileRequestSchema,
  ReconcileRequest_Reason,
  type ReconcileResult,
} from "../../src/proto.js";
import { recordingLogger, waitFor } from "../support.js";

type Call = grpc.ServerDuplexStream<ControllerMessage, ManagerMessage>;

/**
 * A manager that answers Register with `Registered` (a 2 s hold, heartbeats every 400 ms),
 * echoes every heartbeat (the first one `firstEchoMs` late) and hands the call to `script`.
 * It echoes `max_batch` (takes ResultBatch) unless `batches` is false (a manager that predates
 * batches); `messages` are the ids each result-carrying message answered, `batched` whether it
 * was a ResultBatch.
 */
async function scripted(script: (call: Call) => void, firstEchoMs = 0, batches = true): Promise<{
  address: string;
  results: ReconcileResult[];
  resultsAt: number[];
  messages: Array<{ ids: string[]; batched: boolean }>;
  beats: bigint[];
  close(): void;
}> {
  const results: ReconcileResult[] = [];
  const resultsAt: number[] = [];
  const messages: Array<{ ids: string[]; batched: boolean }> = [];
  const beats: bigint[] = [];
  const server = new grpc.Server();
  const serialize = <T>(schema: Parameters<typeof toBinary>[0]) => (m: T) => Buffer.from(toBinary(schema, m as never));
  server.addService(
    {
      Connect: {
        path: "/ctrlhub.v1.ControllerManager/Connect",
        requestStream: true,
        responseStream: true,
        requestSerialize: serialize<ControllerMessage>(ControllerMessageSchema),
        requestDeserialize: (b: Buffer) => fromBinary(ControllerMessageSchema, b),
        responseSerialize: serialize<ManagerMessage>(ManagerMessageSchema),
        responseDeserialize: (b: Buffer) => fromBinary(ManagerMessageSchema, b),
      },
    },
    {
      Connect: (call: Call) => {
        call.on("data", (m: ControllerMessage) => {
          if (m.message.case === "register") {
            call.write(
              create(ManagerMessageSchema, {
                message: {
                  case: "registered",
                  value: {
                    sessionId: "s1",
                    leaderIdentity: "scripted",
                    effective: { ...m.message.value, revision: 5n, maxBatch: batches ? m.message.value.maxBatch : 0 },
                    heartbeatInterval: durationFromMs(400),
                    hold: durationFromMs(2000),
                  },
                },
              }),
            );
            script(call);
          } else if (m.message.case === "result") {
            results.push(m.message.value);
            resultsAt.push(Date.now());
            messages.push({ ids: [m.message.value.id], batched: false });
          } else if (m.message.case === "results") {
            results.push(...m.message.value.results);
            resultsAt.push(...m.message.value.results.map(() => Date.now()));
            messages.push({ ids: m.message.value.results.map((r) => r.id), batched: true });
          } else if (m.message.case === "heartbeat") {
            const nonce = m.message.value.nonce;
            beats.push(nonce);
            setTimeout(() => echo(call, nonce), nonce === 1n ? firstEchoMs : 0);
          }
        });
        call.on("error", () => {});
      },
    },
  );
  const port = await new Promise<number>((ok, fail) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? fail(err) : ok(p))),
  );
  return { address: `127.0.0.1:${port}`, results, resultsAt, messages, beats, close: () => server.forceShutdown() };
}

function echo(call: Call, nonce: bigint): void {
  call.write(create(ManagerMessageSchema, { message: { case: "heartbeat", value: { nonce } } }));
}

function requestMessage(id: string, object: MessageInitShape<typeof ReconcileRequestSchema>["object"], deadlineMs = 10_000): ReconcileRequestMessage {
  return create(ReconcileRequestSchema, {
    id,
    key: { namespace: "default", name: id },
    attempt: 1,
    reasons: [ReconcileRequest_Reason.INITIAL_LIST],
    deadline: timestampFromMs(Date.now() + deadlineMs),
    ...(object === undefined ? {} : { object }),
  });
}

function request(call: Call, id: string, object: MessageInitShape<typeof ReconcileRequestSchema>["object"], deadlineMs = 10_000): void {
  call.write(create(ManagerMessageSchema, { message: { case: "reconcile", value: requestMessage(id, object, deadlineMs) } }));
}

/** Requests `ids` in one WorkBatch. */
function batch(call: Call, ids: string[]): void {
  const requests = ids.map((id) => requestMessage(id, undefined));
  call.write(create(ManagerMessageSchema, { message: { case: "batch", value: { requests } } }));
}

const utf8 = new TextEncoder();

test("an empty object is no object, an empty or undecodable tombstone still a deletion, and an undecodable object an error to retry: never a Terminal answer", async () => {
  const seen: Array<ReconcileRequest<unknown>> = [];
  const m = await scripted((call) => {
    request(call, "empty", { case: "objectJson", value: new Uint8Array() });
    request(call, "tombstone", { case: "tombstone", value: { objectJson: new Uint8Array(), finalStateUnknown: true } });
    request(call, "garbage", { case: "objectJson", value: utf8.encode("{not json") });
    request(call, "array", { case: "objectJson", value: utf8.encode("[]") });
    request(call, "bad-tombstone", { case: "tombstone", value: { objectJson: utf8.encode("{no"), finalStateUnknown: false } });
  });
  const c = controller("wire").for(kinds.ConfigMap).includeObject().concurrency(4).reconcile((req) => {
    seen.push(req);
  });
  const log = recordingLogger();
  const running = c.run({ address: m.address, handleSignals: false, logger: log });
  try {
    await waitFor("five results", () => (m.results.length === 5 ? true : undefined), 10_000);
    const outcome = (id: string) => m.results.find((r) => r.id === id)?.outcome.case;
    assert.equal(outcome("empty"), "done");
    assert.equal(outcome("tombstone"), "done");
    assert.equal(outcome("garbage"), "error", "not the user's fault: retried with backoff, never Terminal");
    assert.equal(outcome("array"), "error");
    assert.equal(outcome("bad-tombstone"), "done");
    assert.deepEqual(seen.find((q) => q.name === "bad-tombstone")?.tombstone, { object: undefined, finalStateUnknown: false });
    const empty = seen.find((q) => q.name === "empty");
    assert.equal(empty?.object, undefined);
    assert.equal(empty?.tombstone, undefined);
    const tomb = seen.find((q) => q.name === "tombstone");
    assert.deepEqual(tomb?.tombstone, { object: undefined, finalStateUnknown: true });
    assert.equal(seen.length, 3, "undecodable objects never reach the handler");
  } finally {
    c.stop();
    m.close();
    await running.catch(() => {});
  }
});

test("handlers start only once the manager answered a heartbeat; heartbeats go out every interval", async () => {
  let answeredAt = 0;
  let started = 0;
  const m = await scripted((call) => {
    request(call, "k", undefined);
    setTimeout(() => (answeredAt = Date.now()), 300);
  }, 300);
  const c = controller("gate").for(kinds.ConfigMap).reconcile(() => {
    started = Date.now();
  });
  const running = c.run({ address: m.address, handleSignals: false, logger: recordingLogger() });
  try {
    await waitFor("the result", () => (m.results.length === 1 ? true : undefined), 10_000);
    assert.ok(answeredAt > 0 && started >= answeredAt, `started ${answeredAt - started} ms before the first answer`);
    await waitFor("heartbeats every 400 ms", () => (m.beats.length >= 3 ? true : undefined), 5_000);
    assert.deepEqual(m.beats.slice(0, 3), [1n, 2n, 3n]);
  } finally {
    c.stop();
    m.close();
    await running.catch(() => {});
  }
});

test("a handler cancelled at its deadline is answered once it has ended and the deadline has passed", async () => {
  let deadline = 0;
  const m = await scripted((call) => {
    deadline = Date.now() + 1000;
    request(call, "slow", undefined, 1000);
  });
  const c = controller("late").for(kinds.ConfigMap).reconcile(async (req) => {
    // Stops as soon as its signal aborts (50 ms before the deadline), so it ends early.
    await new Promise((ok) => req.signal.addEventListener("abort", ok, { once: true }));
  });
  const running = c.run({ address: m.address, handleSignals: false, logger: recordingLogger() });
  try {
    await waitFor("the late result", () => (m.results.length === 1 ? true : undefined), 10_000);
    assert.equal(m.results[0]?.outcome.case, "error");
    assert.ok((m.resultsAt[0] ?? 0) >= deadline, `sent ${deadline - (m.resultsAt[0] ?? 0)} ms before the deadline`);
  } finally {
    c.stop();
    m.close();
    await running.catch(() => {});
  }
});

test("each request of a WorkBatch runs as if it came alone, and results ready in one turn leave as one ResultBatch", async () => {
  const ids = ["a", "b", "c", "d", "e"];
  const m = await scripted((call) => batch(call, ids));
  const seen: string[] = [];
  const c = controller("batch").for(kinds.ConfigMap).concurrency(8).reconcile((req) => {
    seen.push(req.name);
  });
  const running = c.run({ address: m.address, handleSignals: false, logger: recordingLogger() });
  try {
    await waitFor("five results", () => (m.results.length === 5 ? true : undefined), 10_000);
    assert.deepEqual([...seen].sort(), ids, "every request of the batch reached the handler once");
    assert.deepEqual(m.results.map((r) => r.outcome.case), ["done", "done", "done", "done", "done"]);
    // The handlers all finish in the turn the first heartbeat answer opened the gate.
    assert.deepEqual(m.messages, [{ ids: [...seen], batched: true }]);
  } finally {
    c.stop();
    m.close();
    await running.catch(() => {});
  }
});

test("a manager that does not echo max_batch never receives a ResultBatch", async () => {
  const ids = ["a", "b", "c"];
  const m = await scripted((call) => ids.forEach((id) => request(call, id, undefined)), 0, false);
  const c = controller("old").for(kinds.ConfigMap).concurrency(8).reconcile(() => {});
  const running = c.run({ address: m.address, handleSignals: false, logger: recordingLogger() });
  try {
    await waitFor("three results", () => (m.results.length === 3 ? true : undefined), 10_000);
    assert.deepEqual(
      m.messages.map((x) => x.batched),
      [false, false, false],
    );
  } finally {
    c.stop();
    m.close();
    await running.catch(() => {});
  }
});
