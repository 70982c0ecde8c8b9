/**
 * The controller's HTTP health endpoint, for kubelet probes: off unless `CTRLHUB_HEALTH_ADDR`
 * (e.g. `0.0.0.0:8081`) or {@link RunOptions.health} says where to listen.
 *
 * - `GET /healthz`: `200 ok` while the process's event loop runs; `500` with the reason once
 *   it has not run for {@link HealthOptions.stuckAfterMs} (10 s), e.g. because synchronous work
 *   blocks it. The server runs in a worker thread of its own, so a stuck loop still gets its
 *   answer.
 * - `GET /readyz`: `200 ok` while a session is registered and not draining; `503` with a
 *   one-line reason otherwise (connecting, reconnecting after a manager restart or a leader
 *   change, draining on SIGTERM, waiting while a newer definition of the controller runs).
 *
 * The server starts with {@link Controller.run} (an address it cannot listen on fails `run`
 * at once with a {@link ConfigError}) and stops when `run` settles.
 *
 * @module
 */
import { Worker } from "node:worker_threads";

import { ConfigError } from "./errors.js";

/** Where and how the health endpoint answers. */
export interface HealthOptions {
  /** `host:port` to listen on (`0.0.0.0:8081`, `[::]:8081`, `:8081` for every interface, port 0 for any). */
  readonly address: string;
  /** How long the event loop may run no tick before `/healthz` fails. Default 10 s. */
  readonly stuckAfterMs?: number;
}

/** The environment variable naming the health endpoint's address. */
export const HEALTH_ENV = "CTRLHUB_HEALTH_ADDR";

/** The worker: an HTTP server answering from what the controller's thread shares with it. */
const WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const http = require("node:http");
const tick = new Float64Array(workerData.tick);
let reason = "starting";
const send = (res, code, body) => {
  res.writeHead(code, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" });
  res.end(body + "\\n");
};
const server = http.createServer((req, res) => {
  const path = (req.url || "/").split("?")[0];
  if (path === "/healthz" || path === "/livez") {
    const silent = Date.now() - tick[0];
    if (silent > workerData.stuckAfterMs) {
      send(res, 500, "stuck: the controller's event loop ran no tick for " + (silent / 1000).toFixed(1) + " s (more than " +
        (workerData.stuckAfterMs / 1000) + " s); is synchronous work blocking it?");
    } else {
      send(res, 200, "ok");
    }
  } else if (path === "/readyz") {
    reason === "" ? send(res, 200, "ok") : send(res, 503, reason);
  } else {
    send(res, 404, "not found: /healthz and /readyz are served");
  }
});
parentPort.on("message", (m) => {
  if (m && typeof m.reason === "string") reason = m.reason;
});
server.on("error", (err) => parentPort.postMessage({ error: err.message }));
server.listen(workerData.port, workerData.host, () => parentPort.postMessage({ port: server.address().port }));
`;

/** @internal `host:port` (or `[v6]:port`, `:port`) as the host and port to listen on. */
export function parseListen(address: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(address.trim());
  const port = Number(m?.[3]);
  if (m === null || !(port >= 0 && port <= 65535)) {
    throw new ConfigError(`invalid health address ${JSON.stringify(address)}: expected host:port, e.g. 0.0.0.0:8081`);
  }
  return { host: m[1] ?? (m[2] === "" ? "0.0.0.0" : (m[2] as string)), port };
}

/** @internal The running endpoint. */
export class Health {
  private readonly ticker: NodeJS.Timeout;
  private reason = "starting";

  private constructor(
    private readonly worker: Worker,
    private readonly tick: Float64Array,
    /** The port it listens on. */
    readonly port: number,
  ) {
    this.beat();
    this.ticker = setInterval(() => this.beat(), 500);
    this.ticker.unref();
  }

  /** Starts listening; rejects with a {@link ConfigError} when it cannot. */
  static async start(options: HealthOptions): Promise<Health> {
    const { host, port } = parseListen(options.address);
    const stuckAfterMs = options.stuckAfterMs ?? 10_000;
    if (!(stuckAfterMs > 0)) {
      throw new ConfigError(`health stuckAfterMs must be positive, not ${stuckAfterMs}`);
    }
    const shared = new SharedArrayBuffer(8);
    const tick = new Float64Array(shared);
    tick[0] = Date.now();
    const worker = new Worker(WORKER, { eval: true, workerData: { tick: shared, host, port, stuckAfterMs } });
    worker.unref();
    const listening = await new Promise<number>((resolve, reject) => {
      worker.once("message", (m: { port?: number; error?: string }) =>
        m.port !== undefined
          ? resolve(m.port)
          : reject(new ConfigError(`the health endpoint cannot listen on ${options.address}: ${m.error ?? "unknown error"}`)),
      );
      worker.once("error", (err) => reject(new ConfigError(`the health endpoint failed to start: ${err.message}`)));
    }).catch(async (err: unknown) => {
      await worker.terminate();
      throw err;
    });
    return new Health(worker, tick, listening);
  }

  /** Ready from now on. */
  ready(): void {
    this.set("");
  }

  /** Not ready, because of `why` (its first line). */
  notReady(why: string): void {
    this.set(why.split("\n")[0] || "not ready");
  }

  /** Stops the server. */
  async close(): Promise<void> {
    clearInterval(this.ticker);
    await this.worker.terminate();
  }

  private set(reason: string): void {
    if (reason !== this.reason) {
      this.reason = reason;
      this.worker.postMessage({ reason });
    }
  }

  private beat(): void {
    this.tick[0] = Date.now();
  }
}
