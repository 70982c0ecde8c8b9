/**
 * Finalizers without a Kubernetes client: what to patch, and the steps of the finalizer
 * flow. `finalize` in `@ctrlhub/sdk/kubernetes` applies them with `@kubernetes/client-node`.
 *
 * @module
 */
import type { KubernetesObject } from "./resources.js";

/** Whether `obj` carries finalizer `name`. */
export function hasFinalizer(obj: KubernetesObject, name: string): boolean {
  return obj.metadata?.finalizers?.includes(name) ?? false;
}

/** Whether `obj` is being deleted (`metadata.deletionTimestamp` set). */
export function isDeleting(obj: KubernetesObject): boolean {
  const t = obj.metadata?.deletionTimestamp;
  return t !== undefined && t !== null && t !== "";
}

/**
 * A JSON merge patch setting `metadata.finalizers` to `finalizers`, guarded by `obj`'s
 * resourceVersion: the API server answers 409 Conflict if the object changed meanwhile, so a
 * concurrent writer's finalizer is never dropped.
 */
export function finalizersPatch(obj: KubernetesObject, finalizers: readonly string[]): {
  metadata: { finalizers: string[]; resourceVersion?: string };
} {
  const metadata: { finalizers: string[]; resourceVersion?: string } = { finalizers: [...finalizers] };
  const rv = obj.metadata?.resourceVersion;
  if (rv !== undefined && rv !== "") {
    metadata.resourceVersion = rv;
  }
  return { metadata };
}

/**
 * The merge patch adding `name` to `obj`'s finalizers, or `undefined` when it is there.
 */
export function addFinalizerPatch(obj: KubernetesObject, name: string): ReturnType<typeof finalizersPatch> | undefined {
  return hasFinalizer(obj, name) ? undefined : finalizersPatch(obj, [...(obj.metadata?.finalizers ?? []), name]);
}

/**
 * The merge patch removing `name` from `obj`'s finalizers, or `undefined` when it is absent.
 */
export function removeFinalizerPatch(obj: KubernetesObject, name: string): ReturnType<typeof finalizersPatch> | undefined {
  return hasFinalizer(obj, name)
    ? finalizersPatch(obj, (obj.metadata?.finalizers ?? []).filter((f) => f !== name))
    : undefined;
}

/**
 * What the finalizer flow (`finalize` of `@ctrlhub/sdk/kubernetes`) does with an object:
 * - `add`: live, without the finalizer: add it, then apply;
 * - `apply`: live, with it: reconcile;
 * - `cleanup`: being deleted, with it: clean up, then remove it;
 * - `none`: being deleted without it: nothing to do.
 */
export type FinalizerStep = "add" | "apply" | "cleanup" | "none";

/** The {@link FinalizerStep} for `obj` and finalizer `name`. */
export function finalizerStep(obj: KubernetesObject, name: string): FinalizerStep {
  const has = hasFinalizer(obj, name);
  if (isDeleting(obj)) {
    return has ? "cleanup" : "none";
  }
  return has ? "apply" : "add";
}
