/**
 * Watch: a runtime's events as an async iterable that reconnects. `AgentRuntimeClient.watch`
 * is the entry point; this module holds its machinery.
 */

import { Code, ConnectError, type Client as ConnectClient } from "@connectrpc/connect";

import { AgentRuntime, type Delta, type Event } from "./gen/agentruntime/v1/agent_runtime_pb.js";
import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { DEFAULT_RETRY_WINDOW_MS, doubledBackoff, isDropped, pause, retryDelayMs } from "./retry.js";

export interface WatchOptions {
  /** Ends the iteration (it returns; no error): the stream is cancelled. */
  signal?: AbortSignal;
  /**
   * Reconnections in a row with no event between them before the error is thrown (default 5);
   * for `streamRun`, a new piece of a turn (not a reset) counts as an event does.
   */
  maxRetries?: number;
  /** The first reconnection delay in ms (default 1000), doubled per failure in a row up to 30 s, jittered. */
  backoffMs?: number;
  /**
   * How long the pauses of reconnections in a row (no event between them) may add up to before
   * the last error is thrown, in ms (default: the client's `retryWindowMs`, 60 000 unless set;
   * Infinity for none). Time spent on an open stream does not count: with no event to show it,
   * an idle runtime's stream looks the same as one that is about to fail.
   */
  retryWindowMs?: number;
  /**
   * Called when the stream dropped (`error`) or the server ended it (`error` undefined), with
   * the pause before the reconnection, e.g. to log it.
   */
  onDisconnect?: (error: ConnectError | undefined, delayMs: number) => void;
}

/** The default of WatchOptions.maxRetries. */
export const DEFAULT_WATCH_RETRIES = 5;

/** The longest pause between reconnections, however many `maxRetries` allows (as the Python client's). */
export const WATCH_MAX_BACKOFF_MS = 30_000;

/** RESOURCE_EXHAUSTED with ErrorInfo reason WATCH_LAGGING: this consumer fell too far behind. */
function isLagging(error: ConnectError): boolean {
  return error.code === Code.ResourceExhausted && error.findDetails(ErrorInfoSchema)[0]?.reason === "WATCH_LAGGING";
}

/** The machinery of AgentRuntimeClient.watch (see there). */
export async function* watch(
  raw: ConnectClient<typeof AgentRuntime>,
  runtimeId: string,
  afterSeq: bigint,
  options: WatchOptions = {},
): AsyncGenerator<Event, void, undefined> {
  for await (const item of watchItems(raw, runtimeId, afterSeq, false, options)) {
    if (item.event !== undefined) yield item.event;
  }
}

/** One item of a Watch: an event, or (asked for with `deltas`) a piece of a model turn. */
export type WatchItem = { event: Event; delta?: undefined } | { delta: Delta; event?: undefined };

/**
 * Which deltas are new to a consumer, per (handle, turn): after a reconnect the server sends
 * every turn still in progress again from index 0, so a piece whose index is below the next one
 * expected was handed over already. A `reset` is always new: it voids the turn's pieces so far
 * (the turn streams again from index 1 after it), whether or not it was seen before.
 */
export class DeltaFilter {
  private readonly expected = new Map<string, bigint>();

  /** Whether `delta` is to be handed over; it is then counted as seen. */
  admit(delta: Delta): boolean {
    const key = turnKey(delta.handleId, delta.turn);
    if (delta.piece.case === "reset") {
      this.expected.set(key, 1n);
      return true;
    }
    if (delta.index < (this.expected.get(key) ?? 0n)) return false;
    this.expected.set(key, delta.index + 1n);
    return true;
  }

  /**
   * An ended turn is never sent again (a reconnection asks from after its TurnEnded): its entry
   * goes, so a long Watch keeps one per turn in progress, not one per turn ever.
   */
  forget(event: Event): void {
    if (event.payload.case === "turnEnded") this.expected.delete(turnKey(event.handleId, event.payload.value.turn));
  }
}

function turnKey(handleId: string, turn: bigint): string {
  return `${turn} ${handleId}`; // a handle id has no space
}

/**
 * The Watch stream of `watch`, reconnecting by the same rules, with the deltas too when
 * `deltas` is set, each once (DeltaFilter: the server sends a turn in progress again after a
 * reconnect). Deltas do not move the seq a reconnection asks from (they are not journaled). A
 * new piece counts as progress between failures, as an event does, so a long turn streamed
 * across several drops is not given up on; a repeat does not (a stream that keeps re-sending
 * one turn and dropping would be retried for ever), nor does a reset (a turn restarted is no
 * further on). It asks for batches (WatchRequest.batch: the events at hand in one response)
 * and hands their events over one at a time, each moving the seq, as one event a response.
 */
export async function* watchItems(
  raw: ConnectClient<typeof AgentRuntime>,
  runtimeId: string,
  afterSeq: bigint,
  deltas: boolean,
  options: WatchOptions = {},
): AsyncGenerator<WatchItem, void, undefined> {
  const maxRetries = options.maxRetries ?? DEFAULT_WATCH_RETRIES;
  const backoff = options.backoffMs ?? 1000;
  const window = options.retryWindowMs ?? DEFAULT_RETRY_WINDOW_MS;
  const signal = options.signal;
  let seen = afterSeq; // the last seq yielded: a reconnection asks for what follows it
  let failures = 0; // reconnections in a row with no progress (an event, a new piece) between them
  let pausedMs = 0; // the pauses before them, added up
  const filter = new DeltaFilter();
  while (!signal?.aborted) {
    // This stream's own cancellation: the caller's abort, or leaving the generator (a `break`).
    const stream = new AbortController();
    const onAbort = () => stream.abort();
    signal?.addEventListener("abort", onAbort, { once: true });
    let dropped: ConnectError | undefined;
    try {
      // No deadline: the stream lives until it is aborted or dropped.
      const request = { runtimeId, afterSeq: seen, deltas, batch: true };
      for await (const response of raw.watch(request, { signal: stream.signal, timeoutMs: 0 })) {
        const delta = response.delta;
        if (delta !== undefined) {
          if (!deltas || !filter.admit(delta)) continue;
          if (delta.piece.case !== "reset") [failures, pausedMs] = [0, 0];
          yield { delta };
          continue;
        }
        // A batch (WatchRequest.batch) holds the events at hand, in seq order; a server from
        // before batches sends one event a response, in `event`.
        const events = response.events.length > 0 ? response.events : response.event ? [response.event] : [];
        for (const event of events) {
          if (event.seq <= seen) continue; // never the same event twice
          [failures, pausedMs] = [0, 0];
          seen = event.seq;
          filter.forget(event);
          yield { event };
        }
      }
    } catch (error) {
      if (signal?.aborted) return; // our own cancellation, whatever code it surfaced as
      const failure = ConnectError.from(error);
      if (!isDropped(failure) && !isLagging(failure) && retryDelayMs(failure) === undefined) throw failure;
      dropped = failure;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      stream.abort();
    }
    if (signal?.aborted) return;
    // Dropped, lagging, or ended by the server (it is shutting down): reopen from `seen`.
    if (failures >= maxRetries) {
      throw dropped ?? new ConnectError("the server ended the Watch stream", Code.Unavailable);
    }
    // A lagging consumer reconnects at once (the server is up); otherwise 1 s doubling per
    // failure in a row up to 30 s, drawn from its upper half; at least RetryInfo's retry_delay.
    const ceiling =
      dropped !== undefined && isLagging(dropped) ? 0 : doubledBackoff(backoff, failures, WATCH_MAX_BACKOFF_MS);
    const delay = Math.max(ceiling / 2 + (Math.random() * ceiling) / 2, retryDelayMs(dropped) ?? 0);
    if (pausedMs + delay > window) {
      throw dropped ?? new ConnectError("the server ended the Watch stream", Code.Unavailable);
    }
    pausedMs += delay;
    failures += 1;
    options.onDisconnect?.(dropped, delay);
    await pause(delay, signal);
  }
}
