/**
 * Reconnect backoff: exponential with "equal jitter". The n-th consecutive failure waits a
 * random time in `[d/2, d]`, where `d = min(initialMs * 2^(n-1), maxMs)`; a session that
 * registered resets the sequence.
 */
export class Backoff {
  private failures = 0;

  /**
   * @param initialMs delay before the first retry, before jitter (default 100 ms)
   * @param maxMs upper bound of the delay (default 10 s)
   * @param random a source of numbers in [0, 1), replaceable in tests
   */
  constructor(
    readonly initialMs = 100,
    readonly maxMs = 10_000,
    private readonly random: () => number = Math.random,
  ) {
    if (!(initialMs > 0) || !(maxMs >= initialMs)) {
      throw new RangeError(`backoff needs 0 < initialMs <= maxMs, not ${initialMs} and ${maxMs}`);
    }
  }

  /** Consecutive failures recorded so far. */
  get attempts(): number {
    return this.failures;
  }

  /**
   * A session registered and its end waits for nothing (it was redirected to the controller's
   * owner): the next failure waits the first delay again, as after {@link Backoff.next}`(true)`.
   */
  reset(): void {
    this.failures = 0;
  }

  /** Records the end of a session and returns how long to wait before reconnecting. */
  next(registered: boolean): number {
    this.failures = registered ? 1 : this.failures + 1;
    const d = Math.min(this.initialMs * 2 ** Math.min(this.failures - 1, 30), this.maxMs);
    return d / 2 + this.random() * (d / 2);
  }
}

/** @internal A counting semaphore whose limit can change while it is held. */
export class Limiter {
  private active = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(private limit: number) {}

  /** Running holders. */
  get inUse(): number {
    return this.active;
  }

  /** Changes the limit; lowering it cancels nothing, raising it admits waiters. */
  resize(limit: number): void {
    this.limit = Math.max(1, limit);
    this.pump();
  }

  /**
   * Resolves once a slot is free; call the returned function to free it. Resolves with
   * `undefined`, holding nothing, when `signal` aborts first.
   */
  acquire(): Promise<() => void>;
  acquire(signal: AbortSignal): Promise<(() => void) | undefined>;
  async acquire(signal?: AbortSignal): Promise<(() => void) | undefined> {
    if (signal?.aborted) {
      return undefined;
    }
    if (this.active < this.limit && this.waiting.length === 0) {
      this.active++;
    } else {
      const admitted = await new Promise<boolean>((resolve) => {
        const admit = (): void => {
          signal?.removeEventListener("abort", give);
          resolve(true);
        };
        const give = (): void => {
          const at = this.waiting.indexOf(admit);
          if (at >= 0) {
            this.waiting.splice(at, 1);
            resolve(false);
          }
        };
        this.waiting.push(admit);
        signal?.addEventListener("abort", give, { once: true });
      });
      if (!admitted) {
        return undefined;
      }
    }
    let released = false;
    return () => {
      if (!released) {
        released = true;
        this.active--;
        this.pump();
      }
    };
  }

  private pump(): void {
    while (this.active < this.limit && this.waiting.length > 0) {
      this.active++;
      (this.waiting.shift() as () => void)();
    }
  }
}
