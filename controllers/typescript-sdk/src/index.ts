/**
 * # @ctrlhub/sdk
 *
 * Write a ctrlhub controller in TypeScript. The manager owns the
 * caches, leader election, namespace scoping, predicates and the work queue; this package
 * registers your controller over gRPC, runs your Promise-based handler for each request (up
 * to its concurrency, one attempt of a key at a time), aborts it with an `AbortSignal` at its
 * deadline or when its session is lost and answers once it has really ended, heartbeats,
 * reconnects with backoff, waits out a newer definition, and drains on SIGTERM.
 *
 * @example
 * ```ts
 * import { Action, controller, kinds } from "@ctrlhub/sdk";
 *
 * await controller("stamper")
 *   .for(kinds.ConfigMap)
 *   .withLabels({ "example.com/stamp": "true" })
 *   .includeObject()
 *   .concurrency(4)
 *   .reconcile(async (req) => {
 *     if (req.object === undefined) return Action.done(); // gone
 *     // ... write through @kubernetes/client-node ...
 *     return Action.requeueAfter(60_000);
 *   })
 *   .run(); // CTRLHUB_ADDR, CTRLHUB_TOKEN_FILE, ... from the environment
 * ```
 *
 * @module
 */
export { Action, type OutcomeLabel } from "./action.js";
export { Backoff } from "./backoff.js";
export {
  type Condition,
  type NewCondition,
  findCondition,
  isConditionTrue,
  removeCondition,
  setCondition,
} from "./conditions.js";
export {
  type ConnectionOptions,
  DEFAULT_ADDRESS,
  DEFAULT_TOKEN,
  type ParsedAddress,
  type TlsOptions,
  parseAddress,
} from "./config.js";
export { Controller } from "./controller.js";
export { ControllerBuilder, type OwnsOptions, type WatchesOptions, controller } from "./definition.js";
export type { EventHandler, ReadableKind, ReconcileHandler, RegisteredInfo, RunOptions, SessionEndInfo } from "./options.js";
export {
  ConfigError,
  DeadlineExceededError,
  RegistrationRejectedError,
  RetryError,
  SessionEndedError,
  StopTimeoutError,
  SupersededError,
  TerminalError,
} from "./errors.js";
export { EVENT_BURST, EVENT_REFILL_MS, EventRecorder, SERIES_WINDOW_MS } from "./events.js";
export {
  type FinalizerStep,
  Finalizers,
  addFinalizerPatch,
  finalizerStep,
  finalizersPatch,
  hasFinalizer,
  isDeleting,
  removeFinalizerPatch,
} from "./finalizers.js";
export { HEALTH_ENV, type HealthOptions } from "./health.js";
export {
  FORMAT_ENV,
  LEVEL_ENV,
  type LogFormat,
  type LogLevel,
  type LogOptions,
  type Logger,
  consoleLogger,
  logSettingsFromEnv,
} from "./logs.js";
export { CachedReader, type CachedObject, type GetOptions, type ListOptions, ReadError } from "./reader.js";
export type {
  EventType,
  ObjectEvent,
  ObjectKey,
  Reason,
  ReconcileRequest,
  StatusPatch,
  Tombstone,
  WorkContext,
} from "./request.js";
export {
  type KubernetesObject,
  type Mapping,
  type ObjectMeta,
  type OwnerReference,
  type PartialObjectMetadata,
  Predicate,
  type Requirement,
  type ResourceKind,
  type Selector,
  kind,
  kinds,
} from "./resources.js";
export { type TraceParent, childTraceparent, parseTraceparent } from "./traces.js";
export {
  type ApplyOptions,
  WriteError,
  type WriteErrorReason,
  adopt,
  apiStatus,
  isConflict,
  isNotFound,
  withSignal,
} from "./write.js";
