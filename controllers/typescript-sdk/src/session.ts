import { create, toJson } from "@bufbuild/protobuf";
import { type Timestamp, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { type ClientDuplexStream, type StatusObject, status as Status } from "@grpc/grpc-js";

import { type Action, type OutcomeLabel, describe, failureOf, resultOf } from "./action.js";
import { runFor, settlesBefore } from "./attempt.js";
import { type Connection, authMetadata, channelSettings } from "./config.js";
import type { Controller } from "./controller.js";
import { typed } from "./client.js";
import { DeadlineExceededError, RegistrationRejectedError, RetryError, SessionEndedError, TerminalError } from "./errors.js";
import { Fence } from "./fence.js";
import {
  type ControllerMessage,
  ControllerMessageSchema,
  type Event as EventMessage,
  Event_Type,
  type ManagerMessage,
  type ReconcileRequest as RequestMessage,
  type ReconcileResult,
  ReconcileRequest_Reason,
  ReconcileResultSchema,
} from "./gen/ctrlhub/v1/controller_pb.js";
import { type Registered, RegisterSchema, type Rejected, type Revoked, Revoked_Reason } from "./gen/ctrlhub/v1/registration_pb.js";
import { ManagerClient } from "./grpc.js";
import { Finalizers } from "./finalizers.js";
import { type Logger, withFields } from "./logs.js";
import type { EventHandler, ReadableKind, ReconcileHandler, RunOptions } from "./options.js";
import { CachedReader, decode } from "./reader.js";
import type { EventType, ObjectEvent, Reason, ReconcileRequest, Tombstone, WorkContext } from "./request.js";
import type { KubernetesObject } from "./resources.js";
import { type WorkSpan, parseTraceparent, startSpan } from "./traces.js";
import { adopt, identity } from "./write.js";

/** @internal The handler a controller was finished with. */
export type Handlers<T> = { mode: "reconcile"; handler: ReconcileHandler<T> } | { mode: "events"; handler: EventHandler<T> };

/** @internal How a session ended, and what the controller does next. */
export type SessionEnd =
  | { kind: "stopped"; drained: boolean }
  | { kind: "fatal"; error: Error }
  /** A newer definition runs, or another identity holds the name: wait, then register again. */
  | { kind: "wait"; reason: string }
  /** `expected`: an orderly handover (a manager shutting down, a standby): logged at INFO. */
  | { kind: "retry"; registered: boolean; reason: string; expected?: boolean };

const FATAL_BEFORE_REGISTERED = new Set<number>([Status.INVALID_ARGUMENT, Status.PERMISSION_DENIED, Status.UNAUTHENTICATED]);

/** The process exit status when a handler ignored its cancellation past 80 % of the hold. */
export const EXIT_HANDLER_NOT_STOPPED = 70;

/**
 * How long after its deadline (by this host's clock) the result of an attempt cancelled at
 * its deadline is sent, so that the manager takes it as the end of an attempt that missed its
 * deadline (counted so, and re-delivered as REDELIVERY) rather than as an outcome.
 */
const AFTER_DEADLINE_MS = 25;

const REASONS = ReconcileRequest_Reason as unknown as Record<number, string | undefined>;
const EVENT_TYPES = Event_Type as unknown as Record<number, string | undefined>;

/** One request (or event) this session received and has not answered. */
interface Work {
  readonly id: string;
  readonly abort: AbortController;
  /** The manager's deadline, wall clock ms. */
  readonly deadlineMs: number;
  timer: NodeJS.Timeout | undefined;
}

/** What a handler came to. */
type Settled<R> = { value: R } | { error: unknown };

/** @internal One Connect stream on a channel (and so a TCP connection) of its own. */
export class Session<T> {
  registered = false;
  sessionId = "";
  private client: ManagerClient | undefined;
  private call: ClientDuplexStream<ControllerMessage, ManagerMessage> | undefined;
  private reader: CachedReader | undefined;
  private closed = false;
  private draining = false;
  /** Past half the hold without a heartbeat answer: no new work starts. */
  private fenced = false;
  private staleReason: string | undefined;
  private drainTimer: NodeJS.Timeout | undefined;
  private cancelled = false;
  private rejected: Rejected | undefined;
  private revoked: Revoked | undefined;
  private fallbackDeadlineMs = 60_000;
  private fence: Fence | undefined;
  /** Handlers start once it settles: the first heartbeat answered (exclusive attempts). */
  private gate: Promise<void> = Promise.resolve();
  /** Handlers of this session that started and have not settled. */
  private running = 0;
  private exitArmed = false;
  private readonly inFlight = new Map<string, Work>();
  private finish: (end: SessionEnd) => void = () => {};
  private readonly handlers: Handlers<T>;
  /** Results of attempts cancelled at their deadline are still sent (exclusive attempts). */
  private readonly confirmLate: boolean;

  constructor(
    private readonly owner: Controller<T>,
    private readonly connection: Connection,
    private readonly log: Logger,
    private readonly drainGraceMs: number,
    private readonly tracing: boolean,
    private readonly options: RunOptions,
  ) {
    this.handlers = owner.internals.handlers;
    this.confirmLate = owner.internals.register.exclusiveAttempts;
  }

  /** Registered, not ended, not draining and not fenced off: taking work. */
  get live(): boolean {
    return this.registered && !this.closed && !this.draining && !this.fenced;
  }

  async run(): Promise<SessionEnd> {
    let metadata;
    let settings;
    try {
      [metadata, settings] = await Promise.all([authMetadata(this.connection), channelSettings(this.connection)]);
    } catch (err) {
      // A token or certificate file may not be mounted yet, or be mid-rotation: retry.
      const reason = describe(err);
      this.options.onSessionEnd?.({ sessionId: "", registered: false, code: Status.UNKNOWN, reason });
      return { kind: "retry", registered: false, reason };
    }
    if (this.owner.internals.stopping || this.cancelled) {
      return { kind: "stopped", drained: false };
    }
    const client = new ManagerClient(this.connection.target, settings.credentials, settings.options);
    this.client = client;
    this.log.info("connecting to manager", { addr: this.connection.display });
    const ended = new Promise<SessionEnd>((resolve) => (this.finish = resolve));
    const call = client.connect(metadata);
    this.call = call;
    call.on("data", (msg: ManagerMessage) => {
      try {
        this.onMessage(msg);
      } catch (err) {
        this.log.error(`handling a manager message failed: ${describe(err)}`);
      }
    });
    call.on("error", () => {
      // The status that follows ends the session.
    });
    call.on("status", (status: StatusObject) => this.onStatus(status));
    call.write(create(ControllerMessageSchema, { message: { case: "register", value: this.owner.internals.register } }));
    try {
      return await ended;
    } finally {
      client.close();
    }
  }

  /** Sends `Credit` on a registered session. */
  sendCredit(n: number): void {
    if (this.registered) {
      this.send({ case: "credit", value: { $typeName: "ctrlhub.v1.Credit", maxInFlight: n } });
    }
  }

  /** Begins a graceful end: Drain on a registered session, else ends the attempt. */
  drain(): void {
    if (this.closed) {
      return;
    }
    if (!this.registered) {
      this.cancel();
      return;
    }
    if (this.draining) {
      return;
    }
    this.draining = true;
    const retire = this.owner.internals.retire;
    this.log.info(retire ? "draining session; retiring the controller" : "draining session", { in_flight: this.inFlight.size });
    this.send({ case: "drain", value: { $typeName: "ctrlhub.v1.Drain", retire } });
    this.maybeDrained();
  }

  /** Ends the stream from our side now. */
  cancel(): void {
    this.cancelled = true;
    this.call?.cancel();
  }

  private send(message: ControllerMessage["message"]): boolean {
    if (this.closed || this.call === undefined) {
      return false;
    }
    this.log.trace?.(`sending ${message.case ?? "nothing"}`, message.case === "result" ? { id: message.value.id, outcome: message.value.outcome.case } : {});
    this.call.write(create(ControllerMessageSchema, { message }));
    return true;
  }

  private onMessage(msg: ManagerMessage): void {
    const m = msg.message;
    switch (m.case) {
      case "registered":
        this.log.trace?.("received Registered", { session: m.value.sessionId });
        this.onRegistered(m.value);
        return;
      case "heartbeat":
        this.log.trace?.("received a heartbeat answer", { nonce: m.value.nonce });
        this.fence?.answered(m.value.nonce);
        return;
      case "reconcile":
        this.log.trace?.("received ReconcileRequest", {
          id: m.value.id,
          key: `${m.value.key?.namespace ?? ""}/${m.value.key?.name ?? ""}`,
          attempt: m.value.attempt,
          object: m.value.object.case ?? "none",
        });
        this.dispatch(m.value.id, m.value.deadline, (work) => this.reconcile(m.value, work));
        return;
      case "event":
        this.log.trace?.("received Event", { id: m.value.id, sequence: m.value.sequence, type: m.value.type });
        this.dispatch(m.value.id, m.value.deadline, (work) => this.event(m.value, work));
        return;
      case "rejected": {
        this.rejected = m.value;
        const code = Status[m.value.code] ?? String(m.value.code);
        const fields = {
          code,
          ...(m.value.field === "" ? {} : { field: m.value.field }),
          ...(m.value.outdated ? { outdated: true } : {}),
        };
        if (m.value.outdated || m.value.code === Status.ALREADY_EXISTS || (!this.registered && FATAL_BEFORE_REGISTERED.has(m.value.code))) {
          // Reported once, by the wait's WARN line or by run()'s rejection.
          this.log.debug(`the manager refused the registration: ${m.value.message}`, fields);
        } else {
          // A manager shutting down, a standby, caches that cannot list yet: transient.
          this.log.info(`the manager cannot take the registration now (${code}: ${m.value.message}); reconnecting`, fields);
        }
        return;
      }
      case "revoked": {
        this.revoked = m.value;
        const reason = Revoked_Reason[m.value.reason] ?? String(m.value.reason);
        const fields = m.value.leaderIdentity === "" ? {} : { leader: m.value.leaderIdentity };
        if (m.value.reason === Revoked_Reason.SHUTTING_DOWN || m.value.reason === Revoked_Reason.LEADERSHIP_LOST) {
          this.log.info(`the manager ended the session (${reason}: ${m.value.message}); reconnecting`, fields);
        } else {
          this.log.warn(`session revoked (${reason}): ${m.value.message}`, fields);
        }
        this.abortAll("the manager revoked the session");
        this.armExitCheck();
        return;
      }
      default:
        this.log.debug("ignoring a manager message of a kind this SDK does not know");
    }
  }

  private onRegistered(r: Registered): void {
    if (this.registered) {
      this.log.warn("ignoring a second Registered");
      return;
    }
    this.registered = true;
    this.sessionId = r.sessionId;
    const deadline = r.effective?.requestDeadline;
    if (deadline !== undefined) {
      this.fallbackDeadlineMs = durationMs(deadline);
    }
    this.reader = new CachedReader(this.client as ManagerClient, this.connection, this.sessionId);
    const register = this.owner.internals.register;
    const holdMs = r.hold === undefined ? 0 : durationMs(r.hold);
    if (register.exclusiveAttempts && holdMs > 0) {
      const given = r.heartbeatInterval === undefined ? 0 : durationMs(r.heartbeatInterval);
      const interval = given > 0 && given < holdMs / 2 ? given : holdMs / 5;
      this.fence = new Fence(
        holdMs,
        interval,
        (nonce) => this.send({ case: "heartbeat", value: { $typeName: "ctrlhub.v1.Heartbeat", nonce } }),
        (silent) => this.onStale(silent),
      );
      this.gate = this.fence.firstAnswer;
      this.fence.start();
    }
    const readable: ReadableKind[] = r.readable.map((k) => ({
      group: k.resource?.group ?? "",
      version: k.resource?.version ?? "",
      kind: k.resource?.kind ?? "",
      plural: k.resource?.plural ?? "",
      metadataOnly: k.metadataOnly,
    }));
    this.log.info("registered with manager", {
      session: this.sessionId,
      leader: r.leaderIdentity,
      revision: register.revision.toString(),
      readable: readable
        .map((k) => `${k.kind}(${k.group === "" ? k.version : `${k.group}/${k.version}`})=${k.metadataOnly ? "metadata" : "full"}`)
        .join(" "),
      ...(holdMs > 0 ? { hold_ms: holdMs } : {}),
    });
    if (r.effective !== undefined) {
      this.log.debug("effective registration", { effective: toJson(RegisterSchema, r.effective) });
    }
    const credit = this.owner.internals.credit;
    if (credit !== register.maxInFlight) {
      this.sendCredit(credit);
    }
    this.owner.refreshReadiness(undefined);
    this.options.onRegistered?.({
      sessionId: this.sessionId,
      leaderIdentity: r.leaderIdentity,
      effective: r.effective,
      readable,
      revision: register.revision,
      holdMs: this.fence === undefined ? undefined : holdMs,
    });
    if (this.owner.internals.stopping) {
      this.drain();
    }
  }

  /** Half the hold passed without a heartbeat answer: the manager may be gone. */
  private onStale(silentMs: number): void {
    if (this.closed) {
      return;
    }
    const hold = this.fence?.holdMs ?? 0;
    this.staleReason = `the manager answered no heartbeat for ${Math.round(silentMs)} ms (half the ${hold} ms hold)`;
    this.log.warn(`${this.staleReason}: cancelling ${this.running} running handler(s), taking no more work and ending the session`);
    this.fenced = true;
    this.owner.refreshReadiness(`reconnecting: ${this.staleReason}`);
    this.abortAll(`${this.staleReason}; the manager may hand the key to another replica`);
    this.armExitCheck();
    this.call?.cancel();
  }

  /**
   * Once the session is given up: every handler it started must have stopped by 80 % of the
   * hold after the last answered heartbeat, or the manager may hand its key to another replica
   * while it still acts. One that ignores its AbortSignal that long ends the process.
   */
  private armExitCheck(): void {
    const fence = this.fence;
    if (fence === undefined || this.exitArmed || this.running === 0) {
      return;
    }
    this.exitArmed = true;
    const timer = setTimeout(() => {
      if (this.running === 0) {
        return;
      }
      this.log.error(
        `${this.running} handler(s) of session ${this.sessionId} still run 80% of the ${fence.holdMs} ms hold after the last ` +
          "heartbeat the manager answered, although they were cancelled: they ignore their AbortSignal. Exiting " +
          `(status ${EXIT_HANDLER_NOT_STOPPED}) so that no other replica runs their keys alongside them; Kubernetes restarts the pod`,
      );
      process.exit(EXIT_HANDLER_NOT_STOPPED);
    }, Math.max(0, fence.exitAt() - performance.now()));
    timer.unref();
  }

  private onStatus(status: StatusObject): void {
    if (this.closed) {
      return;
    }
    this.closed = true;
    clearTimeout(this.drainTimer);
    this.fence?.stop();
    this.abortAll("the session ended");
    this.armExitCheck();
    const end = this.classify(status);
    const reason =
      end.kind === "retry" || end.kind === "wait" ? end.reason : end.kind === "fatal" ? end.error.message : "drained";
    this.options.onSessionEnd?.({
      sessionId: this.sessionId,
      registered: this.registered,
      code: status.code,
      reason,
    });
    this.finish(end);
  }

  private classify(status: StatusObject): SessionEnd {
    if (this.draining) {
      if (status.code !== Status.OK) {
        this.log.warn(`draining session ended with ${Status[status.code]}: ${status.details}`);
      }
      return { kind: "stopped", drained: status.code === Status.OK };
    }
    if (this.owner.internals.stopping && (this.cancelled || !this.registered)) {
      return { kind: "stopped", drained: false };
    }
    const revoked = this.revoked;
    if (revoked !== undefined) {
      const reason = Revoked_Reason[revoked.reason] ?? String(revoked.reason);
      if (revoked.reason === Revoked_Reason.SUPERSEDED) {
        return {
          kind: "wait",
          reason: `superseded: a newer definition of controller ${this.owner.name} (a higher revision than ` +
            `${this.owner.internals.register.revision}) replaced this one: ${revoked.message}`,
        };
      }
      const expected = revoked.reason === Revoked_Reason.SHUTTING_DOWN || revoked.reason === Revoked_Reason.LEADERSHIP_LOST;
      return { kind: "retry", registered: true, reason: `revoked (${reason}): ${revoked.message}`, expected };
    }
    if (this.staleReason !== undefined) {
      return { kind: "retry", registered: true, reason: this.staleReason };
    }
    const rejected = this.rejected;
    const code = rejected?.code ?? status.code;
    const details = rejected?.message ?? status.details;
    const field = rejected?.field ?? "";
    if (rejected?.outdated === true) {
      return {
        kind: "wait",
        reason: `outdated: another definition of controller ${this.owner.name} runs at a higher or equal revision ` +
          `(this one is ${this.owner.internals.register.revision}): ${details}`,
      };
    }
    if (!this.registered && FATAL_BEFORE_REGISTERED.has(code)) {
      return { kind: "fatal", error: new RegistrationRejectedError(code, details, field) };
    }
    if (!this.registered && code === Status.ALREADY_EXISTS) {
      return { kind: "wait", reason: `another identity of the tenant holds controller name ${this.owner.name}: ${details}` };
    }
    if (code === Status.OK) {
      return { kind: "retry", registered: this.registered, reason: "the manager ended the stream" };
    }
    const leader = status.metadata?.get("ctrlhub-leader")[0];
    const hint = leader === undefined || leader === "" ? "" : ` (leader is ${String(leader)})`;
    return {
      kind: "retry",
      registered: this.registered,
      reason: `${Status[code] ?? code}${hint}: ${details}${field === "" ? "" : ` (field ${field})`}`,
      // A standby naming the leader, or a manager that cannot take the registration now.
      expected: code === Status.UNAVAILABLE && (hint !== "" || rejected !== undefined),
    };
  }

  /** Cancels every request of the session; none of them is answered any more. */
  private abortAll(why: string): void {
    for (const [id, work] of this.inFlight) {
      clearTimeout(work.timer);
      work.abort.abort(new SessionEndedError(why));
      this.inFlight.delete(id);
    }
  }

  /** Tracks one request: its deadline timer and abort, then runs it. */
  private dispatch(id: string, deadline: Timestamp | undefined, work: (w: Work) => Promise<void>): void {
    if (this.closed || this.fenced) {
      return;
    }
    const abort = new AbortController();
    const now = Date.now();
    const deadlineMs = deadline === undefined ? now + this.fallbackDeadlineMs : timestampMs(deadline);
    const stopIn = runFor(deadlineMs - now);
    const w: Work = { id, abort, deadlineMs, timer: undefined };
    w.timer = setTimeout(() => {
      if (!this.inFlight.has(id)) {
        return;
      }
      abort.abort(new DeadlineExceededError(`request ${id} reached its deadline`));
      if (!this.confirmLate) {
        // The older rule: the key is handed out again at the deadline; nothing is sent.
        this.inFlight.delete(id);
        this.maybeDrained();
      }
    }, stopIn);
    this.inFlight.set(id, w);
    void work(w).catch((err: unknown) => {
      this.log.error(`request ${id} failed outside its handler: ${describe(err)}`);
    });
  }

  /**
   * Waits for the first heartbeat answer, for any earlier attempt of `key` in this process
   * (rule: one attempt of a key at a time) and for a free slot; then counts the handler as
   * running. `undefined` when the request was cancelled meanwhile (it never starts).
   */
  private async admit(key: string, signal: AbortSignal): Promise<(() => void) | undefined> {
    const { attempts, limiter } = this.owner.internals;
    if (!(await settlesBefore(this.gate, signal))) {
      return undefined;
    }
    const unlock = await attempts.lock(key, signal);
    if (unlock === undefined) {
      return undefined;
    }
    const release = await limiter.acquire(signal);
    if (release === undefined || signal.aborted || this.closed || this.fenced) {
      release?.();
      unlock();
      return undefined;
    }
    this.running++;
    const end = attempts.begin();
    return () => {
      this.running--;
      end();
      release();
      unlock();
    };
  }

  /** Runs `fn` to its real end, whatever its signal says. */
  private async settle<R>(fn: () => Promise<R>): Promise<Settled<R>> {
    try {
      return { value: await fn() };
    } catch (error) {
      return { error };
    }
  }

  /** The handler's argument: the work's context (with `extra`), and the SDK's logger of the work. */
  private context<W extends WorkContext>(
    kind: "reconcile" | "event",
    id: string,
    key: { namespace: string; name: string } | undefined,
    attempt: number,
    signal: AbortSignal,
    deadlineMs: number,
    span: WorkSpan,
    parent: string,
    extra: Omit<W, keyof WorkContext>,
  ): { context: W; log: Logger } {
    const k = { namespace: key?.namespace ?? "", name: key?.name ?? "" };
    const { kit, register } = this.owner.internals;
    const ids = parseTraceparent(span.traceparent);
    const fields = {
      controller: this.owner.name,
      key: `${k.namespace}/${k.name}`,
      request_id: id,
      attempt,
      session_id: this.sessionId,
      ...(ids === undefined ? {} : { trace_id: ids.traceId, span_id: ids.spanId }),
    };
    const fieldManager = register.controllerName;
    const context: Omit<WorkContext, "kubeConfig"> = {
      id,
      key: k,
      namespace: k.namespace,
      name: k.name,
      attempt,
      deadline: new Date(deadlineMs),
      signal,
      reader: this.reader as CachedReader,
      sessionId: this.sessionId,
      traceparent: span.traceparent,
      tracestate: span.tracestate,
      parentTraceparent: parent,
      log: withFields(kit.handlerLog, kind, fields),
      events: kit.events,
      finalizers: new Finalizers(() => kit.kube.objects, signal),
      adopt: (child, owner) => adopt(child, owner),
      apply: async (obj, options = {}) => {
        identity(obj);
        return kit.kube.objects.applyObject(obj, options.fieldManager ?? fieldManager, options.force ?? true, options.signal ?? signal);
      },
      patchStatus: async (obj, status) => {
        identity(obj);
        return kit.kube.objects.mergePatchObject(obj, { status }, "status", signal);
      },
    };
    // Loaded on first use: a handler that never writes needs no Kubernetes configuration.
    const full = Object.defineProperty({ ...context, ...extra }, "kubeConfig", { get: () => kit.kube.config, enumerable: true });
    return { context: full as unknown as W, log: withFields(this.log, kind, fields) };
  }

  /** The request's object and tombstone; an undecodable object is an error to retry, never Terminal. */
  private decodeRequest(msg: RequestMessage, key: string): { object: T | undefined; tombstone: Tombstone<T> | undefined } | Error {
    try {
      // No object, or an empty one, means the cache does not hold it: NotFound, never a
      // deletion. A tombstone is a deletion the manager saw, with or without its last state.
      if (msg.object.case === "objectJson") {
        return { object: decodeObject<T>(msg.object.value), tombstone: undefined };
      }
      if (msg.object.case === "tombstone") {
        const t = msg.object.value;
        let last: T | undefined;
        try {
          last = decodeObject<T>(t.objectJson);
        } catch (err) {
          // Still a deletion the manager saw: the handler learns it, without the last state.
          this.log.warn(`undecodable tombstone for ${key}; delivering the deletion without its last state: ${describe(err)}`);
        }
        return { object: undefined, tombstone: { object: last, finalStateUnknown: t.finalStateUnknown } };
      }
      return { object: undefined, tombstone: undefined };
    } catch (err) {
      return err instanceof Error ? err : new Error(String(err));
    }
  }

  private async reconcile(msg: RequestMessage, w: Work): Promise<void> {
    const { handlers } = this;
    const key = `${msg.key?.namespace ?? ""}/${msg.key?.name ?? ""}`;
    if (handlers.mode !== "reconcile") {
      this.log.warn("ignoring a ReconcileRequest on an EVENTS-mode session", { id: w.id });
      return;
    }
    const decoded = this.decodeRequest(msg, key);
    if (decoded instanceof Error) {
      // Not the user's fault, and perhaps the manager's or this SDK's: retried with backoff.
      this.log.error(`undecodable object for ${key}; answering a retryable error: ${decoded.message}`, { key, request_id: w.id });
      const [result, label] = failureOf(w.id, new RetryError(`undecodable object: ${decoded.message}`));
      this.complete(w, result, label, undefined);
      return;
    }
    const started = await this.admit(key, w.abort.signal);
    if (started === undefined) {
      this.complete(w, undefined, "error", undefined, "it never started: the request was cancelled while it waited");
      return;
    }
    const reasons = msg.reasons.map((r) => (REASONS[r] as Reason | undefined) ?? "UNSPECIFIED");
    const { kit } = this.owner.internals;
    let outcome: Settled<Action | void>;
    let span: WorkSpan | undefined;
    let log: Logger | undefined;
    const t0 = performance.now();
    try {
      span = startSpan(this.tracing, "reconcile", msg.traceparent, msg.tracestate, {
        "ctrlhub.controller": this.owner.name,
        "k8s.namespace.name": msg.key?.namespace ?? "",
        "k8s.object.name": msg.key?.name ?? "",
        "ctrlhub.attempt": msg.attempt,
        "ctrlhub.request.id": w.id,
      });
      const made = this.context<ReconcileRequest<T>>("reconcile", w.id, msg.key, msg.attempt, w.abort.signal, w.deadlineMs, span,
        msg.traceparent, { reasons, object: decoded.object, tombstone: decoded.tombstone });
      log = made.log;
      log.info("reconcile start", { key, reasons: reasons.join(","), attempt: msg.attempt });
      const request = made.context;
      const handler = handlers.handler;
      const s = span;
      outcome = await this.settle(() => s.run(async () => handler(request)));
    } finally {
      started();
    }
    const end = { key, reasons: reasons.join(","), attempt: msg.attempt, duration_ms: Math.round(performance.now() - t0) };
    if (w.abort.signal.aborted) {
      const reason: unknown = w.abort.signal.reason;
      const atDeadline = reason instanceof DeadlineExceededError;
      log.warn("reconcile end", { ...end, outcome: atDeadline ? "deadline" : "lost", error: describe(reason) });
      this.complete(w, undefined, "error", span, "the handler was cancelled", log);
      return;
    }
    const [result, label] = "value" in outcome ? resultOf(w.id, outcome.value) : failureOf(w.id, outcome.error);
    if ("error" in outcome) {
      const error = outcome.error;
      const message = describe(error);
      const planned = error instanceof RetryError || error instanceof TerminalError;
      const stack = !planned && error instanceof Error && error.stack !== undefined && kit.stacks.due(key) ? { stack: error.stack } : {};
      log.warn("reconcile end", { ...end, outcome: label, error: message, ...stack });
      kit.events.reconcileFailed(decoded.object as KubernetesObject | undefined, error, message);
    } else {
      const action = outcome.value;
      const requeue = action?.type === "requeue" ? { requeue_after_ms: action.afterMs } : {};
      log.info("reconcile end", { ...end, outcome: label === "requeue" ? "requeue_after" : "success", ...requeue });
    }
    this.complete(w, result, label, span);
  }

  private async event(msg: EventMessage, w: Work): Promise<void> {
    const { handlers } = this;
    if (handlers.mode !== "events") {
      this.log.warn("ignoring an Event on a reconcile-mode session", { id: w.id });
      return;
    }
    const key = `${msg.key?.namespace ?? ""}/${msg.key?.name ?? ""}`;
    let object: T;
    try {
      object = typed<T>(decode(msg.objectJson));
    } catch (err) {
      // Nothing a retry can fix: acknowledge and move on.
      this.log.error(`undecodable event object for ${key}; acknowledging it: ${describe(err)}`);
      this.answerEvent(w, undefined, "terminal", describe(err));
      return;
    }
    const started = await this.admit(key, w.abort.signal);
    if (started === undefined) {
      return;
    }
    const type = (EVENT_TYPES[msg.type] as EventType | undefined) ?? "UNSPECIFIED";
    let outcome: Settled<void>;
    let span: WorkSpan;
    let log: Logger;
    const t0 = performance.now();
    try {
      span = startSpan(this.tracing, "event", msg.traceparent, msg.tracestate, {
        "ctrlhub.controller": this.owner.name,
        "k8s.namespace.name": msg.key?.namespace ?? "",
        "k8s.object.name": msg.key?.name ?? "",
        "ctrlhub.attempt": msg.attempt,
        "ctrlhub.request.id": w.id,
      });
      const made = this.context<ObjectEvent<T>>("event", w.id, msg.key, msg.attempt, w.abort.signal, w.deadlineMs, span,
        msg.traceparent, { type, object, sequence: msg.sequence });
      log = made.log;
      log.info("event start", { key, type, attempt: msg.attempt });
      const event = made.context;
      const handler = handlers.handler;
      const s = span;
      outcome = await this.settle(() => s.run(async () => handler(event)));
    } finally {
      started();
    }
    const end = { key, type, attempt: msg.attempt, duration_ms: Math.round(performance.now() - t0) };
    if (w.abort.signal.aborted) {
      const deadline = w.abort.signal.reason instanceof DeadlineExceededError;
      log.warn("event end", { ...end, outcome: deadline ? "deadline" : "lost", error: describe(w.abort.signal.reason) });
      span.end(deadline ? "deadline" : "lost", deadline ? "cancelled at its deadline" : "session ended before the ack");
      return;
    }
    if ("error" in outcome) {
      // Unacknowledged: the manager sends it again after its deadline.
      log.warn("event end", { ...end, outcome: "error", error: `${describe(outcome.error)} (the event is sent again after its deadline)` });
      span.end("error", describe(outcome.error));
      return;
    }
    log.info("event end", { ...end, outcome: "success" });
    this.answerEvent(w, span, "success");
  }

  /**
   * Answers request `w` on this session, if the session still holds it. A request whose
   * deadline cancelled it (or that never started) is answered once its handler has really
   * ended and its deadline has passed: the manager keeps the key until then, takes the result
   * as the attempt's end (a missed deadline) and only then hands the key out again. A request
   * of a session that ended is never answered.
   */
  private complete(
    w: Work,
    result: ReconcileResult | undefined,
    label: OutcomeLabel,
    span: WorkSpan | undefined,
    cancelled?: string,
    /** The work's logger, when its end was logged already. */
    ended?: Logger,
  ): void {
    if (this.closed || !this.inFlight.has(w.id)) {
      span?.end("lost", "session ended before the result");
      return;
    }
    const reason: unknown = w.abort.signal.reason;
    if (w.abort.signal.aborted || result === undefined) {
      const atDeadline = reason instanceof DeadlineExceededError;
      span?.end(atDeadline ? "deadline" : "lost", cancelled ?? "cancelled");
      if (!atDeadline || !this.confirmLate) {
        return;
      }
      const late = Date.now() - w.deadlineMs;
      (ended === undefined ? this.log.warn : ended.debug).call(ended ?? this.log,
        `request ${w.id} was cancelled at its deadline; ${cancelled ?? "the handler ended"}` +
          `${late > 0 ? ` ${late} ms after the deadline` : ""}; the manager re-delivers the key once it has the result`,
      );
      const message = `cancelled at its deadline: ${cancelled ?? "the handler ended"}`;
      const send = (): void => this.sendNow(w, create(ReconcileResultSchema, { id: w.id, outcome: { case: "error", value: { message } } }));
      const wait = w.deadlineMs + AFTER_DEADLINE_MS - Date.now();
      if (wait > 0) {
        setTimeout(send, wait);
      } else {
        send();
      }
      return;
    }
    const outcome = result.outcome;
    span?.end(
      label === "done" ? "success" : label === "requeue" ? "requeue_after" : label,
      outcome.case === "error" || outcome.case === "terminal" ? outcome.value.message : undefined,
    );
    this.sendNow(w, result);
  }

  private sendNow(w: Work, result: ReconcileResult): void {
    if (this.closed || this.inFlight.get(w.id) !== w) {
      return;
    }
    clearTimeout(w.timer);
    this.inFlight.delete(w.id);
    this.send({ case: "result", value: result });
    this.maybeDrained();
  }

  private answerEvent(w: Work, span: WorkSpan | undefined, outcome: string, error?: string): void {
    if (this.closed || this.inFlight.get(w.id) !== w || w.abort.signal.aborted) {
      return;
    }
    clearTimeout(w.timer);
    this.inFlight.delete(w.id);
    span?.end(outcome, error);
    this.send({ case: "eventAck", value: { $typeName: "ctrlhub.v1.EventAck", id: w.id } });
    this.maybeDrained();
  }

  /** While draining: once nothing is in flight, give the manager a while to end the stream. */
  private maybeDrained(): void {
    if (!this.draining || this.closed || this.inFlight.size > 0 || this.drainTimer !== undefined) {
      return;
    }
    this.drainTimer = setTimeout(() => {
      this.log.warn(`the manager did not end the drained session within ${this.drainGraceMs} ms; closing it`);
      this.cancel();
    }, this.drainGraceMs);
  }
}

/** Kubernetes JSON of a request: `undefined` when empty (the manager holds no state for it). */
function decodeObject<T>(bytes: Uint8Array): T | undefined {
  if (bytes.length === 0) {
    return undefined;
  }
  const value: unknown = decode(bytes);
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(`expected a JSON object, got ${Array.isArray(value) ? "an array" : String(value)}`);
  }
  return typed<T>(value);
}
