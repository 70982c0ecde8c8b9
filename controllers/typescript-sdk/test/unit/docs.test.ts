// What the README and the deploy example say, checked against the code: the Website example's
// line count, every CTRLHUB_* variable named is one the SDK reads, and the deploy example probes
// the health endpoint where CTRLHUB_HEALTH_ADDR makes it listen, with the RBAC the operator needs.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import * as k8s from "@kubernetes/client-node";

import { STOP_GRACE_MS } from "../../src/controller.js";
import { REPO } from "../support.js";

const SDK = join(REPO, "controllers/typescript-sdk");
const README = readFileSync(join(SDK, "README.md"), "utf8");
const EXAMPLE = join(REPO, "deploy/examples/typescript-website");

test("the README states the Website example's line count, within the issue's budget of 120", () => {
  const lines = readFileSync(join(SDK, "examples/website.ts"), "utf8").replace(/\n$/, "").split("\n");
  const nonBlank = lines.filter((l) => l.trim() !== "");
  assert.ok(lines.length <= 120, `${lines.length} lines`);
  assert.ok(README.includes(`**${lines.length} lines**`), `the README says **${lines.length} lines**`);
  assert.ok(README.includes(`(${nonBlank.length} non-blank`), `the README says (${nonBlank.length} non-blank`);
});

test("every CTRLHUB_* variable the README and the deploy example name is one the SDK reads", () => {
  const read = new Set<string>();
  for (const file of readdirSync(join(SDK, "src")).filter((f) => f.endsWith(".ts"))) {
    for (const m of readFileSync(join(SDK, "src", file), "utf8").matchAll(/"(CTRLHUB_[A-Z0-9_]*[A-Z0-9])"/g)) {
      read.add(m[1] as string);
    }
  }
  for (const v of ["CA_FILE", "CERT_FILE", "KEY_FILE", "SERVER_NAME"]) {
    read.add(`CTRLHUB_TLS_${v}`); // built from a prefix
  }
  read.add("CTRLHUB_BIN"); // the integration tests' override of the manager binary
  for (const v of ["CTRLHUB_ADDR", "CTRLHUB_TOKEN_FILE", "CTRLHUB_REVISION", "CTRLHUB_LOG", "CTRLHUB_LOG_FORMAT", "CTRLHUB_HEALTH_ADDR"]) {
    assert.ok(read.has(v), `the SDK reads ${v}`);
    assert.ok(README.includes(v), `the README documents ${v}`);
  }
  const texts = [README, ...readdirSync(EXAMPLE).map((f) => readFileSync(join(EXAMPLE, f), "utf8"))];
  for (const text of texts) {
    const unknown = [...text.matchAll(/\bCTRLHUB_[A-Z0-9_]*[A-Z0-9]\b/g)].map((m) => m[0]).filter((v) => !read.has(v));
    assert.deepEqual(unknown, [], "names nothing reads");
  }
  assert.ok(!/@ctrlhub\/sdk\/kubernetes|finalize\(objects/.test(README), "no API that is gone");
});

test("the deploy example probes the health port and grants what the Website operator does", () => {
  const docs = readdirSync(EXAMPLE)
    .filter((f) => f.endsWith(".yaml"))
    .flatMap((f) => k8s.loadAllYaml(readFileSync(join(EXAMPLE, f), "utf8")) as Array<{ kind?: string }>);
  const deployments = docs.filter((d) => d.kind === "Deployment") as k8s.V1Deployment[];
  assert.equal(deployments.length, 1);
  const pod = deployments[0]?.spec?.template.spec;
  const container = pod?.containers[0];
  assert.ok(container);
  const env = new Map((container.env ?? []).map((e) => [e.name, e.value]));
  const port = Number(env.get("CTRLHUB_HEALTH_ADDR")?.split(":").at(-1));
  const ports = new Map((container.ports ?? []).map((p) => [p.name, p.containerPort]));
  assert.equal(ports.get("health"), port);
  assert.deepEqual({ ...container.livenessProbe?.httpGet }, { path: "/healthz", port: "health" });
  assert.deepEqual({ ...container.readinessProbe?.httpGet }, { path: "/readyz", port: "health" });
  assert.equal(env.get("CTRLHUB_LOG_FORMAT"), "json");
  assert.ok(env.has("POD_NAME"), "the Events' reportingInstance");
  assert.ok((pod?.terminationGracePeriodSeconds ?? 30) * 1000 > STOP_GRACE_MS, "longer than the SDK's stop grace");

  const rules = (docs.filter((d) => d.kind === "ClusterRole") as k8s.V1ClusterRole[]).flatMap((r) => r.rules ?? []);
  const granted = new Set(rules.flatMap((r) => (r.apiGroups ?? []).flatMap((g) => (r.resources ?? []).flatMap((res) => r.verbs.map((v) => `${g}/${res}/${v}`)))));
  const needed = [
    "example.ctrlhub.io/websites/watch", "example.ctrlhub.io/websites/patch", "example.ctrlhub.io/websites/status/patch",
    "apps/deployments/watch", "apps/deployments/patch", "/services/watch", "/services/patch",
    "/configmaps/create", "/configmaps/patch", "events.k8s.io/events/create", "events.k8s.io/events/patch",
  ];
  assert.deepEqual(needed.filter((n) => !granted.has(n)), [], "granted");
});
