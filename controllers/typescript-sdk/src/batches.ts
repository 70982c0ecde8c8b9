/**
 * @internal The session's outbound stream, batching answers (docs/protocol.md, "Batches"):
 * one message is written at a time, and when the transport has taken it, every result (or
 * event acknowledgement) that finished meanwhile leaves in one `ResultBatch`. Nothing waits to
 * fill a batch, so batching costs an answer no time; it only saves the per-message cost
 * (an HTTP/2 frame, a wake-up, an encode and a decode) when answers come faster than one
 * message each can carry them.
 */
import type { ControllerMessage, EventAck, ReconcileResult } from "./gen/ctrlhub/v1/controller_pb.js";

/** @internal The most answers one `ResultBatch` carries (the manager's own limit for the other direction). */
export const MAX_BATCH = 64;

/** @internal One message the session sends (the `message` oneof of a `ControllerMessage`). */
export type Outgoing = ControllerMessage["message"];

/** Whether `m` answers a piece of work (so may join a batch). */
function isAnswer(m: Outgoing): m is Extract<Outgoing, { case: "result" | "eventAck" }> {
  return m.case === "result" || m.case === "eventAck";
}

/**
 * @internal What the session has to send, in order. {@link Outbox.take} returns the next
 * message; once {@link Outbox.batching} is set (the manager's `Registered` echoed
 * `max_batch > 1`), answers waiting next to each other at the head leave as one `results`
 * message. Heartbeats, Credit and Drain keep their place: a batch stops at the first of them.
 */
export class Outbox {
  /** Set once the manager said it takes `ResultBatch`; an older manager ends the stream on one. */
  batching = false;
  /** Taken entries are `undefined` until the front is dropped. */
  private queue: (Outgoing | undefined)[] = [];
  /** Index of the next message in `queue` (taking from the front without shifting). */
  private head = 0;

  /** Messages waiting. */
  get size(): number {
    return this.queue.length - this.head;
  }

  /** Queues `m` behind everything waiting. */
  push(m: Outgoing): void {
    this.queue.push(m);
  }

  /**
   * The next message to write, `undefined` when none waits. When batching and the head is an
   * answer with more answers right behind it: all of them (up to {@link MAX_BATCH}) as one
   * `results` message.
   */
  take(): Outgoing | undefined {
    const first = this.next();
    if (first === undefined || !this.batching || !isAnswer(first) || !this.answerNext()) {
      return first;
    }
    const results: ReconcileResult[] = [];
    const acks: EventAck[] = [];
    let m: Outgoing | undefined = first;
    for (let taken = 1; m !== undefined; taken++) {
      if (m.case === "result") {
        results.push(m.value);
      } else if (m.case === "eventAck") {
        acks.push(m.value);
      }
      m = taken < MAX_BATCH && this.answerNext() ? this.next() : undefined;
    }
    return { case: "results", value: { $typeName: "ctrlhub.v1.ResultBatch", results, acks } };
  }

  /** Drops everything waiting (the stream ended). */
  clear(): void {
    this.queue = [];
    this.head = 0;
  }

  /** Whether the head is an answer. */
  private answerNext(): boolean {
    const m = this.queue[this.head];
    return m !== undefined && isAnswer(m);
  }

  /** Removes and returns the head. */
  private next(): Outgoing | undefined {
    const m = this.queue[this.head];
    if (m === undefined) {
      return undefined;
    }
    this.queue[this.head] = undefined;
    this.head++;
    if (this.head === this.queue.length) {
      this.queue.length = 0;
      this.head = 0;
    } else if (this.head >= 1024 && this.head * 2 >= this.queue.length) {
      // A long backlog taken from the front: drop the taken part now and then, not each time.
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
    return m;
  }
}

/** @internal Writes one message; `done` once the transport has taken it (or failed to). */
export type Write = (m: Outgoing, done: () => void) => void;

/**
 * @internal Feeds an {@link Outbox} to a transport one message at a time. A message sent while
 * nothing is being written leaves at the end of the current turn of the event loop (so that the
 * answers of one turn, e.g. of a `WorkBatch`'s requests, go together); one sent while a write
 * is in progress waits for that write, and leaves with everything else that waited.
 */
export class Outbound {
  readonly outbox = new Outbox();
  private writing = false;
  private scheduled = false;
  private stopped = false;

  constructor(
    private readonly write: Write,
    /** When an idle outbound writes: `setImmediate` (after this turn's I/O and microtasks). */
    private readonly soon: (f: () => void) => void = setImmediate,
  ) {}

  /** Queues `m`; it leaves as soon as the transport takes a message. */
  send(m: Outgoing): void {
    if (this.stopped) {
      return;
    }
    this.outbox.push(m);
    if (!this.writing && !this.scheduled) {
      this.scheduled = true;
      this.soon(() => {
        this.scheduled = false;
        this.pump();
      });
    }
  }

  /** Sends nothing more and drops what waits (the stream ended or was cancelled). */
  stop(): void {
    this.stopped = true;
    this.outbox.clear();
  }

  /** Writes the next message unless a write is in progress; the write's end writes the next. */
  private pump(): void {
    if (this.writing || this.stopped) {
      return;
    }
    const m = this.outbox.take();
    if (m === undefined) {
      return;
    }
    this.writing = true;
    this.write(m, () => {
      this.writing = false;
      this.pump();
    });
  }
}
