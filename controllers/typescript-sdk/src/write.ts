/**
 * Writes to the Kubernetes API with the controller's own client: {@link adopt} a child,
 * server-side apply it, patch a status (through the request: `req.apply`, `req.patchStatus`),
 * and tell a NotFound ({@link isNotFound}) or a Conflict ({@link isConflict}) from any other
 * failure, whatever error type the client threw. ctrlhub never proxies writes.
 *
 * @module
 */
import * as k8s from "@kubernetes/client-node";

import { groupOf } from "./client.js";
import type { KubernetesObject, OwnerReference } from "./resources.js";

/** Why a write helper refused an object ({@link WriteError.reason}). */
export type WriteErrorReason =
  /** The object has no `apiVersion` or `kind`. */
  | "MissingKind"
  /** The object has no `metadata.name`. */
  | "MissingName"
  /** The owner has no `metadata.uid`: it was never stored by the API server. */
  | "OwnerWithoutUid"
  /** The owner is in another namespace than the child: owner references never cross namespaces. */
  | "OwnerInAnotherNamespace"
  /** A namespaced owner of a cluster-scoped child. */
  | "ClusterScopedChild";

/** A write helper refused its input; nothing was sent. */
export class WriteError extends Error {
  override readonly name = "WriteError";
  /** What is wrong. */
  readonly reason: WriteErrorReason;

  /** @internal */
  constructor(reason: WriteErrorReason, message: string) {
    super(message);
    this.reason = reason;
  }
}

/**
 * Built-in kinds that are cluster-scoped (group/kind): a namespaced owner cannot own them.
 * A custom cluster-scoped child says so with `metadata.namespace: ""`.
 */
const CLUSTER_SCOPED = new Set([
  "/Namespace",
  "/Node",
  "/PersistentVolume",
  "rbac.authorization.k8s.io/ClusterRole",
  "rbac.authorization.k8s.io/ClusterRoleBinding",
  "apiextensions.k8s.io/CustomResourceDefinition",
  "storage.k8s.io/StorageClass",
  "storage.k8s.io/CSIDriver",
  "storage.k8s.io/VolumeAttachment",
  "scheduling.k8s.io/PriorityClass",
  "admissionregistration.k8s.io/MutatingWebhookConfiguration",
  "admissionregistration.k8s.io/ValidatingWebhookConfiguration",
  "networking.k8s.io/IngressClass",
]);

function describeObject(obj: KubernetesObject): string {
  return `${obj.kind ?? "object"}/${obj.metadata?.name ?? "<unnamed>"}`;
}

/** @internal `apiVersion`, `kind` and `metadata.name` of `obj`, or a {@link WriteError}. */
export function identity(obj: KubernetesObject, role = "the object"): { apiVersion: string; kind: string; name: string } {
  const { apiVersion, kind } = obj;
  if (typeof apiVersion !== "string" || apiVersion === "" || typeof kind !== "string" || kind === "") {
    throw new WriteError("MissingKind", `${role} ${describeObject(obj)} needs apiVersion and kind`);
  }
  const name = obj.metadata?.name;
  if (typeof name !== "string" || name === "") {
    throw new WriteError("MissingName", `${role} (${kind}) needs metadata.name`);
  }
  return { apiVersion, kind, name };
}

/**
 * Makes `owner` the controller of `child` (kopf's `adopt`, controller-runtime's
 * `SetControllerReference`): an entry of `metadata.ownerReferences` with `controller: true`
 * and `blockOwnerDeletion: true` (apiVersion, kind, name and uid from the owner), replacing an
 * earlier reference to the same owner and any other controller reference (an object has one
 * controller). A child without `metadata.namespace` gets the owner's; `namespace: ""` marks a
 * cluster-scoped child of a custom kind (built-in cluster-scoped kinds are known).
 *
 * Changes `child` in place and returns it, so that `req.apply(req.adopt({...}, owner))` reads
 * in one line. The Kubernetes garbage collector then deletes the child with its owner.
 *
 * @throws {@link WriteError} for an owner in another namespace than the child, a namespaced
 *   owner of a cluster-scoped child, or an owner without apiVersion, kind, name or uid.
 */
export function adopt<C extends KubernetesObject>(child: C, owner: KubernetesObject): C {
  const o = identity(owner, "the owner");
  const uid = owner.metadata?.uid;
  if (typeof uid !== "string" || uid === "") {
    throw new WriteError("OwnerWithoutUid", `the owner ${o.kind}/${o.name} has no metadata.uid (read it from the API server first)`);
  }
  const ownerNamespace = owner.metadata?.namespace ?? "";
  const childKind = `${groupOf(child.apiVersion ?? "")}/${child.kind ?? ""}`;
  const meta = (child.metadata ??= {});
  const clusterScoped = CLUSTER_SCOPED.has(childKind) || meta.namespace === "";
  if (ownerNamespace !== "") {
    if (clusterScoped) {
      throw new WriteError(
        "ClusterScopedChild",
        `the owner ${o.kind}/${o.name} is namespaced but ${describeObject(child)} is cluster-scoped: ` +
          "a cluster-scoped object can only have cluster-scoped owners",
      );
    }
    if (meta.namespace === undefined) {
      meta.namespace = ownerNamespace;
    } else if (meta.namespace !== ownerNamespace) {
      throw new WriteError(
        "OwnerInAnotherNamespace",
        `the owner ${o.kind}/${o.name} is in namespace ${JSON.stringify(ownerNamespace)} but ${describeObject(child)} is in ` +
          `${JSON.stringify(meta.namespace)}: an owner must be in its child's namespace (or cluster-scoped)`,
      );
    }
  }
  const reference: OwnerReference = {
    apiVersion: o.apiVersion,
    kind: o.kind,
    name: o.name,
    uid,
    controller: true,
    blockOwnerDeletion: true,
  };
  meta.ownerReferences = [...(meta.ownerReferences ?? []).filter((r) => r.uid !== uid && r.controller !== true), reference];
  return child;
}

/** How {@link WorkContext.apply} applies. */
export interface ApplyOptions {
  /**
   * The field manager: the fields this apply sets are owned by it, and fields it set before
   * but leaves out now are removed. Default: the controller's name.
   */
  readonly fieldManager?: string;
  /** Take fields over from other managers on conflict. Default `true` (a controller owns its children). */
  readonly force?: boolean;
  /** Cancels the request. Default: the request's {@link WorkContext.signal}. */
  readonly signal?: AbortSignal;
}

/**
 * The HTTP status of a Kubernetes API error: client-node's `ApiException` (1.x, `code`), the
 * `statusCode` of older clients and of HTTP errors, a `Status` object (`body.code`), also
 * found through `cause`. `undefined` for anything else (a gRPC `ReadError`'s code is not an
 * HTTP status).
 */
export function apiStatus(err: unknown): number | undefined {
  let e: unknown = err;
  for (let depth = 0; depth < 8 && typeof e === "object" && e !== null; depth++) {
    if (e instanceof k8s.ApiException) {
      return e.code;
    }
    const o = e as { code?: unknown; statusCode?: unknown; kind?: unknown; response?: { statusCode?: unknown }; body?: unknown; cause?: unknown };
    for (const candidate of [o.statusCode, o.response?.statusCode, o.code]) {
      if (typeof candidate === "number" && candidate >= 100 && candidate < 600 && Number.isInteger(candidate)) {
        return candidate;
      }
    }
    const body = typeof o.body === "string" ? parseStatus(o.body) : o.body;
    if (typeof body === "object" && body !== null && (body as { kind?: unknown }).kind === "Status") {
      const code = (body as { code?: unknown }).code;
      if (typeof code === "number") {
        return code;
      }
    }
    e = o.cause;
  }
  return undefined;
}

function parseStatus(body: string): unknown {
  try {
    return JSON.parse(body) as unknown;
  } catch {
    return undefined;
  }
}

/**
 * Whether `err` is a Kubernetes API NotFound (HTTP 404), whatever client threw it: e.g.
 * `if (isNotFound(err)) return Action.done()` after a read of something already gone.
 */
export function isNotFound(err: unknown): boolean {
  return apiStatus(err) === 404;
}

/**
 * Whether `err` is a Kubernetes API Conflict (HTTP 409): a stale `resourceVersion`, an object
 * that already exists, or an apply conflict without `force`. Retrying the reconcile (throw it
 * on) reads the object anew.
 */
export function isConflict(err: unknown): boolean {
  return apiStatus(err) === 409;
}

/**
 * client-node (1.x) call options that cancel the request when `signal` aborts, e.g. a
 * handler's `req.signal`, on top of `options` (such as `setHeaderOptions(...)`'s):
 *
 * ```ts
 * const core = req.kubeConfig.makeApiClient(k8s.CoreV1Api);
 * await core.readNamespacedConfigMap({ name, namespace }, withSignal(req.signal));
 * ```
 */
export function withSignal(signal: AbortSignal, options?: k8s.ConfigurationOptions): k8s.ConfigurationOptions {
  const middleware: k8s.ObservableMiddleware = {
    pre: (request) => {
      request.setSignal(signal);
      return new k8s.Observable(Promise.resolve(request));
    },
    post: (response) => new k8s.Observable(Promise.resolve(response)),
  };
  return { ...options, middleware: [...(options?.middleware ?? []), middleware], middlewareMergeStrategy: "append" };
}
