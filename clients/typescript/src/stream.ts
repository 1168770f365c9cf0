/**
 * streamRun: a handle's model text as it is written, then its result. `AgentRuntimeClient.streamRun`
 * is the entry point (it spawns and wakes the handle); this module holds the watching part.
 */

import type { Client as ConnectClient } from "@connectrpc/connect";

import type { AgentRuntime, Delta, TaskResult } from "./gen/agentruntime/v1/agent_runtime_pb.js";
import { abortError } from "./retry.js";
import { watchItems, type WatchOptions } from "./watch.js";

/**
 * One item of `streamRun`: a piece of the handle's model turn as it streams (`delta`), or, last,
 * the handle's result (`result`). Exactly one of the two is set.
 */
export type StreamRunItem = { delta: Delta; result?: undefined } | { result: TaskResult; delta?: undefined };

/** Options of `streamRun`: those of `watch` for its Watch, and the request ids of its Spawn and Wake. */
export interface StreamRunOptions extends WatchOptions {
  /** The request id of the Spawn (default: a random UUID), see MutationOptions.requestId. */
  spawnRequestId?: string;
  /** The request id of the Wake (default: a random UUID), see MutationOptions.requestId. */
  wakeRequestId?: string;
}

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
    const key = `${delta.turn} ${delta.handleId}`; // a handle id has no space
    if (delta.piece.case === "reset") {
      this.expected.set(key, 1n);
      return true;
    }
    if (delta.index < (this.expected.get(key) ?? 0n)) return false;
    this.expected.set(key, delta.index + 1n);
    return true;
  }
}

/**
 * The deltas of `handleId` (each once, see DeltaFilter) from a Watch of the whole runtime from
 * seq 0 with deltas, reconnecting as `watch` does, then the TaskResult of the handle's first
 * `result` event. Starting from seq 0 after the Wake loses nothing: the server sends the turn in
 * progress from its first piece. Aborting `options.signal` throws CANCELED, as `run` does: the
 * caller gets no result, so silence would read as a run that ended without one.
 */
export async function* streamHandle(
  raw: ConnectClient<typeof AgentRuntime>,
  runtimeId: string,
  handleId: string,
  options: WatchOptions,
): AsyncGenerator<StreamRunItem, void, undefined> {
  const filter = new DeltaFilter();
  for await (const item of watchItems(raw, runtimeId, 0n, true, options)) {
    if (item.delta !== undefined) {
      if (item.delta.handleId === handleId && filter.admit(item.delta)) yield { delta: item.delta };
      continue;
    }
    const event = item.event;
    if (event.handleId === handleId && event.payload.case === "result") {
      yield { result: event.payload.value };
      return;
    }
  }
  // The Watch ends by itself only when the signal aborts.
  if (options.signal?.aborted) throw abortError(options.signal);
}
