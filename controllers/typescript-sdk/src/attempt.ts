/**
 * @internal The handlers running in this process, across all sessions of a controller: one
 * attempt of a key at a time (a request for a key whose earlier attempt still runs waits for
 * it, whichever session delivered either), and a count of what runs, so that stopping can wait
 * until nothing does.
 */
export class Attempts {
  /** Per key, a promise that settles when the last attempt queued for it has ended. */
  private readonly tails = new Map<string, Promise<void>>();
  private running = 0;
  private idleWaiters: Array<() => void> = [];

  /** Handlers running now, in every session. */
  get active(): number {
    return this.running;
  }

  /**
   * Waits until no earlier attempt of `key` runs in this process, then holds the key: call the
   * returned function when this attempt has ended. Resolves with `undefined`, holding nothing,
   * when `signal` aborts first (the attempts queued behind still wait for the earlier one).
   */
  async lock(key: string, signal: AbortSignal): Promise<(() => void) | undefined> {
    const earlier = this.tails.get(key);
    let unlock: () => void = () => {};
    const mine = new Promise<void>((resolve) => (unlock = resolve));
    const tail = earlier === undefined ? mine : earlier.then(() => mine);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) {
        this.tails.delete(key);
      }
    });
    if (earlier !== undefined && !(await settlesBefore(earlier, signal))) {
      unlock();
      return undefined;
    }
    if (signal.aborted) {
      unlock();
      return undefined;
    }
    return unlock;
  }

  /** Whether an attempt of `key` runs or waits in this process. */
  holds(key: string): boolean {
    return this.tails.has(key);
  }

  /** Counts a handler that starts; call the returned function when it has settled. */
  begin(): () => void {
    this.running++;
    let ended = false;
    return () => {
      if (ended) {
        return;
      }
      ended = true;
      this.running--;
      if (this.running === 0) {
        const waiters = this.idleWaiters;
        this.idleWaiters = [];
        for (const w of waiters) {
          w();
        }
      }
    };
  }

  /** Resolves `true` once no handler runs, or `false` after `timeoutMs`. */
  idle(timeoutMs: number): Promise<boolean> {
    if (this.running === 0) {
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.idleWaiters = this.idleWaiters.filter((w) => w !== done);
        resolve(false);
      }, timeoutMs);
      this.idleWaiters.push(done);
    });
  }
}

/**
 * How long a handler with `leftMs` before the manager's deadline may run: the time left less a
 * margin for network latency and clock skew of 5% of it, at most 500 ms; never negative.
 */
export function runFor(leftMs: number): number {
  return Math.max(0, leftMs - Math.min(Math.max(leftMs, 0) * 0.05, 500));
}

/** Resolves `true` when `p` settles, `false` if `signal` aborts first. */
export function settlesBefore(p: Promise<unknown>, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) {
    return Promise.resolve(false);
  }
  return new Promise((resolve) => {
    const onAbort = (): void => resolve(false);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      () => {
        signal.removeEventListener("abort", onAbort);
        resolve(true);
      },
      () => {
        signal.removeEventListener("abort", onAbort);
        resolve(true);
      },
    );
  });
}
