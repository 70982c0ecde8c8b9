// The TypeScript SDK's bench controller: @ctrlhub/sdk with a no-op reconciler on the bench
// Widget CRD, the peer of bench-sdk-controller (Rust SDK). Each reconcile start is reported on
// stdout as `R <ns>/<name> <latency-µs>` (latency from the object's timestamp annotation; -1
// without one), lines batched into one write per turn of the event loop. SIGTERM drains.
//
//   node bench/typescript/controller.mjs --addr 127.0.0.1:9090 --name bench --namespace ns --concurrency 16
import { parseArgs } from "node:util";

import { Action, controller, kind } from "@ctrlhub/sdk";

const { values } = parseArgs({
  options: {
    addr: { type: "string" },
    name: { type: "string", default: "bench" },
    namespace: { type: "string", default: "" },
    concurrency: { type: "string", default: "16" },
  },
});

const TS_ANNOTATION = "bench.ctrlhub.io/ts";
let batch = "";

function report(line) {
  if (batch === "") {
    setImmediate(() => {
      process.stdout.write(batch);
      batch = "";
    });
  }
  batch += `${line}\n`;
}

const widgets = controller(values.name)
  .for(kind("bench.ctrlhub.io/v1", "Widget", "widgets"))
  .includeObject()
  .concurrency(Number(values.concurrency));
if (values.namespace !== "") {
  widgets.inNamespaces(values.namespace);
}

await widgets
  .reconcile((req) => {
    const ts = Number(req.object?.metadata?.annotations?.[TS_ANNOTATION]);
    const latency = Number.isFinite(ts) ? Math.max(0, Date.now() * 1000 - ts) : -1;
    report(`R ${req.namespace}/${req.name} ${latency}`);
    return Action.done();
  })
  .run({ address: values.addr, token: "dev", tracing: false });
