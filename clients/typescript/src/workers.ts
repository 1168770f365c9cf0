/**
 * Worker tools: a host serves the calls of a queue's worker tools (ToolDef.worker) over the
 * bidirectional ServeTools stream. `AgentRuntimeClient.serveTools` is the entry point; this
 * module holds its machinery.
 */

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Client as ConnectClient } from "@connectrpc/connect";

import {
  AgentRuntime,
  ServeToolsRequestSchema,
  ToolOutputSchema,
  WorkerRegistrationSchema,
  type ServeToolsRequest,
  type ToolOutput,
  type WorkerCall,
} from "./gen/agentruntime/v1/agent_runtime_pb.js";
import { doubledBackoff, pause } from "./retry.js";

/**
 * Runs one worker tool call: `args` is the call's arguments (a JSON object), `call` the whole
 * WorkerCall (its id, `call.call.idempotencyKey`, `runtimeId`, `handleId`, `deadline`). What it
 * returns is the tool's output; what it throws is an error result with the error's message.
 */
export type ToolHandler = (args: Record<string, unknown>, call: WorkerCall) => Promise<string> | string;

export interface ServeToolsOptions {
  /** Calls this worker takes at once (default 10); the server never sends more. */
  maxConcurrentCalls?: number;
  /** Stops the worker: serveTools then resolves (the calls in flight are left in doubt). */
  signal?: AbortSignal;
  /** Called with the server's worker id each time a (re)connection is registered. */
  onRegistered?: (workerId: string) => void;
  /**
   * Called when the stream dropped (`error`) or the server ended it (`error` undefined), with
   * the pause before the reconnection, e.g. to log it.
   */
  onDisconnect?: (error: ConnectError | undefined, delayMs: number) => void;
  /** The first reconnection delay in ms (default 250), doubled per failure in a row. */
  backoffMs?: number;
  /** The longest reconnection delay in ms (default 10 000). */
  maxBackoffMs?: number;
}

/** The default of ServeToolsOptions.maxConcurrentCalls. */
export const DEFAULT_MAX_CONCURRENT_CALLS = 10;

/**
 * The codes of a dropped stream, after which serveTools reconnects: the server went away or
 * cancelled the stream (Connect reports a reset connection as Aborted). Any other code
 * (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, ...) rejects at once: trying again
 * would be refused again.
 */
const DROPPED: ReadonlySet<Code> = new Set([Code.Unavailable, Code.Canceled, Code.Aborted, Code.Unknown]);

/**
 * An async queue read as the stream's requests: `push` adds one, `close` ends the iteration
 * (a pending `next` included), so the transport's writer never hangs on a finished stream.
 */
class RequestQueue implements AsyncIterable<ServeToolsRequest> {
  private readonly items: ServeToolsRequest[] = [];
  private waiting: ((result: IteratorResult<ServeToolsRequest>) => void) | undefined;
  private closed = false;

  push(item: ServeToolsRequest): void {
    if (this.closed) return; // the stream is gone: the output is dropped (the call is in doubt)
    const waiting = this.waiting;
    if (waiting) {
      this.waiting = undefined;
      waiting({ value: item, done: false });
    } else {
      this.items.push(item);
    }
  }

  close(): void {
    this.closed = true;
    this.items.length = 0;
    const waiting = this.waiting;
    this.waiting = undefined;
    waiting?.({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterator<ServeToolsRequest> {
    return {
      next: () => {
        const item = this.items.shift();
        if (item !== undefined) return Promise.resolve({ value: item, done: false });
        if (this.closed) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => {
          this.waiting = resolve;
        });
      },
      // The transport calls return when it stops reading, throw when the call fails
      // (Connect requires both): either way the queue is done.
      return: () => {
        this.close();
        return Promise.resolve({ value: undefined, done: true });
      },
      throw: () => {
        this.close();
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}

function message(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

/** Runs `handlers`' handler for the call; every failure becomes an error result. */
async function answer(handlers: Readonly<Record<string, ToolHandler>>, call: WorkerCall): Promise<ToolOutput> {
  const name = call.call?.name ?? "";
  const result = (output: string, isError: boolean) => create(ToolOutputSchema, { callId: call.id, output, isError });
  const handler = Object.hasOwn(handlers, name) ? handlers[name] : undefined;
  if (handler === undefined) return result(`this worker has no handler for the tool ${JSON.stringify(name)}`, true);
  let args: unknown;
  try {
    args = JSON.parse(call.call?.argumentsJson || "{}");
  } catch (error) {
    return result(`the arguments of ${name} are not valid JSON: ${message(error)}`, true);
  }
  if (typeof args !== "object" || args === null || Array.isArray(args)) {
    return result(`the arguments of ${name} are not a JSON object`, true);
  }
  try {
    const output = await handler(args as Record<string, unknown>, call);
    return result(typeof output === "string" ? output : String(output), false);
  } catch (error) {
    // The tool's failure is its result, for the model to see.
    return result(message(error), true);
  }
}


/**
 * One ServeTools stream: registers, answers calls until the stream ends (resolves) or fails
 * (rejects with its ConnectError). `registered` is called once the server accepts it.
 */
async function serveOnce(
  raw: ConnectClient<typeof AgentRuntime>,
  queue: string,
  handlers: Readonly<Record<string, ToolHandler>>,
  limit: number,
  signal: AbortSignal | undefined,
  registered: (workerId: string) => void,
): Promise<void> {
  const requests = new RequestQueue();
  // This stream's own cancellation: the caller's abort, or leaving this function.
  const stream = new AbortController();
  const onAbort = () => stream.abort();
  signal?.addEventListener("abort", onAbort, { once: true });
  requests.push(
    create(ServeToolsRequestSchema, {
      message: {
        case: "registration",
        value: create(WorkerRegistrationSchema, { queue, tools: Object.keys(handlers).sort(), maxConcurrentCalls: limit }),
      },
    }),
  );
  try {
    // No deadline: the stream lives until it is aborted or dropped.
    for await (const response of raw.serveTools(requests, { signal: stream.signal, timeoutMs: 0 })) {
      if (response.message.case === "registered") {
        registered(response.message.value.workerId);
      } else if (response.message.case === "call") {
        // Each call runs on its own (the server keeps to the limit); its output follows it.
        void answer(handlers, response.message.value).then((output) =>
          requests.push(create(ServeToolsRequestSchema, { message: { case: "output", value: output } })),
        );
      }
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    requests.close();
    stream.abort();
  }
}

/** The machinery of AgentRuntimeClient.serveTools (see there). */
export async function serveTools(
  raw: ConnectClient<typeof AgentRuntime>,
  queue: string,
  handlers: Readonly<Record<string, ToolHandler>>,
  options: ServeToolsOptions = {},
): Promise<void> {
  const limit = options.maxConcurrentCalls ?? DEFAULT_MAX_CONCURRENT_CALLS;
  if (!Number.isInteger(limit) || limit < 1) {
    throw new RangeError(`maxConcurrentCalls must be a positive integer, got ${String(limit)}`);
  }
  if (Object.keys(handlers).length === 0) {
    // An empty tool list would register for every tool of the queue, and fail them all.
    throw new TypeError("serveTools needs at least one handler");
  }
  const backoff = options.backoffMs ?? 250;
  const maxBackoff = options.maxBackoffMs ?? 10_000;
  const signal = options.signal;
  let failures = 0; // reconnections in a row without a registration
  while (!signal?.aborted) {
    let dropped: ConnectError | undefined;
    try {
      await serveOnce(raw, queue, handlers, limit, signal, (workerId) => {
        failures = 0;
        options.onRegistered?.(workerId);
      });
    } catch (error) {
      if (signal?.aborted) return; // our own cancellation, whatever code it surfaced as
      if (!(error instanceof ConnectError) || !DROPPED.has(error.code)) throw error;
      dropped = error;
    }
    if (signal?.aborted) return;
    // The stream failed or ended (a server restart): reconnect after a jittered pause,
    // 250 ms doubling per failure in a row up to 10 s, drawn from its upper half.
    const ceiling = doubledBackoff(backoff, failures, maxBackoff);
    const delay = ceiling / 2 + (Math.random() * ceiling) / 2;
    failures += 1;
    options.onDisconnect?.(dropped, delay);
    await pause(delay, signal);
  }
}
