import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

import {
  type ReconcileResult,
  ReconcileResultSchema,
  ReconcileResult_DoneSchema,
} from "./gen/ctrlhub/v1/controller_pb.js";
import { RetryError, TerminalError } from "./errors.js";
import { apiStatus } from "./write.js";

/**
 * What a successful reconcile asks for next: nothing until the object changes
 * ({@link Action.done}), or another look after a delay ({@link Action.requeueAfter}).
 * Failures are thrown instead: {@link RetryError}, {@link TerminalError} or any error.
 */
export type Action =
  | { readonly type: "done" }
  | { readonly type: "requeue"; readonly afterMs: number };

/** Constructors of {@link Action}. */
export const Action = {
  /** Reconciled; nothing more to do until the object (or something mapped to it) changes. */
  done(): Action {
    return DONE;
  },
  /**
   * Reconciled; look again no earlier than `ms` milliseconds from now (earlier only if the
   * object changes), e.g. to poll an external system.
   */
  requeueAfter(ms: number): Action {
    if (!Number.isFinite(ms) || ms < 0) {
      throw new RangeError(`requeueAfter needs a finite, non-negative delay, not ${ms}`);
    }
    return { type: "requeue", afterMs: ms };
  },
} as const;

const DONE: Action = Object.freeze({ type: "done" });

/** The `Done` outcome of a result, shared: results are encoded, never changed. */
const DONE_OUTCOME: ReconcileResult["outcome"] = Object.freeze({
  case: "done",
  value: Object.freeze(create(ReconcileResult_DoneSchema)),
});

/** The outcome label of a result, as the conformance reports and logs spell it. */
export type OutcomeLabel = "done" | "requeue" | "error" | "terminal";

/** @internal The wire result of a handler's return value. */
export function resultOf(id: string, action: Action | void): [ReconcileResult, OutcomeLabel] {
  if (action === undefined || action.type === "done") {
    // A literal, not create(): this is every successful reconcile's result.
    return [{ $typeName: "ctrlhub.v1.ReconcileResult", id, outcome: DONE_OUTCOME }, "done"];
  }
  if (action.type === "requeue") {
    return [
      create(ReconcileResultSchema, {
        id,
        outcome: { case: "requeueAfter", value: { delay: durationFromMs(action.afterMs) } },
      }),
      "requeue",
    ];
  }
  throw new TypeError(`a reconcile handler returned ${JSON.stringify(action)}, not an Action`);
}

/**
 * @internal The wire result of a handler's failure. {@link TerminalError} is terminal and
 * {@link RetryError} honours its `retryAfterMs`. A Kubernetes API error (anything with a
 * numeric HTTP `code`, such as `@kubernetes/client-node`'s `ApiException`) maps like the Rust
 * SDK's: 400 and 422 are terminal (the request can never succeed as built), 429 honours
 * Retry-After, everything else is retried.
 */
export function failureOf(id: string, err: unknown): [ReconcileResult, OutcomeLabel] {
  const message = describe(err);
  if (err instanceof TerminalError) {
    return [terminal(id, message), "terminal"];
  }
  if (err instanceof RetryError) {
    return [retry(id, message, err.retryAfterMs), "error"];
  }
  const http = apiStatus(err);
  if (http === 400 || http === 422) {
    return [terminal(id, `kubernetes API: ${message}`), "terminal"];
  }
  if (http === 429) {
    return [retry(id, `kubernetes API: ${message}`, retryAfterHeader(err) ?? 1_000), "error"];
  }
  return [retry(id, message, undefined), "error"];
}

function terminal(id: string, message: string): ReconcileResult {
  return create(ReconcileResultSchema, { id, outcome: { case: "terminal", value: { message } } });
}

function retry(id: string, message: string, retryAfterMs: number | undefined): ReconcileResult {
  return create(ReconcileResultSchema, {
    id,
    outcome: {
      case: "error",
      value:
        retryAfterMs === undefined
          ? { message }
          : { message, retryAfter: durationFromMs(Math.max(0, retryAfterMs)) },
    },
  });
}

/** A one-line description of anything thrown. */
export function describe(err: unknown): string {
  if (err instanceof Error) {
    return err.message || err.name;
  }
  return String(err);
}

function retryAfterHeader(err: unknown): number | undefined {
  const headers = (err as { headers?: unknown }).headers;
  if (typeof headers !== "object" || headers === null) {
    return undefined;
  }
  const entry = Object.entries(headers).find(([k]) => k.toLowerCase() === "retry-after");
  const seconds = Number(entry?.[1]);
  return Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : undefined;
}
