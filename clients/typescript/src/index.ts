/**
 * A thin client over the generated AgentRuntime stubs: one method per verb, errors as
 * ConnectError with their gRPC code and google.rpc details. The calls that change nothing when
 * repeated (Wait, Resume, Inspect, List, GetTranscript, ListRuntimes) are retried on UNAVAILABLE
 * and on a connection that died under the call (see retry.ts `isDropped`); Spawn, Wake, Post,
 * Interrupt, Close, CreateRuntime, DeleteRuntime and ServeTools are not: a lost answer does
 * not say whether they took effect.
 *
 * ```ts
 * const client = createClient("127.0.0.1:50051");
 * const runtimeId = await client.createRuntime(agents);
 * const result = await client.run(runtimeId, "coordinator", "map the repo");
 * ```
 */

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
  type AgentDefSchema,
  type AnswerSchema,
  type BudgetSchema,
  type Event,
  type GetTranscriptResponse,
  type HandleView,
  type ListResponse,
  type ListRuntimesResponse,
  type Message,
  type RuntimeSummary,
  type TaskResult,
} from "./gen/agentruntime/v1/agent_runtime_pb.js";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  QuotaFailureSchema,
  ResourceInfoSchema,
  type BadRequest,
  type ErrorInfo,
  type QuotaFailure,
  type ResourceInfo,
} from "./gen/google/rpc/error_details_pb.js";
import { sessionOptions, type KeepaliveOptions } from "./keepalive.js";
import { RESUME_RETRY, SAFE_RETRY, WAIT_MARGIN_MS, WAIT_RETRY, deadlineMs, retrying, waitSliceMs } from "./retry.js";
import { watch, type WatchOptions } from "./watch.js";
import { serveTools, type ServeToolsOptions, type ToolHandler } from "./workers.js";

export { DEFAULT_MAX_CONCURRENT_CALLS, type ServeToolsOptions, type ToolHandler } from "./workers.js";
export { DEFAULT_WATCH_RETRIES, type WatchOptions } from "./watch.js";
export { DEFAULT_KEEPALIVE, type KeepaliveOptions } from "./keepalive.js";
export {
  RESUME_RETRY,
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

/** Options of `wait`. */
export interface WaitOptions {
  /** Stops waiting: the call rejects with a ConnectError of code `Canceled` (the run goes on). */
  signal?: AbortSignal;
}

/** Options of `run`: those of `wait`, and its `timeoutMs`. */
export interface RunOptions extends WaitOptions {
  /** As `wait`'s `timeoutMs`: after it, the server's STATUS_TIMEOUT result (the handle still running). */
  timeoutMs?: number;
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
   * The deadline of each call in ms (default 60 000); 0 means no deadline, and one past
   * setTimeout's longest delay (2^31-1 ms, about 24.8 days; Infinity too) is that long. It does not bound
   * `wait` (each Wait RPC has its own deadline) nor `watch` and `serveTools` (none).
   */
  timeoutMs?: number;
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

/** The generated Connect client, for what the thin methods do not cover. */
export type RawClient = ConnectClient<typeof AgentRuntime>;

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
  private readonly sessions: Http2SessionManager;

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
  }

  /**
   * Closes the connection: calls in flight fail, and the client is not to be used again. A
   * process whose clients are closed (or idle) can exit.
   */
  disconnect(): void {
    this.sessions.abort();
  }

  private call(timeoutMs?: number): CallOptions {
    return { timeoutMs: deadlineMs(timeoutMs ?? this.timeoutMs) };
  }

  /** Creates a runtime (one tree); returns its id (generated when `runtimeId` is empty). */
  async createRuntime(agents: AgentDefInit[], runtimeId = ""): Promise<string> {
    const response = await this.raw.createRuntime({ runtimeId, agents }, this.call());
    return response.runtimeId;
  }

  /** Spawns a handle of `agent` under `parent` (`root` or a handle id); returns its id. */
  async spawn(runtimeId: string, agent: string, parent = "root", budget?: BudgetInit): Promise<string> {
    const response = await this.raw.spawn({ runtimeId, parentId: parent, agent, budget }, this.call());
    return response.handleId;
  }

  /** Posts a message into the handle's inbox; returns the inbox size. */
  async post(runtimeId: string, handleId: string, text: string, channel = "", sender = ""): Promise<number> {
    const response = await this.raw.post({ runtimeId, handleId, text, channel, sender }, this.call());
    return response.inboxSize;
  }

  /** Starts a run on `prompt` plus the inbox; returns at once (true when accepted). */
  async wake(runtimeId: string, handleId: string, prompt = ""): Promise<boolean> {
    const response = await this.raw.wake({ runtimeId, handleId, prompt }, this.call());
    return response.queued;
  }

  /**
   * The handle's settled (or PENDING) result, however long the run takes: the client's
   * `timeoutMs` does not cut it short. Each Wait RPC asks the server for at most 30 s
   * (`WAIT_SLICE_MS`) under a deadline 10 s longer, and is repeated while the result is
   * STATUS_TIMEOUT. With `timeoutMs`, the server's STATUS_TIMEOUT result (the handle still
   * running) comes back once it has passed: a timeout is the caller's choice, never the
   * transport's. A server that is restarting (UNAVAILABLE, or the connection dropped) is
   * waited for, with backoff and jitter (100 ms doubling, at most 5 s), until `timeoutMs`.
   * `options.signal` stops waiting (a ConnectError of code `Canceled`).
   */
  async wait(runtimeId: string, handleId: string, timeoutMs?: number, options: WaitOptions = {}): Promise<TaskResult> {
    const signal = options.signal;
    const end = timeoutMs === undefined ? undefined : performance.now() + Math.max(timeoutMs, 0);
    for (;;) {
      const response = await retrying(
        () => {
          const slice = waitSliceMs(end, performance.now());
          const request = { runtimeId, handleId, timeout: durationFromMs(slice) };
          return this.raw.wait(request, { timeoutMs: slice + WAIT_MARGIN_MS, signal });
        },
        WAIT_RETRY,
        { signal, until: end },
      );
      const result = response.result ?? create(TaskResultSchema);
      if (result.status !== Status.TIMEOUT || (end !== undefined && performance.now() >= end)) return result;
    }
  }

  /**
   * Answers a pending Request and continues the suspended handles. Safe to repeat (the server
   * returns the same result for the same answer and runs nothing again), so UNAVAILABLE (or a
   * dropped connection) is retried: 8 attempts, 100 ms doubling to 5 s, jittered.
   */
  async resume(runtimeId: string, answer: AnswerInit): Promise<TaskResult> {
    const response = await retrying(() => this.raw.resume({ runtimeId, answer }, this.call()), RESUME_RETRY);
    return response.result ?? create(TaskResultSchema);
  }

  /**
   * Spawn + Wake + Wait: the settled (or PENDING) result of a fresh handle, however long it
   * takes (see `wait`; `options.timeoutMs` and `options.signal` are passed on to it).
   */
  async run(runtimeId: string, agent: string, prompt: string, parent = "root", options: RunOptions = {}): Promise<TaskResult> {
    const handleId = await this.spawn(runtimeId, agent, parent);
    await this.wake(runtimeId, handleId, prompt);
    return this.wait(runtimeId, handleId, options.timeoutMs, { signal: options.signal });
  }

  /** Cancels the handle's run and its subtree's; false when there was nothing to interrupt. */
  async interrupt(runtimeId: string, handleId: string): Promise<boolean> {
    const response = await this.raw.interrupt({ runtimeId, handleId }, this.call());
    return response.interrupted;
  }

  /** Closes the handle and its subtree; returns the closed ids, leaf first. */
  async close(runtimeId: string, handleId: string, force = false): Promise<string[]> {
    const response = await this.raw.close({ runtimeId, handleId, force }, this.call());
    return response.closedHandleIds;
  }

  /** One handle's view. */
  async inspect(runtimeId: string, handleId: string): Promise<HandleView> {
    const response = await retrying(() => this.raw.inspect({ runtimeId, handleId }, this.call()), SAFE_RETRY);
    return response.handle ?? create(HandleViewSchema);
  }

  /** Every handle of the runtime, in spawn order (it follows the pages of List to the last). */
  async list(runtimeId: string): Promise<HandleView[]> {
    return collect(this.iterateList(runtimeId));
  }

  /**
   * The runtime's handles one at a time, in spawn order, fetching a page of `pageSize` (0: the
   * server's default) whenever the previous one is used up: `for await (const view of
   * client.iterateList(runtimeId)) ...`. Leaving the loop early fetches no more pages.
   */
  iterateList(runtimeId: string, pageSize = 0): AsyncGenerator<HandleView, void, undefined> {
    return paged(async (pageToken) => {
      const response = await this.listPage(runtimeId, pageSize, pageToken);
      return [response.handles, response.nextPageToken];
    });
  }

  /**
   * One page of List: at most `pageSize` handles (0: the server's default) from `pageToken` on
   * (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async listPage(runtimeId: string, pageSize = 0, pageToken = ""): Promise<ListResponse> {
    return retrying(() => this.raw.list({ runtimeId, pageSize, pageToken }, this.call()), SAFE_RETRY);
  }

  /** The handle's whole stored transcript (it follows the pages of GetTranscript to the last). */
  async transcript(runtimeId: string, handleId: string): Promise<Message[]> {
    return collect(this.iterateTranscript(runtimeId, handleId));
  }

  /**
   * The handle's transcript one message at a time, oldest first, fetching a page of `pageSize`
   * (0: the server's default) whenever the previous one is used up.
   */
  iterateTranscript(runtimeId: string, handleId: string, pageSize = 0): AsyncGenerator<Message, void, undefined> {
    return paged(async (pageToken) => {
      const response = await this.transcriptPage(runtimeId, handleId, pageSize, pageToken);
      return [response.messages, response.nextPageToken];
    });
  }

  /**
   * One page of GetTranscript: at most `pageSize` messages (0: the server's default) from
   * `pageToken` on (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async transcriptPage(runtimeId: string, handleId: string, pageSize = 0, pageToken = ""): Promise<GetTranscriptResponse> {
    return retrying(() => this.raw.getTranscript({ runtimeId, handleId, pageSize, pageToken }, this.call()), SAFE_RETRY);
  }

  /** Every runtime of the caller's tenant, newest first (it follows the pages of ListRuntimes to the last). */
  async listRuntimes(): Promise<RuntimeSummary[]> {
    return collect(this.iterateRuntimes());
  }

  /**
   * The caller's tenant's runtimes one at a time, newest first, fetching a page of `pageSize`
   * (0: the server's default) whenever the previous one is used up.
   */
  iterateRuntimes(pageSize = 0): AsyncGenerator<RuntimeSummary, void, undefined> {
    return paged(async (pageToken) => {
      const response = await this.listRuntimesPage(pageSize, pageToken);
      return [response.runtimes, response.nextPageToken];
    });
  }

  /**
   * One page of ListRuntimes: at most `pageSize` runtimes (0: the server's default), newest first,
   * from `pageToken` on (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async listRuntimesPage(pageSize = 0, pageToken = ""): Promise<ListRuntimesResponse> {
    return retrying(() => this.raw.listRuntimes({ pageSize, pageToken }, this.call()), SAFE_RETRY);
  }

  /**
   * Closes the runtime and deletes everything stored of it; `force` interrupts running handles
   * (without it a runtime with running handles is refused).
   */
  async deleteRuntime(runtimeId: string, force = false): Promise<void> {
    await this.raw.deleteRuntime({ runtimeId, force }, this.call());
  }

  /**
   * The runtime's events after `afterSeq` (0: its whole history), in order, once each; it never
   * ends by itself. It uses this client's connection (TLS, token) and no deadline. A dropped
   * stream (UNAVAILABLE; CANCELED or ABORTED from a connection that died; RESOURCE_EXHAUSTED
   * with ErrorInfo reason WATCH_LAGGING when this consumer fell too far behind) or one the
   * server ends is reopened from the last seq seen,
   * so nothing is missed or seen twice: after a pause of 1 s doubling per failure in a row, up to 30 s
   * (`backoffMs`), drawn from its upper half (none when lagging). After `maxRetries` (default 5) reconnections in a row with
   * no event between them, the last error is thrown; any other code is thrown at once.
   * `options.signal` (or leaving the loop) ends it.
   *
   * ```ts
   * const stop = new AbortController();
   * for await (const event of client.watch(runtimeId, 0, { signal: stop.signal })) {
   *   console.log(event.seq, event.handleId, event.payload.case);
   * }
   * ```
   */
  watch(runtimeId: string, afterSeq: bigint | number = 0, options?: WatchOptions): AsyncGenerator<Event, void, undefined> {
    return watch(this.raw, runtimeId, BigInt(afterSeq), options);
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
/** UNAVAILABLE: the server could not be reached; calls safe to repeat were retried already. */
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
