import { randomBytes } from "node:crypto";

import type * as Otel from "@opentelemetry/api";

/** A parsed W3C `traceparent`. */
export interface TraceParent {
  readonly version: string;
  readonly traceId: string;
  readonly spanId: string;
  readonly flags: string;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$/;

/** Parses a W3C `traceparent`; `undefined` when empty or invalid (all-zero ids, version ff). */
export function parseTraceparent(value: string): TraceParent | undefined {
  const m = TRACEPARENT.exec(value.trim());
  if (m === null) {
    return undefined;
  }
  const [, version, traceId, spanId, flags] = m as unknown as [string, string, string, string, string];
  if (version === "ff" || /^0+$/.test(traceId) || /^0+$/.test(spanId) || (version === "00" && value.trim().length !== 55)) {
    return undefined;
  }
  return { version, traceId, spanId, flags };
}

/**
 * The `traceparent` of a new span under `parent`: the same trace id and flags, a new random
 * span id. What the SDK reports as a request's span when no OpenTelemetry SDK records spans.
 */
export function childTraceparent(parent: TraceParent): string {
  let spanId = randomBytes(8).toString("hex");
  while (/^0+$/.test(spanId) || spanId === parent.spanId) {
    spanId = randomBytes(8).toString("hex");
  }
  return `00-${parent.traceId}-${spanId}-${parent.flags}`;
}

/** @internal One reconcile's (or event's) span. */
export interface WorkSpan {
  /** This span's traceparent; "" when the request carried none and nothing records spans. */
  readonly traceparent: string;
  readonly tracestate: string;
  /** Runs `fn` with this span as the active OpenTelemetry context. */
  run<R>(fn: () => R): R;
  /** Ends the span with `outcome` (`ctrlhub.outcome`), an error status when `error` is set. */
  end(outcome: string, error?: string): void;
}

let api: typeof Otel | undefined;
let loading: Promise<typeof Otel | undefined> | undefined;

/**
 * @internal Loads the optional `@opentelemetry/api` peer dependency once; `undefined` when it
 * is not installed (then spans are not recorded, but trace context is still continued).
 */
export function loadOpenTelemetry(enabled: boolean): Promise<typeof Otel | undefined> {
  if (!enabled) {
    return Promise.resolve(undefined);
  }
  loading ??= import("@opentelemetry/api").then(
    (m) => (api = "trace" in m ? (m as unknown as typeof Otel) : (m as unknown as { default: typeof Otel }).default),
    () => undefined,
  );
  return loading;
}

/** @internal Starts the controller's span of one request, child of the manager's dispatch span. */
export function startSpan(
  useApi: boolean,
  name: string,
  traceparent: string,
  tracestate: string,
  attributes: Record<string, string | number>,
): WorkSpan {
  const parent = parseTraceparent(traceparent);
  const otel = useApi ? api : undefined;
  if (otel === undefined) {
    const own = parent === undefined ? "" : childTraceparent(parent);
    return { traceparent: own, tracestate: own === "" ? "" : tracestate, run: (fn) => fn(), end: () => {} };
  }
  let ctx = otel.ROOT_CONTEXT;
  if (parent !== undefined) {
    const remote: Otel.SpanContext = {
      traceId: parent.traceId,
      spanId: parent.spanId,
      traceFlags: Number.parseInt(parent.flags, 16),
      isRemote: true,
    };
    if (tracestate !== "") {
      remote.traceState = otel.createTraceState(tracestate);
    }
    ctx = otel.trace.setSpanContext(ctx, remote);
  }
  const span = otel.trace
    .getTracer("@ctrlhub/sdk")
    .startSpan(name, { kind: otel.SpanKind.SERVER, attributes }, ctx);
  const sc = span.spanContext();
  let own: string;
  if (otel.isSpanContextValid(sc) && sc.spanId !== parent?.spanId) {
    own = `00-${sc.traceId}-${sc.spanId}-${sc.traceFlags.toString(16).padStart(2, "0")}`;
  } else {
    // No OpenTelemetry SDK records spans: continue the trace with an id of our own.
    own = parent === undefined ? "" : childTraceparent(parent);
  }
  const active = otel.trace.setSpan(ctx, span);
  return {
    traceparent: own,
    tracestate: own === "" ? "" : (sc.traceState?.serialize() ?? tracestate),
    run: (fn) => otel.context.with(active, fn),
    end: (outcome, error) => {
      span.setAttribute("ctrlhub.outcome", outcome);
      if (error !== undefined) {
        span.setStatus({ code: otel.SpanStatusCode.ERROR, message: error });
      }
      span.end();
    },
  };
}
