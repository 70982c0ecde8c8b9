import assert from "node:assert/strict";
import { after, test } from "node:test";

import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import { childTraceparent, parseTraceparent } from "../../src/index.js";
import { loadOpenTelemetry, startSpan } from "../../src/traces.js";

const PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

test("traceparents are parsed strictly", () => {
  assert.deepEqual(parseTraceparent(PARENT), {
    version: "00",
    traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
    spanId: "00f067aa0ba902b7",
    flags: "01",
  });
  assert.equal(parseTraceparent(""), undefined);
  assert.equal(parseTraceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), undefined);
  assert.equal(parseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), undefined);
  assert.equal(parseTraceparent("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), undefined);
  assert.equal(parseTraceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), undefined);
});

test("without a recording SDK the trace is continued with a new span id", () => {
  const parent = parseTraceparent(PARENT);
  assert.ok(parent);
  const child = parseTraceparent(childTraceparent(parent));
  assert.equal(child?.traceId, parent.traceId);
  assert.equal(child?.flags, "01");
  assert.notEqual(child?.spanId, parent.spanId);
  const span = startSpan(false, "reconcile", PARENT.replace(/01$/, "00"), "", {});
  assert.match(span.traceparent, /^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-00$/);
  assert.equal(startSpan(false, "reconcile", "", "", {}).traceparent, "");
});

const exporter = new InMemorySpanExporter();
const contextManager = new AsyncLocalStorageContextManager().enable();
after(() => {
  contextManager.disable();
  trace.disable();
  context.disable();
});

test("with OpenTelemetry the reconcile span is a child of the manager's and the active context", async () => {
  context.setGlobalContextManager(contextManager);
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  assert.ok(await loadOpenTelemetry(true));
  const span = startSpan(true, "reconcile", PARENT, "vendor=x", { "ctrlhub.attempt": 1 });
  const inner = await span.run(async () => {
    await new Promise((r) => setImmediate(r));
    return trace.getActiveSpan()?.spanContext().spanId;
  });
  span.end("error", "boom");
  const [finished] = exporter.getFinishedSpans();
  assert.ok(finished);
  assert.equal(finished.name, "reconcile");
  assert.equal(finished.spanContext().traceId, "4bf92f3577b34da6a3ce929d0e0e4736");
  assert.equal(finished.parentSpanContext?.spanId, "00f067aa0ba902b7");
  assert.equal(finished.attributes["ctrlhub.outcome"], "error");
  assert.equal(finished.status.message, "boom");
  assert.equal(inner, finished.spanContext().spanId, "the handler runs inside the span");
  assert.equal(span.traceparent, `00-4bf92f3577b34da6a3ce929d0e0e4736-${finished.spanContext().spanId}-01`);
  assert.equal(span.tracestate, "vendor=x");
});
