/**
 * A controller's definition: the fluent {@link ControllerBuilder} and the `Register` message it
 * becomes.
 *
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

import { MAX_BATCH } from "./batches.js";
import { Controller } from "./controller.js";
import { ConfigError } from "./errors.js";
import { type Register, RegisterSchema, Register_Mode, type WatchedResource } from "./gen/ctrlhub/v1/registration_pb.js";
import type { EventHandler, ReconcileHandler } from "./options.js";
import {
  type KubernetesObject,
  type Mapping,
  Predicate,
  type ResourceKind,
  type Selector,
  labelSelector,
  resourceType,
} from "./resources.js";

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const MAX_U64 = 2n ** 64n - 1n;

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

/** Options of an owned kind ({@link ControllerBuilder.owns}). */
export interface OwnsOptions {
  /**
   * Follow only the owner reference with `controller: true` (controller-runtime's `Owns()`).
   * Default `true`.
   */
  readonly controllerOnly?: boolean;
  /** Only changes passing it queue the owner. */
  readonly predicate?: Predicate;
  /**
   * Cache only the kind's metadata (a fraction of the memory; no spec or status). It takes
   * effect only when every `owns`/`watches` entry of the kind asks for it; then reads of the
   * kind go through {@link CachedReader.getMetadata}. Default `false`: children are cached,
   * and readable through {@link CachedReader.get}, in full.
   */
  readonly metadataOnly?: boolean;
}

/** Options of a watched kind ({@link ControllerBuilder.watches}). */
export interface WatchesOptions {
  /** Only changes passing it queue a key. */
  readonly predicate?: Predicate;
  /** Cache only the kind's metadata; see {@link OwnsOptions.metadataOnly}. Default `false`. */
  readonly metadataOnly?: boolean;
}

interface Definition {
  name: string;
  primary?: ResourceKind<unknown>;
  owns: Array<{ kind: ResourceKind<unknown>; controllerOnly: boolean; predicate?: Predicate; metadataOnly: boolean }>;
  watches: Array<{ kind: ResourceKind<unknown>; mapping: Mapping; predicate?: Predicate; metadataOnly: boolean }>;
  namespaces?: { all: true } | { names: string[] } | { selector: Selector };
  labels?: Selector;
  predicate?: Predicate;
  concurrency: number;
  maxConcurrentReconciles?: number;
  deadlineMs?: number;
  resyncMs?: number;
  backoff?: { baseMs: number; maxMs: number };
  includeObject: boolean;
  revision?: bigint;
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
   * `ownerReferences`; only the `controller: true` one unless `controllerOnly` is false). The
   * children are cached in full, so their status is readable through
   * {@link CachedReader.get}, unless `metadataOnly` says otherwise.
   */
  owns(kind: ResourceKind<unknown>, options: OwnsOptions = {}): this {
    const owned: Definition["owns"][number] = {
      kind,
      controllerOnly: options.controllerOnly ?? true,
      metadataOnly: options.metadataOnly ?? false,
    };
    if (options.predicate !== undefined) {
      owned.predicate = options.predicate;
    }
    this.def.owns.push(owned);
    return this;
  }

  /** Another type whose objects name the primary they concern by `mapping`. */
  watches(kind: ResourceKind<unknown>, mapping: Mapping, options: WatchesOptions = {}): this {
    const watched: Definition["watches"][number] = { kind, mapping, metadataOnly: options.metadataOnly ?? false };
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

  /**
   * The revision of this definition, for rolling upgrades: a registration with a higher
   * revision replaces a running one with a different definition at once; a lower or equal
   * one waits until the running definition's replicas are gone. Default: the environment
   * variable `CTRLHUB_REVISION`, else 0. See the README's "Rolling upgrades".
   */
  revision(n: number | bigint): this {
    const value = typeof n === "bigint" ? n : Number.isSafeInteger(n) ? BigInt(n) : -1n;
    if (value < 0n || value > MAX_U64) {
      throw new ConfigError(`revision must be a non-negative integer below 2^64, not ${String(n)}`);
    }
    this.def.revision = value;
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

/** `Register.revision`: the option, else `CTRLHUB_REVISION`, else 0. */
function revisionOf(d: Definition, env: NodeJS.ProcessEnv): bigint {
  if (d.revision !== undefined) {
    return d.revision;
  }
  const raw = env["CTRLHUB_REVISION"]?.trim() ?? "";
  if (raw === "") {
    return 0n;
  }
  const value = /^\d+$/.test(raw) ? BigInt(raw) : -1n;
  if (value < 0n || value > MAX_U64) {
    throw new ConfigError(
      `CTRLHUB_REVISION must be a non-negative integer below 2^64 (the revision of this controller's definition), ` +
        `not ${JSON.stringify(env["CTRLHUB_REVISION"])}`,
    );
  }
  return value;
}

function toRegister(d: Definition, mode: Register_Mode, env: NodeJS.ProcessEnv = process.env): Register {
  const r = create(RegisterSchema, {
    controllerName: d.name,
    mode,
    primary: resourceType(d.primary as ResourceKind<unknown>),
    owns: d.owns.map((o) => ({
      resource: resourceType(o.kind),
      controllerOnly: o.controllerOnly,
      metadataOnly: o.metadataOnly,
      ...(o.predicate === undefined ? {} : { predicate: o.predicate.message }),
    })),
    watches: d.watches.map((w) => ({
      resource: resourceType(w.kind),
      mapping: mappingOf(w.mapping),
      metadataOnly: w.metadataOnly,
      ...(w.predicate === undefined ? {} : { predicate: w.predicate.message }),
    })),
    maxConcurrentReconciles: d.maxConcurrentReconciles ?? 0,
    maxInFlight: d.concurrency,
    includeObject: d.includeObject,
    revision: revisionOf(d, env),
    // Exclusive attempts for reconciles: no two attempts of a key ever run at once. EVENTS
    // mode keeps the older rule, because an event whose handler failed has no negative
    // acknowledgement: an exclusive session would hold it until the session ends.
    exclusiveAttempts: mode === Register_Mode.RECONCILE,
    // Batches both ways (docs/protocol.md, "Batches"): the manager echoes what it applies.
    maxBatch: MAX_BATCH,
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

/** @internal Exposed for tests. */
export const _private = { toRegister };
