/**
 * HTTP/2 keepalive of the client's connection: ClientOptions.keepalive turned into the options of
 * Connect's Node session manager (Http2SessionManager).
 */

import type { Http2SessionOptions } from "@connectrpc/connect-node";

/**
 * HTTP/2 keepalive of the client's connection (Connect's Node session manager): PING frames that
 * find a dead connection (a server that vanished without closing it, a NAT or proxy that dropped
 * it) before a call or a stream (`watch`, `serveTools`) hangs on it. A field left out keeps its
 * default (DEFAULT_KEEPALIVE, or Connect's for `idleConnectionTimeoutMs`).
 */
export interface KeepaliveOptions {
  /** Sends a PING after this many ms without a frame received (default 60 000; `Infinity`: no PINGs). */
  pingIntervalMs?: number;
  /** Closes the connection (and its calls, which fail UNAVAILABLE and are retried) when a PING is not answered within this many ms (default 20 000). */
  pingTimeoutMs?: number;
  /** Also PINGs while no call is open (default false: an idle connection is checked before its next call). */
  pingIdleConnection?: boolean;
  /** Closes a connection no call used for this many ms (default 15 min); the next call reconnects. */
  idleConnectionTimeoutMs?: number;
}

/**
 * The keepalive of a client without `keepalive` (as the Python, Go and Java clients'): a PING
 * after 60 s without a frame while a call or stream is open, the connection closed when it is
 * not answered within 20 s, no PINGs on an idle connection. A silent stream behind a NAT or a
 * proxy that dropped it is then found within 80 s, and `watch` and `serveTools` reconnect.
 */
export const DEFAULT_KEEPALIVE: Readonly<Required<Omit<KeepaliveOptions, "idleConnectionTimeoutMs">>> = Object.freeze({
  pingIntervalMs: 60_000,
  pingTimeoutMs: 20_000,
  pingIdleConnection: false,
});

/**
 * The session manager's options for ClientOptions.keepalive: `false` is Connect's own default
 * (no PINGs); otherwise DEFAULT_KEEPALIVE under the fields given. A duration that is not a
 * positive number throws (a zero interval would PING without pause).
 */
export function sessionOptions(keepalive: KeepaliveOptions | false | undefined): Http2SessionOptions | undefined {
  if (keepalive === false) return undefined;
  const options: Http2SessionOptions = {
    pingIntervalMs: keepalive?.pingIntervalMs ?? DEFAULT_KEEPALIVE.pingIntervalMs,
    pingTimeoutMs: keepalive?.pingTimeoutMs ?? DEFAULT_KEEPALIVE.pingTimeoutMs,
    pingIdleConnection: keepalive?.pingIdleConnection ?? DEFAULT_KEEPALIVE.pingIdleConnection,
  };
  if (keepalive?.idleConnectionTimeoutMs !== undefined) options.idleConnectionTimeoutMs = keepalive.idleConnectionTimeoutMs;
  for (const name of ["pingIntervalMs", "pingTimeoutMs", "idleConnectionTimeoutMs"] as const) {
    const ms = options[name];
    // NaN fails `> 0` too.
    if (ms !== undefined && !(ms > 0)) {
      throw new RangeError(`keepalive.${name} must be a positive number of ms, got ${String(ms)} (keepalive: false turns PINGs off)`);
    }
  }
  return options;
}
