import type { KubeConfig } from "@kubernetes/client-node";

import type { Action } from "./action.js";
import type { ConnectionOptions } from "./config.js";
import type { Register } from "./gen/ctrlhub/v1/registration_pb.js";
import type { HealthOptions } from "./health.js";
import type { Logger } from "./logs.js";
import type { ObjectEvent, ReconcileRequest } from "./request.js";

/**
 * A reconcile handler: make the world match the object named by the request, then return
 * {@link Action.done} (or nothing), {@link Action.requeueAfter}, or throw
 * ({@link RetryError}, {@link TerminalError}, any error).
 */
export type ReconcileHandler<T> = (request: ReconcileRequest<T>) => Promise<Action | void> | Action | void;

/** An EVENTS-mode handler; the event is acknowledged when it resolves. */
export type EventHandler<T> = (event: ObjectEvent<T>) => Promise<void> | void;

/** A kind the session may read through {@link CachedReader}, and the form it is cached in. */
export interface ReadableKind {
  /** API group; `""` for the core group. */
  readonly group: string;
  /** Version within the group. */
  readonly version: string;
  /** Kind, e.g. `Deployment`. */
  readonly kind: string;
  /** Plural resource name, as discovery reported it. */
  readonly plural: string;
  /**
   * Cached metadata only (every `owns`/`watches` entry of the kind asked for it): read it with
   * {@link CachedReader.getMetadata}. Otherwise it is cached, and read, in full.
   */
  readonly metadataOnly: boolean;
}

/** What the manager answered to a registration; passed to {@link RunOptions.onRegistered}. */
export interface RegisteredInfo {
  /** This session's id (it changes on every reconnect); quote it when reporting problems. */
  readonly sessionId: string;
  /** The manager replica serving the session. */
  readonly leaderIdentity: string;
  /** The registration as the manager applies it, every default filled in. */
  readonly effective: Register | undefined;
  /** Every kind the session may read (primary, owned, watched), each once, with its form. */
  readonly readable: readonly ReadableKind[];
  /** The definition's revision this replica registered with (`Register.revision`). */
  readonly revision: bigint;
  /**
   * `Registered.hold` in milliseconds: every handler of the session stops within it of the last
   * heartbeat the manager answered. `undefined` without exclusive attempts (EVENTS mode).
   */
  readonly holdMs: number | undefined;
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
  /**
   * Where to log. Default {@link consoleLogger} with `CTRLHUB_LOG` (level) and
   * `CTRLHUB_LOG_FORMAT` (`text` or `json`).
   */
  readonly logger?: Logger;
  /**
   * The Kubernetes client configuration the write helpers (`req.apply`, `req.patchStatus`,
   * `req.finalizers`), the Events recorder and `req.kubeConfig` use: the controller's own
   * identity. Default: client-node's `loadFromDefault()` (KUBECONFIG, ~/.kube/config, or the
   * pod's ServiceAccount), loaded on first use.
   */
  readonly kubeConfig?: KubeConfig;
  /**
   * The HTTP health endpoint (`/healthz`, `/readyz`) for kubelet probes: an address, or
   * {@link HealthOptions}; `false` turns it off. Default: env `CTRLHUB_HEALTH_ADDR`, else off.
   */
  readonly health?: string | HealthOptions | false;
  /**
   * Reconnect backoff: first delay (before jitter) and cap. Default 100 ms doubling to 10 s. A
   * ring member's redirect to the controller's owner is followed without it (and is not counted
   * as a failure), up to 3 in a row.
   */
  readonly reconnect?: { readonly initialMs?: number; readonly maxMs?: number };
  /**
   * After Drain, once nothing is in flight, how long to wait for the manager to end the
   * stream before closing it. Default 10 s.
   */
  readonly drainGraceMs?: number;
  /**
   * After a stop (SIGTERM, {@link Controller.stop}), how long {@link Controller.run} waits for
   * running handlers (the drained session's, and any of earlier sessions still settling) before
   * it rejects. Default 25 s: keep it below the pod's `terminationGracePeriodSeconds` (30 s by
   * default) so the log says which handlers did not end.
   */
  readonly stopGraceMs?: number;
  /**
   * How long a replica waits before registering again when a newer definition of the
   * controller runs (Revoked SUPERSEDED, Rejected `outdated`) or another identity holds its
   * name (ALREADY_EXISTS). Default 30 s.
   */
  readonly outdatedRetryMs?: number;
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
