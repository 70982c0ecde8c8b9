// Ring mode's redirects (issue 29): a member that does not own the controller answers the
// Register with Rejected(UNAVAILABLE, owner_identity, owner_address) and the ctrlhub-owner*
// trailers; a live session whose controller moved ends with Revoked(UNIT_MOVED, owner_address).
// The route's rules on their own (`redirect.ts`), then the SDK against fake members: scripted
// ControllerManager servers on loopback (the generated ctrlhub.v1 types on grpc-js), no manager.
import assert from "node:assert/strict";
import { test } from "node:test";

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import * as grpc from "@grpc/grpc-js";

import { resolveConnection } from "../../src/config.js";
import { type SessionEndInfo, SessionEndedError, controller, kinds } from "../../src/index.js";
import {
  type ControllerMessage,
  ControllerMessageSchema,
  type GetRequest,
  GetRequestSchema,
  type GetResponse,
  GetResponseSchema,
  type ManagerMessage,
  ManagerMessageSchema,
  ReconcileRequest_Reason,
  type ReconcileResult,
  Revoked_Reason,
} from "../../src/proto.js";
import { MAX_REDIRECTS, Route, redirected } from "../../src/redirect.js";
import { recordingLogger, waitFor } from "../support.js";

type Call = grpc.ServerDuplexStream<ControllerMessage, ManagerMessage>;

/** Any backoff of the SDK's would show: its first wait is at least 30 s, the tests wait 20 s. */
const NO_BACKOFF = { initialMs: 60_000, maxMs: 60_000 };
const PATIENCE_MS = 20_000;

/** How a fake member answers its n-th Register (1-based). */
type Answer = { readonly redirectTo: Owner } | { readonly registered: (call: Call) => void };

/** Where a redirect points: a member's identity and `host:port`. */
interface Owner {
  readonly name: string;
  readonly address: string;
}

/** A fake ring member: a ControllerManager (Connect and Get) on a loopback port of its own. */
interface Member extends Owner {
  /** Results received, in order. */
  readonly results: ReconcileResult[];
  /** Names read with Get. */
  readonly gets: string[];
  /** Registers received. */
  registers: number;
  close(): void;
}

const encode = <T>(schema: Parameters<typeof toBinary>[0]) => (m: T) => Buffer.from(toBinary(schema, m as never));

/**
 * Starts member `name`, which answers each Register as `answer` says and appends its name to
 * `registers` (the order the SDK dialled the members in). A registered session gets a 2 s hold
 * with heartbeats every 400 ms, all answered; a Get answers a ConfigMap naming the member.
 */
async function member(name: string, registers: string[], answer: (n: number) => Answer): Promise<Member> {
  const server = new grpc.Server();
  const m: Member = { name, address: "", results: [], gets: [], registers: 0, close: () => server.forceShutdown() };
  server.addService(
    {
      Connect: {
        path: "/ctrlhub.v1.ControllerManager/Connect",
        requestStream: true,
        responseStream: true,
        requestSerialize: encode<ControllerMessage>(ControllerMessageSchema),
        requestDeserialize: (b: Buffer) => fromBinary(ControllerMessageSchema, b),
        responseSerialize: encode<ManagerMessage>(ManagerMessageSchema),
        responseDeserialize: (b: Buffer) => fromBinary(ManagerMessageSchema, b),
      },
      Get: {
        path: "/ctrlhub.v1.ControllerManager/Get",
        requestStream: false,
        responseStream: false,
        requestSerialize: encode<GetRequest>(GetRequestSchema),
        requestDeserialize: (b: Buffer) => fromBinary(GetRequestSchema, b),
        responseSerialize: encode<GetResponse>(GetResponseSchema),
        responseDeserialize: (b: Buffer) => fromBinary(GetResponseSchema, b),
      },
    },
    {
      Connect: (call: Call) => {
        call.on("data", (msg: ControllerMessage) => onMessage(m, registers, answer, call, msg));
        call.on("error", () => {});
      },
      Get: (call: grpc.ServerUnaryCall<GetRequest, GetResponse>, done: grpc.sendUnaryData<GetResponse>) => {
        m.gets.push(call.request.name);
        const object = { apiVersion: "v1", kind: "ConfigMap", metadata: { name: call.request.name, namespace: call.request.namespace }, data: { member: name } };
        done(null, create(GetResponseSchema, { objectJson: new TextEncoder().encode(JSON.stringify(object)), resourceVersion: "1" }));
      },
    },
  );
  const port = await new Promise<number>((ok, fail) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? fail(err) : ok(p))),
  );
  return Object.assign(m, { address: `127.0.0.1:${port}` });
}

function onMessage(m: Member, registers: string[], answer: (n: number) => Answer, call: Call, msg: ControllerMessage): void {
  const x = msg.message;
  if (x.case === "register") {
    m.registers++;
    registers.push(m.name);
    const a = answer(m.registers);
    if ("redirectTo" in a) {
      redirect(call, m, a.redirectTo);
      return;
    }
    const registered = {
      sessionId: `${m.name}-${m.registers}`,
      leaderIdentity: m.name,
      memberIdentity: m.name,
      effective: { ...x.value, revision: 1n },
      heartbeatInterval: durationFromMs(400),
      hold: durationFromMs(2000),
    };
    call.write(create(ManagerMessageSchema, { message: { case: "registered", value: registered } }));
    a.registered(call);
  } else if (x.case === "result") {
    m.results.push(x.value);
  } else if (x.case === "results") {
    m.results.push(...x.value.results);
  } else if (x.case === "heartbeat") {
    call.write(create(ManagerMessageSchema, { message: { case: "heartbeat", value: { nonce: x.value.nonce } } }));
  }
}

/** What a member that does not own the controller answers: Rejected, then UNAVAILABLE with trailers. */
function redirect(call: Call, from: Member, to: Owner): void {
  const [identity, address] = [to.name, to.address];
  const message = `member ${from.name} does not own this controller; ${identity} at ${address} does`;
  const rejected = { code: grpc.status.UNAVAILABLE, message, ownerIdentity: identity, ownerAddress: address };
  call.write(create(ManagerMessageSchema, { message: { case: "rejected", value: rejected } }));
  const trailers = new grpc.Metadata();
  trailers.set("ctrlhub-owner", identity);
  trailers.set("ctrlhub-owner-addr", address);
  trailers.set("ctrlhub-leader", from.name);
  call.emit("error", { code: grpc.status.UNAVAILABLE, details: message, metadata: trailers });
}

/** What a member whose controller moved to `to` sends on a live session. */
function moved(call: Call, to: Member): void {
  const revoked = {
    reason: Revoked_Reason.UNIT_MOVED,
    code: grpc.status.UNAVAILABLE,
    message: "the ring changed",
    leaderIdentity: to.name,
    ownerAddress: to.address,
  };
  call.write(create(ManagerMessageSchema, { message: { case: "revoked", value: revoked } }));
  call.emit("error", { code: grpc.status.UNAVAILABLE, details: "unit moved" });
}

function request(call: Call, id: string): void {
  const value = {
    id,
    key: { namespace: "default", name: id },
    attempt: 1,
    reasons: [ReconcileRequest_Reason.INITIAL_LIST],
    deadline: timestampFromMs(Date.now() + 10_000),
  };
  call.write(create(ManagerMessageSchema, { message: { case: "reconcile", value } }));
}

const registeredWith = (script: (call: Call) => void): Answer => ({ registered: script });

/** The addresses the SDK dialled, in order (its "connecting to manager" lines). */
function dialled(log: ReturnType<typeof recordingLogger>): string[] {
  return log.lines.filter((l) => l.message === "connecting to manager").map((l) => String(l.fields["addr"]));
}

function backoffs(log: ReturnType<typeof recordingLogger>): string[] {
  return log.lines.filter((l) => /^session ended: .*; reconnecting in \d+ ms$/.test(l.message)).map((l) => l.message);
}

// ---- the route on its own ----

test("a route follows 3 redirects in a row, declines the 4th and goes back to the configured address", () => {
  const route = new Route(resolveConnection({ address: "10.0.0.1:9090", token: "t" }, {}));
  for (let n = 1; n <= MAX_REDIRECTS; n++) {
    const hop = route.follow(`10.0.0.${n + 1}:9090`);
    assert.ok(hop.followed);
    assert.equal(hop.count, n);
    assert.equal(route.connection.target, `10.0.0.${n + 1}:9090`);
  }
  const fourth = route.follow("10.0.0.9:9090");
  assert.equal(fourth.followed, false);
  assert.match(fourth.followed ? "" : fourth.why, /3 in a row.*back to the configured address http:\/\/10\.0\.0\.1:9090/);
  assert.equal(route.connection.target, "10.0.0.1:9090");
  assert.ok(route.follow("10.0.0.2:9090").followed, "the next redirect after the backoff is the first in a row again");
});

test("a Registered, or any other end, starts the count again; an address that is not one is not followed", () => {
  const route = new Route(resolveConnection({ address: "a:1" }, {}));
  route.follow("b:2");
  route.follow("c:3");
  route.registered();
  for (let n = 1; n <= MAX_REDIRECTS; n++) {
    assert.ok(route.follow("d:4").followed, `redirect ${n} after a Registered`);
  }
  route.back();
  assert.equal(route.connection.target, "a:1");
  assert.ok(route.follow("b:2").followed);
  const bad = route.follow("no port");
  assert.equal(bad.followed, false);
  assert.match(bad.followed ? "" : bad.why, /invalid manager address/);
  assert.equal(route.connection.target, "a:1");
});

test("a redirect keeps the token and the TLS files, and verifies the member's host name", () => {
  const configured = resolveConnection(
    { address: "https://ctrlhub.example:9090", tokenFile: "/var/run/token", tls: { caFile: "/ca.pem", certFile: "/c.pem", keyFile: "/k.pem", serverName: "ctrlhub" } },
    {},
  );
  const next = redirected(configured, "member-2.ctrlhub.example:9443");
  assert.equal(next.target, "member-2.ctrlhub.example:9443");
  assert.equal(next.display, "https://member-2.ctrlhub.example:9443");
  assert.deepEqual(next.tls, { caFile: "/ca.pem", certFile: "/c.pem", keyFile: "/k.pem" }, "no serverName: the target's host is verified");
  assert.equal(next.tokenFile, "/var/run/token");
  assert.equal(next.keepaliveMs, configured.keepaliveMs);
  assert.equal(redirected(resolveConnection({ address: "a:1" }, {}), "b:2").display, "http://b:2");
});

// ---- the SDK against fake members ----

test("a Register redirected from A to B registers at B at once, and B's session reconciles and reads through B", async () => {
  const order: string[] = [];
  const b = await member("member-b", order, () => registeredWith((call) => request(call, "k1")));
  const a = await member("member-a", order, () => ({ redirectTo: b }));
  const read: string[] = [];
  const c = controller("redirected").for(kinds.ConfigMap).reconcile(async (req) => {
    const other = await req.reader.get(kinds.ConfigMap, { namespace: "default", name: "other" });
    read.push(String(other?.data?.["member"]));
  });
  const log = recordingLogger();
  const running = c.run({ address: a.address, handleSignals: false, logger: log, reconnect: NO_BACKOFF });
  try {
    await waitFor("the result at B", () => (b.results.length === 1 ? true : undefined), PATIENCE_MS);
    assert.equal(b.results[0]?.outcome.case, "done");
    assert.deepEqual(order, ["member-a", "member-b"]);
    assert.deepEqual(read, ["member-b"], "the cached read went to the owner");
    assert.deepEqual([a.gets, b.gets], [[], ["other"]]);
    const line = log.lines.find((l) => l.message.startsWith("redirected to the controller's owner"));
    assert.equal(line?.level, "info");
    assert.deepEqual([line?.fields["owner"], line?.fields["addr"], line?.fields["redirects"]], ["member-b", `http://${b.address}`, 1]);
    assert.deepEqual(backoffs(log), [], "a redirect is no failure");
    assert.equal(log.lines.filter((l) => l.level === "warn" || l.level === "error").length, 0);
  } finally {
    c.stop();
    a.close();
    b.close();
    await running.catch(() => {});
  }
});

test("a session at B ended by Revoked(UNIT_MOVED, A) cancels B's handlers and registers at A at once", async () => {
  const order: string[] = [];
  let bCall: Call | undefined;
  const a = await member("member-a", order, () => registeredWith((call) => request(call, "after")));
  const b = await member("member-b", order, () =>
    registeredWith((call) => {
      bCall = call;
      request(call, "slow");
    }),
  );
  let slowReason: unknown;
  let slowStarted = false;
  const done: string[] = [];
  const c = controller("moved").for(kinds.ConfigMap).concurrency(2).reconcile(async (req) => {
    if (req.name === "slow") {
      slowStarted = true;
      await new Promise((ok) => req.signal.addEventListener("abort", ok, { once: true }));
      slowReason = req.signal.reason;
      return;
    }
    done.push(`${req.name}@${req.sessionId}`);
  });
  const ends: SessionEndInfo[] = [];
  const log = recordingLogger();
  const running = c.run({ address: b.address, handleSignals: false, logger: log, reconnect: NO_BACKOFF, onSessionEnd: (e) => ends.push(e) });
  try {
    await waitFor("the slow handler at B", () => (slowStarted ? true : undefined), PATIENCE_MS);
    moved(bCall as Call, a);
    await waitFor("the result at A", () => (a.results.length === 1 ? true : undefined), PATIENCE_MS);
    assert.deepEqual(done, ["after@member-a-1"]);
    assert.ok(slowReason instanceof SessionEndedError, `the old session's handler was cancelled: ${String(slowReason)}`);
    assert.deepEqual(b.results, [], "a cancelled handler of the old session is never answered");
    assert.deepEqual(order, ["member-b", "member-a"]);
    assert.equal(ends[0]?.registered, true);
    assert.match(ends[0]?.reason ?? "", /UNIT_MOVED/);
    assert.deepEqual(backoffs(log), []);
    const line = log.lines.find((l) => l.message.startsWith("redirected to the controller's owner"));
    assert.deepEqual([line?.level, line?.fields["owner"], line?.fields["addr"]], ["info", "member-a", `http://${a.address}`]);
  } finally {
    c.stop();
    a.close();
    b.close();
    await running.catch(() => {});
  }
});

test("members redirecting to each other: 3 redirects in a row, then the configured address after a backoff, again and again", async () => {
  const order: string[] = [];
  let b: Member | undefined;
  const a = await member("member-a", order, () => ({ redirectTo: b as Member }));
  b = await member("member-b", order, () => ({ redirectTo: a }));
  const configured = await member("configured", order, () => ({ redirectTo: a }));
  const c = controller("storm").for(kinds.ConfigMap).reconcile(() => {});
  const log = recordingLogger();
  const registered: string[] = [];
  const minWaitMs = 200; // equal jitter: a wait of initialMs = maxMs = 400 is in [200, 400]
  const started = Date.now();
  const running = c.run({
    address: configured.address,
    handleSignals: false,
    logger: log,
    reconnect: { initialMs: 2 * minWaitMs, maxMs: 2 * minWaitMs },
    onRegistered: (r) => registered.push(r.sessionId),
  });
  try {
    await waitFor("three rounds", () => (configured.registers >= 3 ? true : undefined), PATIENCE_MS);
    const elapsed = Date.now() - started;
    const round = ["configured", "member-a", "member-b", "member-a"];
    assert.deepEqual(order.slice(0, 9), [...round, ...round, "configured"], "each round: 3 redirects followed, the 4th not");
    assert.ok(elapsed >= 2 * minWaitMs, `two backoffs took ${elapsed} ms`);
    const waits = backoffs(log);
    assert.ok(waits.length >= 2 && waits.every((w) => /not following a redirect after 3 in a row/.test(w)), waits.join("\n"));
    // Not a hot loop: every 4 Registers are followed by a backoff.
    assert.ok(order.length <= 4 * (backoffs(log).length + 1), `${order.length} Registers for ${backoffs(log).length} backoffs`);
    assert.deepEqual(dialled(log).slice(0, 5), [configured, a, b, a, configured].map((m) => `http://${m.address}`));
    assert.deepEqual(registered, []);
  } finally {
    c.stop();
    for (const m of [a, b, configured]) {
      m.close();
    }
    await running.catch(() => {});
  }
});

test("a redirect to an address where nothing listens goes back to the configured address with backoff", async () => {
  const order: string[] = [];
  // Port 1: privileged and unused, so no other suite's server can be listening there.
  const nowhere = "127.0.0.1:1";
  const a = await member("member-a", order, (n) => (n === 1 ? { redirectTo: { name: "gone", address: nowhere } } : registeredWith((call) => request(call, "k"))));
  const c = controller("nowhere").for(kinds.ConfigMap).reconcile(() => {});
  const log = recordingLogger();
  const ends: SessionEndInfo[] = [];
  const running = c.run({ address: a.address, handleSignals: false, logger: log, reconnect: { initialMs: 100, maxMs: 200 }, onSessionEnd: (e) => ends.push(e) });
  try {
    await waitFor("the result at A", () => (a.results.length === 1 ? true : undefined), PATIENCE_MS);
    assert.deepEqual(dialled(log), [a.address, nowhere, a.address].map((x) => `http://${x}`));
    assert.equal(a.registers, 2);
    assert.deepEqual(ends.map((e) => e.code), [grpc.status.UNAVAILABLE, grpc.status.UNAVAILABLE]);
    const waits = backoffs(log);
    assert.equal(waits.length, 1, "the failure at the owner's address is backed off");
    assert.match(waits[0] ?? "", /^session ended: UNAVAILABLE/);
  } finally {
    c.stop();
    a.close();
    await running.catch(() => {});
  }
});
