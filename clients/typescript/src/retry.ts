/**
 * Retries of the calls that are safe to repeat, with exponential backoff and full jitter.
 * Connect has no service-config retry policy (grpc's `retryPolicy`), so the client does it here:
 * one helper, used by every method whose RPC changes nothing when repeated.
 */

import { Code, ConnectError } from "@connectrpc/connect";

/** How a call is retried: `attempts` in all (Infinity: until `until` or an abort). */
export interface RetryPolicy {
  /** Attempts in all, the first included. */
  readonly attempts: number;
  /** The first pause's ceiling in ms; doubled after each failure. */
  readonly initialBackoffMs: number;
  /** The largest pause's ceiling in ms. */
  readonly maxBackoffMs: number;
}

/**
 * The RPCs that change nothing when repeated: retried on UNAVAILABLE. Spawn, Wake, Post,
 * Interrupt, Close, CreateRuntime, DeleteRuntime and ServeTools are not: a lost answer does not
 * say whether they took effect.
 */
export const SAFE_TO_REPEAT = ["Wait", "Resume", "Inspect", "List", "GetTranscript", "ListRuntimes"] as const;

/** Inspect, List, GetTranscript, ListRuntimes: 5 attempts, 100 ms doubling to 2 s (gRPC's policy in the Python client). */
export const SAFE_RETRY: RetryPolicy = { attempts: 5, initialBackoffMs: 100, maxBackoffMs: 2_000 };

/** Resume: the server returns the same result for the same answer, so it is retried longer. */
export const RESUME_RETRY: RetryPolicy = { attempts: 8, initialBackoffMs: 100, maxBackoffMs: 5_000 };

/** Wait: a restarting server is waited for until the caller's timeout (or abort). */
export const WAIT_RETRY: RetryPolicy = { attempts: Number.POSITIVE_INFINITY, initialBackoffMs: 100, maxBackoffMs: 5_000 };

/** The longest one Wait RPC asks the server for (WaitRequest.timeout): well under any proxy's idle cut. */
export const WAIT_SLICE_MS = 30_000;

/** How far a Wait RPC's call deadline lies past its server-side timeout. */
export const WAIT_MARGIN_MS = 10_000;

/**
 * The longest delay setTimeout keeps (2^31-1 ms, about 24.8 days). A longer one (Infinity
 * included) fires at once: a deadline that expires before the call starts, a pause that is none.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * The timeout of one Wait RPC at `now`: what is left of the caller's timeout (until `end`,
 * `performance.now()` time; undefined: none), at most one slice, and 0 once it has passed (the
 * server then answers at once, STATUS_TIMEOUT if the handle still runs).
 */
export function waitSliceMs(end: number | undefined, now: number): number {
  if (end === undefined) return WAIT_SLICE_MS;
  return Math.min(WAIT_SLICE_MS, Math.max(Math.ceil(end - now), 0));
}

/** The `timeoutMs` of a call for the client's: 0 (Connect: no deadline) for none, at most MAX_TIMER_MS. */
export function deadlineMs(timeoutMs: number): number {
  // NaN fails `> 0`: no deadline, as before this cap.
  return timeoutMs > 0 ? Math.min(timeoutMs, MAX_TIMER_MS) : 0;
}

/**
 * Whether a failed call may be made again: the server was unreachable or went away under the
 * call. That is UNAVAILABLE (refused connection, a server shutting down), and also CANCELED and
 * ABORTED, which is how Connect's Node transport reports a connection that dies under a call
 * (an HTTP/2 RST_STREAM CANCEL, ECONNRESET) where gRPC's own clients say UNAVAILABLE, and how
 * grpc-core answers a call that reached a server as it began to shut down, before a handler took
 * it (grpc/grpc#41785). The caller's own abort is told apart by its signal, checked first.
 */
export function isDropped(error: unknown): boolean {
  if (!(error instanceof ConnectError)) return false;
  return error.code === Code.Unavailable || error.code === Code.Canceled || error.code === Code.Aborted;
}

/** The pause before retry number `failures` (1 for the first): uniform in [0, ceiling]. */
export function jitteredBackoff(policy: RetryPolicy, failures: number): number {
  const ceiling = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * 2 ** (failures - 1));
  return Math.random() * ceiling;
}

/**
 * `baseMs * 2^failures`, at most `capMs` and MAX_TIMER_MS: a longer pause would fire at once, a
 * busy loop through a long outage. The exponent stops growing long past any cap (from 2^1024
 * the product is Infinity, and 0 * Infinity is NaN).
 */
export function doubledBackoff(baseMs: number, failures: number, capMs: number): number {
  return Math.min(capMs, MAX_TIMER_MS, baseMs * 2 ** Math.min(failures, 64));
}

/** What an abort rejects with: Connect's CANCELED, as an aborted call does. */
export function abortError(signal: AbortSignal): ConnectError {
  return ConnectError.from(signal.reason ?? new Error("the operation was aborted"), Code.Canceled);
}

/** Waits `ms`; resolves early when `signal` aborts (the caller checks it). */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((done) => {
    if (signal?.aborted) return done();
    const onAbort = () => {
      clearTimeout(timer);
      done();
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      done();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export interface RetryOptions {
  /** Stops retrying: the pending pause ends and the call rejects with CANCELED. */
  signal?: AbortSignal;
  /** `performance.now()` after which no retry starts (the last error is thrown). */
  until?: number;
}

/**
 * Makes `call` until it succeeds, fails otherwise than by a dropped connection (`isDropped`), or has failed
 * `policy.attempts` times (or `until` has passed); between attempts it pauses a jittered
 * `initialBackoffMs * 2^(n-1)` (at most `maxBackoffMs`, and never past `until`).
 */
export async function retrying<T>(call: () => Promise<T>, policy: RetryPolicy, options: RetryOptions = {}): Promise<T> {
  const { signal, until } = options;
  for (let failures = 1; ; failures++) {
    if (signal?.aborted) throw abortError(signal);
    try {
      return await call();
    } catch (error) {
      if (signal?.aborted) throw abortError(signal);
      if (!isDropped(error) || failures >= policy.attempts) throw error;
      let delay = jitteredBackoff(policy, failures);
      if (until !== undefined) {
        const left = until - performance.now();
        if (left <= 0) throw error;
        delay = Math.min(delay, left);
      }
      await pause(delay, signal);
    }
  }
}
