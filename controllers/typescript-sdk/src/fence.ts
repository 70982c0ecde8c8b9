/**
 * @internal The replica's half of exclusive attempts for one session (docs/protocol.md,
 * "Exclusive attempts"): a heartbeat every interval, remembering when each nonce was sent; the
 * anchor is when the last heartbeat the manager echoed was *sent*, by this process's monotonic
 * clock. At half of the hold without a newer anchor the session is given up (`onStale`); its
 * handlers must all have stopped by 80 % of the hold ({@link Fence.exitAt}).
 *
 * Handlers start only once the first heartbeat is answered ({@link Fence.answered}): that
 * heartbeat was sent after `Registered` arrived, so its anchor is no earlier than the manager's
 * start of the session's hold, however long the caches took to list before `Registered`.
 */
export class Fence {
  private nonce = 0n;
  private readonly sent = new Map<bigint, number>();
  private anchorAt: number | undefined;
  private startedAt = 0;
  private beat: NodeJS.Timeout | undefined;
  private stale: NodeJS.Timeout | undefined;
  private over = false;
  private resolveFirst: () => void = () => {};
  /** Settles when the manager answered the first heartbeat. */
  readonly firstAnswer: Promise<void>;

  constructor(
    /** `Registered.hold`, in milliseconds. */
    readonly holdMs: number,
    /** `Registered.heartbeat_interval`, in milliseconds. */
    readonly intervalMs: number,
    private readonly send: (nonce: bigint) => void,
    private readonly onStale: (silentMs: number) => void,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.firstAnswer = new Promise((resolve) => (this.resolveFirst = resolve));
  }

  /** The anchor (monotonic ms), once a heartbeat was answered. */
  get anchor(): number | undefined {
    return this.anchorAt;
  }

  /** Starts heartbeating: one now, then one every interval. */
  start(): void {
    this.startedAt = this.now();
    this.heartbeat();
    this.beat = setInterval(() => this.heartbeat(), this.intervalMs);
    this.beat.unref();
    this.arm();
  }

  /** The manager echoed `nonce`. */
  answered(nonce: bigint): void {
    const at = this.sent.get(nonce);
    if (at === undefined || this.over) {
      return;
    }
    for (const n of this.sent.keys()) {
      if (n <= nonce) {
        this.sent.delete(n);
      }
    }
    if (this.anchorAt === undefined || at > this.anchorAt) {
      this.anchorAt = at;
    }
    this.resolveFirst();
    this.arm();
  }

  /** The session ended: no more heartbeats; the anchor stays where it is. */
  stop(): void {
    this.over = true;
    clearInterval(this.beat);
    clearTimeout(this.stale);
  }

  /**
   * By when (monotonic ms) every handler of the session must have stopped: 80 % of the hold
   * after the anchor, leaving a margin before the manager may hand its keys to another replica.
   */
  exitAt(): number {
    return (this.anchorAt ?? this.startedAt) + 0.8 * this.holdMs;
  }

  private heartbeat(): void {
    if (this.over) {
      return;
    }
    const nonce = ++this.nonce;
    this.sent.set(nonce, this.now());
    this.send(nonce);
  }

  /** (Re)schedules the half-hold check from the newest anchor. */
  private arm(): void {
    clearTimeout(this.stale);
    const base = this.anchorAt ?? this.startedAt;
    const due = base + this.holdMs / 2;
    this.stale = setTimeout(() => {
      const silent = this.now() - (this.anchorAt ?? this.startedAt);
      if (this.over) {
        return;
      }
      if (silent >= this.holdMs / 2) {
        this.stop();
        this.onStale(silent);
      } else {
        this.arm();
      }
    }, Math.max(0, due - this.now()));
    this.stale.unref();
  }
}
