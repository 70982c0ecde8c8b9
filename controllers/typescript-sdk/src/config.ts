import { readFile } from "node:fs/promises";

import * as grpc from "@grpc/grpc-js";

import { ConfigError } from "./errors.js";

/** The manager address of `ctrlhub dev`. */
export const DEFAULT_ADDRESS = "127.0.0.1:9090";
/** The static token `ctrlhub dev` (and `ctrlhub run --auth static`) accepts unless told otherwise. */
export const DEFAULT_TOKEN = "dev";

/**
 * PEM files for TLS to the manager. They are read again on every connect, so certificates
 * rotated on disk (cert-manager, a projected Secret) take effect at the next reconnect.
 */
export interface TlsOptions {
  /**
   * The CA that signed the manager's serving certificate (env `CTRLHUB_TLS_CA_FILE`).
   * Unset: Node's default trust store.
   */
  readonly caFile?: string;
  /**
   * This controller's client certificate, for a manager started with `--grpc-client-ca`
   * (mutual TLS; env `CTRLHUB_TLS_CERT_FILE`). Needs {@link TlsOptions.keyFile}.
   */
  readonly certFile?: string;
  /** The client certificate's private key (env `CTRLHUB_TLS_KEY_FILE`). */
  readonly keyFile?: string;
  /**
   * The name to verify in the manager's certificate when it differs from the address's host
   * (env `CTRLHUB_TLS_SERVER_NAME`).
   */
  readonly serverName?: string;
}

/** Where the manager is and how to authenticate to it. Every field has a default. */
export interface ConnectionOptions {
  /**
   * The manager's gRPC endpoint as `host:port`, `http://host:port` (plaintext) or
   * `https://host:port` (TLS). Default: env `CTRLHUB_ADDR`, else `127.0.0.1:9090`.
   */
  readonly address?: string;
  /** A static bearer token. Default: env `CTRLHUB_TOKEN`, else `dev`. */
  readonly token?: string;
  /**
   * A file holding the bearer token, read again on every connect and every cached read, e.g.
   * a projected ServiceAccount token that the kubelet rotates (env `CTRLHUB_TOKEN_FILE`).
   * Takes precedence over {@link ConnectionOptions.token}.
   */
  readonly tokenFile?: string;
  /**
   * TLS to the manager. `true` (or an `https://` address) verifies the manager against
   * Node's default trust store; {@link TlsOptions} names the files. Default: the
   * `CTRLHUB_TLS_*` variables, else plaintext.
   */
  readonly tls?: boolean | TlsOptions;
  /** HTTP/2 keepalive ping interval, so that a dead peer is noticed. Default 30 s. */
  readonly keepaliveMs?: number;
}

/** @internal Settings after validation. */
export interface Connection {
  readonly target: string;
  readonly display: string;
  readonly tls: TlsOptions | undefined;
  readonly token: string;
  readonly tokenFile: string | undefined;
  readonly keepaliveMs: number;
}

/** A parsed manager address. */
export interface ParsedAddress {
  /** `host:port` as gRPC dials it (IPv6 hosts in brackets). */
  readonly target: string;
  /** The scheme given: `http`, `https`, or `undefined` for a bare `host:port`. */
  readonly scheme: "http" | "https" | undefined;
}

const ADDRESS = /^(?:([A-Za-z][A-Za-z0-9+.-]*):\/\/)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d+))?\/?$/;

/**
 * Parses a manager address given as `host:port`, `http://host:port` or `https://host:port`.
 *
 * @throws {@link ConfigError} naming what is wrong and what is expected.
 */
export function parseAddress(address: string): ParsedAddress {
  const text = address.trim();
  const expected = "expected host:port, http://host:port or https://host:port (e.g. 127.0.0.1:9090)";
  const fail = (why: string): never => {
    throw new ConfigError(`invalid manager address ${JSON.stringify(address)}: ${why}; ${expected}`);
  };
  if (text === "") {
    fail("it is empty");
  }
  const m = ADDRESS.exec(text);
  if (m === null) {
    fail(text.includes("/") && !text.includes("://") ? "it has a path" : "it is not a host and port");
  }
  const [, scheme, host, port] = m as RegExpExecArray;
  if (scheme !== undefined && scheme !== "http" && scheme !== "https") {
    fail(`the scheme ${JSON.stringify(scheme)} is not supported`);
  }
  if (port === undefined) {
    fail("the port is missing");
  }
  const n = Number(port);
  if (!Number.isInteger(n) || n < 1 || n > 65535) {
    fail(`the port ${port} is not between 1 and 65535`);
  }
  return { target: `${host}:${n}`, scheme: scheme as "http" | "https" | undefined };
}

/** @internal Defaults from the environment, validated. */
export function resolveConnection(
  options: ConnectionOptions = {},
  env: NodeJS.ProcessEnv = process.env,
): Connection {
  const value = (name: string): string | undefined => {
    const v = env[name];
    return v === undefined || v === "" ? undefined : v;
  };
  const address = options.address ?? value("CTRLHUB_ADDR") ?? DEFAULT_ADDRESS;
  const parsed = parseAddress(address);
  let tls: TlsOptions | undefined;
  if (options.tls === undefined) {
    const files = dropUndefined({
      caFile: value("CTRLHUB_TLS_CA_FILE"),
      certFile: value("CTRLHUB_TLS_CERT_FILE"),
      keyFile: value("CTRLHUB_TLS_KEY_FILE"),
      serverName: value("CTRLHUB_TLS_SERVER_NAME"),
    });
    tls = Object.keys(files).length > 0 || parsed.scheme === "https" ? files : undefined;
  } else if (options.tls === true) {
    tls = {};
  } else if (options.tls !== false) {
    tls = options.tls;
  }
  if (options.tls === false && parsed.scheme === "https") {
    throw new ConfigError(`${address} is https:// but tls is false; use http:// or host:port for plaintext`);
  }
  if (tls !== undefined && parsed.scheme === "http") {
    throw new ConfigError(
      `TLS is configured but the manager address ${address} is http://; use https:// or host:port`,
    );
  }
  if (tls !== undefined && (tls.certFile === undefined) !== (tls.keyFile === undefined)) {
    throw new ConfigError(
      "a client certificate needs its key and a key its certificate: set both certFile and keyFile " +
        "(CTRLHUB_TLS_CERT_FILE and CTRLHUB_TLS_KEY_FILE), or neither",
    );
  }
  const tokenFile = options.tokenFile ?? value("CTRLHUB_TOKEN_FILE");
  const token = options.token ?? value("CTRLHUB_TOKEN") ?? DEFAULT_TOKEN;
  if (tokenFile === undefined) {
    bearer(token);
  }
  const keepaliveMs = options.keepaliveMs ?? 30_000;
  if (!Number.isFinite(keepaliveMs) || keepaliveMs <= 0) {
    throw new ConfigError(`keepaliveMs must be positive, not ${keepaliveMs}`);
  }
  return {
    target: parsed.target,
    display: `${tls === undefined ? "http" : "https"}://${parsed.target}`,
    tls,
    token,
    tokenFile,
    keepaliveMs,
  };
}

/** @internal `authorization` metadata with the token as it is now (the file read again). */
export async function authMetadata(c: Connection): Promise<grpc.Metadata> {
  let token = c.token;
  if (c.tokenFile !== undefined) {
    try {
      token = (await readFile(c.tokenFile, "utf8")).trim();
    } catch (err) {
      throw new ConfigError(`reading the token file ${c.tokenFile}: ${(err as Error).message}`);
    }
  }
  const md = new grpc.Metadata();
  md.set("authorization", bearer(token));
  return md;
}

function bearer(token: string): string {
  if (token === "" || !/^[\x21-\x7e]+$/.test(token)) {
    throw new ConfigError("the token must be non-empty printable ASCII without spaces");
  }
  return `Bearer ${token}`;
}

/** @internal Channel credentials and options for one session, with the TLS files read now. */
export async function channelSettings(
  c: Connection,
): Promise<{ credentials: grpc.ChannelCredentials; options: grpc.ChannelOptions }> {
  const options: grpc.ChannelOptions = {
    // A new connection for every session: the Service in front of the managers picks the
    // leader per TCP connection, and grpc-js would otherwise share the connection to a manager
    // that stepped down between channels to the same target.
    "grpc.use_local_subchannel_pool": 1,
    "grpc.keepalive_time_ms": c.keepaliveMs,
    "grpc.keepalive_timeout_ms": 10_000,
    "grpc.keepalive_permit_without_calls": 1,
    // The SDK reconnects with its own backoff; grpc-js must not retry behind its back.
    "grpc.enable_retries": 0,
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
  };
  if (c.tls === undefined) {
    return { credentials: grpc.credentials.createInsecure(), options };
  }
  const read = async (what: string, path: string | undefined): Promise<Buffer | null> => {
    if (path === undefined) {
      return null;
    }
    try {
      return await readFile(path);
    } catch (err) {
      throw new ConfigError(`reading the TLS ${what} ${path}: ${(err as Error).message}`);
    }
  };
  const [ca, cert, key] = await Promise.all([
    read("CA", c.tls.caFile),
    read("certificate", c.tls.certFile),
    read("key", c.tls.keyFile),
  ]);
  if (c.tls.serverName !== undefined) {
    options["grpc.ssl_target_name_override"] = c.tls.serverName;
    options["grpc.default_authority"] = c.tls.serverName;
  }
  let credentials: grpc.ChannelCredentials;
  try {
    credentials = grpc.credentials.createSsl(ca, key, cert);
  } catch (err) {
    throw new ConfigError(`invalid TLS files: ${(err as Error).message}`);
  }
  return { credentials, options };
}

function dropUndefined(o: Record<string, string | undefined>): TlsOptions {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as TlsOptions;
}
