/**
 * streamRun: a handle's model text as it is written, then its result. `AgentRuntimeClient.streamRun`
 * is the entry point (it spawns the handle); this module holds the watching part, which wakes it.
 */

import type { Client as ConnectClient } from "@connectrpc/connect";

import type { AgentRuntime, Delta, TaskResult } from "./gen/agentruntime/v1/agent_runtime_pb.js";
import { abortError } from "./retry.js";
import { watchItems, type WatchOptions } from "./watch.js";

export { DeltaFilter } from "./watch.js";

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
 * The deltas of `handleId` (each once) from a Watch of the whole runtime from seq 0 with deltas,
 * reconnecting as `watch` does, then the TaskResult of the handle's first `result` event.
 * `wake` is called once the Watch has answered, not before: a provider's turn streams only to
 * the watchers subscribed when it starts, and the server subscribes a watcher before it sends
 * the history, whose first response (the handle's `spawned`, at least) there always is. Until
 * then nothing was seen (seq 0, no delta), so a reconnection's first response is handed over
 * too and the rule holds across it. Aborting `options.signal` throws CANCELED, as `run` does:
 * the caller gets no result, so silence would read as a run that ended without one.
 */
export async function* streamHandle(
  raw: ConnectClient<typeof AgentRuntime>,
  runtimeId: string,
  handleId: string,
  wake: () => Promise<unknown>,
  options: WatchOptions,
): AsyncGenerator<StreamRunItem, void, undefined> {
  let woken = false;
  for await (const item of watchItems(raw, runtimeId, 0n, true, options)) {
    if (!woken) {
      await wake();
      woken = true;
    }
    if (item.delta !== undefined) {
      if (item.delta.handleId === handleId) yield { delta: item.delta };
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
