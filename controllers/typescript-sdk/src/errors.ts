import { status as Status } from "@grpc/grpc-js";

/**
 * Invalid settings found before connecting: a malformed manager address, an unreadable TLS
 * file, a missing primary type, a controller name that is not a DNS-1123 label.
 */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

/**
 * The manager refused the registration in a way that needs a human (INVALID_ARGUMENT,
 * PERMISSION_DENIED or UNAUTHENTICATED before `Registered`). Reconnecting unchanged cannot
 * help, so {@link Controller.run} rejects with this error.
 */
export class RegistrationRejectedError extends Error {
  override readonly name = "RegistrationRejectedError";
  /** The gRPC status code (`@grpc/grpc-js`'s `status` numbering). */
  readonly code: number;
  /** The offending field, e.g. `register.watches[2].field_path`; empty when none. */
  readonly field: string;
  /** The manager's explanation. */
  readonly details: string;

  /** @internal */
  constructor(code: number, details: string, field: string) {
    super(
      `registration rejected with ${Status[code] ?? code}${field ? ` (field ${field})` : ""}: ${details}`,
    );
    this.code = code;
    this.field = field;
    this.details = details;
  }
}

/**
 * A newer definition of this controller replaced this one.
 *
 * @deprecated {@link Controller.run} no longer rejects with it: a superseded or outdated
 * replica stops taking work, reports not ready ({@link Controller.ready}) and registers again
 * 30 s later, so that a rollout converges without crash loops (see the README's "Rolling
 * upgrades").
 */
export class SupersededError extends Error {
  override readonly name = "SupersededError";
}

/**
 * Throw from a handler for a transient failure: the manager retries the key after its
 * backoff, or after `retryAfterMs` when that is later (e.g. a rate limit's Retry-After).
 * Any other thrown error is treated the same way, without `retryAfterMs`.
 *
 * @example
 * ```ts
 * throw new RetryError("the bucket is still being created", { retryAfterMs: 5_000 });
 * ```
 */
export class RetryError extends Error {
  override readonly name = "RetryError";
  /** Retry no earlier than this many milliseconds from now. */
  readonly retryAfterMs: number | undefined;

  constructor(message: string, options: { retryAfterMs?: number; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.retryAfterMs = options.retryAfterMs;
  }
}

/**
 * Throw from a handler when retrying cannot help (an invalid spec, say): the manager records
 * the failure and does not retry the key until it changes.
 */
export class TerminalError extends Error {
  override readonly name = "TerminalError";

  constructor(message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
  }
}

/**
 * The reason a handler's {@link ReconcileRequest.signal} aborts when the request's deadline
 * is near. Stop acting on it: once the handler has ended, the manager re-delivers the key
 * (perhaps to another replica).
 */
export class DeadlineExceededError extends Error {
  override readonly name = "DeadlineExceededError";
}

/**
 * The reason a handler's {@link ReconcileRequest.signal} aborts when the session that
 * delivered the request ended (the stream broke, the manager revoked it, or it answered no
 * heartbeat for half the hold). The manager re-delivers the key once the hold is over; stop
 * acting on it before then.
 */
export class SessionEndedError extends Error {
  override readonly name = "SessionEndedError";
}

/**
 * {@link Controller.run} rejects with it when handlers still run {@link RunOptions.stopGraceMs}
 * after a stop: they ignore their `AbortSignal`. The process should exit; their keys are handed
 * out again once the manager's hold is over.
 */
export class StopTimeoutError extends Error {
  override readonly name = "StopTimeoutError";
  /** Handlers still running. */
  readonly running: number;

  /** @internal */
  constructor(running: number, graceMs: number) {
    super(
      `${running} handler(s) still run ${graceMs} ms after the stop (RunOptions.stopGraceMs): ` +
        "they ignore their AbortSignal; stopping without them",
    );
    this.running = running;
  }
}
