import assert from "node:assert/strict";
import { test } from "node:test";

import { ConfigError, parseAddress } from "../../src/index.js";
import { resolveConnection } from "../../src/config.js";

test("addresses with or without a scheme", () => {
  assert.deepEqual(parseAddress("127.0.0.1:9090"), { target: "127.0.0.1:9090", scheme: undefined });
  assert.deepEqual(parseAddress("http://localhost:9090"), { target: "localhost:9090", scheme: "http" });
  assert.deepEqual(parseAddress(" https://ctrlhub.ctrlhub-system.svc:9090/ "), {
    target: "ctrlhub.ctrlhub-system.svc:9090",
    scheme: "https",
  });
  assert.deepEqual(parseAddress("[::1]:9090"), { target: "[::1]:9090", scheme: undefined });
});

test("bad addresses say what is wrong and what is expected", () => {
  const cases: Array<[string, RegExp]> = [
    ["", /it is empty/],
    ["127.0.0.1", /the port is missing/],
    ["http://127.0.0.1", /the port is missing/],
    ["grpc://127.0.0.1:9090", /the scheme "grpc" is not supported/],
    ["127.0.0.1:0", /not between 1 and 65535/],
    ["127.0.0.1:70000", /not between 1 and 65535/],
    ["127.0.0.1:9090/api", /has a path/],
    ["http://[::1:9090", /not a host and port/],
    ["a b:1", /not a host and port/],
  ];
  for (const [address, why] of cases) {
    assert.throws(
      () => parseAddress(address),
      (err: unknown) =>
        err instanceof ConfigError && why.test(err.message) && err.message.includes("expected host:port, http://host:port or https://host:port"),
      address,
    );
  }
});

test("connection defaults come from the environment", () => {
  const c = resolveConnection({}, {});
  assert.equal(c.target, "127.0.0.1:9090");
  assert.equal(c.display, "http://127.0.0.1:9090");
  assert.equal(c.token, "dev");
  assert.equal(c.tls, undefined);
  const e = resolveConnection({}, { CTRLHUB_ADDR: "https://m:443", CTRLHUB_TOKEN_FILE: "/t", CTRLHUB_TLS_CA_FILE: "/ca.pem" });
  assert.equal(e.display, "https://m:443");
  assert.equal(e.tokenFile, "/t");
  assert.deepEqual(e.tls, { caFile: "/ca.pem" });
  // Options win over the environment.
  assert.equal(resolveConnection({ address: "x:1" }, { CTRLHUB_ADDR: "y:2" }).target, "x:1");
});

test("inconsistent TLS settings are refused", () => {
  assert.throws(() => resolveConnection({ address: "http://m:1", tls: { caFile: "/ca" } }, {}), /is http:\/\/; use https:\/\//);
  assert.throws(() => resolveConnection({ address: "https://m:1", tls: false }, {}), /tls is false/);
  assert.throws(() => resolveConnection({ address: "m:1", tls: { certFile: "/c" } }, {}), /needs its key/);
  assert.throws(() => resolveConnection({}, { CTRLHUB_TLS_KEY_FILE: "/k" }), /needs its key/);
  assert.deepEqual(resolveConnection({ address: "m:1", tls: true }, {}).tls, {});
});

test("tokens must be sendable as metadata", () => {
  assert.throws(() => resolveConnection({ token: "a b" }, {}), ConfigError);
  assert.throws(() => resolveConnection({ token: "bad\ntoken" }, {}), ConfigError);
  // A token file is only read when connecting.
  assert.equal(resolveConnection({ tokenFile: "/nonexistent" }, {}).tokenFile, "/nonexistent");
});
