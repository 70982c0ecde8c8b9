/**
 * @internal One session with the manager, as named steps: {@link Session.run} reads the
 * credentials, opens the Connect stream with the Register and serves it until it ends; the
 * manager's messages (Registered, requests, heartbeat answers, refusals, revocations) each have
 * a handler, and the stream's status is classified into what the controller does next
 * (`controller.ts` runs the sessions one after another). Each request runs as an attempt
 * (`attempt.ts`), which sees the session only through an {@link AttemptHost}.
 */
import { create, toJson } from "@bufbuild/protobuf";
import { type Timestamp, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { type ClientDuplexStream, type StatusObject, status as Status } from "@grpc/grpc-js";

import { type OutcomeLabel, describe } from "./action.js";
import { Outbound, type Outgoing } from "./batches.js";
import {
  type AttemptHost,
  type Attempts,
  type Handlers,
  type Kit,
  type Work,
  event,
  reconcile,
  runFor,
  settlesBefore,
} from "./attempt.js";
import type { Limiter } from "./backoff.js";
import { type Connection, authMetadata, channelSettings } from "./config.js";
import { DeadlineExceededError, RegistrationRejectedError, SessionEndedError } from "./errors.js";
import { Fence } from "./fence.js";
import {
  type ControllerMessage,
  type Event,
  type ManagerMessage,
  type ReconcileRequest,
  type ReconcileResult,
  ReconcileResultSchema,
} from "./gen/ctrlhub/v1/controller_pb.js";
import {
  type Register,
  type Registered,
  RegisterSchema,
  type Rejected,
  type Revoked,
  Revoked_Reason,
} from "./gen/ctrlhub/v1/registration_pb.js";
import { ManagerClient } from "./grpc.js";
import type { Logger } from "./logs.js";
import type { ReadableKind, RunOptions } from "./options.js";
import { CachedReader } from "./reader.js";
import type { WorkSpan } from "./traces.js";

/** @internal How a session ended, and what the controller does next. */
export type SessionEnd =
  | { kind: "stopped"; drained: boolean }
  | { kind: "fatal"; error: Error }
  /** A newer definition runs, or another identity holds the name: wait, then register again. */
  | { kind: "wait"; reason: string }
  /** `expected`: an orderly handover (a manager shutting down, a standby): logged at INFO. */
  | { kind: "retry"; registered: boolean; reason: string; expected?: boolean }
  /**
   * Ring mode: another member owns the controller (`Rejected` UNAVAILABLE on Register) or owns
   * it now (`Revoked` UNIT_MOVED): dial `address` next, at once (`redirect.ts` bounds how often).
   */
  | { kind: "redirect"; registered: boolean; owner: string; address: string; reason: string };

const FATAL_BEFORE_REGISTERED = new Set<number>([Status.INVALID_ARGUMENT, Status.PERMISSION_DENIED, Status.UNAUTHENTICATED]);

/** Revocations that are an orderly handover, not a fault: logged at INFO. */
const HANDOVER = new Set<Revoked_Reason>([Revoked_Reason.SHUTTING_DOWN, Revoked_Reason.LEADERSHIP_LOST, Revoked_Reason.UNIT_MOVED]);

/** The trailers of a ring member's redirect (the same values as `Rejected.owner_*`). */
const OWNER_TRAILER = "ctrlhub-owner";
const OWNER_ADDR_TRAILER = "ctrlhub-owner-addr";

/** The process exit status when a handler ignored its cancellation past 80 % of the hold. */
export const EXIT_HANDLER_NOT_STOPPED = 70;

/**
 * How long after its deadline (by this host's clock) the result of an attempt cancelled at
 * its deadline is sent, so that the manager takes it as the end of an attempt that missed its
 * deadline (counted so, and re-delivered as REDELIVERY) rather than as an outcome.
 */
const AFTER_DEADLINE_MS = 25;

/** @internal The controller's parts a session reads: its registration, handlers and limits. */
export interface OwnerInternals<T> {
  readonly register: Register;
  readonly handlers: Handlers<T>;
  readonly credit: number;
  readonly limiter: Limiter;
  readonly attempts: Attempts;
  readonly stopping: boolean;
  readonly retire: boolean;
  readonly kit: Kit;
}

/**
 * @internal What a session needs of its controller (the controller fits it; the session
 * does not import the controller).
 */
export interface SessionOwner<T> {
  readonly name: string;
  readonly internals: OwnerInternals<T>;
  /** A session's state changed: ready while it is live (`undefined`), else why not. */
  refreshReadiness(liveReason: string | undefined): void;
}

/** A session's credentials: the call's metadata (the bearer token) and the channel's TLS. */
interface Credentials {
  readonly metadata: Awaited<ReturnType<typeof authMetadata>>;
  readonly settings: Awaited<ReturnType<typeof channelSettings>>;
}

/** @internal One Connect stream on a channel (and so a TCP connection) of its own. */
export class Session<T> {
  registered = false;
  sessionId = "";
  private client: ManagerClient | undefined;
  private call: ClientDuplexStream<ControllerMessage, ManagerMessage> | undefined;
  /** What the session sends, one message at a time, answers batched (`batches.ts`). */
  private outbound: Outbound | undefined;
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
  private readonly host: AttemptHost<T>;

  constructor(
    private readonly owner: SessionOwner<T>,
    private readonly connection: Connection,
    private readonly log: Logger,
    private readonly drainGraceMs: number,
    private readonly tracing: boolean,
    private readonly options: RunOptions,
  ) {
    this.handlers = owner.internals.handlers;
    this.confirmLate = owner.internals.register.exclusiveAttempts;
    this.host = this.attemptHost();
  }

  /** This session as its attempts see it. */
  private attemptHost(): AttemptHost<T> {
    const self = this;
    return {
      name: this.owner.name,
      get kit() {
        return self.owner.internals.kit;
      },
      // The controller's name, which never changes (`register` is a fresh copy on every read).
      fieldManager: this.owner.internals.register.controllerName,
      handlers: this.handlers,
      log: this.log,
      get sessionId() {
        return self.sessionId;
      },
      get reader() {
        return self.reader;
      },
      tracing: this.tracing,
      admit: (key, signal) => this.admit(key, signal),
      complete: (w, result, label, span, cancelled, ended) => this.complete(w, result, label, span, cancelled, ended),
      answerEvent: (w, span, outcome, error) => this.answerEvent(w, span, outcome, error),
    };
  }

  /** Registered, not ended, not draining and not fenced off: taking work. */
  get live(): boolean {
    return this.registered && !this.closed && !this.draining && !this.fenced;
  }

  /**
   * One session, in order: read the credentials → open the stream with the Register → serve
   * it until it ends (`onMessage`: Registered, requests, heartbeat answers, refusals;
   * `onStatus`: the end, `classify`d into what the controller does next).
   */
  async run(): Promise<SessionEnd> {
    const credentials = await this.credentials();
    if ("kind" in credentials) {
      return credentials;
    }
    if (this.owner.internals.stopping || this.cancelled) {
      return { kind: "stopped", drained: false };
    }
    const ended = new Promise<SessionEnd>((resolve) => (this.finish = resolve));
    const client = this.open(credentials.metadata, credentials.settings);
    try {
      return await ended;
    } finally {
      client.close();
    }
  }

  /** The token and TLS settings, read now (they may be rotated between sessions). */
  private async credentials(): Promise<Credentials | SessionEnd> {
    try {
      const [metadata, settings] = await Promise.all([authMetadata(this.connection), channelSettings(this.connection)]);
      return { metadata, settings };
    } catch (err) {
      // A token or certificate file may not be mounted yet, or be mid-rotation: retry.
      const reason = describe(err);
      this.options.onSessionEnd?.({ sessionId: "", registered: false, code: Status.UNKNOWN, reason });
      return { kind: "retry", registered: false, reason };
    }
  }

  /** Opens the Connect stream on a channel of its own and sends the Register first. */
  private open(metadata: Credentials["metadata"], settings: Credentials["settings"]): ManagerClient {
    const client = new ManagerClient(this.connection.target, settings.credentials, settings.options);
    this.client = client;
    this.log.info("connecting to manager", { addr: this.connection.display });
    const call = client.connect(metadata);
    this.call = call;
    this.outbound = new Outbound((message, done) => {
      // A literal, not create(): every field is set (one write per message on the hot path).
      call.write({ $typeName: "ctrlhub.v1.ControllerMessage", message }, () => done());
    });
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
    this.send({ case: "register", value: this.owner.internals.register });
    return client;
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

  /** Queues `message` on the stream (answers that wait together leave as one batch). */
  private send(message: Outgoing): void {
    if (this.closed || this.outbound === undefined) {
      return;
    }
    this.log.trace?.(`sending ${message.case ?? "nothing"}`, message.case === "result" ? { id: message.value.id, outcome: message.value.outcome.case } : {});
    this.outbound.send(message);
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
        this.onRequest(m.value);
        return;
      case "event":
        this.onEvent(m.value);
        return;
      case "batch":
        // Each piece exactly as if it had come alone.
        this.log.trace?.("received WorkBatch", { requests: m.value.requests.length, events: m.value.events.length });
        for (const request of m.value.requests) {
          this.onRequest(request);
        }
        for (const e of m.value.events) {
          this.onEvent(e);
        }
        return;
      case "rejected": {
        this.rejected = m.value;
        const code = Status[m.value.code] ?? String(m.value.code);
        const fields = {
          code,
          ...(m.value.field === "" ? {} : { field: m.value.field }),
          ...(m.value.outdated ? { outdated: true } : {}),
        };
        if (
          m.value.outdated ||
          m.value.code === Status.ALREADY_EXISTS ||
          m.value.ownerAddress !== "" ||
          (!this.registered && FATAL_BEFORE_REGISTERED.has(m.value.code))
        ) {
          // Reported once, by the wait's WARN line, the redirect's INFO line or run()'s rejection.
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
        const fields = {
          ...(m.value.leaderIdentity === "" ? {} : { leader: m.value.leaderIdentity }),
          ...(m.value.ownerAddress === "" ? {} : { owner_addr: m.value.ownerAddress }),
        };
        if (HANDOVER.has(m.value.reason)) {
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

  private onRequest(request: ReconcileRequest): void {
    this.log.trace?.("received ReconcileRequest", {
      id: request.id,
      key: `${request.key?.namespace ?? ""}/${request.key?.name ?? ""}`,
      attempt: request.attempt,
      object: request.object.case ?? "none",
    });
    this.dispatch(request.id, request.deadline, (work) => reconcile(this.host, request, work));
  }

  private onEvent(e: Event): void {
    this.log.trace?.("received Event", { id: e.id, sequence: e.sequence, type: e.type });
    this.dispatch(e.id, e.deadline, (work) => event(this.host, e, work));
  }

  private onRegistered(r: Registered): void {
    if (this.registered) {
      this.log.warn("ignoring a second Registered");
      return;
    }
    this.registered = true;
    this.sessionId = r.sessionId;
    // Results batch only when the manager echoed max_batch: an older one ends the stream on a ResultBatch.
    if (this.outbound !== undefined) {
      this.outbound.outbox.batching = (r.effective?.maxBatch ?? 0) > 1;
    }
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
      ...(r.memberIdentity === "" || r.memberIdentity === r.leaderIdentity ? {} : { member: r.memberIdentity }),
      addr: this.connection.display,
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
    this.outbound?.stop();
    clearTimeout(this.drainTimer);
    this.fence?.stop();
    this.abortAll("the session ended");
    this.armExitCheck();
    const end = this.classify(status);
    const reason = end.kind === "fatal" ? end.error.message : end.kind === "stopped" ? "drained" : end.reason;
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
      const why = `revoked (${reason}): ${revoked.message}`;
      const moved = revoked.reason === Revoked_Reason.UNIT_MOVED ? this.redirect(status, revoked.leaderIdentity, revoked.ownerAddress, why) : undefined;
      return moved ?? { kind: "retry", registered: true, reason: why, expected: HANDOVER.has(revoked.reason) };
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
    if (!this.registered && code === Status.UNAVAILABLE) {
      const owner = this.redirect(status, rejected?.ownerIdentity ?? "", rejected?.ownerAddress ?? "", `UNAVAILABLE: ${details}`);
      if (owner !== undefined) {
        return owner;
      }
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

  /**
   * A ring member's redirect to the controller's owner: the message's owner (identity and
   * `host:port`), else the `ctrlhub-owner`/`ctrlhub-owner-addr` trailers; `undefined` when
   * neither names an address (an owner not known yet: reconnect through the configured address).
   */
  private redirect(status: StatusObject, identity: string, address: string, why: string): SessionEnd | undefined {
    const trailer = (key: string): string => String(status.metadata?.get(key)[0] ?? "");
    const addr = address !== "" ? address : trailer(OWNER_ADDR_TRAILER);
    if (addr === "") {
      return undefined;
    }
    const owner = identity !== "" ? identity : trailer(OWNER_TRAILER);
    return { kind: "redirect", registered: this.registered, owner, address: addr, reason: why };
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
