// The README's install lines, run verbatim (read from between its `install:begin` and
// `install:end` markers, so the two cannot drift) in a new directory outside the repository,
// against a copy of the SDK's sources without node_modules or dist (a fresh clone): then a
// handler using the write helpers compiles with tsc (`skipLibCheck: false`, without the optional
// `@opentelemetry/api`) and runs on this Node (20 in CI: client-node 2.x would crash on import).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join, relative, sep } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { REPO, tempDir } from "../support.js";

const run = promisify(execFile);
const SDK = join(REPO, "controllers/typescript-sdk");

/** The shell lines of the README's install block. */
export function installLines(readme: string): string {
  const m = /<!-- install:begin -->\s*```sh\n([\s\S]*?)```\s*<!-- install:end -->/.exec(readme);
  assert.ok(m?.[1], "the README has an install block between <!-- install:begin --> and <!-- install:end -->");
  return m[1];
}

/** The environment of a user's shell: nothing of this npm run, no path into the repository. */
function userEnv(clone: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!/^npm_|^NODE_PATH$|^INIT_CWD$/i.test(k)) {
      env[k] = v;
    }
  }
  env["PATH"] = (process.env["PATH"] ?? "").split(":").filter((p) => !p.includes("node_modules") && !p.startsWith(REPO)).join(":");
  return { ...env, CTRLHUB: clone, npm_config_audit: "false", npm_config_fund: "false", npm_config_update_notifier: "false" };
}

/** Every `@kubernetes/client-node` package under `dir`'s node_modules, as `path@version`. */
function clientNodeCopies(dir: string): string[] {
  const found: string[] = [];
  const walk = (modules: string): void => {
    if (!existsSync(modules)) {
      return;
    }
    for (const entry of readdirSync(modules, { withFileTypes: true })) {
      if (!entry.isDirectory()) {
        continue;
      }
      const scoped = entry.name.startsWith("@")
        ? readdirSync(join(modules, entry.name), { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => join(entry.name, e.name))
        : [entry.name];
      for (const name of scoped) {
        const pkg = join(modules, name);
        if (name === join("@kubernetes", "client-node")) {
          found.push(`${relative(dir, pkg)}@${(JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")) as { version: string }).version}`);
        }
        walk(join(pkg, "node_modules"));
      }
    }
  };
  walk(join(dir, "node_modules"));
  return found;
}

const OPERATOR = `import type * as k8s from "@kubernetes/client-node";
import { Action, controller, isConflict, isNotFound, kinds, withSignal } from "@ctrlhub/sdk";

const c = controller("install-check")
  .for(kinds.ConfigMap)
  .owns(kinds.Deployment)
  .includeObject()
  .reconcile(async (req) => {
    const cm: k8s.V1ConfigMap | undefined = req.object;
    if (cm === undefined) return Action.done();
    if (await req.finalizers.finalize(cm, "example.com/f", async () => {})) return Action.done();
    await req.finalizers.ensure(cm, "example.com/f");
    const child: k8s.V1Deployment = { apiVersion: "apps/v1", kind: "Deployment", metadata: { name: req.name } };
    const applied: k8s.V1Deployment = await req.apply(req.adopt(child, cm));
    const d = await req.reader.get(kinds.Deployment, { namespace: req.namespace, name: req.name });
    await req.patchStatus(applied, { readyReplicas: d?.status?.readyReplicas ?? 0 });
    req.events.info(cm, "Seen", "ok");
    try {
      await req.kubeConfig.makeApiClient((await import("@kubernetes/client-node")).CoreV1Api)
        .readNamespacedConfigMap({ name: "x", namespace: req.namespace }, withSignal(req.signal));
    } catch (err) {
      if (!isNotFound(err) && !isConflict(err)) throw err;
    }
    return Action.requeueAfter(1000);
  });
console.log(\`defined \${c.name}\`);
`;

const TSCONFIG = {
  compilerOptions: {
    target: "ES2022",
    module: "NodeNext",
    moduleResolution: "NodeNext",
    strict: true,
    skipLibCheck: false,
    types: ["node"],
    outDir: "out",
  },
  include: ["operator.ts"],
};

test("the README's install lines give a project that compiles with skipLibCheck off and runs on this Node", { timeout: 300_000 }, async () => {
  const root = tempDir("install");
  assert.ok(!root.startsWith(REPO + sep), "the project lives outside the repository");
  try {
    // A fresh clone: the SDK's sources and proto/, no node_modules, no dist, no generated code.
    const clone = join(root, "ctrlhub");
    cpSync(join(REPO, "proto"), join(clone, "proto"), { recursive: true });
    cpSync(SDK, join(clone, "controllers/typescript-sdk"), {
      recursive: true,
      filter: (src) => !/[/\\](node_modules|dist|gen)([/\\]|$)|\.tgz$/.test(relative(SDK, src) === "" ? "" : `/${relative(SDK, src)}`),
    });
    const work = join(root, "work");
    mkdirSync(work);

    const lines = installLines(readFileSync(join(SDK, "README.md"), "utf8"));
    const t0 = Date.now();
    await run("bash", ["-euo", "pipefail", "-c", lines], { cwd: work, env: userEnv(clone), maxBuffer: 64 << 20 }).catch((err: unknown) => {
      const e = err as { stdout?: string; stderr?: string; message: string };
      throw new Error(`the README's install lines failed:\n${lines}\n${e.message}\n${e.stdout ?? ""}\n${e.stderr ?? ""}`);
    });
    const installMs = Date.now() - t0;

    const project = join(work, "my-operator");
    const sdk = join(project, "node_modules/@ctrlhub/sdk");
    assert.ok(existsSync(join(sdk, "dist/src/index.d.ts")), "the SDK is installed with its declarations");
    assert.ok(!existsSync(join(sdk, "node_modules")), "the SDK brings no node_modules of its own");
    const copies = clientNodeCopies(project);
    assert.equal(copies.length, 1, `one @kubernetes/client-node: ${copies.join(", ")}`);
    assert.match(copies[0] ?? "", /@1\.\d+\.\d+$/, "client-node 1.x (2.x needs Node 22)");
    assert.ok(!existsSync(join(project, "node_modules/@opentelemetry/api")), "the optional @opentelemetry/api is not installed");
    for (const file of readdirSync(join(sdk, "dist/src"), { recursive: true, encoding: "utf8" })) {
      assert.ok(!file.endsWith(".map"), `no source map in the package: ${file}`);
      if (file.endsWith(".d.ts")) {
        const text = readFileSync(join(sdk, "dist/src", file), "utf8");
        assert.ok(!/from ["']@opentelemetry|import\(["']@opentelemetry/.test(text), `${file} imports no optional package`);
        assert.ok(!text.includes("@internal"), `${file} shows no @internal member (stripInternal)`);
      }
    }

    writeFileSync(join(project, "operator.ts"), OPERATOR);
    writeFileSync(join(project, "tsconfig.json"), JSON.stringify(TSCONFIG, null, 2));
    const tsc = join(project, "node_modules/typescript/bin/tsc");
    await run(process.execPath, [tsc, "-p", "."], { cwd: project, env: userEnv(clone) }).catch((err: unknown) => {
      const e = err as { stdout?: string; stderr?: string; message: string };
      throw new Error(`tsc failed in the installed project:\n${e.stdout ?? ""}${e.stderr ?? ""}`);
    });
    const { stdout } = await run(process.execPath, [join(project, "out/operator.js")], { cwd: project, env: userEnv(clone) });
    assert.equal(stdout.trim(), "defined install-check");
    process.stderr.write(`# install lines ran in ${installMs} ms\n`);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
