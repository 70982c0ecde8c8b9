// The outbound queue driven directly (no transport, no timers): which messages leave together
// and in what order (docs/protocol.md, "Batches"; the Rust SDK's runtime/batches.rs tests).
import assert from "node:assert/strict";
import { test } from "node:test";

import { MAX_BATCH, Outbound, Outbox, type Outgoing } from "../../src/batches.js";

function result(id: string): Outgoing {
  return { case: "result", value: { $typeName: "ctrlhub.v1.ReconcileResult", id, outcome: { case: "done", value: { $typeName: "ctrlhub.v1.ReconcileResult.Done" } } } };
}

function ack(id: string): Outgoing {
  return { case: "eventAck", value: { $typeName: "ctrlhub.v1.EventAck", id } };
}

function beat(): Outgoing {
  return { case: "heartbeat", value: { $typeName: "ctrlhub.v1.Heartbeat", nonce: 7n } };
}

function drain(): Outgoing {
  return { case: "drain", value: { $typeName: "ctrlhub.v1.Drain", retire: false } };
}

/** What a message carries: the ids it answers (`batch:` first when a ResultBatch), else its kind. */
function shape(m: Outgoing | undefined): string {
  if (m === undefined) {
    return "none";
  }
  switch (m.case) {
    case "result":
    case "eventAck":
      return m.value.id;
    case "results":
      return `batch:${[...m.value.results.map((r) => r.id), ...m.value.acks.map((a) => `ack ${a.id}`)].join(",")}`;
    default:
      return m.case ?? "empty";
  }
}

function outbox(batching: boolean, ...messages: Outgoing[]): Outbox {
  const o = new Outbox();
  o.batching = batching;
  messages.forEach((m) => o.push(m));
  return o;
}

function takeAll(o: Outbox): string[] {
  const out: string[] = [];
  for (let m = o.take(); m !== undefined; m = o.take()) {
    out.push(shape(m));
  }
  return out;
}

test("answers waiting together leave as one ResultBatch; a heartbeat or a Drain keeps its place", () => {
  const o = outbox(true, result("a"), result("b"), beat(), result("c"), result("d"), drain(), result("e"));
  assert.deepEqual(takeAll(o), ["batch:a,b", "heartbeat", "batch:c,d", "drain", "e"]);
  assert.equal(o.size, 0);
});

test("event acknowledgements batch like results", () => {
  assert.deepEqual(takeAll(outbox(true, ack("1"), ack("2"), ack("3"))), ["batch:ack 1,ack 2,ack 3"]);
});

test("a single answer goes as a plain result", () => {
  assert.deepEqual(takeAll(outbox(true, beat(), result("a"))), ["heartbeat", "a"]);
});

test("without the manager's consent every answer goes alone", () => {
  assert.deepEqual(takeAll(outbox(false, result("a"), result("b"), ack("c"))), ["a", "b", "c"]);
});

test("a batch stops at MAX_BATCH", () => {
  const o = outbox(true);
  for (let i = 0; i < 2 * MAX_BATCH + 1; i++) {
    o.push(result(String(i)));
  }
  const sizes = takeAll(o).map((s) => s.split(",").length);
  assert.deepEqual(sizes, [MAX_BATCH, MAX_BATCH, 1]);
});

test("a long backlog taken from the front, with more pushed meanwhile, keeps its order", () => {
  const o = outbox(false);
  let pushed = 0;
  const push = (n: number): void => {
    for (const end = pushed + n; pushed < end; pushed++) {
      o.push(result(String(pushed)));
    }
  };
  push(5000);
  const ids: string[] = [];
  for (let i = 0; i < 3000; i++) {
    ids.push(shape(o.take()));
  }
  push(10);
  ids.push(...takeAll(o));
  assert.deepEqual(ids, Array.from({ length: 5010 }, (_, i) => String(i)));
  assert.equal(o.size, 0);
});

/** An Outbound on a transport whose writes end when the test says, and a turn the test runs. */
function transport(): { out: Outbound; written: string[]; finishWrite(): void; endTurn(): void } {
  const written: string[] = [];
  const pending: Array<() => void> = [];
  const turn: Array<() => void> = [];
  const out = new Outbound(
    (m, done) => {
      written.push(shape(m));
      pending.push(done);
    },
    (f) => turn.push(f),
  );
  out.outbox.batching = true;
  return {
    out,
    written,
    finishWrite: () => pending.shift()?.(),
    endTurn: () => turn.splice(0).forEach((f) => f()),
  };
}

test("what finished while a write was in progress leaves with the next write; nothing waits for more", () => {
  const t = transport();
  t.out.send(result("a"));
  t.out.send(result("b"));
  assert.deepEqual(t.written, [], "an idle outbound writes at the end of the turn");
  t.endTurn();
  assert.deepEqual(t.written, ["batch:a,b"], "the answers of one turn go together");
  t.out.send(result("c"));
  t.out.send(result("d"));
  t.out.send({ case: "credit", value: { $typeName: "ctrlhub.v1.Credit", maxInFlight: 3 } });
  t.out.send(result("e"));
  t.endTurn();
  assert.deepEqual(t.written, ["batch:a,b"], "nothing is written while a write is in progress");
  t.finishWrite();
  assert.deepEqual(t.written, ["batch:a,b", "batch:c,d"]);
  t.finishWrite();
  t.finishWrite();
  assert.deepEqual(t.written, ["batch:a,b", "batch:c,d", "credit", "e"]);
  t.finishWrite();
  t.out.send(result("f"));
  t.endTurn();
  assert.deepEqual(t.written.at(-1), "f", "a result alone goes alone, in the turn it finished");
});

test("a stopped outbound drops what waits and sends nothing more", () => {
  const t = transport();
  t.out.send(result("a"));
  t.endTurn();
  t.out.send(result("b"));
  t.out.stop();
  t.out.send(result("c"));
  t.finishWrite();
  t.endTurn();
  assert.deepEqual(t.written, ["a"]);
});
