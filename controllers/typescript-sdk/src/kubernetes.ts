/**
 * Finalizers applied through `@kubernetes/client-node` (an optional peer dependency):
 * `import { finalize } from "@ctrlhub/sdk/kubernetes"`. ctrlhub never proxies writes; your
 * controller writes with its own identity.
 *
 * @module
 */
import { ApiException, type KubernetesObjectApi, PatchStrategy } from "@kubernetes/client-node";

import type { Action } from "./action.js";
import { addFinalizerPatch, finalizerStep, removeFinalizerPatch } from "./finalizers.js";
import type { KubernetesObject } from "./resources.js";

/** The object's identity, as `KubernetesObjectApi` needs it in a patch body. */
function target(obj: KubernetesObject): { apiVersion: string; kind: string; metadata: { name: string; namespace?: string } } {
  const name = obj.metadata?.name;
  if (obj.apiVersion === undefined || obj.kind === undefined || name === undefined) {
    throw new TypeError("the object needs apiVersion, kind and metadata.name to be patched");
  }
  const metadata: { name: string; namespace?: string } = { name };
  if (obj.metadata?.namespace !== undefined) {
    metadata.namespace = obj.metadata.namespace;
  }
  return { apiVersion: obj.apiVersion, kind: obj.kind, metadata };
}

async function mergePatch<T extends KubernetesObject>(
  api: KubernetesObjectApi,
  obj: T,
  patch: { metadata: Record<string, unknown> },
): Promise<T> {
  const t = target(obj);
  const body = { ...t, metadata: { ...t.metadata, ...patch.metadata } };
  return (await api.patch(body, undefined, undefined, undefined, undefined, PatchStrategy.MergePatch)) as T;
}

/**
 * Adds finalizer `name` to `obj` unless present (a merge patch guarded by its
 * resourceVersion); returns the object as stored afterwards.
 */
export async function ensureFinalizer<T extends KubernetesObject>(api: KubernetesObjectApi, obj: T, name: string): Promise<T> {
  const patch = addFinalizerPatch(obj, name);
  return patch === undefined ? obj : mergePatch(api, obj, patch);
}

/**
 * Removes finalizer `name` from `obj` if present; returns the object as stored afterwards, or
 * `undefined` when it is gone (removing the last finalizer of a deleted object lets the API
 * server delete it).
 */
export async function removeFinalizer<T extends KubernetesObject>(
  api: KubernetesObjectApi,
  obj: T,
  name: string,
): Promise<T | undefined> {
  const patch = removeFinalizerPatch(obj, name);
  if (patch === undefined) {
    return obj;
  }
  try {
    return await mergePatch(api, obj, patch);
  } catch (err) {
    if (err instanceof ApiException && err.code === 404) {
      return undefined;
    }
    throw err;
  }
}

/** The two halves of {@link finalize}. */
export interface FinalizerHandlers<T> {
  /** The object is live and carries the finalizer: reconcile it. */
  apply(obj: T): Promise<Action | void> | Action | void;
  /** The object is being deleted: clean up external state (idempotently). */
  cleanup(obj: T): Promise<Action | void> | Action | void;
}

/**
 * Runs a reconcile under finalizer `name`, like kube-rs' `finalizer()`:
 * a live object gets the finalizer (then `apply`); a deleting object with the finalizer is
 * cleaned up and then released; a deleting object without it needs nothing. A conflict while
 * patching (the object changed meanwhile) throws, so the key is retried.
 *
 * @example
 * ```ts
 * const objects = KubernetesObjectApi.makeApiClient(kubeConfig);
 * .reconcile(async (req) => {
 *   if (!req.object) return Action.done();
 *   return finalize(objects, req.object, "example.com/cleanup", {
 *     apply: async (cm) => { ... },
 *     cleanup: async (cm) => { ... },
 *   });
 * })
 * ```
 */
export async function finalize<T extends KubernetesObject>(
  api: KubernetesObjectApi,
  obj: T,
  name: string,
  handlers: FinalizerHandlers<T>,
): Promise<Action | void> {
  switch (finalizerStep(obj, name)) {
    case "add":
      return handlers.apply(await ensureFinalizer(api, obj, name));
    case "apply":
      return handlers.apply(obj);
    case "cleanup": {
      const action = await handlers.cleanup(obj);
      await removeFinalizer(api, obj, name);
      return action;
    }
    case "none":
      return undefined;
  }
}
