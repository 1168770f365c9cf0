/**
 * The client's one retry layer. Connect has no service-config retry policy (grpc's
 * `retryPolicy`), so the client retries itself: every unary RPC goes through `withRetries`
 * (mutating ones carry a request id that stays the same on every attempt, so a repeat returns
 * the first answer), with backoff and full jitter, until the caller's deadline or the client's
 * retry window. Wait and Watch keep their own loops, which use the same rules for a failure.
 */

import { durationMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type CallOptions } from "@connectrpc/connect";

import { RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** How a call is retried: `attempts` in all (Infinity: until its deadline or an abort). */
export interface RetryPolicy {
  /** Attempts in all, the first included. */
  readonly attempts: number;
  /** The first pause's ceiling in ms; doubled after each failure. */
  readonly initialBackoffMs: number;
  /** The largest pause's ceiling in ms. */
  readonly maxBackoffMs: number;
}

/**
 * The RPCs that change nothing when repeated. Since request ids (a repeated mutating call
 * returns the first answer) every unary RPC is retried, these and the mutating ones alike.
 * @deprecated kept for compatibility; nothing reads it.
 */
export const SAFE_TO_REPEAT = ["Wait", "Resume", "Inspect", "List", "GetTranscript", "ListRuntimes"] as const;

/**
 * Inspect, List, GetTranscript, ListRuntimes were retried so before request ids.
 * @deprecated every call is now retried with RETRY_BACKOFF within the retry window.
 */
export const SAFE_RETRY: RetryPolicy = { attempts: 5, initialBackoffMs: 100, maxBackoffMs: 2_000 };

/**
 * Resume was retried so before request ids.
 * @deprecated every call is now retried with RETRY_BACKOFF within the retry window.
 */
export const RESUME_RETRY: RetryPolicy = { attempts: 8, initialBackoffMs: 100, maxBackoffMs: 5_000 };

/**
 * The backoff of every retry (Wait's and Watch's loops aside): the pause before retry n (from
 * 0) is drawn uniformly from [0, min(5 s, 100 ms * 2^n)] (full jitter), at least a RetryInfo's
 * retry_delay. The attempts are bounded by time (the caller's deadline or the retry window),
 * not by a count.
 */
export const RETRY_BACKOFF: RetryPolicy = { attempts: Number.POSITIVE_INFINITY, initialBackoffMs: 100, maxBackoffMs: 5_000 };

/**
 * Wait's backoff after a failed Wait RPC, the same as RETRY_BACKOFF.
 * @deprecated Wait uses RETRY_BACKOFF (a run of failures bounded by the retry window).
 */
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
 * Whether a failed call met a server that was unreachable or went away under it: UNAVAILABLE
 * (a refused connection, a server shutting down); CANCELED, which is how Connect's Node
 * transport reports a connection that dies under a call (an HTTP/2 RST_STREAM CANCEL) and how
 * grpc-core answers a call that reached a server as it began to shut down, before a handler
 * took it (grpc/grpc#41785); and ABORTED raised by the transport itself (a connection reset,
 * ECONNRESET: Connect's code for what gRPC's own clients call UNAVAILABLE), not one a server
 * sent. The caller's own abort is told apart by its signal, checked before this.
 */
export function isDropped(error: unknown): boolean {
  if (!(error instanceof ConnectError)) return false;
  if (error.code === Code.Aborted) return error.cause instanceof Error && !(error.cause instanceof ConnectError);
  return error.code === Code.Unavailable || error.code === Code.Canceled;
}

/** The `retry_delay` in ms of the google.rpc.RetryInfo in a failed call's details (undefined: none). */
export function retryDelayMs(error: unknown): number | undefined {
  if (!(error instanceof ConnectError)) return undefined;
  const info = error.findDetails(RetryInfoSchema)[0];
  if (info === undefined) return undefined;
  const delay = info.retryDelay === undefined ? 0 : durationMs(info.retryDelay);
  return Number.isFinite(delay) ? Math.min(Math.max(delay, 0), MAX_TIMER_MS) : 0;
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

/** Waits `ms`; resolves early when one of the `signals` aborts (the caller checks it). */
export function pause(ms: number, ...signals: (AbortSignal | undefined)[]): Promise<void> {
  const watched = signals.filter((signal): signal is AbortSignal => signal !== undefined);
  return new Promise((done) => {
    if (watched.some((signal) => signal.aborted)) return done();
    const finish = () => {
      clearTimeout(timer);
      for (const signal of watched) signal.removeEventListener("abort", finish);
      done();
    };
    const timer = setTimeout(finish, ms);
    for (const signal of watched) signal.addEventListener("abort", finish, { once: true });
  });
}

/** The default of ClientOptions.retryWindowMs: how long a call (or Wait's run of failures) is retried. */
export const DEFAULT_RETRY_WINDOW_MS = 60_000;

/**
 * How much earlier than an attempt's deadline a DEADLINE_EXCEEDED may come and still be that
 * deadline's (timers and the server's own clock of the grpc-timeout are not exact).
 */
const DEADLINE_SLACK_MS = 25;

/** How `withRetries` makes a call. */
export interface RetryLoopOptions {
  /** False: one attempt, its error thrown as it is. */
  retry: boolean;
  /** The caller's cancellation: passed to every attempt; after it nothing is retried (CANCELED). */
  signal?: AbortSignal;
  /** The client's own end (`disconnect`): after it nothing is retried either (CANCELED). */
  closed?: AbortSignal;
  /**
   * `performance.now()` time after which no attempt starts, no pause ends and every attempt's
   * deadline falls (the caller's deadline, or the retry window from the call's start).
   */
  deadline: number;
  /** Each attempt's own deadline in ms (0: none but `deadline`). */
  attemptTimeoutMs: number;
}

/**
 * Whether `error`, from an attempt that ran `elapsedMs` under a deadline of `timeoutMs` (0:
 * none), may be retried: a dropped connection (`isDropped`), the attempt's own deadline
 * (DEADLINE_EXCEEDED after it), or any status whose details carry google.rpc.RetryInfo. The
 * caller's own cancellation is told apart before this, by its signal.
 */
export function isRetryable(error: unknown, elapsedMs: number, timeoutMs: number): boolean {
  if (!(error instanceof ConnectError)) return false;
  if (isDropped(error) || retryDelayMs(error) !== undefined) return true;
  return error.code === Code.DeadlineExceeded && timeoutMs > 0 && elapsedMs >= timeoutMs - DEADLINE_SLACK_MS;
}

/**
 * The pause before retry `n` (from 0) after `error`: RETRY_BACKOFF's full jitter, at least the
 * error's RetryInfo retry_delay.
 */
export function retryPauseMs(error: unknown, n: number): number {
  return Math.max(jitteredBackoff(RETRY_BACKOFF, n + 1), retryDelayMs(error) ?? 0);
}

/**
 * Makes `call` (given each attempt's Connect options: its deadline and the caller's signal)
 * until it succeeds or fails in a way not to retry (`isRetryable`), or no time is left before
 * `options.deadline`; between attempts it pauses `retryPauseMs`. A pause that would end past
 * the deadline is not taken: the last error is thrown instead. After the caller's signal
 * aborts, nothing is retried and the call rejects with CANCELED.
 */
export async function withRetries<T>(call: (attempt: CallOptions) => Promise<T>, options: RetryLoopOptions): Promise<T> {
  const { retry, signal, closed, deadline, attemptTimeoutMs } = options;
  const stopped = (): AbortSignal | undefined => (signal?.aborted ? signal : closed?.aborted ? closed : undefined);
  for (let n = 0; ; n++) {
    const stop = stopped();
    if (stop !== undefined) throw abortError(stop);
    const started = performance.now();
    const left = deadline - started;
    // A whole number of ms (Connect writes it into grpc-timeout as it is), at least 1: Connect
    // takes 0 for no deadline. Only the first attempt can start with none left.
    const timeoutMs = Math.max(1, Math.ceil(attemptTimeoutMs > 0 ? Math.min(attemptTimeoutMs, left) : left));
    try {
      return await call({ timeoutMs: deadlineMs(timeoutMs), signal });
    } catch (error) {
      const stop = stopped();
      if (stop !== undefined) throw abortError(stop);
      const now = performance.now();
      if (!retry || !isRetryable(error, now - started, Math.min(timeoutMs, MAX_TIMER_MS))) throw error;
      const delay = retryPauseMs(error, n);
      if (now + delay >= deadline) throw error;
      await pause(delay, signal, closed);
    }
  }
}
