/**
 * @internal Where the next session dials: the configured address, or the address of the ring
 * member that owns the controller when the last session was redirected there (`Rejected`
 * UNAVAILABLE with `owner_address` on Register, or `Revoked` REASON_UNIT_MOVED). A redirect is
 * followed at once, at most {@link MAX_REDIRECTS} times in a row without a `Registered`: members'
 * views of the ring can briefly differ, and two of them pointing at each other must not make a
 * storm of Registers. Every other end goes back to the configured address.
 */
import { type Connection, type TlsOptions, parseAddress } from "./config.js";
import { ConfigError } from "./errors.js";

/** Redirects followed in a row without a `Registered`; the next one is not followed. */
export const MAX_REDIRECTS = 3;

/** @internal What {@link Route.follow} decided. */
export type Hop =
  | { readonly followed: true; readonly connection: Connection; readonly count: number }
  | { readonly followed: false; readonly why: string };

/** @internal The address the next session dials, and the redirects followed in a row. */
export class Route {
  private current: Connection;
  private inARow = 0;

  constructor(readonly configured: Connection) {
    this.current = configured;
  }

  /** The connection the next session dials. */
  get connection(): Connection {
    return this.current;
  }

  /** A session reached `Registered`: a later redirect is the first in a row again. */
  registered(): void {
    this.inARow = 0;
  }

  /**
   * A session was redirected to `address` (`host:port`): the next session dials it, unless
   * {@link MAX_REDIRECTS} were followed in a row already or the address is not one; then the
   * next session dials the configured address (after the caller's backoff).
   */
  follow(address: string): Hop {
    if (this.inARow >= MAX_REDIRECTS) {
      this.back();
      return {
        followed: false,
        why: `not following a redirect after ${MAX_REDIRECTS} in a row without Registered (the members' views of the ring ` +
          `may differ for a moment); back to the configured address ${this.configured.display}`,
      };
    }
    let connection: Connection;
    try {
      connection = redirected(this.configured, address);
    } catch (err) {
      this.back();
      const why = err instanceof ConfigError ? err.message : String(err);
      return { followed: false, why: `not following the redirect (${why}); back to the configured address ${this.configured.display}` };
    }
    this.current = connection;
    this.inARow++;
    return { followed: true, connection, count: this.inARow };
  }

  /** Any end other than a redirect: the next session dials the configured address. */
  back(): void {
    this.current = this.configured;
    this.inARow = 0;
  }
}

/**
 * @internal `configured` with the target `address` (a ring member's `host:port`; a scheme, if
 * any, is ignored): the same token and TLS files, but the TLS server name is the member's host
 * (a configured `serverName` names the configured address' certificate, not the member's).
 *
 * @throws {@link ConfigError} when `address` is not a `host:port`.
 */
export function redirected(configured: Connection, address: string): Connection {
  const { target } = parseAddress(address);
  const tls = configured.tls === undefined ? undefined : withoutServerName(configured.tls);
  return { ...configured, target, tls, display: `${tls === undefined ? "http" : "https"}://${target}` };
}

function withoutServerName(tls: TlsOptions): TlsOptions {
  const { serverName: _, ...rest } = tls;
  return rest;
}
