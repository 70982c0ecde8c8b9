/**
 * @internal One attempt: a request (or event) from its arrival until its handler has really
 * ended, and its answer ({@link reconcile}, {@link event}); and the handlers running in this
 * process across all sessions of a controller ({@link Attempts}). The session
 * (`session.ts`) hands each request here through an {@link AttemptHost}, so that this module
 * needs nothing of the session's own.
 */
import { type Action, type OutcomeLabel, describe, failureOf, resultOf } from "./action.js";
import { type Kube, typed } from "./client.js";
import { DeadlineExceededError, RetryError, TerminalError } from "./errors.js";
import type { EventRecorder } from "./events.js";
import { Finalizers } from "./finalizers.js";
import {
  type Event as EventMessage,
  Event_Type,
  type ReconcileRequest as RequestMessage,
  type ReconcileResult,
  ReconcileRequest_Reason,
} from "./gen/ctrlhub/v1/controller_pb.js";
import { type Logger, type StackLimiter, withFields } from "./logs.js";
import type { EventHandler, ReconcileHandler } from "./options.js";
import { type CachedReader, decode } from "./reader.js";
import type { EventType, ObjectEvent, Reason, ReconcileRequest, Tombstone, WorkContext } from "./request.js";
import type { KubernetesObject } from "./resources.js";
import { type WorkSpan, parseTraceparent, startSpan } from "./traces.js";
import { adopt, identity } from "./write.js";

/** @internal The handler a controller was finished with. */
export type Handlers<T> = { mode: "reconcile"; handler: ReconcileHandler<T> } | { mode: "events"; handler: EventHandler<T> };

/** @internal What a request's helpers and logs use, shared by the controller's sessions. */
export interface Kit {
  readonly kube: Kube;
  readonly events: EventRecorder;
  /** The handlers' logger (target: the controller's name). */
  readonly handlerLog: Logger;
  readonly stacks: StackLimiter;
}

/** @internal One request (or event) a session received and has not answered. */
export interface Work {
  readonly id: string;
  readonly abort: AbortController;
  /** The manager's deadline, wall clock ms. */
  readonly deadlineMs: number;
  timer: NodeJS.Timeout | undefined;
}

/** @internal What an attempt needs of the session that received it. */
export interface AttemptHost<T> {
  /** The controller's name. */
  readonly name: string;
  readonly kit: Kit;
  /** The field manager of the handlers' applies (the controller's name). */
  readonly fieldManager: string;
  readonly handlers: Handlers<T>;
  /** The session's logger. */
  readonly log: Logger;
  readonly sessionId: string;
  readonly reader: CachedReader | undefined;
  readonly tracing: boolean;
  /**
   * Waits for the first heartbeat answer, the key's earlier attempt and a free slot; the
   * returned function ends the handler's run. `undefined`: cancelled meanwhile, never started.
   */
  admit(key: string, signal: AbortSignal): Promise<(() => void) | undefined>;
  /** Answers a reconcile request (see `Session.complete`). */
  complete(
    w: Work,
    result: ReconcileResult | undefined,
    label: OutcomeLabel,
    span: WorkSpan | undefined,
    cancelled?: string,
    ended?: Logger,
  ): void;
  /** Acknowledges an event. */
  answerEvent(w: Work, span: WorkSpan | undefined, outcome: string, error?: string): void;
}

/** What a handler came to. */
type Settled<R> = { value: R } | { error: unknown };

const REASONS = ReconcileRequest_Reason as unknown as Record<number, string | undefined>;
const EVENT_TYPES = Event_Type as unknown as Record<number, string | undefined>;

/**
 * @internal The handlers running in this process, across all sessions of a controller: one
 * attempt of a key at a time (a request for a key whose earlier attempt still runs waits for
 * it, whichever session delivered either), and a count of what runs, so that stopping can wait
 * until nothing does.
 */
export class Attempts {
  /** Per key, a promise that settles when the last attempt queued for it has ended. */
  private readonly tails = new Map<string, Promise<void>>();
  private running = 0;
  private idleWaiters: Array<() => void> = [];

  /** Handlers running now, in every session. */
  get active(): number {
    return this.running;
  }

  /**
   * Waits until no earlier attempt of `key` runs in this process, then holds the key: call the
   * returned function when this attempt has ended. Resolves with `undefined`, holding nothing,
   * when `signal` aborts first (the attempts queued behind still wait for the earlier one).
   */
  async lock(key: string, signal: AbortSignal): Promise<(() => void) | undefined> {
    const earlier = this.tails.get(key);
    let unlock: () => void = () => {};
    const mine = new Promise<void>((resolve) => (unlock = resolve));
    const tail = earlier === undefined ? mine : earlier.then(() => mine);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) {
        this.tails.delete(key);
      }
    });
    if (earlier !== undefined && !(await settlesBefore(earlier, signal))) {
      unlock();
      return undefined;
    }
    if (signal.aborted) {
      unlock();
      return undefined;
    }
    return unlock;
  }

  /** Whether an attempt of `key` runs or waits in this process. */
  holds(key: string): boolean {
    return this.tails.has(key);
  }

  /** Counts a handler that starts; call the returned function when it has settled. */
  begin(): () => void {
    this.running++;
    let ended = false;
    return () => {
      if (ended) {
        return;
      }
      ended = true;
      this.running--;
      if (this.running === 0) {
        const waiters = this.idleWaiters;
        this.idleWaiters = [];
        for (const w of waiters) {
          w();
        }
      }
    };
  }

  /** Resolves `true` once no handler runs, or `false` after `timeoutMs`. */
  idle(timeoutMs: number): Promise<boolean> {
    if (this.running === 0) {
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.idleWaiters = this.idleWaiters.filter((w) => w !== done);
        resolve(false);
      }, timeoutMs);
      this.idleWaiters.push(done);
    });
  }
}

/**
 * How long a handler with `leftMs` before the manager's deadline may run: the time left less a
 * margin for network latency and clock skew of 5% of it, at most 500 ms; never negative.
 */
export function runFor(leftMs: number): number {
  return Math.max(0, leftMs - Math.min(Math.max(leftMs, 0) * 0.05, 500));
}

/** Resolves `true` when `p` settles, `false` if `signal` aborts first. */
export function settlesBefore(p: Promise<unknown>, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) {
    return Promise.resolve(false);
  }
  return new Promise((resolve) => {
    const onAbort = (): void => resolve(false);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      () => {
        signal.removeEventListener("abort", onAbort);
        resolve(true);
      },
      () => {
        signal.removeEventListener("abort", onAbort);
        resolve(true);
      },
    );
  });
}

/** Runs `fn` to its real end, whatever its signal says. */
async function settle<R>(fn: () => Promise<R>): Promise<Settled<R>> {
  try {
    return { value: await fn() };
  } catch (error) {
    return { error };
  }
}

/** The handler's argument: the work's context (with `extra`), and the SDK's logger of the work. */
function context<T, W extends WorkContext>(
  s: AttemptHost<T>,
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
  const { kit } = s;
  const ids = parseTraceparent(span.traceparent);
  const fields = {
    controller: s.name,
    key: `${k.namespace}/${k.name}`,
    request_id: id,
    attempt,
    session_id: s.sessionId,
    ...(ids === undefined ? {} : { trace_id: ids.traceId, span_id: ids.spanId }),
  };
  const fieldManager = s.fieldManager;
  const context: Omit<WorkContext, "kubeConfig"> = {
    id,
    key: k,
    namespace: k.namespace,
    name: k.name,
    attempt,
    deadline: new Date(deadlineMs),
    signal,
    reader: s.reader as CachedReader,
    sessionId: s.sessionId,
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
  return { context: full as unknown as W, log: withFields(s.log, kind, fields) };
}

/** The request's object and tombstone; an undecodable object is an error to retry, never Terminal. */
function decodeRequest<T>(s: AttemptHost<T>, msg: RequestMessage, key: string): { object: T | undefined; tombstone: Tombstone<T> | undefined } | Error {
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
        s.log.warn(`undecodable tombstone for ${key}; delivering the deletion without its last state: ${describe(err)}`);
      }
      return { object: undefined, tombstone: { object: last, finalStateUnknown: t.finalStateUnknown } };
    }
    return { object: undefined, tombstone: undefined };
  } catch (err) {
    return err instanceof Error ? err : new Error(String(err));
  }
}

export async function reconcile<T>(s: AttemptHost<T>, msg: RequestMessage, w: Work): Promise<void> {
  const { handlers } = s;
  const key = `${msg.key?.namespace ?? ""}/${msg.key?.name ?? ""}`;
  if (handlers.mode !== "reconcile") {
    s.log.warn("ignoring a ReconcileRequest on an EVENTS-mode session", { id: w.id });
    return;
  }
  const decoded = decodeRequest(s, msg, key);
  if (decoded instanceof Error) {
    // Not the user's fault, and perhaps the manager's or this SDK's: retried with backoff.
    s.log.error(`undecodable object for ${key}; answering a retryable error: ${decoded.message}`, { key, request_id: w.id });
    const [result, label] = failureOf(w.id, new RetryError(`undecodable object: ${decoded.message}`));
    s.complete(w, result, label, undefined);
    return;
  }
  const started = await s.admit(key, w.abort.signal);
  if (started === undefined) {
    s.complete(w, undefined, "error", undefined, "it never started: the request was cancelled while it waited");
    return;
  }
  const reasons = msg.reasons.map((r) => (REASONS[r] as Reason | undefined) ?? "UNSPECIFIED");
  const { kit } = s;
  let outcome: Settled<Action | void>;
  let span: WorkSpan | undefined;
  let log: Logger | undefined;
  const t0 = performance.now();
  try {
    span = startSpan(s.tracing, "reconcile", msg.traceparent, msg.tracestate, {
      "ctrlhub.controller": s.name,
      "k8s.namespace.name": msg.key?.namespace ?? "",
      "k8s.object.name": msg.key?.name ?? "",
      "ctrlhub.attempt": msg.attempt,
      "ctrlhub.request.id": w.id,
    });
    const made = context<T, ReconcileRequest<T>>(s, "reconcile", w.id, msg.key, msg.attempt, w.abort.signal, w.deadlineMs, span,
      msg.traceparent, { reasons, object: decoded.object, tombstone: decoded.tombstone });
    log = made.log;
    log.info("reconcile start", { key, reasons: reasons.join(","), attempt: msg.attempt });
    const request = made.context;
    const handler = handlers.handler;
    const running = span;
    outcome = await settle(() => running.run(async () => handler(request)));
  } finally {
    started();
  }
  const end = { key, reasons: reasons.join(","), attempt: msg.attempt, duration_ms: Math.round(performance.now() - t0) };
  if (w.abort.signal.aborted) {
    const reason: unknown = w.abort.signal.reason;
    const atDeadline = reason instanceof DeadlineExceededError;
    log.warn("reconcile end", { ...end, outcome: atDeadline ? "deadline" : "lost", error: describe(reason) });
    s.complete(w, undefined, "error", span, "the handler was cancelled", log);
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
  s.complete(w, result, label, span);
}

export async function event<T>(s: AttemptHost<T>, msg: EventMessage, w: Work): Promise<void> {
  const { handlers } = s;
  if (handlers.mode !== "events") {
    s.log.warn("ignoring an Event on a reconcile-mode session", { id: w.id });
    return;
  }
  const key = `${msg.key?.namespace ?? ""}/${msg.key?.name ?? ""}`;
  let object: T;
  try {
    object = typed<T>(decode(msg.objectJson));
  } catch (err) {
    // Nothing a retry can fix: acknowledge and move on.
    s.log.error(`undecodable event object for ${key}; acknowledging it: ${describe(err)}`);
    s.answerEvent(w, undefined, "terminal", describe(err));
    return;
  }
  const started = await s.admit(key, w.abort.signal);
  if (started === undefined) {
    return;
  }
  const type = (EVENT_TYPES[msg.type] as EventType | undefined) ?? "UNSPECIFIED";
  let outcome: Settled<void>;
  let span: WorkSpan;
  let log: Logger;
  const t0 = performance.now();
  try {
    span = startSpan(s.tracing, "event", msg.traceparent, msg.tracestate, {
      "ctrlhub.controller": s.name,
      "k8s.namespace.name": msg.key?.namespace ?? "",
      "k8s.object.name": msg.key?.name ?? "",
      "ctrlhub.attempt": msg.attempt,
      "ctrlhub.request.id": w.id,
    });
    const made = context<T, ObjectEvent<T>>(s, "event", w.id, msg.key, msg.attempt, w.abort.signal, w.deadlineMs, span,
      msg.traceparent, { type, object, sequence: msg.sequence });
    log = made.log;
    log.info("event start", { key, type, attempt: msg.attempt });
    const event = made.context;
    const handler = handlers.handler;
    const running = span;
    outcome = await settle(() => running.run(async () => handler(event)));
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
  s.answerEvent(w, span, "success");
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
