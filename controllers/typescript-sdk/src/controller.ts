/**
 * The controller's run loop: sessions one after another, reconnect backoff, waiting out a
 * newer definition, signals and the stop.
 *
 * @module
 */
import { Attempts, type Handlers, type Kit } from "./attempt.js";
import { Backoff, Limiter } from "./backoff.js";
import { Kube } from "./client.js";
import { resolveConnection } from "./config.js";
import { ConfigError, StopTimeoutError } from "./errors.js";
import { EventRecorder } from "./events.js";
import type { Register } from "./gen/ctrlhub/v1/registration_pb.js";
import { HEALTH_ENV, Health, type HealthOptions } from "./health.js";
import { type Logger, StackLimiter, consoleLogger } from "./logs.js";
import type { RunOptions } from "./options.js";
import { Route } from "./redirect.js";
import { type OwnerInternals, Session, type SessionEnd } from "./session.js";
import { loadOpenTelemetry } from "./traces.js";

/** How long a stop waits for queued Events to be posted. */
const EVENTS_FLUSH_MS = 2_000;


/** How long an outdated or superseded replica waits before it registers again. */
export const OUTDATED_RETRY_MS = 30_000;
/** How long stopping waits for running handlers by default (below Kubernetes' 30 s grace). */
export const STOP_GRACE_MS = 25_000;

/**
 * A defined controller, ready to {@link Controller.run}. It owns the session with the manager:
 * connecting and registering, running handlers up to its concurrency (one attempt of a key at
 * a time), aborting them at their deadlines, answering, heartbeating, reconnecting with
 * backoff, and draining on shutdown.
 *
 * @typeParam T the primary type's objects
 */
export class Controller<T> {
  /** The controller's name. */
  readonly name: string;
  private readonly register: Register;
  private readonly handlers: Handlers<T>;
  private credit: number;
  private readonly limiter: Limiter;
  private readonly attempts = new Attempts();
  private running = false;
  private stopping = false;
  private retire = false;
  private stoppedAt = 0;
  private stopGraceMs = STOP_GRACE_MS;
  private graceTimer: NodeJS.Timeout | undefined;
  private waiting = false;
  private session: Session<T> | undefined;
  private wake: (() => void) | undefined;
  private kit: Kit | undefined;
  private health: Health | undefined;
  private view: OwnerInternals<T> | undefined;

  /** @internal */
  constructor(register: Register, handlers: Handlers<T>) {
    this.name = register.controllerName;
    this.register = register;
    this.handlers = handlers;
    this.credit = register.maxInFlight;
    this.limiter = new Limiter(this.credit);
  }

  /** The `Register` message this controller sends (a copy). */
  registration(): Register {
    return { ...this.register, maxInFlight: this.credit };
  }

  /** The live session's id, when registered. */
  get sessionId(): string | undefined {
    return this.session?.registered ? this.session.sessionId : undefined;
  }

  /**
   * Whether this replica takes work now: registered on a live session, not draining, and not
   * waiting out a newer definition. Serve it on your readiness probe: a replica superseded by
   * a newer revision (or refused as outdated) is not ready until it registers again.
   */
  get ready(): boolean {
    return !this.waiting && !this.stopping && this.session?.live === true;
  }

  /**
   * Changes this replica's concurrency while it runs: sends `Credit` to the manager (0 pauses
   * dispatch without ending the session) and resizes the local limit. Lowering it cancels
   * nothing. Kept for later sessions.
   */
  setCredit(n: number): void {
    if (!Number.isInteger(n) || n < 0) {
      throw new RangeError(`credit must be a non-negative integer, not ${n}`);
    }
    this.credit = n;
    this.limiter.resize(Math.max(1, n));
    this.session?.sendCredit(n);
  }

  /**
   * Drains: the manager sends no new work, in-flight handlers finish and answer, and
   * {@link Controller.run} resolves once the manager has ended the session and no handler
   * runs any more (at most {@link RunOptions.stopGraceMs}). Between sessions it resolves once
   * no handler runs. The same as aborting {@link RunOptions.signal}.
   *
   * @param options `retire: true` when this is the controller's last replica and the
   *   controller goes away for good (`Drain.retire`): the manager forgets it at once instead
   *   of keeping it, and alerting on it, for its `--controller-grace`. Leave it unset on an
   *   ordinary shutdown or rollout.
   */
  stop(options: { readonly retire?: boolean } = {}): void {
    if (this.stopping) {
      return;
    }
    this.retire = options.retire ?? false;
    this.stopping = true;
    this.stoppedAt = Date.now();
    this.notReady("draining: the controller is stopping");
    this.armGrace();
    this.session?.drain();
    this.wake?.();
  }

  /** Once the stop's grace is over, the session is closed whatever still runs. */
  private armGrace(): void {
    if (!this.running || !this.stopping || this.graceTimer !== undefined) {
      return;
    }
    this.graceTimer = setTimeout(() => this.session?.cancel(), Math.max(0, this.stoppedAt + this.stopGraceMs - Date.now()));
    this.graceTimer.unref();
  }

  /**
   * Runs until stopped (SIGTERM or SIGINT, {@link RunOptions.signal}, {@link Controller.stop}),
   * then drains, waits for running handlers and resolves. Reconnects with backoff after every
   * other end of a session; waits 30 s before registering again when a newer definition runs.
   * In ring mode, a member's redirect to the controller's owner (`Rejected` UNAVAILABLE with
   * `owner_address`, or `Revoked` REASON_UNIT_MOVED) is dialled at once, at most 3 times in a row
   * without a `Registered`; then, and after any other end, the configured address with backoff.
   *
   * @throws {@link ConfigError} for invalid settings (before connecting).
   * @throws {@link RegistrationRejectedError} when the manager refuses the registration in a
   *   way that needs a human (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED).
   * @throws {@link StopTimeoutError} when handlers still run {@link RunOptions.stopGraceMs} after
   *   the stop.
   */
  async run(options: RunOptions = {}): Promise<void> {
    if (this.running) {
      throw new Error(`controller ${this.name} is already running`);
    }
    const route = new Route(resolveConnection(options));
    const log = options.logger ?? consoleLogger(this.name);
    const handlerLog = options.logger ?? consoleLogger(this.name, { target: this.name });
    const reconnect = new Backoff(options.reconnect?.initialMs ?? 100, options.reconnect?.maxMs ?? 10_000);
    const drainGraceMs = options.drainGraceMs ?? 10_000;
    const stopGraceMs = options.stopGraceMs ?? STOP_GRACE_MS;
    const outdatedRetryMs = options.outdatedRetryMs ?? OUTDATED_RETRY_MS;
    for (const [name, v] of [["drainGraceMs", drainGraceMs], ["stopGraceMs", stopGraceMs], ["outdatedRetryMs", outdatedRetryMs]] as const) {
      if (!Number.isFinite(v) || v < 0) {
        throw new ConfigError(`${name} must be zero or positive, not ${v}`);
      }
    }
    const healthOptions = healthOf(options);
    const tracing = (await loadOpenTelemetry(options.tracing ?? true)) !== undefined;
    const kube = new Kube(options.kubeConfig);
    const kit: Kit = { kube, events: new EventRecorder(this.name, kube, log), handlerLog, stacks: new StackLimiter() };
    this.health = healthOptions === undefined ? undefined : await Health.start(healthOptions);
    if (this.health !== undefined) {
      log.info("health endpoint listening", { port: this.health.port, paths: "/healthz /readyz" });
    }
    this.kit = kit;
    this.running = true;
    this.stopping = false;
    this.stopGraceMs = stopGraceMs;
    this.notReady("connecting to the manager");

    let hard = false;
    let signals = 0;
    const onSignal = (sig: NodeJS.Signals): void => {
      signals++;
      if (signals === 1) {
        log.info(`${sig}: draining (send it again to stop at once)`);
        this.stop();
      } else {
        log.warn(`${sig} again: stopping at once; in-flight work is re-delivered elsewhere`);
        hard = true;
        this.session?.cancel();
        this.wake?.();
      }
    };
    const handleSignals = options.handleSignals ?? true;
    if (handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    const onAbort = (): void => this.stop();
    this.retire = false;
    options.signal?.addEventListener("abort", onAbort, { once: true });
    if (options.signal?.aborted) {
      this.stop();
    }
    const pause = (ms: number): Promise<void> =>
      new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, ms);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      }).finally(() => (this.wake = undefined));
    let drained = false;
    try {
      for (;;) {
        if (this.stopping) {
          break;
        }
        const session = new Session<T>(this, route.connection, log, drainGraceMs, tracing, options);
        this.session = session;
        let end: SessionEnd = await session.run();
        this.session = undefined;
        if (end.kind === "stopped") {
          drained = end.drained;
          break;
        }
        if (end.kind === "fatal") {
          // Reported once: by the rejection (Node prints an unhandled one), not also logged.
          throw end.error;
        }
        if (this.stopping) {
          break;
        }
        if (end.kind === "redirect") {
          const notFollowed = followRedirect(end, route, reconnect, log);
          if (notFollowed === undefined) {
            this.notReady(`redirected to ${route.connection.display}`);
            continue; // at once, and no failure for the backoff
          }
          end = notFollowed;
        } else {
          route.back();
        }
        if (end.kind === "wait") {
          const why =
            `${end.reason}; this replica takes no work and reports not ready, and registers again in ` +
            `${Math.round(outdatedRetryMs / 1000)} s (a rollout replaces it meanwhile)`;
          log.warn(why);
          this.waiting = true;
          this.notReady(`waiting: ${end.reason}`);
          await pause(outdatedRetryMs);
          this.waiting = false;
          reconnect.next(true); // a fresh start after the wait
          continue;
        }
        const delay = reconnect.next(end.registered);
        this.notReady(`reconnecting: ${end.reason}`);
        (end.expected ? log.info : log.warn).call(log, `session ended: ${end.reason}; reconnecting in ${Math.round(delay)} ms`, {
          failures: reconnect.attempts,
        });
        await pause(delay);
      }
      // Stopping: nothing is answered any more once run() resolves, so wait for what runs.
      if (!hard && this.attempts.active > 0) {
        const left = Math.max(0, this.stoppedAt + stopGraceMs - Date.now());
        log.info(`waiting up to ${left} ms for ${this.attempts.active} running handler(s) to end`);
        if (!(await this.attempts.idle(left))) {
          throw new StopTimeoutError(this.attempts.active, stopGraceMs);
        }
      }
      await kit.events.close(hard ? 0 : EVENTS_FLUSH_MS);
      log.info(drained ? "session drained; controller stopped" : "controller stopped");
    } finally {
      clearTimeout(this.graceTimer);
      this.graceTimer = undefined;
      this.running = false;
      this.waiting = false;
      void kit.events.close(0);
      const health = this.health;
      this.health = undefined;
      await health?.close();
      options.signal?.removeEventListener("abort", onAbort);
      if (handleSignals) {
        process.off("SIGTERM", onSignal);
        process.off("SIGINT", onSignal);
      }
    }
  }

  /** Tells the health endpoint (when there is one) that this replica takes no work now, and why. */
  private notReady(why: string): void {
    this.health?.notReady(why);
  }

  /** @internal A session's state changed: ready while it is live and nothing stops. */
  refreshReadiness(liveReason: string | undefined): void {
    if (this.stopping) {
      this.notReady("draining: the controller is stopping");
    } else if (liveReason === undefined) {
      this.health?.ready();
    } else {
      this.notReady(liveReason);
    }
  }

  /**
   * @internal What a session needs of its controller: one object, made once, whose getters
   * read the controller's state now (sessions read it on every request).
   */
  get internals(): OwnerInternals<T> {
    this.view ??= this.makeView();
    return this.view;
  }

  private makeView(): OwnerInternals<T> {
    const self = this;
    return {
      get register() {
        return self.registration();
      },
      handlers: this.handlers,
      get credit() {
        return self.credit;
      },
      limiter: this.limiter,
      attempts: this.attempts,
      get stopping() {
        return self.stopping;
      },
      get retire() {
        return self.retire;
      },
      get kit() {
        return self.kit as Kit;
      },
    };
  }
}

/**
 * A ring member redirected the session to the controller's owner: the next session dials it at
 * once (`undefined`), unless {@link Route.follow} declines (a redirect too many in a row, an
 * address that is not one); then the end to back off after, towards the configured address.
 */
function followRedirect(
  end: Extract<SessionEnd, { kind: "redirect" }>,
  route: Route,
  reconnect: Backoff,
  log: Logger,
): Extract<SessionEnd, { kind: "retry" }> | undefined {
  if (end.registered) {
    // A Registered resets the count and the backoff, as it does for any other end.
    route.registered();
    reconnect.reset();
  }
  const hop = route.follow(end.address);
  if (!hop.followed) {
    return { kind: "retry", registered: false, reason: `${end.reason}; ${hop.why}` };
  }
  log.info("redirected to the controller's owner; connecting there now", {
    owner: end.owner,
    addr: hop.connection.display,
    redirects: hop.count,
    reason: end.reason,
  });
  return undefined;
}

/** The health endpoint's settings: the option, else `CTRLHUB_HEALTH_ADDR`, else none. */
function healthOf(options: RunOptions): HealthOptions | undefined {
  const h = options.health;
  if (h === false) {
    return undefined;
  }
  if (typeof h === "string") {
    return { address: h };
  }
  if (h !== undefined) {
    return h;
  }
  const env = process.env[HEALTH_ENV]?.trim() ?? "";
  return env === "" ? undefined : { address: env };
}
