// Real parts for the integration tests: the devcluster binary (an in-memory Kubernetes API
// server over HTTPS) and the real `ctrlhub` manager binary on loopback gRPC, both from the
// cargo target directory (`cargo build --workspace --bins`). Nothing here mocks the manager.
import { type ChildProcess, spawn } from "node:child_process";
import { createWriteStream, existsSync, mkdtempSync } from "node:fs";
import { type Server, type Socket, connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import * as k8s from "@kubernetes/client-node";

import {
  type Controller,
  type LogLevel,
  type Logger,
  type RegisteredInfo,
  type RunOptions,
  type SessionEndInfo,
  consoleLogger,
} from "../src/index.js";

/** The repository root (this file is dist/test/support.js of controllers/typescript-sdk). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** The same bound as the Rust suites' PATIENCE. */
export const PATIENCE_MS = 60_000;

/** A cargo-built binary of this repository. */
export function binary(name: string): string {
  const override = process.env[`${name.toUpperCase()}_BIN`];
  if (override) {
    return override;
  }
  const target = process.env["CARGO_TARGET_DIR"] ?? join(REPO, "target");
  const path = join(target, "debug", name);
  if (!existsSync(path)) {
    throw new Error(`${path} not found; run \`cargo build --workspace --bins\` first`);
  }
  return path;
}

/** Polls `probe` until it returns a value other than undefined, or fails after `timeoutMs`. */
export async function waitFor<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, timeoutMs = PATIENCE_MS): Promise<T> {
  const start = Date.now();
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) {
        return value;
      }
    } catch (err) {
      last = err;
    }
    if (Date.now() - start > timeoutMs) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    }
    await sleep(20);
  }
}

/** Binds `port` (0: any) on loopback and releases it; its number, or null if taken. */
function tryPort(port: number): Promise<number | null> {
  return new Promise((ok) => {
    const server = createServer();
    server.once("error", () => ok(null));
    server.listen(port, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => ok(typeof address === "object" && address !== null ? address.port : null));
    });
  });
}

/**
 * A free loopback TCP port for a process started next, below Linux's ephemeral range
 * (32768-60999), where no outgoing connection or bind(0) of another process can take it before
 * that process binds; picked at random so suites running side by side rarely meet.
 */
export async function freePort(): Promise<number> {
  for (let i = 0; i < 64; i++) {
    const port = await tryPort(20000 + Math.floor(Math.random() * 12768));
    if (port !== null) return port;
  }
  const any = await tryPort(0);
  if (any === null) throw new Error("no free loopback port");
  return any;
}

/** A child process whose stderr goes to a log file; `stop()` sends SIGTERM and waits. */
export class Proc {
  readonly exited: Promise<number | null>;
  private code: number | null | undefined;

  constructor(readonly child: ChildProcess, readonly log: string) {
    this.exited = new Promise((ok) => child.once("exit", (code, signal) => ok((this.code = code ?? (signal ? null : 0)))));
  }

  get running(): boolean {
    return this.code === undefined;
  }

  signal(sig: NodeJS.Signals): void {
    if (this.running) {
      this.child.kill(sig);
    }
  }

  async stop(timeoutMs = 20_000): Promise<number | null> {
    this.signal("SIGTERM");
    const timer = setTimeout(() => this.signal("SIGKILL"), timeoutMs);
    try {
      return await this.exited;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** Spawns `bin args` with stdout piped (when `pipeStdout`) and stderr to a log file. */
export function start(bin: string, args: string[], env: NodeJS.ProcessEnv, log: string, pipeStdout = false): Proc {
  const child = spawn(bin, args, { env, stdio: ["ignore", pipeStdout ? "pipe" : "ignore", "pipe"] });
  child.stderr?.pipe(createWriteStream(log));
  return new Proc(child, log);
}

/** A temporary directory of this test run. */
export function tempDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `ctrlhub-ts-${prefix}-`));
}

/** A running devcluster: its kubeconfig and an API client. */
export interface Cluster {
  readonly url: string;
  readonly kubeconfig: string;
  readonly kc: k8s.KubeConfig;
  readonly core: k8s.CoreV1Api;
  readonly proc: Proc;
}

/** Starts `devcluster --listen 127.0.0.1:0` and waits for its ready line. */
export async function startDevcluster(): Promise<Cluster> {
  const dir = tempDir("devcluster");
  const kubeconfig = join(dir, "kubeconfig");
  const proc = start(binary("devcluster"), ["--listen", "127.0.0.1:0", "--kubeconfig", kubeconfig], process.env, join(dir, "devcluster.log"), true);
  const lines = createInterface({ input: proc.child.stdout as NodeJS.ReadableStream });
  const url = await new Promise<string>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error("devcluster printed nothing within 60 s")), PATIENCE_MS);
    lines.once("line", (line) => {
      clearTimeout(timer);
      const prefix = "devcluster ready at ";
      line.startsWith(prefix) ? ok(line.slice(prefix.length).trim()) : fail(new Error(`unexpected devcluster line ${line}`));
    });
    void proc.exited.then((code) => fail(new Error(`devcluster exited with ${code}`)));
  });
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  return { url, kubeconfig, kc, core: kc.makeApiClient(k8s.CoreV1Api), proc };
}

/** A running `ctrlhub run` manager. */
export interface Manager {
  readonly grpc: string;
  readonly http: string;
  readonly proc: Proc;
  readonly identity: string;
  status(): Promise<Record<string, unknown>>;
}

/**
 * Starts `ctrlhub run` with static token `dev` (plus `extra` flags and `env` variables) and
 * waits until it leads.
 */
export async function startManager(
  cluster: Cluster,
  identity: string,
  extra: string[] = [],
  port?: number,
  extraEnv: NodeJS.ProcessEnv = {},
): Promise<Manager> {
  const [grpcPort, httpPort] = [port ?? (await freePort()), await freePort()];
  const dir = tempDir("manager");
  const env: NodeJS.ProcessEnv = { ...process.env, RUST_LOG: "info,ctrlhub=debug" };
  delete env["OTEL_EXPORTER_OTLP_ENDPOINT"];
  delete env["WATCH_NAMESPACE"];
  Object.assign(env, extraEnv);
  const proc = start(
    binary("ctrlhub"),
    [
      "run",
      "--kubeconfig", cluster.kubeconfig,
      "--grpc-addr", `127.0.0.1:${grpcPort}`,
      "--http-addr", `127.0.0.1:${httpPort}`,
      "--token", "dev",
      "--identity", identity,
      ...extra,
    ],
    env,
    join(dir, `ctrlhub-${identity}.log`),
  );
  const http = `http://127.0.0.1:${httpPort}`;
  const status = async (): Promise<Record<string, unknown>> => (await (await fetch(`${http}/status`)).json()) as Record<string, unknown>;
  await waitFor(`manager ${identity} leads (log ${proc.log})`, async () => {
    if (!proc.running) {
      throw new Error(`manager exited; see ${proc.log}`);
    }
    return (await status())["leading"] === true ? true : undefined;
  });
  return { grpc: `127.0.0.1:${grpcPort}`, http, proc, identity, status };
}

/** The controllers of the manager's `/status`. */
export async function controllers(m: Manager): Promise<Array<Record<string, unknown>>> {
  return ((await m.status())["controllers"] as Array<Record<string, unknown>> | undefined) ?? [];
}

/** Creates namespace `name`. */
export async function namespace(c: Cluster, name: string): Promise<void> {
  await c.core.createNamespace({ body: { metadata: { name } } });
}

/** Creates a ConfigMap. */
export async function configMap(
  c: Cluster,
  ns: string,
  name: string,
  data: Record<string, string> = {},
  labels: Record<string, string> = {},
): Promise<k8s.V1ConfigMap> {
  return c.core.createNamespacedConfigMap({ namespace: ns, body: { metadata: { name, labels }, data } });
}

/** A controller running in this process, with what its sessions reported. */
export interface Running {
  readonly registrations: RegisteredInfo[];
  readonly ends: SessionEndInfo[];
  /** Settles when `run` does. */
  readonly done: Promise<void>;
  /** Resolves once `n` sessions have registered. */
  registered(n?: number): Promise<RegisteredInfo>;
  /** Drains and waits for `run` to resolve. */
  stop(): Promise<void>;
}

/** Runs `c` against `m` (quiet logs), returning once it has registered. */
export async function runController<T>(c: Controller<T>, m: Manager | string, options: RunOptions = {}): Promise<Running> {
  const registrations: RegisteredInfo[] = [];
  const ends: SessionEndInfo[] = [];
  let settled = false;
  const done = c
    .run({
      address: typeof m === "string" ? m : m.grpc,
      handleSignals: false,
      logger: consoleLogger(c.name, (process.env["CTRLHUB_TEST_LOG"] as LogLevel | undefined) ?? "error"),
      reconnect: { initialMs: 50, maxMs: 500 },
      ...options,
      onRegistered: (r) => registrations.push(r),
      onSessionEnd: (e) => ends.push(e),
    })
    .finally(() => (settled = true));
  done.catch(() => {}); // observed by the test through `done`
  const registered = (n = 1): Promise<RegisteredInfo> =>
    waitFor(`${c.name}: ${n} registration(s)`, () => {
      if (settled && registrations.length < n) {
        throw new Error(`${c.name}: run settled after ${registrations.length} registration(s)`);
      }
      return registrations[n - 1];
    });
  const handle: Running = {
    registrations,
    ends,
    done,
    registered,
    stop: async () => {
      c.stop();
      await done;
    },
  };
  if (options.tokenFile === undefined || existsSync(options.tokenFile)) {
    await registered(1).catch(async (err: unknown) => {
      c.stop();
      throw err;
    });
  }
  return handle;
}

/** The manager's `/status` entry of controller `name`. */
export async function controllerStatus(m: Manager, name: string): Promise<Record<string, unknown> | undefined> {
  return (await controllers(m)).find((c) => c["name"] === name);
}

/**
 * The value of one sample on the manager's `/metrics` (0 when absent), e.g.
 * `ctrlhub_batch_size_sum{direction="received"}`: `name` with its labels exactly as printed.
 */
export async function metric(m: Manager, name: string): Promise<number> {
  const text = await (await fetch(`${m.http}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? 0 : Number(line.slice(name.length + 1));
}

/** Merge-patches a ConfigMap. */
export async function mergePatch(c: Cluster, ns: string, name: string, body: object): Promise<k8s.V1ConfigMap> {
  return c.core.patchNamespacedConfigMap({ name, namespace: ns, body }, k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch));
}

/** The manager flags of a 2 s hold (a 4 s Lease, 2 s renew deadline), as the conformance suite runs it. */
export const SHORT_HOLD = ["--lease-duration", "4s", "--renew-deadline", "2s", "--retry-period", "500ms"];

/**
 * A TCP proxy in front of a manager, playing a network that can freeze: once frozen, no byte
 * is forwarded either way on any connection (old or new), and none is closed.
 */
export class TcpProxy {
  private frozen = false;
  private readonly sockets = new Set<Socket>();

  private constructor(private readonly server: Server, readonly port: number) {}

  /** Starts forwarding 127.0.0.1:`port` (a free one) to `target` (`host:port`). */
  static async start(target: string): Promise<TcpProxy> {
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    let proxy: TcpProxy | undefined;
    const server = createServer((client) => {
      const p = proxy as TcpProxy;
      const upstream = connect(port, host);
      for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
        p.sockets.add(from);
        from.on("data", (chunk) => {
          if (!p.frozen) {
            to.write(chunk);
          }
        });
        from.on("error", () => to.destroy());
        from.on("close", () => {
          p.sockets.delete(from);
          if (!p.frozen) {
            to.destroy();
          }
        });
      }
    });
    await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
    const address = server.address();
    proxy = new TcpProxy(server, typeof address === "object" && address !== null ? address.port : 0);
    return proxy;
  }

  /** `host:port` of the proxy. */
  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** From now on nothing is forwarded; connections stay open. */
  freeze(): void {
    this.frozen = true;
  }

  /** Closes every connection and the listener. */
  close(): void {
    for (const s of this.sockets) {
      s.destroy();
    }
    this.server.close();
  }
}

/** A logger that keeps every line, for tests that look at what the SDK logs. */
export function recordingLogger(): Logger & { readonly lines: Array<{ level: string; message: string; fields: Record<string, unknown> }> } {
  const lines: Array<{ level: string; message: string; fields: Record<string, unknown> }> = [];
  const at = (level: string) => (message: string, fields: Record<string, unknown> = {}) => {
    lines.push({ level, message, fields });
  };
  return { lines, debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}
