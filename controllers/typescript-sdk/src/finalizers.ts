/**
 * Finalizers: {@link Finalizers} (a request's `req.finalizers`) adds one and runs the cleanup
 * it guards, with the controller's Kubernetes client; the functions say what to patch without
 * a client.
 *
 * @module
 */
import type { ObjectApi } from "./client.js";
import type { KubernetesObject } from "./resources.js";
import { identity, isNotFound } from "./write.js";

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
 * What the finalizer flow does with an object:
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

/**
 * A finalizer's two steps on the controller's Kubernetes client, for `req.finalizers`:
 *
 * ```ts
 * if (await req.finalizers.finalize(site, "example.com/cleanup", () => dropExternalState(site))) {
 *   return Action.done(); // cleaned up; the finalizer is gone, and with it the object
 * }
 * await req.finalizers.ensure(site, "example.com/cleanup"); // before creating external state
 * ```
 *
 * Both patch `metadata.finalizers` with a JSON merge patch guarded by the object's
 * `resourceVersion`: if the object changed meanwhile the API server answers 409 Conflict (a
 * concurrent writer's finalizer is never dropped), the call throws, and the reconcile is
 * retried with the new state.
 */
export class Finalizers {
  /** @internal */
  constructor(
    private readonly objects: () => ObjectApi,
    private readonly signal: AbortSignal | undefined,
  ) {}

  /**
   * Adds finalizer `name` to `obj` unless it is there, and reports whether it patched. An
   * object being deleted gets none (the API server refuses new finalizers then): `false`.
   * Updates `obj.metadata.finalizers` and `resourceVersion` in place to the stored ones.
   */
  async ensure(obj: KubernetesObject, name: string): Promise<boolean> {
    const patch = finalizerStep(obj, name) === "add" ? addFinalizerPatch(obj, name) : undefined;
    if (patch === undefined) {
      return false;
    }
    identity(obj);
    const stored = await this.objects().mergePatchObject(obj, patch, "", this.signal);
    const meta = (obj.metadata ??= {});
    meta.finalizers = stored.metadata?.finalizers ?? patch.metadata.finalizers;
    if (stored.metadata?.resourceVersion !== undefined) {
      meta.resourceVersion = stored.metadata.resourceVersion;
    }
    return true;
  }

  /**
   * When `obj` is being deleted and holds finalizer `name`: runs `cleanup(obj)` (it must be
   * idempotent: a failure after it retries it), then removes the finalizer, and reports `true`.
   * Otherwise does nothing and reports `false`. An object already gone when the finalizer is
   * removed counts as removed.
   */
  async finalize<T extends KubernetesObject>(obj: T, name: string, cleanup: (obj: T) => Promise<unknown> | unknown): Promise<boolean> {
    if (finalizerStep(obj, name) !== "cleanup") {
      return false;
    }
    identity(obj);
    await cleanup(obj);
    const patch = removeFinalizerPatch(obj, name);
    if (patch !== undefined) {
      try {
        await this.objects().mergePatchObject(obj, patch, "", this.signal);
      } catch (err) {
        if (!isNotFound(err)) {
          throw err;
        }
      }
    }
    return true;
  }
}
