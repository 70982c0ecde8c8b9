/**
 * @internal The controller's Kubernetes client, on `@kubernetes/client-node` (1.x, a peer
 * dependency, so that the application and the SDK share one copy): the KubeConfig, the object
 * API the write helpers use, and the conversion of Kubernetes JSON into client-node's typed
 * objects (timestamps as `Date`), as client-node's own reads return them.
 *
 * @module
 */
import * as k8s from "@kubernetes/client-node";
// Not exported by the package's index (1.x): the serializer its own API classes use.
import { ObjectSerializer } from "@kubernetes/client-node/dist/gen/models/ObjectSerializer.js";

import { ConfigError } from "./errors.js";
import type { KubernetesObject } from "./resources.js";

/** API groups served by Kubernetes itself, whose kinds client-node has types for. */
const BUILTIN_GROUPS = new Set(["", "apps", "batch", "autoscaling", "policy"]);

/** The apiVersion's group (`""` for the core group). */
export function groupOf(apiVersion: string): string {
  const slash = apiVersion.indexOf("/");
  return slash < 0 ? "" : apiVersion.slice(0, slash);
}

/** client-node's model name of a built-in kind (`V1Deployment`), or undefined for any other kind. */
function modelOf(apiVersion: unknown, kind: unknown): string | undefined {
  if (typeof apiVersion !== "string" || typeof kind !== "string" || apiVersion === "" || kind === "") {
    return undefined;
  }
  const group = groupOf(apiVersion);
  if (!BUILTIN_GROUPS.has(group) && !group.endsWith(".k8s.io")) {
    return undefined; // a custom resource: never mistaken for a built-in of the same kind name
  }
  const version = apiVersion.slice(apiVersion.indexOf("/") + 1);
  return `${version.charAt(0).toUpperCase()}${version.slice(1)}${kind}`;
}

/**
 * Kubernetes JSON (parsed) as client-node types it: a built-in kind through client-node's
 * `ObjectSerializer` (timestamps become `Date`s), anything else as it is.
 */
export function typed<T>(value: unknown): T {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return value as T;
  }
  const o = value as { apiVersion?: unknown; kind?: unknown };
  const model = modelOf(o.apiVersion, o.kind);
  return (model === undefined ? value : ObjectSerializer.deserialize(value, model, "")) as T;
}

/** `obj` as JSON for the API server (the reverse of {@link typed}). */
function serialized(obj: KubernetesObject): string {
  const model = modelOf(obj.apiVersion, obj.kind);
  return JSON.stringify(model === undefined ? obj : ObjectSerializer.serialize(obj, model, ""));
}

/**
 * client-node's `KubernetesObjectApi` with the writes the helpers need: server-side apply, a
 * merge patch of the object or of its `status`, and create, each taking an `AbortSignal`.
 */
export class ObjectApi extends k8s.KubernetesObjectApi {
  /** A client for `kc`, in the context's default namespace. */
  static forConfig(kc: k8s.KubeConfig): ObjectApi {
    const api = kc.makeApiClient(ObjectApi);
    api.setDefaultNamespace(kc);
    return api;
  }

  /** Server-side apply (`application/apply-patch+yaml`; JSON is YAML) of the full object `obj`. */
  async applyObject<T extends KubernetesObject>(obj: T, fieldManager: string, force: boolean, signal?: AbortSignal): Promise<T> {
    const ctx = await this.context(obj, "patch", k8s.HttpMethod.PATCH, "", signal);
    ctx.setHeaderParam("Content-Type", k8s.PatchStrategy.ServerSideApply);
    ctx.setQueryParam("fieldManager", fieldManager);
    if (force) {
      ctx.setQueryParam("force", "true");
    }
    ctx.setBody(serialized(obj));
    return (await this.requestPromise(ctx)) as T;
  }

  /**
   * A JSON merge patch (`application/merge-patch+json`) of the object `obj` names (or of its
   * `subresource`), with `patch` as the body.
   */
  async mergePatchObject<T extends KubernetesObject>(
    obj: KubernetesObject,
    patch: Record<string, unknown>,
    subresource: "" | "status",
    signal?: AbortSignal,
  ): Promise<T> {
    const ctx = await this.context(obj, "patch", k8s.HttpMethod.PATCH, subresource, signal);
    ctx.setHeaderParam("Content-Type", k8s.PatchStrategy.MergePatch);
    const head = { apiVersion: obj.apiVersion, kind: obj.kind };
    ctx.setBody(serialized({ ...head, ...patch } as KubernetesObject));
    return (await this.requestPromise(ctx)) as T;
  }

  /** Creates `obj`. */
  async createObject<T extends KubernetesObject>(obj: T, signal?: AbortSignal): Promise<T> {
    const ctx = await this.context(obj, "create", k8s.HttpMethod.POST, "", signal);
    ctx.setHeaderParam("Content-Type", "application/json");
    ctx.setBody(serialized(obj));
    return (await this.requestPromise(ctx)) as T;
  }

  private async context(
    obj: KubernetesObject,
    action: "patch" | "create",
    method: k8s.HttpMethod,
    subresource: string,
    signal: AbortSignal | undefined,
  ): Promise<k8s.RequestContext> {
    const path = await this.specUriPath(obj as unknown as k8s.KubernetesObject, action);
    const ctx = this.configuration.baseServer.makeRequestContext(subresource === "" ? path : `${path}/${subresource}`, method);
    ctx.setHeaderParam("Accept", "application/json");
    if (signal !== undefined) {
      ctx.setSignal(signal);
    }
    return ctx;
  }
}

/**
 * The controller's Kubernetes client: `RunOptions.kubeConfig`, else client-node's
 * `loadFromDefault()` (KUBECONFIG, ~/.kube/config or the pod's ServiceAccount), loaded on first
 * use, so a controller that never writes never needs one.
 */
export class Kube {
  private kc: k8s.KubeConfig | undefined;
  private api: ObjectApi | undefined;

  constructor(given: k8s.KubeConfig | undefined) {
    this.kc = given;
  }

  /** The KubeConfig (loaded now if it was not given). */
  get config(): k8s.KubeConfig {
    if (this.kc === undefined) {
      const kc = new k8s.KubeConfig();
      try {
        kc.loadFromDefault();
      } catch (err) {
        throw new ConfigError(
          `loading the Kubernetes client configuration (KUBECONFIG, ~/.kube/config or the pod's ServiceAccount) failed: ` +
            `${err instanceof Error ? err.message : String(err)}; pass RunOptions.kubeConfig`,
        );
      }
      this.kc = kc;
    }
    return this.kc;
  }

  /** The object API on {@link Kube.config}. */
  get objects(): ObjectApi {
    this.api ??= ObjectApi.forConfig(this.config);
    return this.api;
  }
}
