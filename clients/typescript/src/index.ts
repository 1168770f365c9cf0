/**
 * A thin client over the generated AgentRuntime stubs: one method per verb, errors as
 * ConnectError with their gRPC code and google.rpc details. Every call is retried by the
 * client's own loop (retry.ts `withRetries`) on UNAVAILABLE, a connection that died under it, its
 * attempt's own deadline and any error carrying google.rpc.RetryInfo, with backoff and full
 * jitter, until the call's deadline or the client's retry window; each mutating call (Spawn,
 * Post, Wake, Resume, Interrupt, Close, CreateRuntime, DeleteRuntime, ForkRuntime, ReplayRuntime)
 * carries one request id on every attempt (the caller's, or a random UUID drawn once per call), so
 * that the server answers a repeat with the first answer and does nothing twice.
 *
 * ```ts
 * const client = createClient("127.0.0.1:50051");
 * const runtimeId = await client.createRuntime(agents);
 * const result = await client.run(runtimeId, "coordinator", "map the repo");
 * ```
 */

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import {
  Code,
  ConnectError,
  createClient as createConnectClient,
  type CallOptions,
  type Client as ConnectClient,
  type Interceptor,
} from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";

import {
  AgentRuntime,
  HandleViewSchema,
  Status,
  TaskResultSchema,
  UnrecordedCalls,
  type AgentDefSchema,
  type AnswerSchema,
  type BudgetSchema,
  type Event,
  type ForkMessageSchema,
  type ForkRuntimeResponse,
  type GetTranscriptResponse,
  type HandleView,
  type ListResponse,
  type ListRuntimesResponse,
  type Message,
  type ReplayRuntimeResponse,
  type RuntimeSummary,
  type TaskResult,
} from "./gen/agentruntime/v1/agent_runtime_pb.js";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  QuotaFailureSchema,
  ResourceInfoSchema,
  RetryInfoSchema,
  type BadRequest,
  type ErrorInfo,
  type QuotaFailure,
  type ResourceInfo,
  type RetryInfo,
} from "./gen/google/rpc/error_details_pb.js";
import { sessionOptions, type KeepaliveOptions } from "./keepalive.js";
import {
  DEFAULT_RETRY_WINDOW_MS,
  WAIT_MARGIN_MS,
  abortError,
  isRetryable,
  pause,
  retryPauseMs,
  waitSliceMs,
  withRetries,
} from "./retry.js";
import { streamHandle, type StreamRunItem, type StreamRunOptions } from "./stream.js";
import { watch, type WatchOptions } from "./watch.js";
import { serveTools, type ServeToolsOptions, type ToolHandler } from "./workers.js";

export { DEFAULT_MAX_CONCURRENT_CALLS, type ServeToolsOptions, type ToolHandler } from "./workers.js";
export { DEFAULT_WATCH_RETRIES, type WatchOptions } from "./watch.js";
export { type StreamRunItem, type StreamRunOptions } from "./stream.js";
export { DEFAULT_KEEPALIVE, type KeepaliveOptions } from "./keepalive.js";
export { OutputError, outputAs, outputJson } from "./output.js";
export {
  DEFAULT_RETRY_WINDOW_MS,
  RESUME_RETRY,
  RETRY_BACKOFF,
  SAFE_RETRY,
  SAFE_TO_REPEAT,
  WAIT_MARGIN_MS,
  WAIT_RETRY,
  WAIT_SLICE_MS,
  type RetryPolicy,
} from "./retry.js";
export * from "./gen/agentruntime/v1/agent_runtime_pb.js";
export * from "./gen/google/rpc/error_details_pb.js";
export { Code, ConnectError, type Interceptor };

/** The default deadline of every call, as in the Python client (60 s); Wait and Watch have their own. */
export const DEFAULT_TIMEOUT_MS = 60_000;

/** Options of one call of a method that reads (Inspect, List, GetTranscript, ListRuntimes). */
export interface RequestOptions {
  /**
   * This call's deadline in ms, its retries and the pauses between them included; in its place
   * the client's `retryWindowMs` bounds them. A number that is not positive is none given.
   */
  timeoutMs?: number;
  /**
   * Cancels the call: the attempt under way is cancelled, no retry follows, and the call
   * rejects with a ConnectError of code `Canceled`.
   */
  signal?: AbortSignal;
}

/**
 * Options of one call of a mutating method (CreateRuntime, Spawn, Post, Wake, Resume, Interrupt,
 * Close, DeleteRuntime, ForkRuntime).
 */
export interface MutationOptions extends RequestOptions {
  /**
   * The request id every attempt of this call carries: up to 64 characters of
   * `[A-Za-z0-9_-]`. The server answers a repeat (same id, same request) with the first
   * answer and does nothing again; the same id with another request is INVALID_ARGUMENT with
   * ErrorInfo reason `REQUEST_ID_REUSED`. Default: a random UUID, drawn once per call. Pass
   * your own to make a call safe to repeat across your own retries (a restarted process, a
   * queue's redelivery).
   */
  requestId?: string;
}

/** Options of `wait`. */
export interface WaitOptions {
  /** Stops waiting: the call rejects with a ConnectError of code `Canceled` (the run goes on). */
  signal?: AbortSignal;
}

/** Options of `run`: those of `wait`, and its `timeoutMs`. */
export interface RunOptions extends WaitOptions {
  /** As `wait`'s `timeoutMs`: after it, the server's STATUS_TIMEOUT result (the handle still running). */
  timeoutMs?: number;
  /** The request id of run's Spawn (default: a random UUID), see MutationOptions.requestId. */
  spawnRequestId?: string;
  /** The request id of run's Wake (default: a random UUID), see MutationOptions.requestId. */
  wakeRequestId?: string;
}

/** Options of `listRuntimes`, `iterateRuntimes` and `listRuntimesPage`: those of a read, and a filter. */
export interface ListRuntimesOptions extends RequestOptions {
  /** Only the forks of this runtime (ForkRuntime's `sourceRuntimeId`) and its replays; empty or absent: every runtime. */
  forksOf?: string;
}

/** Options of `forkRuntime`: those of a mutating call, and the changes at the fork. */
export interface ForkRuntimeOptions extends MutationOptions {
  /** The fork's id (a slug, as CreateRuntime's); empty or absent: generated by the server. */
  runtimeId?: string;
  /**
   * Replacement definitions: an agent of the source's with the same name is replaced (its handles
   * at the cut go on with it), a new name is added.
   */
  agents?: AgentDefInit[];
  /** Handles whose last user message (and what followed it) is dropped, their inbox given `text` instead. */
  messages?: ForkMessageInit[];
  /** Answers to Requests pending at the cut (as Resume's): the answered run is held, and goes on at the next Wake. */
  answers?: AnswerInit[];
}

/** Options of `replayRuntime`. */
export interface ReplayRuntimeOptions {
  /** Replacement definitions, by name (none: the recording's own). */
  agents?: AgentDefInit[];
  /** What the replay does with a tool call the recording does not have (default UNSPECIFIED: RECORDED_ONLY). */
  unrecordedCalls?: UnrecordedCalls;
  /** The replay's id (a slug); empty or absent: generated by the server. */
  runtimeId?: string;
  /**
   * The request id every ReplayRuntime RPC of this call carries, the first and every one sent
   * again while the replay has not settled (see MutationOptions.requestId). Default: a random
   * UUID, drawn once per call.
   */
  requestId?: string;
  /**
   * How long to wait for the replay to settle, in ms; after it the last response comes back as
   * it is (`settled: false`; call again with the same `requestId` to wait on). Absent: as long as
   * it takes (as `wait`). The client's `timeoutMs` does not bound it.
   */
  timeoutMs?: number;
  /** Stops waiting: the call rejects with a ConnectError of code `Canceled` (the replay goes on). */
  signal?: AbortSignal;
}

export interface ClientOptions {
  /**
   * Connect over TLS (`https://`), verifying the server against Node's bundled CAs. Default
   * false (plaintext HTTP/2, `http://`); any of the CA or client certificate options implies it.
   */
  tls?: boolean;
  /** Sent as `authorization: Bearer <token>` on every call (`raw` calls included). */
  token?: string;
  /**
   * The deadline of each attempt of a call in ms (default 60 000), within what is left of the
   * call's own deadline or retry window; 0 means none but those, and one past setTimeout's
   * longest delay (2^31-1 ms, about 24.8 days; Infinity too) is that long. It does not bound
   * `wait` (each Wait RPC has its own deadline) nor `watch` and `serveTools` (none).
   */
  timeoutMs?: number;
  /**
   * `false` turns the client's retries off: each call is made once (Wait's failures are thrown
   * at once too; `watch` and `serveTools` keep reopening their streams). Mutating calls still
   * carry a request id. Default true: see `retryWindowMs`.
   */
  retry?: boolean;
  /**
   * How long a call is retried when the caller gives it no `timeoutMs` of its own: no retry
   * starts, and no attempt runs, past this many ms from the call's start. It also bounds a run
   * of failures in a row of `wait` and `watch` (a success starts it again). Default 60 000, or
   * `timeoutMs` when that is longer (so the first attempt keeps its whole deadline).
   */
  retryWindowMs?: number;
  /** PEM CA certificates to verify the server with, instead of Node's bundled CAs. */
  rootCertificates?: string | Buffer;
  /** `rootCertificates` read from a PEM file. */
  caFile?: string;
  /** PEM client certificate (chain) presented to the server (mTLS); needs its key. */
  clientCertificate?: string | Buffer;
  /** PEM private key of the client certificate. */
  clientKey?: string | Buffer;
  /** `clientCertificate` read from a PEM file. */
  clientCertificateFile?: string;
  /** `clientKey` read from a PEM file. */
  clientKeyFile?: string;
  /**
   * HTTP/2 PINGs that detect a dead connection, see KeepaliveOptions. Default DEFAULT_KEEPALIVE
   * (a PING after 60 s without a frame while a call or stream is open, 20 s to answer it); the
   * fields given override it; `false` sends no PINGs.
   */
  keepalive?: KeepaliveOptions | false;
  /**
   * Connect interceptors run around every call (`raw` ones, retries' attempts, `watch` and
   * `serveTools` streams included), the first one outermost. The `token`'s interceptor runs
   * inside them, so they do not see the `authorization` header.
   */
  interceptors?: Interceptor[];
}

/** An AgentDef, Budget or Answer as a message or as a plain init object. */
export type AgentDefInit = MessageInitShape<typeof AgentDefSchema>;
export type BudgetInit = MessageInitShape<typeof BudgetSchema>;
export type AnswerInit = MessageInitShape<typeof AnswerSchema>;
/** A ForkMessage (a handle's last user message replaced at a fork) as a message or a plain init object. */
export type ForkMessageInit = MessageInitShape<typeof ForkMessageSchema>;

/** The generated Connect client, for what the thin methods do not cover. */
export type RawClient = ConnectClient<typeof AgentRuntime>;

/** The unary RPCs of the generated client, by their method names (`spawn`, `post`, ...): what `call` takes. */
export type UnaryMethod = Exclude<keyof RawClient, "watch" | "serveTools">;

/** Turns `host:port` into a base URL; a target that already has a scheme is kept. */
export function baseUrl(target: string, tls = false): string {
  if (/^https?:\/\//.test(target)) return target;
  return `${tls ? "https" : "http"}://${target}`;
}

/** The `ca`, `cert` and `key` of Node's TLS options from ClientOptions (files read now). */
function tlsOptions(options: ClientOptions): { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer } {
  const read = (path: string | undefined, what: string): Buffer | undefined => {
    if (path === undefined) return undefined;
    try {
      return readFileSync(path);
    } catch (error) {
      throw new Error(`cannot read the ${what} file ${path}: ${error instanceof Error ? error.message : String(error)}`);
    }
  };
  const ca = options.rootCertificates ?? read(options.caFile, "CA");
  const cert = options.clientCertificate ?? read(options.clientCertificateFile, "client certificate");
  const key = options.clientKey ?? read(options.clientKeyFile, "client key");
  if ((cert === undefined) !== (key === undefined)) {
    throw new Error("a client certificate and its key go together (mTLS): give both, or neither");
  }
  return { ...(ca !== undefined ? { ca } : {}), ...(cert !== undefined ? { cert, key } : {}) };
}

export class AgentRuntimeClient {
  /** The generated client: every RPC with the transport's interceptors. */
  readonly raw: RawClient;
  private readonly timeoutMs: number;
  private readonly retry: boolean;
  private readonly retryWindowMs: number;
  private readonly sessions: Http2SessionManager;
  /** Aborted by `disconnect`: a call in flight is not retried after it. */
  private readonly closing = new AbortController();

  constructor(target: string, options: ClientOptions = {}) {
    const interceptors: Interceptor[] = [...(options.interceptors ?? [])];
    const token = options.token;
    if (token) {
      interceptors.push((next) => async (request) => {
        request.header.set("authorization", `Bearer ${token}`);
        return next(request);
      });
    }
    const security = tlsOptions(options);
    const secure = options.tls === true || Object.keys(security).length > 0;
    const url = baseUrl(target, secure);
    // The connection (an HTTP/2 session, reopened when it drops), held here so `disconnect` can end it.
    this.sessions = new Http2SessionManager(
      url,
      sessionOptions(options.keepalive),
      Object.keys(security).length > 0 ? security : undefined,
    );
    const transport = createGrpcTransport({ baseUrl: url, interceptors, sessionManager: this.sessions });
    this.raw = createConnectClient(AgentRuntime, transport);
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.retry = options.retry ?? true;
    const window = options.retryWindowMs ?? Math.max(DEFAULT_RETRY_WINDOW_MS, this.timeoutMs > 0 ? this.timeoutMs : 0);
    if (!(window >= 0)) throw new RangeError(`retryWindowMs must be a number of ms >= 0, got ${String(window)}`);
    this.retryWindowMs = window;
  }

  /**
   * Closes the connection: calls in flight fail, and the client is not to be used again. A
   * process whose clients are closed (or idle) can exit.
   */
  disconnect(): void {
    this.closing.abort(new ConnectError("the client was disconnected", Code.Canceled));
    this.sessions.abort();
  }

  /**
   * Makes one call of `rpc` (with each attempt's Connect options) through the retry loop: until
   * `options.timeoutMs` (or the retry window) has passed, each attempt under the client's
   * `timeoutMs` at most; once, under `options.timeoutMs` or `timeoutMs`, when retries are off.
   */
  private unary<T>(options: RequestOptions, rpc: (attempt: CallOptions) => Promise<T>): Promise<T> {
    const given = options.timeoutMs !== undefined && options.timeoutMs > 0 ? options.timeoutMs : undefined;
    const each = this.timeoutMs > 0 ? this.timeoutMs : 0;
    return withRetries(rpc, {
      retry: this.retry,
      signal: options.signal,
      closed: this.closing.signal,
      deadline: performance.now() + (given ?? (this.retry ? this.retryWindowMs : Number.POSITIVE_INFINITY)),
      // Retries off: the one attempt has the call's deadline if given, else the client's.
      attemptTimeoutMs: this.retry || given === undefined ? each : given,
    });
  }

  /**
   * Any unary RPC with a request of your own (fields the thin methods do not take: a Post's
   * `trust` or `coalesceKey`, a Close's `grace`), retried like the thin methods: the request of
   * a mutating RPC is sent with `options.requestId`, else its own `requestId`, else one random
   * UUID for the call, the same on every attempt. Returns the whole response.
   *
   * ```ts
   * const { inboxSize } = await client.call("post", { runtimeId, handleId, text, trust: Trust.EXTERNAL });
   * ```
   */
  async call<M extends UnaryMethod>(
    method: M,
    request: Parameters<RawClient[M]>[0],
    options: MutationOptions = {},
  ): Promise<Awaited<ReturnType<RawClient[M]>>> {
    const takesId = AgentRuntime.method[method].input.fields.some((field) => field.localName === "requestId");
    const own = (request as { requestId?: string }).requestId;
    const sent = takesId ? { ...request, requestId: options.requestId ?? (own || randomUUID()) } : request;
    const rpc = this.raw[method] as (request: unknown, options: CallOptions) => Promise<Awaited<ReturnType<RawClient[M]>>>;
    return this.unary(options, (attempt) => rpc(sent, attempt));
  }

  /**
   * Creates a runtime (one tree); returns its id (generated when `runtimeId` is empty). A
   * repeat with the same request id returns the runtime the first call made.
   */
  async createRuntime(agents: AgentDefInit[], runtimeId = "", options: MutationOptions = {}): Promise<string> {
    const requestId = options.requestId ?? randomUUID();
    const response = await this.unary(options, (call) => this.raw.createRuntime({ runtimeId, agents, requestId }, call));
    return response.runtimeId;
  }

  /** Spawns a handle of `agent` under `parent` (`root` or a handle id); returns its id. */
  async spawn(
    runtimeId: string,
    agent: string,
    parent = "root",
    budget?: BudgetInit,
    options: MutationOptions = {},
  ): Promise<string> {
    const requestId = options.requestId ?? randomUUID();
    const request = { runtimeId, parentId: parent, agent, budget, requestId };
    const response = await this.unary(options, (call) => this.raw.spawn(request, call));
    return response.handleId;
  }

  /** Posts a message into the handle's inbox; returns the inbox size. */
  async post(
    runtimeId: string,
    handleId: string,
    text: string,
    channel = "",
    sender = "",
    options: MutationOptions = {},
  ): Promise<number> {
    const requestId = options.requestId ?? randomUUID();
    const request = { runtimeId, handleId, text, channel, sender, requestId };
    const response = await this.unary(options, (call) => this.raw.post(request, call));
    return response.inboxSize;
  }

  /** Starts a run on `prompt` plus the inbox; returns at once (true when accepted). */
  async wake(runtimeId: string, handleId: string, prompt = "", options: MutationOptions = {}): Promise<boolean> {
    const requestId = options.requestId ?? randomUUID();
    const response = await this.unary(options, (call) => this.raw.wake({ runtimeId, handleId, prompt, requestId }, call));
    return response.queued;
  }

  /**
   * The handle's settled (or PENDING) result, however long the run takes: the client's
   * `timeoutMs` does not cut it short. Each Wait RPC asks the server for at most 30 s
   * (`WAIT_SLICE_MS`) under a deadline 10 s longer, and is repeated while the result is
   * STATUS_TIMEOUT. With `timeoutMs`, the server's STATUS_TIMEOUT result (the handle still
   * running) comes back once it has passed: a timeout is the caller's choice, never the
   * transport's. A failed Wait RPC that may be retried (UNAVAILABLE, a dropped connection, its
   * own deadline, an error with RetryInfo: as every call's) is repeated after a pause with full
   * jitter (0 to 100 ms doubling, at most 5 s; at least RetryInfo's retry_delay), so a server
   * that restarts or a runtime that moves between replicas is waited for; a run of failures in
   * a row longer than the client's `retryWindowMs` (or past `timeoutMs`) throws the last one.
   * `options.signal` stops waiting (a ConnectError of code `Canceled`).
   */
  async wait(runtimeId: string, handleId: string, timeoutMs?: number, options: WaitOptions = {}): Promise<TaskResult> {
    const response = await this.longWait(
      timeoutMs,
      options.signal,
      (sliceMs, call) => this.raw.wait({ runtimeId, handleId, timeout: durationFromMs(sliceMs) }, call),
      (response) => response.result?.status !== Status.TIMEOUT,
    );
    return response.result ?? create(TaskResultSchema);
  }

  /**
   * The loop of `wait` and `replayRuntime`: `rpc(sliceMs, attempt)` asks the server to wait at
   * most `sliceMs` (at most WAIT_SLICE_MS, what is left of `timeoutMs` if given) under an attempt
   * deadline WAIT_MARGIN_MS longer, and is made again while its response is not `settled`; once
   * `timeoutMs` has passed the last response is returned as it is. A failed attempt that may be
   * retried is made again after a pause (RETRY_BACKOFF, at least RetryInfo's retry_delay) unless
   * retries are off; a run of failures in a row longer than the retry window (or past
   * `timeoutMs`) throws the last one. `signal` (or `disconnect`) stops it with CANCELED.
   */
  private async longWait<T>(
    timeoutMs: number | undefined,
    signal: AbortSignal | undefined,
    rpc: (sliceMs: number, attempt: CallOptions) => Promise<T>,
    settled: (response: T) => boolean,
  ): Promise<T> {
    const closed = this.closing.signal;
    const end = timeoutMs === undefined ? undefined : performance.now() + Math.max(timeoutMs, 0);
    let failures = 0; // failed attempts in a row
    let failingSince = 0; // when the first of them failed
    for (;;) {
      const stop = signal?.aborted ? signal : closed.aborted ? closed : undefined;
      if (stop !== undefined) throw abortError(stop);
      const slice = waitSliceMs(end, performance.now());
      const attemptMs = slice + WAIT_MARGIN_MS;
      const started = performance.now();
      let response: T;
      try {
        response = await rpc(slice, { timeoutMs: attemptMs, signal });
      } catch (error) {
        const stop = signal?.aborted ? signal : closed.aborted ? closed : undefined;
        if (stop !== undefined) throw abortError(stop);
        const now = performance.now();
        if (!this.retry || !isRetryable(error, now - started, attemptMs)) throw error;
        if (failures === 0) failingSince = now;
        const delay = retryPauseMs(error, failures);
        failures += 1;
        const limit = Math.min(failingSince + this.retryWindowMs, end ?? Number.POSITIVE_INFINITY);
        if (now + delay >= limit) throw error;
        await pause(delay, signal, closed);
        continue;
      }
      failures = 0;
      if (settled(response) || (end !== undefined && performance.now() >= end)) return response;
    }
  }

  /**
   * Answers a pending Request and continues the suspended handles; returns the next result
   * (the server returns the same result for the same answer and runs nothing again).
   */
  async resume(runtimeId: string, answer: AnswerInit, options: MutationOptions = {}): Promise<TaskResult> {
    const requestId = options.requestId ?? randomUUID();
    const response = await this.unary(options, (call) => this.raw.resume({ runtimeId, answer, requestId }, call));
    return response.result ?? create(TaskResultSchema);
  }

  /**
   * Spawn + Wake + Wait: the settled (or PENDING) result of a fresh handle, however long it
   * takes (see `wait`; `options.timeoutMs` and `options.signal` are passed on to it, the signal
   * to the Spawn and the Wake too). The Spawn and the Wake each carry one request id on every
   * attempt (`options.spawnRequestId`, `options.wakeRequestId`, or random UUIDs), so retrying
   * them makes no second handle and no second run.
   */
  async run(runtimeId: string, agent: string, prompt: string, parent = "root", options: RunOptions = {}): Promise<TaskResult> {
    const signal = options.signal;
    const handleId = await this.spawn(runtimeId, agent, parent, undefined, { requestId: options.spawnRequestId, signal });
    await this.wake(runtimeId, handleId, prompt, { requestId: options.wakeRequestId, signal });
    return this.wait(runtimeId, handleId, options.timeoutMs, { signal });
  }

  /** Cancels the handle's run and its subtree's; false when there was nothing to interrupt. */
  async interrupt(runtimeId: string, handleId: string, options: MutationOptions = {}): Promise<boolean> {
    const requestId = options.requestId ?? randomUUID();
    const response = await this.unary(options, (call) => this.raw.interrupt({ runtimeId, handleId, requestId }, call));
    return response.interrupted;
  }

  /** Closes the handle and its subtree; returns the closed ids, leaf first. */
  async close(runtimeId: string, handleId: string, force = false, options: MutationOptions = {}): Promise<string[]> {
    const requestId = options.requestId ?? randomUUID();
    const response = await this.unary(options, (call) => this.raw.close({ runtimeId, handleId, force, requestId }, call));
    return response.closedHandleIds;
  }

  /** One handle's view. */
  async inspect(runtimeId: string, handleId: string, options: RequestOptions = {}): Promise<HandleView> {
    const response = await this.unary(options, (call) => this.raw.inspect({ runtimeId, handleId }, call));
    return response.handle ?? create(HandleViewSchema);
  }

  /**
   * Every handle of the runtime, in spawn order (it follows the pages of List to the last);
   * `options` apply to each page's call.
   */
  async list(runtimeId: string, options: RequestOptions = {}): Promise<HandleView[]> {
    return collect(this.iterateList(runtimeId, 0, options));
  }

  /**
   * The runtime's handles one at a time, in spawn order, fetching a page of `pageSize` (0: the
   * server's default) whenever the previous one is used up: `for await (const view of
   * client.iterateList(runtimeId)) ...`. Leaving the loop early fetches no more pages.
   */
  iterateList(runtimeId: string, pageSize = 0, options: RequestOptions = {}): AsyncGenerator<HandleView, void, undefined> {
    return paged(async (pageToken) => {
      const response = await this.listPage(runtimeId, pageSize, pageToken, options);
      return [response.handles, response.nextPageToken];
    });
  }

  /**
   * One page of List: at most `pageSize` handles (0: the server's default) from `pageToken` on
   * (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async listPage(runtimeId: string, pageSize = 0, pageToken = "", options: RequestOptions = {}): Promise<ListResponse> {
    return this.unary(options, (call) => this.raw.list({ runtimeId, pageSize, pageToken }, call));
  }

  /**
   * The handle's whole stored transcript (it follows the pages of GetTranscript to the last);
   * `options` apply to each page's call.
   */
  async transcript(runtimeId: string, handleId: string, options: RequestOptions = {}): Promise<Message[]> {
    return collect(this.iterateTranscript(runtimeId, handleId, 0, options));
  }

  /**
   * The handle's transcript one message at a time, oldest first, fetching a page of `pageSize`
   * (0: the server's default) whenever the previous one is used up.
   */
  iterateTranscript(
    runtimeId: string,
    handleId: string,
    pageSize = 0,
    options: RequestOptions = {},
  ): AsyncGenerator<Message, void, undefined> {
    return paged(async (pageToken) => {
      const response = await this.transcriptPage(runtimeId, handleId, pageSize, pageToken, options);
      return [response.messages, response.nextPageToken];
    });
  }

  /**
   * One page of GetTranscript: at most `pageSize` messages (0: the server's default) from
   * `pageToken` on (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async transcriptPage(
    runtimeId: string,
    handleId: string,
    pageSize = 0,
    pageToken = "",
    options: RequestOptions = {},
  ): Promise<GetTranscriptResponse> {
    return this.unary(options, (call) => this.raw.getTranscript({ runtimeId, handleId, pageSize, pageToken }, call));
  }

  /**
   * Every runtime of the caller's tenant, newest first (it follows the pages of ListRuntimes to
   * the last); `options` apply to each page's call, and `options.forksOf` keeps only that
   * runtime's forks and replays.
   */
  async listRuntimes(options: ListRuntimesOptions = {}): Promise<RuntimeSummary[]> {
    return collect(this.iterateRuntimes(0, options));
  }

  /**
   * The caller's tenant's runtimes one at a time, newest first, fetching a page of `pageSize`
   * (0: the server's default) whenever the previous one is used up (`options.forksOf`: only that
   * runtime's forks and replays).
   */
  iterateRuntimes(pageSize = 0, options: ListRuntimesOptions = {}): AsyncGenerator<RuntimeSummary, void, undefined> {
    return paged(async (pageToken) => {
      const response = await this.listRuntimesPage(pageSize, pageToken, options);
      return [response.runtimes, response.nextPageToken];
    });
  }

  /**
   * One page of ListRuntimes: at most `pageSize` runtimes (0: the server's default), newest first,
   * from `pageToken` on (empty for the first page); its `nextPageToken` is empty on the last page.
   * `options.forksOf` keeps only that runtime's forks and replays.
   */
  async listRuntimesPage(pageSize = 0, pageToken = "", options: ListRuntimesOptions = {}): Promise<ListRuntimesResponse> {
    const forksOf = options.forksOf ?? "";
    return this.unary(options, (call) => this.raw.listRuntimes({ pageSize, pageToken, forksOf }, call));
  }

  /**
   * Closes the runtime and deletes everything stored of it; `force` interrupts running handles
   * (without it a runtime with running handles is refused). A repeat with the same request id
   * gets the first answer, not NOT_FOUND.
   */
  async deleteRuntime(runtimeId: string, force = false, options: MutationOptions = {}): Promise<void> {
    const requestId = options.requestId ?? randomUUID();
    await this.unary(options, (call) => this.raw.deleteRuntime({ runtimeId, force, requestId }, call));
  }

  /**
   * Forks `sourceRuntimeId` at the event `atSeq` (a Watch seq, 1 or more): a new runtime whose
   * journal is the source's up to the step that made that event, replayed without a model or
   * tool call; the runs in flight at the cut are held (HANDLE_STATE_HELD) until a Wake. The source
   * is never written to. `options` carry the changes at the fork (`agents`, `messages`,
   * `answers`), the fork's id (`runtimeId`, generated when empty) and, as every mutating call's,
   * a request id (the caller's, or a random UUID drawn once) sent on every attempt, so a retry
   * makes no second fork. Returns the whole response: the fork's `runtimeId`, its `forkSeq` (the
   * last event it holds: `atSeq`, or the last event of that step) and `heldHandleIds`.
   */
  async forkRuntime(
    sourceRuntimeId: string,
    atSeq: bigint | number,
    options: ForkRuntimeOptions = {},
  ): Promise<ForkRuntimeResponse> {
    const { runtimeId = "", agents = [], messages = [], answers = [] } = options;
    const requestId = options.requestId ?? randomUUID();
    const request = { sourceRuntimeId, atSeq: BigInt(atSeq), runtimeId, agents, messages, answers, requestId };
    return this.unary(options, (call) => this.raw.forkRuntime(request, call));
  }

  /**
   * Replays `sourceRuntimeId`: its root handles' runs again, in a new runtime, with
   * `options.agents` in place of the recording's definitions of those names; a tool call the
   * recording has (same handle, call and place) is answered from it, any other as
   * `options.unrecordedCalls` says. Returns, once every root of the replay has settled, the
   * response: the replay's `runtimeId`, one `ReplayDiff` per recorded root (recorded and replayed
   * results and tool calls side by side, and what `changed`) and `changedCount`.
   *
   * It waits as `wait` does, however long the replay takes: each ReplayRuntime RPC asks the server
   * for at most 30 s (`ReplayRuntimeRequest.timeout`, WAIT_SLICE_MS) under a deadline 10 s
   * longer, and while the response says `settled: false` the same request is sent again with the
   * same request id (the caller's `options.requestId`, or one random UUID for the call), so the
   * replay is started once and waited on. Failed RPCs are retried as `wait`'s. With
   * `options.timeoutMs`, the last response (`settled: false`) comes back once it has passed;
   * `options.signal` stops waiting (CANCELED; the replay goes on).
   */
  async replayRuntime(sourceRuntimeId: string, options: ReplayRuntimeOptions = {}): Promise<ReplayRuntimeResponse> {
    const { agents = [], unrecordedCalls = UnrecordedCalls.UNSPECIFIED, runtimeId = "" } = options;
    const requestId = options.requestId ?? randomUUID();
    return this.longWait(
      options.timeoutMs,
      options.signal,
      (sliceMs, call) =>
        this.raw.replayRuntime(
          { sourceRuntimeId, agents, unrecordedCalls, runtimeId, requestId, timeout: durationFromMs(sliceMs) },
          call,
        ),
      (response) => response.settled,
    );
  }

  /**
   * The runtime's events after `afterSeq` (0: its whole history), in order, once each; it never
   * ends by itself. It uses this client's connection (TLS, token) and no deadline. A dropped
   * stream (UNAVAILABLE; CANCELED or ABORTED from a connection that died; RESOURCE_EXHAUSTED
   * with ErrorInfo reason WATCH_LAGGING when this consumer fell too far behind; any error with
   * RetryInfo) or one the server ends is reopened from the last seq seen, so nothing is missed
   * or seen twice: after a pause of 1 s doubling per failure in a row, up to 30 s (`backoffMs`),
   * drawn from its upper half (none when lagging), at least RetryInfo's retry_delay. After
   * `maxRetries` (default 5) reconnections in a row with no event between them, or failures in a
   * row for longer than the client's `retryWindowMs`, the last error is thrown; any other code is
   * thrown at once. `options.signal` (or leaving the loop) ends it. The server is asked for
   * batches (`WatchRequest.batch`: the events at hand in one response), whose events are handed
   * over one at a time.
   *
   * ```ts
   * const stop = new AbortController();
   * for await (const event of client.watch(runtimeId, 0, { signal: stop.signal })) {
   *   console.log(event.seq, event.handleId, event.payload.case);
   * }
   * ```
   */
  watch(runtimeId: string, afterSeq: bigint | number = 0, options?: WatchOptions): AsyncGenerator<Event, void, undefined> {
    return watch(this.raw, runtimeId, BigInt(afterSeq), { ...options, retryWindowMs: options?.retryWindowMs ?? this.retryWindowMs });
  }

  /**
   * Spawn + Watch with deltas + Wake: the text (and thinking, tool-call pieces, resets) of a
   * fresh handle's model turns as the model writes them, then its result. It yields
   * `{ delta }` for each piece of that handle's turns (other handles' are left out), each once,
   * then one `{ result }`, the TaskResult of the handle's first `result` event, and ends. The
   * Spawn and the Wake are retried like `run`'s, each with one request id
   * (`options.spawnRequestId`, `options.wakeRequestId`, or random UUIDs). The Wake is sent only
   * once the Watch (from seq 0, `WatchRequest.deltas`) has answered: a provider's turn streams
   * only to the watchers there when it starts. The Watch is reopened as `watch` reopens it, by
   * the same rules and options (a new piece counting as progress, as an event does), from the
   * last event seen: the server then sends each turn in progress again from index 0, and the
   * pieces already handed over are skipped. A `reset` delta (the turn's provider call is
   * retried, or the turn runs again after a restart) is always handed over: what was shown of
   * that turn is void, and its pieces follow again from index 1. Aborting `options.signal`
   * throws CANCELED (as `run` does); leaving the loop cancels the Watch (the run goes on).
   *
   * ```ts
   * for await (const item of client.streamRun(runtimeId, "writer", "tell me a story")) {
   *   if (item.delta?.piece.case === "text") process.stdout.write(item.delta.piece.value);
   *   else if (item.result) console.log("\n", StatusSchema.value[item.result.status]?.name);
   * }
   * ```
   */
  async *streamRun(
    runtimeId: string,
    agent: string,
    prompt: string,
    parent = "root",
    options: StreamRunOptions = {},
  ): AsyncGenerator<StreamRunItem, void, undefined> {
    const { spawnRequestId, wakeRequestId, ...watchOptions } = options;
    const signal = options.signal;
    const handleId = await this.spawn(runtimeId, agent, parent, undefined, { requestId: spawnRequestId, signal });
    const wake = () => this.wake(runtimeId, handleId, prompt, { requestId: wakeRequestId, signal });
    yield* streamHandle(this.raw, runtimeId, handleId, wake, {
      ...watchOptions,
      retryWindowMs: watchOptions.retryWindowMs ?? this.retryWindowMs,
    });
  }

  /**
   * Serves the worker tools (ToolDef.worker) of `queue` until `options.signal` aborts, then
   * resolves. `handlers` maps each tool name to its handler; the worker registers for those
   * names (sorted) and `maxConcurrentCalls` (default 10) calls at once, which run concurrently.
   * A handler's return value is the tool's output; a handler that throws, an unknown tool and
   * arguments that are not a JSON object are answered as error results (`isError`), for the
   * model to see. A dropped stream (UNAVAILABLE, UNKNOWN, CANCELLED by the server, ABORTED: a
   * reset connection) or one the server ends is reopened with backoff (250 ms doubling up to
   * 10 s, jittered); any other code (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, ...)
   * rejects at once. It uses this client's connection (TLS, token) and no deadline.
   *
   * ```ts
   * const stop = new AbortController();
   * const serving = client.serveTools("weather", {
   *   forecast: async (args) => `sunny in ${String(args.city)}`,
   * }, { signal: stop.signal });
   * // ... later
   * stop.abort();
   * await serving;
   * ```
   */
  serveTools(queue: string, handlers: Record<string, ToolHandler>, options?: ServeToolsOptions): Promise<void> {
    return serveTools(this.raw, queue, handlers, options);
  }
}

/**
 * Every item of every page, a page fetched (`fetch(pageToken)`: its items and the next page's
 * token, empty after the last) only when the one before is used up.
 */
async function* paged<T>(fetch: (pageToken: string) => Promise<[T[], string]>): AsyncGenerator<T, void, undefined> {
  let pageToken = "";
  do {
    const [items, next] = await fetch(pageToken);
    yield* items;
    pageToken = next;
  } while (pageToken);
}

/** Every item of an async iterable, in order. */
async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const all: T[] = [];
  for await (const item of items) all.push(item);
  return all;
}

/**
 * `createClient("127.0.0.1:50051", { token, tls, timeoutMs })`; over TLS with a private CA and a
 * client certificate: `createClient("host:443", { caFile, clientCertificateFile, clientKeyFile, token })`.
 */
export function createClient(target: string, options?: ClientOptions): AgentRuntimeClient {
  return new AgentRuntimeClient(target, options);
}

// --- errors ------------------------------------------------------------------

/** The canonical gRPC status code names, by Connect `Code`. */
const GRPC_CODE_NAMES: Record<Code, string> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** The gRPC name of a Connect code: `Code.ResourceExhausted` → `RESOURCE_EXHAUSTED`. */
export function grpcCodeName(code: Code): string {
  return GRPC_CODE_NAMES[code] ?? `CODE_${code}`;
}

/** The google.rpc details this server sends, decoded from the error's status. */
export interface ErrorDetails {
  errorInfo?: ErrorInfo;
  badRequest?: BadRequest;
  resourceInfo?: ResourceInfo;
  /** A tenant quota that a RESOURCE_EXHAUSTED hit: its violations' subject (`tenant:acme`). */
  quotaFailure?: QuotaFailure;
  /**
   * How long to wait before trying again (`retryInfo.retryDelay`): on every UNAVAILABLE the
   * server sends without having acted (ErrorInfo reason RUNTIME_MOVING, SERVER_DRAINING,
   * STORE_UNAVAILABLE, ...). The client's retries honour it already.
   */
  retryInfo?: RetryInfo;
}

/**
 * Decodes the details of a failed call (any caught value; non-Connect errors have none).
 * `errorInfo.metadata.limit` names the budget of a RESOURCE_EXHAUSTED (`LIMIT_MAX_CHILDREN`, ...).
 */
export function errorDetails(error: unknown): ErrorDetails {
  if (!(error instanceof ConnectError)) return {};
  return {
    errorInfo: error.findDetails(ErrorInfoSchema)[0],
    badRequest: error.findDetails(BadRequestSchema)[0],
    resourceInfo: error.findDetails(ResourceInfoSchema)[0],
    quotaFailure: error.findDetails(QuotaFailureSchema)[0],
    retryInfo: error.findDetails(RetryInfoSchema)[0],
  };
}

/**
 * Whether `error` is a ConnectError with `code` (a type guard): `hasCode(err, Code.NotFound)`,
 * then `errorDetails(err).resourceInfo` says what was not found.
 */
export function hasCode(error: unknown, code: Code): error is ConnectError {
  return error instanceof ConnectError && error.code === code;
}

/** NOT_FOUND: no such runtime, handle or pending request (`errorDetails(err).resourceInfo` says which). */
export const isNotFound = (error: unknown): error is ConnectError => hasCode(error, Code.NotFound);
/** INVALID_ARGUMENT: `errorDetails(err).badRequest` lists the fields. */
export const isInvalidArgument = (error: unknown): error is ConnectError => hasCode(error, Code.InvalidArgument);
/** FAILED_PRECONDITION: `errorDetails(err).errorInfo.reason` says which (HANDLE_RUNNING, ...). */
export const isFailedPrecondition = (error: unknown): error is ConnectError => hasCode(error, Code.FailedPrecondition);
/** RESOURCE_EXHAUSTED: a budget (`errorInfo.metadata.limit`) or a tenant quota (`quotaFailure`). */
export const isResourceExhausted = (error: unknown): error is ConnectError => hasCode(error, Code.ResourceExhausted);
/** ALREADY_EXISTS: CreateRuntime with an id in use. */
export const isAlreadyExists = (error: unknown): error is ConnectError => hasCode(error, Code.AlreadyExists);
/** UNAVAILABLE: the server could not be reached, or refused for now (`errorDetails(err).errorInfo.reason`), and the retries ran out. */
export const isUnavailable = (error: unknown): error is ConnectError => hasCode(error, Code.Unavailable);
/** UNAUTHENTICATED: a missing or rejected token. */
export const isUnauthenticated = (error: unknown): error is ConnectError => hasCode(error, Code.Unauthenticated);
/** PERMISSION_DENIED: a token without the scope the call needs. */
export const isPermissionDenied = (error: unknown): error is ConnectError => hasCode(error, Code.PermissionDenied);

/** `RESOURCE_EXHAUSTED: <server message>`, like the Python client's AgentRuntimeError. */
export function describeError(error: unknown): string {
  if (error instanceof ConnectError) return `${grpcCodeName(error.code)}: ${error.rawMessage}`;
  return error instanceof Error ? error.message : String(error);
}
