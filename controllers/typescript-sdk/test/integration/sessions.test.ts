// Sessions across manager restarts, token files and TLS, against real managers.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Action, type SessionEndInfo, consoleLogger, controller, kinds } from "../../src/index.js";
import {
  type Cluster,
  configMap,
  freePort,
  namespace,
  runController,
  startDevcluster,
  startManager,
  tempDir,
  waitFor,
} from "../support.js";

let cluster: Cluster;

before(async () => {
  cluster = await startDevcluster();
});

after(async () => {
  await cluster?.proc.stop();
});

test("the token file is read on every connect, and a manager restart is survived", async () => {
  await namespace(cluster, "restart");
  const port = await freePort();
  let manager = await startManager(cluster, "ts-restart-1", [], port);
  const tokenFile = join(tempDir("token"), "token");
  const seen: string[] = [];
  const c = controller("restart")
    .for(kinds.ConfigMap)
    .inNamespaces("restart")
    .reconcile((req) => {
      seen.push(req.name);
      return Action.done();
    });
  // No token file yet: connecting fails and is retried until it appears.
  const r = await runController(c, manager, { tokenFile });
  try {
    await waitFor("attempts without a token", () => (r.ends.length >= 2 ? true : undefined));
    assert.equal(r.registrations.length, 0);
    assert.match(r.ends[0]?.reason ?? "", /reading the token file/);
    writeFileSync(tokenFile, "dev\n");
    await r.registered(1);

    await manager.proc.stop(); // SIGTERM: Revoked(SHUTTING_DOWN), then the port closes
    await configMap(cluster, "restart", "while-down");
    const endsBefore = r.ends.length;
    await waitFor("retries while no manager runs", () => (r.ends.length >= endsBefore + 3 ? true : undefined));
    manager = await startManager(cluster, "ts-restart-2", [], port);
    await r.registered(2);
    await waitFor("the key created meanwhile is reconciled", () => (seen.includes("while-down") ? true : undefined));
    assert.notEqual(r.registrations[0]?.sessionId, r.registrations[1]?.sessionId);
    assert.match(r.ends.find((e) => e.registered)?.reason ?? "", /SHUTTING_DOWN/);
  } finally {
    await r.stop();
    await manager.proc.stop();
  }
});

function openssl(dir: string, ...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
}

/** A CA, a server certificate for 127.0.0.1, and a client CA with one client certificate. */
function certificates(): string {
  const dir = tempDir("tls");
  for (const ca of ["ca", "client-ca"]) {
    openssl(dir, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
      "-subj", `/CN=${ca}`, "-keyout", `${ca}.key`, "-out", `${ca}.pem`);
  }
  const leaf = (name: string, ca: string, ext: string): void => {
    openssl(dir, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", `/CN=${name}`,
      "-keyout", `${name}.key`, "-out", `${name}.csr`);
    writeFileSync(join(dir, `${name}.ext`), ext);
    openssl(dir, "x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.pem`, "-CAkey", `${ca}.key`, "-CAcreateserial",
      "-days", "1", "-extfile", `${name}.ext`, "-out", `${name}.pem`);
  };
  leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:ctrlhub.test\nextendedKeyUsage=serverAuth\n");
  leaf("client", "client-ca", "extendedKeyUsage=clientAuth\n");
  return dir;
}

test("mutual TLS: a client certificate from the client CA is admitted, none is refused", async () => {
  const dir = certificates();
  const manager = await startManager(cluster, "ts-mtls", [
    "--grpc-tls-cert", join(dir, "server.pem"),
    "--grpc-tls-key", join(dir, "server.key"),
    "--grpc-client-ca", join(dir, "client-ca.pem"),
  ]);
  try {
    const ok = await runController(controller("mtls").for(kinds.ConfigMap).reconcile(() => undefined), `https://${manager.grpc}`, {
      tls: { caFile: join(dir, "ca.pem"), certFile: join(dir, "client.pem"), keyFile: join(dir, "client.key") },
    });
    await ok.stop();
    // The name in the certificate rather than the address's.
    const named = await runController(controller("mtls-named").for(kinds.ConfigMap).reconcile(() => undefined), manager.grpc, {
      tls: { caFile: join(dir, "ca.pem"), certFile: join(dir, "client.pem"), keyFile: join(dir, "client.key"), serverName: "ctrlhub.test" },
    });
    await named.stop();

    const anonymous = controller("anonymous").for(kinds.ConfigMap).reconcile(() => undefined);
    const ends: SessionEndInfo[] = [];
    let registered = 0;
    const running = anonymous.run({
      address: `https://${manager.grpc}`,
      tls: { caFile: join(dir, "ca.pem") },
      handleSignals: false,
      reconnect: { initialMs: 50, maxMs: 200 },
      logger: consoleLogger("anonymous", "silent"),
      onRegistered: () => registered++,
      onSessionEnd: (e) => ends.push(e),
    });
    await waitFor("two refused attempts", () => (ends.length >= 2 ? true : undefined));
    anonymous.stop();
    await running;
    assert.equal(registered, 0);
    assert.ok(ends.every((e) => !e.registered && e.code === 14), JSON.stringify(ends));
  } finally {
    await manager.proc.stop();
  }
});
