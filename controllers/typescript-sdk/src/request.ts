import type { KubeConfig } from "@kubernetes/client-node";

import type { EventRecorder } from "./events.js";
import type { Finalizers } from "./finalizers.js";
import type { Logger } from "./logs.js";
import type { CachedReader } from "./reader.js";
import type { KubernetesObject } from "./resources.js";
import type { ApplyOptions } from "./write.js";

/** A primary object's namespace and name. The namespace is `""` for cluster-scoped types. */
export interface ObjectKey {
  readonly namespace: string;
  readonly name: string;
}

/**
 * Why a key was queued (informational: reconcile the current state whatever they say).
 * `UNSPECIFIED` stands for a reason newer than this SDK.
 */
export type Reason =
  | "CREATED"
  | "UPDATED"
  | "DELETED"
  | "OWNED_CHANGED"
  | "WATCHED_CHANGED"
  | "RESYNC"
  | "REQUEUE"
  | "RETRY"
  | "REDELIVERY"
  | "INITIAL_LIST"
  | "LEFT_SCOPE"
  | "UNSPECIFIED";

/**
 * An object the manager saw go: deleted, or out of the label selector. Only a tombstone means
 * a deletion; a request without an object means the cache does not hold it (NotFound).
 */
export interface Tombstone<T> {
  /** Its last known state; `undefined` when the manager sent none (empty or undecodable JSON). */
  readonly object: T | undefined;
  /** The manager did not see the deletion itself (a relist found the object missing). */
  readonly finalStateUnknown: boolean;
}

/** What every unit of work carries: its deadline, cancellation, reads and trace. */
export interface WorkContext {
  /** Opaque request id (for logs). */
  readonly id: string;
  /** The object's key. */
  readonly key: ObjectKey;
  /** `key.namespace`. */
  readonly namespace: string;
  /** `key.name`. */
  readonly name: string;
  /** 1 on a first attempt; counts consecutive attempts without success. */
  readonly attempt: number;
  /**
   * When the manager stops waiting (its clock). The SDK aborts {@link WorkContext.signal} a
   * little earlier; what the handler returns afterwards is not taken as its outcome.
   */
  readonly deadline: Date;
  /**
   * Aborts when the work must stop: near its deadline ({@link DeadlineExceededError}), or when
   * the session that delivered it ended or lost the manager ({@link SessionEndedError}). Pass
   * it to everything that takes one: `fetch`, timers, and `@kubernetes/client-node` calls through
   * {@link withSignal} (the SDK's own helpers, `apply`, `patchStatus` and `finalizers`, pass it
   * themselves). After
   * it aborts, what the handler returns is not its outcome: at its deadline the SDK reports an
   * error once the handler's promise has settled (the manager keeps the key until then); when
   * the session ended, nothing. A handler still running at 80 % of `Registered.hold` after
   * its session lost the manager ends the process (exit status 70).
   */
  readonly signal: AbortSignal;
  /** Cached Get/List through the session that delivered this work. */
  readonly reader: CachedReader;
  /** The session that delivered this work. */
  readonly sessionId: string;
  /**
   * W3C `traceparent` of this work's span (a child of the manager's dispatch span); send it
   * onwards to continue the trace. `""` when the manager sent none.
   */
  readonly traceparent: string;
  /** W3C `tracestate` accompanying {@link WorkContext.traceparent}. */
  readonly tracestate: string;
  /** The manager's `traceparent`, exactly as received. */
  readonly parentTraceparent: string;
  /**
   * The controller's logger for this work: every line carries its `key` and `request_id`
   * (and, in JSON, its `attempt`, `controller`, `session_id`, `trace_id` and `span_id`).
   */
  readonly log: Logger;
  /**
   * The controller's Kubernetes client configuration (`RunOptions.kubeConfig`, else
   * client-node's `loadFromDefault()`), for client-node APIs of your own:
   * `req.kubeConfig.makeApiClient(k8s.CoreV1Api)`.
   */
  readonly kubeConfig: KubeConfig;
  /** Kubernetes Events about objects, aggregated and rate-limited: see {@link EventRecorder}. */
  readonly events: EventRecorder;
  /** Finalizer steps on the controller's client: see {@link Finalizers}. */
  readonly finalizers: Finalizers;
  /**
   * Makes `owner` the controller of `child` (an owner reference with `controller: true`),
   * giving it the owner's namespace when it has none, and returns `child`: see {@link adopt}.
   *
   * @throws {@link WriteError} for an owner in another namespace or a namespaced owner of a
   *   cluster-scoped child.
   */
  adopt<C extends KubernetesObject>(child: C, owner: KubernetesObject): C;
  /**
   * Server-side applies the full object `obj` (`apiVersion`, `kind`, `metadata.name` and what
   * you want set) with the controller's name as field manager and `force`, and returns the
   * object as the API server stored it: creates it, or puts back fields someone else changed,
   * and removes fields an earlier apply set but this one leaves out. Built-in kinds and custom
   * resources alike.
   */
  apply<C extends KubernetesObject>(obj: C, options?: ApplyOptions): Promise<C>;
  /**
   * Merge-patches the `status` subresource of the object `obj` names with `status` (a `null`
   * removes a field) and returns the updated object. Custom resources (with a status
   * subresource) and built-ins alike.
   */
  patchStatus<C extends KubernetesObject>(obj: C, status: StatusPatch<C>): Promise<C>;
}

/** The `status` of a merge patch of `C`'s status: any of its fields, `null` to remove one. */
export type StatusPatch<C> = C extends { status?: infer S }
  ? NonNullable<S> extends object
    ? { [K in keyof NonNullable<S>]?: NonNullable<S>[K] | null }
    : Record<string, unknown>
  : Record<string, unknown>;

/**
 * One reconcile request (MODE_RECONCILE): make the world match the current state of the
 * object named by {@link WorkContext.key}.
 *
 * @typeParam T the primary type's objects
 */
export interface ReconcileRequest<T> extends WorkContext {
  /** Every reason collapsed into this request, in the order received. */
  readonly reasons: readonly Reason[];
  /**
   * The object as of dispatch, with `includeObject()`. `undefined` without `includeObject()`,
   * when it is gone ({@link ReconcileRequest.tombstone} is set), or when the cache does not
   * hold it and the manager saw no deletion: treat that as NotFound, not as a deletion (clean
   * up external state on the object's finalizer, never because a request lacks an object).
   */
  readonly object: T | undefined;
  /**
   * With `includeObject()`: set when the manager saw the object's deletion (or its leaving the
   * label selector), with its last known state.
   */
  readonly tombstone: Tombstone<T> | undefined;
}

/** What happened to an object, in MODE_EVENTS. `UNSPECIFIED` stands for a type newer than this SDK. */
export type EventType = "ADDED" | "MODIFIED" | "DELETED" | "SYNC" | "UNSPECIFIED";

/**
 * One change to an object (MODE_EVENTS), delivered in order per key and at least once. The
 * SDK acknowledges it when the handler resolves; a handler that throws leaves it
 * unacknowledged, so the manager sends it again (`attempt` + 1) after its deadline.
 *
 * @typeParam T the primary type's objects
 */
export interface ObjectEvent<T> extends WorkContext {
  /** What happened. `SYNC`: the object exists in this state; changes before it may have been missed. */
  readonly type: EventType;
  /** The object; its last known state for `DELETED`. */
  readonly object: T;
  /** The event's position in its key's history (comparable within one leader term). */
  readonly sequence: bigint;
}
