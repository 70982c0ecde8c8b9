import { type MessageInitShape, create } from "@bufbuild/protobuf";
import type {
  EventsV1Event,
  V1ClusterRole,
  V1ClusterRoleBinding,
  V1ConfigMap,
  V1CronJob,
  V1CustomResourceDefinition,
  V1DaemonSet,
  V1Deployment,
  V1EndpointSlice,
  V1Ingress,
  V1Job,
  V1Lease,
  V1Namespace,
  V1NetworkPolicy,
  V1Node,
  V1PersistentVolume,
  V1PersistentVolumeClaim,
  V1Pod,
  V1PodDisruptionBudget,
  V1ReplicaSet,
  V1Role,
  V1RoleBinding,
  V1Secret,
  V1Service,
  V1ServiceAccount,
  V1StatefulSet,
  V1StorageClass,
  V2HorizontalPodAutoscaler,
} from "@kubernetes/client-node";

import {
  type LabelSelector,
  LabelSelectorRequirement_Operator,
  LabelSelectorSchema,
  type ResourceType,
  ResourceTypeSchema,
} from "./gen/ctrlhub/v1/resource_pb.js";
import { type Predicate as PredicateMessage, PredicateSchema } from "./gen/ctrlhub/v1/registration_pb.js";
import { ConfigError } from "./errors.js";

/** One entry of `metadata.ownerReferences`. */
export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

/** The metadata every Kubernetes object has, as far as the SDK looks at it. */
export interface ObjectMeta {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: Date | string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: OwnerReference[];
  deletionTimestamp?: Date | string;
}

/**
 * An object of a kind the manager caches metadata only (`owns(kind, { metadataOnly: true })`,
 * or `watches` likewise): a `PartialObjectMetadata`, its metadata without spec, status or
 * data. As controller-runtime's, its `apiVersion` and `kind` name the object's own kind.
 * {@link CachedReader.getMetadata} and {@link CachedReader.listMetadata} return it.
 */
export interface PartialObjectMetadata {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
}

/** Any Kubernetes object (`@kubernetes/client-node`'s `KubernetesObject` fits). */
export interface KubernetesObject {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
}

/**
 * A Kubernetes type, named as a manifest names it, and the TypeScript type of its objects
 * (`T`, only for the compiler). Make one with {@link kind}, or use {@link kinds}.
 */
export interface ResourceKind<T = KubernetesObject> {
  /** API group; `""` for the core group (`v1` objects such as ConfigMap). */
  readonly group: string;
  /** Version within the group, e.g. `v1`. */
  readonly version: string;
  /** Kind in PascalCase, e.g. `Deployment`. */
  readonly kind: string;
  /** Plural resource name; leave unset and the manager asks discovery. */
  readonly plural?: string;
  /**
   * @internal Carries `T` for type inference; never set. A method type, so that
   * `controller(..).for<V1ConfigMap>(kinds.ConfigMap)` can narrow a generic kind.
   */
  readonly __object?: { bivariant(object: T): void }["bivariant"];
}

/**
 * A Kubernetes type from its `apiVersion` and `kind`, as in a manifest.
 *
 * @example
 * ```ts
 * import type { V1Deployment } from "@kubernetes/client-node";
 * const Deployment = kind<V1Deployment>("apps/v1", "Deployment");
 * const Widget = kind<Widget>("example.com/v1", "Widget", "widgets");
 * ```
 */
export function kind<T = KubernetesObject>(apiVersion: string, kindName: string, plural?: string): ResourceKind<T> {
  const parts = apiVersion.split("/");
  if (parts.length > 2 || parts.some((p) => p === "")) {
    throw new ConfigError(`invalid apiVersion ${JSON.stringify(apiVersion)}: expected "v1" or "group/version"`);
  }
  if (!/^[A-Z][A-Za-z0-9]*$/.test(kindName)) {
    throw new ConfigError(`invalid kind ${JSON.stringify(kindName)}: expected PascalCase, e.g. "ConfigMap"`);
  }
  const [group, version] = parts.length === 2 ? (parts as [string, string]) : ["", parts[0] as string];
  return plural === undefined ? { group, version, kind: kindName } : { group, version, kind: kindName, plural };
}

/**
 * The built-in kinds, typed with `@kubernetes/client-node`'s models: `kinds.Deployment` is a
 * `ResourceKind<V1Deployment>`, so `.for(kinds.ConfigMap)` makes `req.object` a
 * `V1ConfigMap` and `req.reader.get(kinds.Deployment, ...)` returns a `V1Deployment`. Objects
 * of built-in kinds arrive as client-node returns them (timestamps as `Date`).
 */
export const kinds = {
  ConfigMap: kind<V1ConfigMap>("v1", "ConfigMap", "configmaps"),
  Secret: kind<V1Secret>("v1", "Secret", "secrets"),
  Pod: kind<V1Pod>("v1", "Pod", "pods"),
  Service: kind<V1Service>("v1", "Service", "services"),
  ServiceAccount: kind<V1ServiceAccount>("v1", "ServiceAccount", "serviceaccounts"),
  Namespace: kind<V1Namespace>("v1", "Namespace", "namespaces"),
  Node: kind<V1Node>("v1", "Node", "nodes"),
  PersistentVolumeClaim: kind<V1PersistentVolumeClaim>("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
  PersistentVolume: kind<V1PersistentVolume>("v1", "PersistentVolume", "persistentvolumes"),
  Deployment: kind<V1Deployment>("apps/v1", "Deployment", "deployments"),
  StatefulSet: kind<V1StatefulSet>("apps/v1", "StatefulSet", "statefulsets"),
  DaemonSet: kind<V1DaemonSet>("apps/v1", "DaemonSet", "daemonsets"),
  ReplicaSet: kind<V1ReplicaSet>("apps/v1", "ReplicaSet", "replicasets"),
  Job: kind<V1Job>("batch/v1", "Job", "jobs"),
  CronJob: kind<V1CronJob>("batch/v1", "CronJob", "cronjobs"),
  Ingress: kind<V1Ingress>("networking.k8s.io/v1", "Ingress", "ingresses"),
  NetworkPolicy: kind<V1NetworkPolicy>("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
  EndpointSlice: kind<V1EndpointSlice>("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
  Role: kind<V1Role>("rbac.authorization.k8s.io/v1", "Role", "roles"),
  RoleBinding: kind<V1RoleBinding>("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
  ClusterRole: kind<V1ClusterRole>("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles"),
  ClusterRoleBinding: kind<V1ClusterRoleBinding>("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings"),
  Lease: kind<V1Lease>("coordination.k8s.io/v1", "Lease", "leases"),
  PodDisruptionBudget: kind<V1PodDisruptionBudget>("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
  HorizontalPodAutoscaler: kind<V2HorizontalPodAutoscaler>("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
  StorageClass: kind<V1StorageClass>("storage.k8s.io/v1", "StorageClass", "storageclasses"),
  CustomResourceDefinition: kind<V1CustomResourceDefinition>("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions"),
  Event: kind<EventsV1Event>("events.k8s.io/v1", "Event", "events"),
} as const;

/** @internal */
export function resourceType(k: ResourceKind<unknown>): ResourceType {
  return create(ResourceTypeSchema, {
    group: k.group,
    version: k.version,
    kind: k.kind,
    plural: k.plural ?? "",
  });
}

/** One set-based requirement of a {@link Selector}. */
export type Requirement =
  | { readonly key: string; readonly operator: "In" | "NotIn"; readonly values: readonly string[] }
  | { readonly key: string; readonly operator: "Exists" | "DoesNotExist" };

/**
 * A label selector: `matchLabels` (a plain object of key → value) and, optionally,
 * `matchExpressions`, with Kubernetes' meaning (every entry must hold).
 */
export type Selector =
  | Readonly<Record<string, string>>
  | {
      readonly matchLabels?: Readonly<Record<string, string>>;
      readonly matchExpressions?: readonly Requirement[];
    };

const OPERATORS = {
  In: LabelSelectorRequirement_Operator.IN,
  NotIn: LabelSelectorRequirement_Operator.NOT_IN,
  Exists: LabelSelectorRequirement_Operator.EXISTS,
  DoesNotExist: LabelSelectorRequirement_Operator.DOES_NOT_EXIST,
} as const;

/** @internal */
export function labelSelector(s: Selector): LabelSelector {
  const structured =
    "matchLabels" in s || "matchExpressions" in s
      ? (s as { matchLabels?: Record<string, string>; matchExpressions?: readonly Requirement[] })
      : { matchLabels: s as Record<string, string> };
  for (const [k, v] of Object.entries(structured.matchLabels ?? {})) {
    if (typeof v !== "string") {
      throw new ConfigError(`label selector value of ${JSON.stringify(k)} must be a string, not ${typeof v}`);
    }
  }
  return create(LabelSelectorSchema, {
    matchLabels: { ...(structured.matchLabels ?? {}) },
    matchExpressions: (structured.matchExpressions ?? []).map((r) => {
      const operator = OPERATORS[r.operator];
      if (operator === undefined) {
        throw new ConfigError(`unknown label selector operator ${JSON.stringify(r.operator)}`);
      }
      return { key: r.key, operator, values: "values" in r ? [...r.values] : [] };
    }),
  });
}

/**
 * An event filter the manager evaluates before anything is queued. Combine with
 * {@link Predicate.and}, {@link Predicate.or} and {@link Predicate.not}.
 *
 * @example
 * ```ts
 * Predicate.generationChanged().or(Predicate.deleting())
 * ```
 */
export class Predicate {
  /** @internal */
  readonly message: PredicateMessage;

  private constructor(message: PredicateMessage) {
    this.message = message;
  }

  /** Updates where `metadata.generation` changed (spec changes); creations and deletions pass. */
  static generationChanged(): Predicate {
    return Predicate.of({ case: "generationChanged", value: {} });
  }
  /** Updates where the labels changed. */
  static labelsChanged(): Predicate {
    return Predicate.of({ case: "labelsChanged", value: {} });
  }
  /** Updates where the annotations changed. */
  static annotationsChanged(): Predicate {
    return Predicate.of({ case: "annotationsChanged", value: {} });
  }
  /** Updates where the resourceVersion changed (drops no-op relist updates). */
  static resourceVersionChanged(): Predicate {
    return Predicate.of({ case: "resourceVersionChanged", value: {} });
  }
  /** Objects being deleted (`metadata.deletionTimestamp` set). */
  static deleting(): Predicate {
    return Predicate.of({ case: "deleting", value: {} });
  }
  /** Objects carrying finalizer `name`. */
  static hasFinalizer(name: string): Predicate {
    return Predicate.of({ case: "hasFinalizer", value: { name } });
  }
  /** Objects whose labels match `selector` (a filter only: the objects stay cached). */
  static labels(selector: Selector): Predicate {
    return Predicate.of({ case: "labelSelector", value: labelSelector(selector) });
  }
  /** Passes when every one of `predicates` passes. */
  static allOf(...predicates: Predicate[]): Predicate {
    return Predicate.of({ case: "allOf", value: { predicates: predicates.map((p) => p.message) } });
  }
  /** Passes when at least one of `predicates` passes. */
  static anyOf(...predicates: Predicate[]): Predicate {
    return Predicate.of({ case: "anyOf", value: { predicates: predicates.map((p) => p.message) } });
  }
  /** This and `other`. */
  and(other: Predicate): Predicate {
    return Predicate.allOf(this, other);
  }
  /** This or `other`. */
  or(other: Predicate): Predicate {
    return Predicate.anyOf(this, other);
  }
  /** Passes when this does not. */
  not(): Predicate {
    return Predicate.of({ case: "negate", value: this.message });
  }

  private static of(predicate: NonNullable<MessageInitShape<typeof PredicateSchema>["predicate"]>): Predicate {
    return new Predicate(create(PredicateSchema, { predicate }));
  }
}

/** How an object of a watched type names the primary it concerns. */
export type Mapping =
  | { readonly label: string }
  | { readonly annotation: string }
  | { readonly fieldPath: string };
