/**
 * Kubernetes Events (`events.k8s.io/v1`) about objects, as client-go's recorder posts them:
 * aggregated into series, rate-limited per object, and never in the reconcile's way. Every
 * request carries the controller's recorder, `req.events`:
 *
 * ```ts
 * req.events.info(site, "Synced", "Deployment and Service applied");
 * req.events.warning(site, "ImageMissing", `no image ${image}`);
 * ```
 *
 * - **Who reports**: `reportingController` is `ctrlhub.io/<controller name>`,
 *   `reportingInstance` the pod's name (`POD_NAME`, else the host name).
 * - **Failures are posted for you**: a handler that throws posts a Warning with reason
 *   `ReconcileFailed` and the error's message about the request's object, except when the
 *   request carries no object and when the error is the primary's own NotFound.
 * - **Aggregation**: the same object, type, reason and message again within 10 minutes
 *   increments `series.count` (and `series.lastObservedTime`) of the Event already posted.
 * - **Rate limits**: at most 25 Events per object in a burst, then one every 5 minutes (a token
 *   bucket per object, like client-go's spam filter); the rest are dropped.
 * - **Never blocking**: `info` and `warning` queue the Event and return; the controller posts
 *   them in order in the background. A failed post is logged at DEBUG, and at WARN at most
 *   once a minute; it never fails a reconcile.
 *
 * The controller's identity needs `create` and `patch` on `events` in the `events.k8s.io`
 * group in its objects' namespaces (`default` for cluster-scoped objects).
 *
 * @module
 */
import { hostname } from "node:os";

import type { Kube } from "./client.js";
import type { Logger } from "./logs.js";
import type { KubernetesObject } from "./resources.js";
import { isNotFound } from "./write.js";

/** How long the same Event aggregates into one series (client-go: 10 minutes). */
export const SERIES_WINDOW_MS = 10 * 60_000;
/** Events one object may get at once before the rate limit applies (client-go: 25). */
export const EVENT_BURST = 25;
/** After a burst, one Event per object this often (client-go: every 5 minutes). */
export const EVENT_REFILL_MS = 5 * 60_000;
/** Events waiting to be posted; more are dropped (client-go's broadcaster keeps 1000). */
const QUEUE = 1000;
/** Series and buckets remembered at most (the oldest are forgotten first). */
const REMEMBERED = 4096;
/** The longest note the API server takes, in bytes. */
const MAX_NOTE = 1024;

/** The object an Event is about (`regarding`). */
interface Regarding {
  apiVersion: string;
  kind: string;
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
}

/** One Event to post. */
interface Post {
  readonly regarding: Regarding;
  readonly type: "Normal" | "Warning";
  readonly reason: string;
  readonly note: string;
}

/** An Event already posted. */
interface Seen {
  readonly namespace: string;
  readonly name: string;
  count: number;
  last: number;
}

/** @internal What to do with a post. */
export type Decision = { kind: "drop" } | { kind: "create" } | { kind: "increment"; namespace: string; name: string; count: number };

/**
 * @internal client-go's event correlation: series of identical Events and a token bucket per
 * object, on a monotonic clock.
 */
export class Correlator {
  private readonly series = new Map<string, Seen>();
  private readonly buckets = new Map<string, { tokens: number; at: number }>();

  decide(post: Post, now: number): Decision {
    const id = objectId(post.regarding);
    const bucket = this.buckets.get(id) ?? { tokens: EVENT_BURST, at: now };
    bucket.tokens = Math.min(EVENT_BURST, bucket.tokens + (now - bucket.at) / EVENT_REFILL_MS);
    bucket.at = now;
    remember(this.buckets, id, bucket);
    if (bucket.tokens < 1) {
      return { kind: "drop" };
    }
    bucket.tokens -= 1;
    const seen = this.series.get(seriesKey(post));
    if (seen !== undefined && now - seen.last < SERIES_WINDOW_MS) {
      return { kind: "increment", namespace: seen.namespace, name: seen.name, count: seen.count + 1 };
    }
    return { kind: "create" };
  }

  created(post: Post, now: number, namespace: string, name: string): void {
    remember(this.series, seriesKey(post), { namespace, name, count: 1, last: now });
  }

  incremented(post: Post, now: number, count: number): void {
    const seen = this.series.get(seriesKey(post));
    if (seen !== undefined) {
      seen.count = count;
      seen.last = now;
    }
  }

  forget(post: Post): void {
    this.series.delete(seriesKey(post));
  }
}

function remember<V>(map: Map<string, V>, key: string, value: V): void {
  map.delete(key);
  map.set(key, value);
  if (map.size > REMEMBERED) {
    map.delete(map.keys().next().value as string);
  }
}

function objectId(r: Regarding): string {
  return JSON.stringify([r.apiVersion, r.kind, r.namespace ?? "", r.name, r.uid ?? ""]);
}

function seriesKey(p: Post): string {
  return JSON.stringify([objectId(p.regarding), p.type, p.reason, p.note]);
}

/** RFC 3339 with microseconds (`metav1.MicroTime`). */
function microTime(ms: number): string {
  const iso = new Date(ms).toISOString();
  return `${iso.slice(0, 23)}000Z`;
}

/** `s` cut to at most `max` UTF-8 bytes, on a character boundary. */
function truncate(s: string, max: number): string {
  if (Buffer.byteLength(s) <= max) {
    return s;
  }
  let out = "";
  for (const ch of s) {
    if (Buffer.byteLength(out + ch) > max) {
      break;
    }
    out += ch;
  }
  return out;
}

/**
 * Records Events about objects for one controller (see the module's documentation). Every
 * request's `req.events` is the controller's recorder.
 */
export class EventRecorder {
  private readonly queue: Post[] = [];
  private readonly correlator = new Correlator();
  private pumping: Promise<void> | undefined;
  private closed = false;
  private lastWarnAt = -Infinity;
  private readonly abort = new AbortController();
  /** `reportingController`. */
  readonly controller: string;
  /** `reportingInstance`. */
  readonly instance: string;

  /** @internal */
  constructor(
    controller: string,
    private readonly kube: Kube,
    private readonly log: Logger,
  ) {
    this.controller = `ctrlhub.io/${controller}`;
    const instance = process.env["POD_NAME"]?.trim() || hostname().trim() || controller;
    this.instance = instance.slice(0, 128);
  }

  /** Posts a Normal Event about `obj` (a PascalCase `reason`, a human-readable `message`); returns at once. */
  info(obj: KubernetesObject, reason: string, message: string): void {
    this.post(obj, "Normal", reason, message);
  }

  /** Posts a Warning Event about `obj`; returns at once. */
  warning(obj: KubernetesObject, reason: string, message: string): void {
    this.post(obj, "Warning", reason, message);
  }

  /** @internal The automatic Warning for a failed handler (not for the primary's own NotFound). */
  reconcileFailed(obj: KubernetesObject | undefined, err: unknown, message: string): void {
    if (obj === undefined) {
      return;
    }
    if (isNotFound(err)) {
      const details = (err as { body?: { details?: { name?: unknown } } }).body?.details;
      if (details === undefined || details.name === obj.metadata?.name) {
        return;
      }
    }
    this.post(obj, "Warning", "ReconcileFailed", message);
  }

  /**
   * @internal Resolves once everything queued so far is posted, or after `timeoutMs`; then
   * drops what is left and cancels a post in flight, so that nothing keeps the process alive.
   */
  async close(timeoutMs: number): Promise<void> {
    const pumping = this.pumping;
    if (pumping !== undefined) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([pumping, new Promise<void>((ok) => (timer = setTimeout(ok, timeoutMs)))]);
      clearTimeout(timer);
    }
    this.closed = true;
    this.queue.length = 0;
    this.abort.abort();
  }

  private post(obj: KubernetesObject, type: "Normal" | "Warning", reason: string, message: string): void {
    try {
      const name = obj.metadata?.name;
      if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string" || typeof name !== "string" || name === "") {
        this.log.debug(`event ${reason} not posted: the object has no apiVersion, kind or name`);
        return;
      }
      if (this.closed) {
        return;
      }
      if (this.queue.length >= QUEUE) {
        this.complain(`event ${reason} dropped: ${QUEUE} events wait to be posted`);
        return;
      }
      const regarding: Regarding = { apiVersion: obj.apiVersion, kind: obj.kind, name };
      const meta = obj.metadata;
      if (meta?.namespace) regarding.namespace = meta.namespace;
      if (meta?.uid) regarding.uid = meta.uid;
      if (meta?.resourceVersion) regarding.resourceVersion = meta.resourceVersion;
      this.queue.push({ regarding, type, reason, note: truncate(String(message), MAX_NOTE) });
      this.pumping ??= this.pump().finally(() => (this.pumping = undefined));
    } catch (err) {
      this.complain(`event ${reason} not posted: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  private async pump(): Promise<void> {
    for (let post = this.queue.shift(); post !== undefined && !this.closed; post = this.queue.shift()) {
      try {
        await this.send(post);
      } catch (err) {
        this.complain(`posting event ${post.reason} about ${post.regarding.kind}/${post.regarding.name} failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
  }

  private async send(post: Post): Promise<void> {
    const now = performance.now();
    const decision = this.correlator.decide(post, now);
    if (decision.kind === "drop") {
      this.log.debug(`event ${post.reason} about ${post.regarding.kind}/${post.regarding.name} dropped by the per-object rate limit`);
      return;
    }
    if (decision.kind === "increment") {
      const ref = { apiVersion: "events.k8s.io/v1", kind: "Event", metadata: { name: decision.name, namespace: decision.namespace } };
      try {
        await this.kube.objects.mergePatchObject(ref, { series: { count: decision.count, lastObservedTime: microTime(Date.now()) } }, "", this.abort.signal);
        this.correlator.incremented(post, now, decision.count);
        return;
      } catch (err) {
        if (!isNotFound(err)) {
          throw err;
        }
        this.correlator.forget(post); // expired or deleted meanwhile: a new series
      }
    }
    const namespace = post.regarding.namespace ?? "default";
    const wall = Date.now();
    const name = `${post.regarding.name}.${(BigInt(wall) * 1_000_000n + BigInt(Math.floor((now % 1) * 1e6))).toString(16)}`;
    await this.kube.objects.createObject(
      {
        apiVersion: "events.k8s.io/v1",
        kind: "Event",
        metadata: { name, namespace },
        eventTime: microTime(wall),
        action: post.reason,
        reason: post.reason,
        note: post.note,
        type: post.type,
        regarding: post.regarding,
        reportingController: this.controller,
        reportingInstance: this.instance,
      } as KubernetesObject,
      this.abort.signal,
    );
    this.correlator.created(post, now, namespace, name);
  }

  /** A failed post: at DEBUG always, at WARN at most once a minute. */
  private complain(what: string): void {
    const now = performance.now();
    if (now - this.lastWarnAt >= 60_000) {
      this.lastWarnAt = now;
      this.log.warn(`${what} (Events are best effort; further failures within a minute are logged at DEBUG)`);
    } else {
      this.log.debug(what);
    }
  }
}
