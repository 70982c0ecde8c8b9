import { create } from "@bufbuild/protobuf";
import { type Timestamp, durationFromMs, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { type ClientDuplexStream, type StatusObject, status as Status } from "@grpc/grpc-js";

import { type Action, type OutcomeLabel, describe, failureOf, resultOf } from "./action.js";
import { Backoff, Limiter } from "./backoff.js";
import { type Connection, type ConnectionOptions, authMetadata, channelSettings, resolveConnection } from "./config.js";
import {
  ConfigError,
  DeadlineExceededError,
  TerminalError,
  RegistrationRejectedError,
  SessionEndedError,
  SupersededError,
} from "./errors.js";
import {
  type ControllerMessage,
  ControllerMessageSchema,
  type Event as EventMessage,
  Event_Type,
  type ManagerMessage,
  type ReconcileRequest as RequestMessage,
  type ReconcileResult,
  ReconcileRequest_Reason,
} from "./gen/ctrlhub/v1/controller_pb.js";
import {
  type Register,
  RegisterSchema,
  Register_Mode,
  type Rejected,
  type Revoked,
  Revoked_Reason,
  type WatchedResource,
} from "./gen/ctrlhub/v1/registration_pb.js";
import { ManagerClient } from "./grpc.js";
import { type Logger, consoleLogger } from "./log.js";
import { CachedReader, decode } from "./reader.js";
import type { EventType, ObjectEvent, Reason, ReconcileRequest, WorkContext } from "./request.js";
import {
  type KubernetesObject,
  type Mapping,
  Predicate,
  type ResourceKind,
  type Selector,
  labelSelector,
  resourceType,
} from "./resources.js";
import { type WorkSpan, loadOpenTelemetry, startSpan } from "./traces.js";

/**
 * A reconcile handler: make the world match the object named by the request, then return
 * {@link Action.done} (or nothing), {@link Action.requeueAfter}, or throw
 * ({@link RetryError}, {@link TerminalError}, any error).
 */
export type ReconcileHandler<T> = (request: ReconcileRequest<T>) => Promise<Action | void> | Action | void;

/** An EVENTS-mode handler; the event is acknowledged when it resolves. */
export type EventHandler<T> = (event: ObjectEvent<T>) => Promise<void> | void;

/** What the manager answered to a registration; passed to {@link RunOptions.onRegistered}. */
export interface RegisteredInfo {
  /** This session's id (it changes on every reconnect); quote it when reporting problems. */
  readonly sessionId: string;
  /** The manager replica serving the session. */
  readonly leaderIdentity: string;
  /** The registration as the manager applies it, every default filled in. */
  readonly effective: Register | undefined;
}

/** How a session ended; passed to {@link RunOptions.onSessionEnd}. */
export interface SessionEndInfo {
  /** The session's id; `""` when it never registered. */
  readonly sessionId: string;
  /** Whether it registered. */
  readonly registered: boolean;
  /** The final gRPC status code (`@grpc/grpc-js`'s `status`). */
  readonly code: number;
  /** Why, in words (a Revoked reason, a Rejected message, a status' details). */
  readonly reason: string;
}

/** How {@link Controller.run} connects and behaves. Every field has a default. */
export interface RunOptions extends ConnectionOptions {
  /** Aborting it drains the controller (like SIGTERM) and makes `run` resolve. */
  readonly signal?: AbortSignal;
  /**
   * Drain on SIGTERM and SIGINT (a second signal stops at once, abandoning in-flight work to
   * other replicas). Default `true`.
   */
  readonly handleSignals?: boolean;
  /** Where to log. Default {@link consoleLogger}. */
  readonly logger?: Logger;
  /** Reconnect backoff: first delay (before jitter) and cap. Default 100 ms doubling to 10 s. */
  readonly reconnect?: { readonly initialMs?: number; readonly maxMs?: number };
  /**
   * After Drain, once nothing is in flight, how long to wait for the manager to end the
   * stream before closing it. Default 10 s.
   */
  readonly drainGraceMs?: number;
  /**
   * Record a `reconcile` (or `event`) span per request with `@opentelemetry/api` when it is
   * installed, as a child of the manager's dispatch span. Default `true`. Trace context is
   * continued either way ({@link WorkContext.traceparent}).
   */
  readonly tracing?: boolean;
  /** Called on every `Registered` (every (re)connect). */
  readonly onRegistered?: (info: RegisteredInfo) => void;
  /** Called whenever a session ends. */
  readonly onSessionEnd?: (info: SessionEndInfo) => void;
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/**
 * Starts the definition of controller `name` (a DNS-1123 label, unique within your tenant;
 * replicas share it).
 *
 * @example
 * ```ts
 * await controller("stamper")
 *   .for(kinds.ConfigMap)
 *   .inNamespaces("default")
 *   .withLabels({ "example.com/stamp": "true" })
 *   .reconcile(async (req) => {
 *     // ... write through @kubernetes/client-node, passing req.signal ...
 *     return Action.done();
 *   })
 *   .run();
 * ```
 */
export function controller(name: string): ControllerBuilder<KubernetesObject> {
  return new ControllerBuilder(name);
}

interface Definition {
  name: string;
  primary?: ResourceKind<unknown>;
  owns: Array<{ kind: ResourceKind<unknown>; controllerOnly: boolean; predicate?: Predicate }>;
  watches: Array<{ kind: ResourceKind<unknown>; mapping: Mapping; predicate?: Predicate }>;
  namespaces?: { all: true } | { names: string[] } | { selector: Selector };
  labels?: Selector;
  predicate?: Predicate;
  concurrency: number;
  maxConcurrentReconciles?: number;
  deadlineMs?: number;
  resyncMs?: number;
  backoff?: { baseMs: number; maxMs: number };
  includeObject: boolean;
}

/**
 * A controller's definition, built fluently: what it reconciles ({@link ControllerBuilder.for}),
 * where ({@link ControllerBuilder.inNamespaces}, {@link ControllerBuilder.withLabels}), what
 * else maps to its keys ({@link ControllerBuilder.owns}, {@link ControllerBuilder.watches}),
 * and how much at once; finished by {@link ControllerBuilder.reconcile} or
 * {@link ControllerBuilder.onEvent}. Every method returns the builder.
 *
 * @typeParam T the primary type's objects
 */
export class ControllerBuilder<T> {
  private readonly def: Definition;

  /** @internal */
  constructor(name: string) {
    this.def = { name, owns: [], watches: [], concurrency: 1, includeObject: false };
  }

  /** The primary type: the type whose keys are reconciled. Required. */
  for<U>(kind: ResourceKind<U>): ControllerBuilder<U> {
    this.def.primary = kind;
    return this as unknown as ControllerBuilder<U>;
  }

  /** Only these namespaces (default: every namespace the caller may watch). */
  inNamespaces(...names: string[]): this {
    if (names.length === 0) {
      throw new ConfigError("inNamespaces needs at least one name; use inAllNamespaces() for all");
    }
    this.def.namespaces = { names };
    return this;
  }

  /** Every namespace, including ones created later (the default). */
  inAllNamespaces(): this {
    this.def.namespaces = { all: true };
    return this;
  }

  /** Namespaces whose labels match `selector`, followed live. */
  inNamespacesMatching(selector: Selector): this {
    this.def.namespaces = { selector };
    return this;
  }

  /**
   * Only primaries whose labels match (applied by the API server, so nothing else is cached).
   * An object that stops matching is delivered once more with reason `LEFT_SCOPE`.
   */
  withLabels(selector: Selector): this {
    this.def.labels = selector;
    return this;
  }

  /** Only changes passing `predicate` queue a key. */
  where(predicate: Predicate): this {
    this.def.predicate = predicate;
    return this;
  }

  /**
   * A child type this controller creates: a change to one queues its owner (through
   * `ownerReferences`; only the `controller: true` one unless `controllerOnly` is false).
   */
  owns(kind: ResourceKind<unknown>, options: { controllerOnly?: boolean; predicate?: Predicate } = {}): this {
    const owned: Definition["owns"][number] = { kind, controllerOnly: options.controllerOnly ?? true };
    if (options.predicate !== undefined) {
      owned.predicate = options.predicate;
    }
    this.def.owns.push(owned);
    return this;
  }

  /** Another type whose objects name the primary they concern by `mapping`. */
  watches(kind: ResourceKind<unknown>, mapping: Mapping, options: { predicate?: Predicate } = {}): this {
    const watched: Definition["watches"][number] = { kind, mapping };
    if (options.predicate !== undefined) {
      watched.predicate = options.predicate;
    }
    this.def.watches.push(watched);
    return this;
  }

  /** Deliver the object (or its tombstone) with each request, saving a read. */
  includeObject(on = true): this {
    this.def.includeObject = on;
    return this;
  }

  /**
   * How many requests this replica handles at once: its credit with the manager
   * (`max_in_flight`) and the number of handlers running concurrently. Default 1.
   */
  concurrency(n: number): this {
    if (!Number.isInteger(n) || n < 1) {
      throw new ConfigError(`concurrency must be a positive integer, not ${n}`);
    }
    this.def.concurrency = n;
    return this;
  }

  /** A bound on requests in flight across all replicas of this controller. */
  maxConcurrentReconciles(n: number): this {
    if (!Number.isInteger(n) || n < 1) {
      throw new ConfigError(`maxConcurrentReconciles must be a positive integer, not ${n}`);
    }
    this.def.maxConcurrentReconciles = n;
    return this;
  }

  /** How long a handler has per request (default 60 s; the tenant's bounds apply). */
  deadline(ms: number): this {
    if (!Number.isFinite(ms) || ms <= 0) {
      throw new ConfigError(`deadline must be positive, not ${ms}`);
    }
    this.def.deadlineMs = ms;
    return this;
  }

  /** Re-deliver every key this often (default 10 h); `0` turns resync off. */
  resync(ms: number): this {
    if (!Number.isFinite(ms) || ms < 0) {
      throw new ConfigError(`resync must be zero (off) or positive, not ${ms}`);
    }
    this.def.resyncMs = ms;
    return this;
  }

  /** Per-key retry backoff after errors (default 5 ms doubling to 1000 s). */
  backoff(options: { baseMs: number; maxMs: number }): this {
    if (!(options.baseMs > 0) || !(options.maxMs >= options.baseMs)) {
      throw new ConfigError(`backoff needs 0 < baseMs <= maxMs, not ${options.baseMs} and ${options.maxMs}`);
    }
    this.def.backoff = { ...options };
    return this;
  }

  /** Finishes the definition with a reconcile handler (MODE_RECONCILE). */
  reconcile(handler: ReconcileHandler<T>): Controller<T> {
    return new Controller<T>(this.validated(Register_Mode.RECONCILE), { mode: "reconcile", handler });
  }

  /**
   * Finishes the definition with an event handler (MODE_EVENTS): every change to an object of
   * the primary type, in order per key, at least once. Owned and watched types,
   * `maxConcurrentReconciles` and `backoff` do not apply to events.
   */
  onEvent(handler: EventHandler<T>): Controller<T> {
    const d = this.def;
    const refused = [
      d.owns.length > 0 && "owns()",
      d.watches.length > 0 && "watches()",
      d.maxConcurrentReconciles !== undefined && "maxConcurrentReconciles()",
      d.backoff !== undefined && "backoff()",
    ].filter((x): x is string => typeof x === "string");
    if (refused.length > 0) {
      throw new ConfigError(`controller ${JSON.stringify(d.name)}: onEvent() cannot be combined with ${refused.join(", ")}`);
    }
    return new Controller<T>(this.validated(Register_Mode.EVENTS), { mode: "events", handler });
  }

  private validated(mode: Register_Mode): Register {
    const d = this.def;
    if (d.name.length > 63 || !DNS_LABEL.test(d.name)) {
      throw new ConfigError(
        `invalid controller name ${JSON.stringify(d.name)}: it must be a DNS-1123 label ` +
          "(lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)",
      );
    }
    if (d.primary === undefined) {
      throw new ConfigError(`controller ${JSON.stringify(d.name)} has no primary type: call .for(kind) first`);
    }
    return toRegister(d, mode);
  }
}

function toRegister(d: Definition, mode: Register_Mode): Register {
  const r = create(RegisterSchema, {
    controllerName: d.name,
    mode,
    primary: resourceType(d.primary as ResourceKind<unknown>),
    owns: d.owns.map((o) => ({
      resource: resourceType(o.kind),
      controllerOnly: o.controllerOnly,
      ...(o.predicate === undefined ? {} : { predicate: o.predicate.message }),
    })),
    watches: d.watches.map((w) => ({
      resource: resourceType(w.kind),
      mapping: mappingOf(w.mapping),
      ...(w.predicate === undefined ? {} : { predicate: w.predicate.message }),
    })),
    maxConcurrentReconciles: d.maxConcurrentReconciles ?? 0,
    maxInFlight: d.concurrency,
    includeObject: d.includeObject,
  });
  const ns = d.namespaces;
  if (ns !== undefined) {
    r.namespaces = {
      $typeName: "ctrlhub.v1.NamespaceScope",
      scope:
        "all" in ns
          ? { case: "all", value: { $typeName: "ctrlhub.v1.NamespaceScope.All" } }
          : "names" in ns
            ? { case: "names", value: { $typeName: "ctrlhub.v1.NamespaceScope.Names", names: [...ns.names] } }
            : { case: "labelSelector", value: labelSelector(ns.selector) },
    };
  }
  if (d.labels !== undefined) {
    r.labelSelector = labelSelector(d.labels);
  }
  if (d.predicate !== undefined) {
    r.predicate = d.predicate.message;
  }
  if (d.deadlineMs !== undefined) {
    r.requestDeadline = durationFromMs(d.deadlineMs);
  }
  if (d.resyncMs !== undefined) {
    r.resyncPeriod = durationFromMs(d.resyncMs);
  }
  if (d.backoff !== undefined) {
    r.backoff = {
      $typeName: "ctrlhub.v1.Backoff",
      base: durationFromMs(d.backoff.baseMs),
      max: durationFromMs(d.backoff.maxMs),
    };
  }
  return r;
}

function mappingOf(m: Mapping): WatchedResource["mapping"] {
  if ("label" in m) {
    return { case: "labelKey", value: m.label };
  }
  if ("annotation" in m) {
    return { case: "annotationKey", value: m.annotation };
  }
  return { case: "fieldPath", value: m.fieldPath };
}

type Handlers<T> = { mode: "reconcile"; handler: ReconcileHandler<T> } | { mode: "events"; handler: EventHandler<T> };

type SessionEnd =
  | { kind: "stopped" }
  | { kind: "fatal"; error: Error }
  | { kind: "retry"; registered: boolean; reason: string };

const FATAL_BEFORE_REGISTERED = new Set<number>([
  Status.INVALID_ARGUMENT,
  Status.PERMISSION_DENIED,
  Status.UNAUTHENTICATED,
  Status.ALREADY_EXISTS,
]);

/**
 * A defined controller, ready to {@link Controller.run}. It owns the session with the manager:
 * connecting and registering, running handlers up to its concurrency, aborting them at their
 * deadlines, answering, reconnecting with backoff, and draining on shutdown.
 *
 * @typeParam T the primary type's objects
 */
export class Controller<T> {
  /** The controller's name. */
  readonly name: string;
  private readonly register: Register;
  private readonly handlers: Handlers<T>;
  private credit: number;
  private readonly limiter: Limiter;
  private running = false;
  private stopping = false;
  private session: Session<T> | undefined;
  private wake: (() => void) | undefined;

  /** @internal */
  constructor(register: Register, handlers: Handlers<T>) {
    this.name = register.controllerName;
    this.register = register;
    this.handlers = handlers;
    this.credit = register.maxInFlight;
    this.limiter = new Limiter(this.credit);
  }

  /** The `Register` message this controller sends (a copy). */
  registration(): Register {
    return { ...this.register, maxInFlight: this.credit };
  }

  /** The live session's id, when registered. */
  get sessionId(): string | undefined {
    return this.session?.registered ? this.session.sessionId : undefined;
  }

  /**
   * Changes this replica's concurrency while it runs: sends `Credit` to the manager (0 pauses
   * dispatch without ending the session) and resizes the local limit. Lowering it cancels
   * nothing. Kept for later sessions.
   */
  setCredit(n: number): void {
    if (!Number.isInteger(n) || n < 0) {
      throw new RangeError(`credit must be a non-negative integer, not ${n}`);
    }
    this.credit = n;
    this.limiter.resize(Math.max(1, n));
    this.session?.sendCredit(n);
  }

  /**
   * Drains: the manager sends no new work, in-flight handlers finish and answer, and
   * {@link Controller.run} resolves once the manager has ended the session. Between sessions
   * it resolves at once. The same as aborting {@link RunOptions.signal}.
   */
  stop(): void {
    if (this.stopping) {
      return;
    }
    this.stopping = true;
    this.session?.drain();
    this.wake?.();
  }

  /**
   * Runs until stopped (SIGTERM or SIGINT, {@link RunOptions.signal}, {@link Controller.stop}),
   * then drains and resolves. Reconnects with backoff after every other end of a session.
   *
   * @throws {@link ConfigError} for invalid settings (before connecting).
   * @throws {@link RegistrationRejectedError} when the manager refuses the registration in a
   *   way that needs a human.
   * @throws {@link SupersededError} when a newer definition of this controller replaced it.
   */
  async run(options: RunOptions = {}): Promise<void> {
    if (this.running) {
      throw new Error(`controller ${this.name} is already running`);
    }
    const connection = resolveConnection(options);
    const log = options.logger ?? consoleLogger(this.name);
    const reconnect = new Backoff(options.reconnect?.initialMs ?? 100, options.reconnect?.maxMs ?? 10_000);
    const drainGraceMs = options.drainGraceMs ?? 10_000;
    const tracing = (await loadOpenTelemetry(options.tracing ?? true)) !== undefined;
    this.running = true;
    this.stopping = false;

    let signals = 0;
    const onSignal = (sig: NodeJS.Signals): void => {
      signals++;
      if (signals === 1) {
        log.info(`${sig}: draining (send it again to stop at once)`);
        this.stop();
      } else {
        log.warn(`${sig} again: stopping at once; in-flight work is re-delivered elsewhere`);
        this.session?.cancel();
      }
    };
    const handleSignals = options.handleSignals ?? true;
    if (handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    const onAbort = (): void => this.stop();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    if (options.signal?.aborted) {
      this.stop();
    }
    try {
      for (;;) {
        if (this.stopping) {
          return;
        }
        const session = new Session<T>(this, connection, log, drainGraceMs, tracing, options);
        this.session = session;
        const end = await session.run();
        this.session = undefined;
        if (end.kind === "stopped") {
          log.info("controller stopped");
          return;
        }
        if (end.kind === "fatal") {
          log.error(`giving up: ${end.error.message}`);
          throw end.error;
        }
        if (this.stopping) {
          return;
        }
        const delay = reconnect.next(end.registered);
        log.warn(`session ended: ${end.reason}; reconnecting in ${Math.round(delay)} ms`, {
          failures: reconnect.attempts,
        });
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, delay);
          this.wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.wake = undefined;
      }
    } finally {
      this.running = false;
      options.signal?.removeEventListener("abort", onAbort);
      if (handleSignals) {
        process.off("SIGTERM", onSignal);
        process.off("SIGINT", onSignal);
      }
    }
  }

  /** @internal What a session needs of its controller. */
  get internals(): {
    readonly register: Register;
    readonly handlers: Handlers<T>;
    readonly credit: number;
    readonly limiter: Limiter;
    readonly stopping: boolean;
  } {
    const self = this;
    return {
      get register() {
        return self.registration();
      },
      handlers: this.handlers,
      credit: this.credit,
      limiter: this.limiter,
      stopping: this.stopping,
    };
  }
}

interface InFlight {
  readonly abort: AbortController;
  readonly timer: NodeJS.Timeout;
}

const REASONS = ReconcileRequest_Reason as unknown as Record<number, string | undefined>;
const EVENT_TYPES = Event_Type as unknown as Record<number, string | undefined>;

/** One Connect stream on a channel (and so a TCP connection) of its own. */
class Session<T> {
  registered = false;
  sessionId = "";
  private client: ManagerClient | undefined;
  private call: ClientDuplexStream<ControllerMessage, ManagerMessage> | undefined;
  private reader: CachedReader | undefined;
  private closed = false;
  private draining = false;
  private drainTimer: NodeJS.Timeout | undefined;
  private cancelled = false;
  private rejected: Rejected | undefined;
  private revoked: Revoked | undefined;
  private fallbackDeadlineMs = 60_000;
  private readonly inFlight = new Map<string, InFlight>();
  private finish: (end: SessionEnd) => void = () => {};
  private readonly handlers: Handlers<T>;
  private readonly limiter: Limiter;

  constructor(
    private readonly owner: Controller<T>,
    private readonly connection: Connection,
    private readonly log: Logger,
    private readonly drainGraceMs: number,
    private readonly tracing: boolean,
    private readonly options: RunOptions,
  ) {
    this.handlers = owner.internals.handlers;
    this.limiter = owner.internals.limiter;
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
      return { kind: "stopped" };
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
    this.log.info("draining session", { in_flight: this.inFlight.size });
    this.send({ case: "drain", value: { $typeName: "ctrlhub.v1.Drain" } });
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
    this.call.write(create(ControllerMessageSchema, { message }));
    return true;
  }

  private onMessage(msg: ManagerMessage): void {
    const m = msg.message;
    switch (m.case) {
      case "registered": {
        if (this.registered) {
          this.log.warn("ignoring a second Registered");
          return;
        }
        this.registered = true;
        this.sessionId = m.value.sessionId;
        const deadline = m.value.effective?.requestDeadline;
        if (deadline !== undefined) {
          this.fallbackDeadlineMs = durationMs(deadline);
        }
        this.reader = new CachedReader(this.client as ManagerClient, this.connection, this.sessionId);
        this.log.info("registered with manager", { session: this.sessionId, leader: m.value.leaderIdentity });
        this.log.debug("effective registration", { effective: m.value.effective });
        const credit = this.owner.internals.credit;
        if (credit !== this.owner.internals.register.maxInFlight) {
          this.sendCredit(credit);
        }
        this.options.onRegistered?.({
          sessionId: this.sessionId,
          leaderIdentity: m.value.leaderIdentity,
          effective: m.value.effective,
        });
        if (this.owner.internals.stopping) {
          this.drain();
        }
        return;
      }
      case "reconcile":
        this.dispatch(m.value.id, m.value.deadline, (work) => this.reconcile(m.value, work));
        return;
      case "event":
        this.dispatch(m.value.id, m.value.deadline, (work) => this.event(m.value, work));
        return;
      case "rejected":
        this.rejected = m.value;
        this.log.warn(`registration rejected: ${m.value.message}`, { code: Status[m.value.code], field: m.value.field });
        return;
      case "revoked": {
        this.revoked = m.value;
        const reason = Revoked_Reason[m.value.reason] ?? String(m.value.reason);
        this.log.warn(`session revoked (${reason}): ${m.value.message}`, {
          ...(m.value.leaderIdentity === "" ? {} : { leader: m.value.leaderIdentity }),
        });
        this.abortAll("the manager revoked the session");
        return;
      }
      default:
        this.log.debug("ignoring a manager message of a kind this SDK does not know");
    }
  }

  private onStatus(status: StatusObject): void {
    if (this.closed) {
      return;
    }
    this.closed = true;
    clearTimeout(this.drainTimer);
    this.abortAll("the session ended");
    const end = this.classify(status);
    const reason = end.kind === "retry" ? end.reason : end.kind === "fatal" ? end.error.message : "drained";
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
      } else {
        this.log.info("session drained; the manager ended the stream");
      }
      return { kind: "stopped" };
    }
    if (this.owner.internals.stopping && (this.cancelled || !this.registered)) {
      return { kind: "stopped" };
    }
    const revoked = this.revoked;
    if (revoked !== undefined) {
      const reason = Revoked_Reason[revoked.reason] ?? String(revoked.reason);
      if (revoked.reason === Revoked_Reason.SUPERSEDED) {
        return {
          kind: "fatal",
          error: new SupersededError(`superseded by a newer definition of controller ${this.owner.name}: ${revoked.message}`),
        };
      }
      return { kind: "retry", registered: true, reason: `revoked (${reason}): ${revoked.message}` };
    }
    const rejected = this.rejected;
    const code = rejected?.code ?? status.code;
    const details = rejected?.message ?? status.details;
    const field = rejected?.field ?? "";
    if (!this.registered && FATAL_BEFORE_REGISTERED.has(code)) {
      return { kind: "fatal", error: new RegistrationRejectedError(code, details, field) };
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
    };
  }

  private abortAll(why: string): void {
    for (const [id, work] of this.inFlight) {
      clearTimeout(work.timer);
      work.abort.abort(new SessionEndedError(why));
      this.inFlight.delete(id);
    }
  }

  /** Tracks one request: its deadline timer and abort, then runs it. */
  private dispatch(
    id: string,
    deadline: Timestamp | undefined,
    work: (w: { id: string; signal: AbortSignal; deadlineMs: number }) => Promise<void>,
  ): void {
    if (this.closed) {
      return;
    }
    const abort = new AbortController();
    const now = Date.now();
    const deadlineMs = deadline === undefined ? now + this.fallbackDeadlineMs : timestampMs(deadline);
    // Stop a little early for network latency and clock skew: 5% of the time left, at most 500 ms.
    const left = deadlineMs - now;
    const stopIn = Math.max(0, left - Math.min(Math.max(left, 0) * 0.05, 500));
    const timer = setTimeout(() => {
      if (this.inFlight.delete(id)) {
        abort.abort(new DeadlineExceededError(`request ${id} reached its deadline`));
        this.maybeDrained();
      }
    }, stopIn);
    this.inFlight.set(id, { abort, timer });
    void work({ id, signal: abort.signal, deadlineMs }).catch((err: unknown) => {
      this.log.error(`request ${id} failed outside its handler: ${describe(err)}`);
    });
  }

  /** Resolves with the handler's outcome, or with `undefined` once `signal` aborts. */
  private async guarded<R>(signal: AbortSignal, fn: () => Promise<R>): Promise<{ value: R } | { error: unknown } | undefined> {
    if (signal.aborted) {
      return undefined;
    }
    let onAbort: () => void = () => {};
    const aborted = new Promise<undefined>((resolve) => {
      onAbort = () => resolve(undefined);
      signal.addEventListener("abort", onAbort, { once: true });
    });
    const running = (async () => {
      try {
        return { value: await fn() };
      } catch (error) {
        return { error };
      }
    })();
    try {
      return await Promise.race([running, aborted]);
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }

  private context(
    id: string,
    key: { namespace: string; name: string } | undefined,
    attempt: number,
    signal: AbortSignal,
    deadlineMs: number,
    span: WorkSpan,
    parent: string,
  ): WorkContext {
    const k = { namespace: key?.namespace ?? "", name: key?.name ?? "" };
    return {
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
      log: this.log,
    };
  }

  private async reconcile(msg: RequestMessage, w: { id: string; signal: AbortSignal; deadlineMs: number }): Promise<void> {
    const { handlers, limiter } = this;
    if (handlers.mode !== "reconcile") {
      this.log.warn("ignoring a ReconcileRequest on an EVENTS-mode session", { id: w.id });
      return;
    }
    const release = await limiter.acquire();
    try {
      if (w.signal.aborted) {
        return;
      }
      const key = `${msg.key?.namespace ?? ""}/${msg.key?.name ?? ""}`;
      let object: T | undefined;
      let tombstone: { object: T; finalStateUnknown: boolean } | undefined;
      try {
        if (msg.object.case === "objectJson") {
          object = decode<T>(msg.object.value);
        } else if (msg.object.case === "tombstone") {
          tombstone = { object: decode<T>(msg.object.value.objectJson), finalStateUnknown: msg.object.value.finalStateUnknown };
        }
      } catch (err) {
        this.log.error(`undecodable object for ${key}: ${describe(err)}`);
        const [result, label] = failureOf(w.id, new TerminalError(`undecodable object: ${describe(err)}`));
        this.answer(w, result, label, undefined);
        return;
      }
      const span = startSpan(this.tracing, "reconcile", msg.traceparent, msg.tracestate, {
        "ctrlhub.controller": this.owner.name,
        "k8s.namespace.name": msg.key?.namespace ?? "",
        "k8s.object.name": msg.key?.name ?? "",
        "ctrlhub.attempt": msg.attempt,
        "ctrlhub.request.id": w.id,
      });
      const request: ReconcileRequest<T> = {
        ...this.context(w.id, msg.key, msg.attempt, w.signal, w.deadlineMs, span, msg.traceparent),
        reasons: msg.reasons.map((r) => (REASONS[r] as Reason | undefined) ?? "UNSPECIFIED"),
        object,
        tombstone,
      };
      const handler = handlers.handler;
      const outcome = await this.guarded(w.signal, () => span.run(async () => handler(request)));
      if (outcome === undefined) {
        this.abandoned(w, span, key);
        return;
      }
      const [result, label] = "value" in outcome ? resultOf(w.id, outcome.value) : failureOf(w.id, outcome.error);
      if ("error" in outcome) {
        this.log.debug(`reconcile of ${key} failed: ${describe(outcome.error)}`, { outcome: label });
      }
      this.answer(w, result, label, span);
    } finally {
      release();
    }
  }

  private async event(msg: EventMessage, w: { id: string; signal: AbortSignal; deadlineMs: number }): Promise<void> {
    const { handlers, limiter } = this;
    if (handlers.mode !== "events") {
      this.log.warn("ignoring an Event on a reconcile-mode session", { id: w.id });
      return;
    }
    const release = await limiter.acquire();
    try {
      if (w.signal.aborted) {
        return;
      }
      const key = `${msg.key?.namespace ?? ""}/${msg.key?.name ?? ""}`;
      const span = startSpan(this.tracing, "event", msg.traceparent, msg.tracestate, {
        "ctrlhub.controller": this.owner.name,
        "k8s.namespace.name": msg.key?.namespace ?? "",
        "k8s.object.name": msg.key?.name ?? "",
        "ctrlhub.attempt": msg.attempt,
        "ctrlhub.request.id": w.id,
      });
      let object: T;
      try {
        object = decode<T>(msg.objectJson);
      } catch (err) {
        // Nothing a retry can fix: acknowledge and move on.
        this.log.error(`undecodable event object for ${key}; acknowledging it: ${describe(err)}`);
        this.answerEvent(w, span, "terminal", describe(err));
        return;
      }
      const event: ObjectEvent<T> = {
        ...this.context(w.id, msg.key, msg.attempt, w.signal, w.deadlineMs, span, msg.traceparent),
        type: (EVENT_TYPES[msg.type] as EventType | undefined) ?? "UNSPECIFIED",
        object,
        sequence: msg.sequence,
      };
      const handler = handlers.handler;
      const outcome = await this.guarded(w.signal, () => span.run(async () => handler(event)));
      if (outcome === undefined) {
        this.abandoned(w, span, key);
        return;
      }
      if ("error" in outcome) {
        // Unacknowledged: the manager sends it again after its deadline.
        this.log.warn(`event handler for ${key} failed; the event is sent again after its deadline: ${describe(outcome.error)}`);
        span.end("error", describe(outcome.error));
        return;
      }
      this.answerEvent(w, span, "success");
    } finally {
      release();
    }
  }

  private abandoned(w: { id: string; signal: AbortSignal }, span: WorkSpan, key: string): void {
    const deadline = w.signal.reason instanceof DeadlineExceededError;
    span.end(deadline ? "deadline" : "lost", deadline ? "cancelled at its deadline" : "session ended before the result");
    if (deadline) {
      this.log.warn(`handler for ${key} aborted at its deadline; the manager re-delivers the key`, { id: w.id });
    } else {
      this.log.debug(`handler for ${key} abandoned: the session ended`, { id: w.id });
    }
  }

  private answer(
    w: { id: string; signal: AbortSignal },
    result: ReconcileResult,
    label: OutcomeLabel,
    span: WorkSpan | undefined,
  ): void {
    const work = this.inFlight.get(w.id);
    if (work === undefined || w.signal.aborted) {
      return; // late: never sent
    }
    clearTimeout(work.timer);
    this.inFlight.delete(w.id);
    const outcome = result.outcome;
    span?.end(
      label === "done" ? "success" : label === "requeue" ? "requeue_after" : label,
      outcome.case === "error" || outcome.case === "terminal" ? outcome.value.message : undefined,
    );
    this.sendResult(result);
    this.maybeDrained();
  }

  private sendResult(result: ReconcileResult): void {
    this.send({ case: "result", value: result });
  }

  private answerEvent(w: { id: string; signal: AbortSignal }, span: WorkSpan, outcome: string, error?: string): void {
    const work = this.inFlight.get(w.id);
    if (work === undefined || w.signal.aborted) {
      return;
    }
    clearTimeout(work.timer);
    this.inFlight.delete(w.id);
    span.end(outcome, error);
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

/** @internal Exposed for tests. */
export const _private = { toRegister };
