/**
 * A thin client over the generated AgentRuntime stubs: one method per verb, errors as
 * ConnectError with their gRPC code and google.rpc details.
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
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  AgentRuntime,
  HandleViewSchema,
  TaskResultSchema,
  type AgentDefSchema,
  type AnswerSchema,
  type BudgetSchema,
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
  ResourceInfoSchema,
  type BadRequest,
  type ErrorInfo,
  type ResourceInfo,
} from "./gen/google/rpc/error_details_pb.js";
import { serveTools, type ServeToolsOptions, type ToolHandler } from "./workers.js";

export { DEFAULT_MAX_CONCURRENT_CALLS, type ServeToolsOptions, type ToolHandler } from "./workers.js";
export * from "./gen/agentruntime/v1/agent_runtime_pb.js";
export * from "./gen/google/rpc/error_details_pb.js";
export { Code, ConnectError };

/** The default deadline of every call, as in the Python client (60 s). */
export const DEFAULT_TIMEOUT_MS = 60_000;

export interface ClientOptions {
  /**
   * Connect over TLS (`https://`), verifying the server against Node's bundled CAs. Default
   * false (plaintext HTTP/2, `http://`); any of the CA or client certificate options implies it.
   */
  tls?: boolean;
  /** Sent as `authorization: Bearer <token>` on every call (`raw` calls included). */
  token?: string;
  /** The deadline of each call in ms (default 60 000); 0 means no deadline. */
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

  constructor(target: string, options: ClientOptions = {}) {
    const interceptors: Interceptor[] = [];
    const token = options.token;
    if (token) {
      interceptors.push((next) => async (request) => {
        request.header.set("authorization", `Bearer ${token}`);
        return next(request);
      });
    }
    const security = tlsOptions(options);
    const secure = options.tls === true || Object.keys(security).length > 0;
    const transport = createGrpcTransport({
      baseUrl: baseUrl(target, secure),
      interceptors,
      ...(Object.keys(security).length > 0 ? { nodeOptions: security } : {}),
    });
    this.raw = createConnectClient(AgentRuntime, transport);
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  }

  private call(timeoutMs?: number): CallOptions {
    const ms = timeoutMs ?? this.timeoutMs;
    // Connect: timeoutMs <= 0 disables the deadline.
    return { timeoutMs: ms > 0 ? ms : 0 };
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
   * Waits for the handle to settle. Without `timeoutMs` the server waits until it settles,
   * bounded by the call deadline; with it, STATUS_TIMEOUT comes back when it passes first.
   */
  async wait(runtimeId: string, handleId: string, timeoutMs?: number): Promise<TaskResult> {
    const timeout = timeoutMs !== undefined ? durationFromMs(timeoutMs) : undefined;
    // The call deadline outlives the server-side timeout by 5 s (0: no deadline).
    const deadline = this.timeoutMs > 0 ? Math.max(this.timeoutMs, (timeoutMs ?? 0) + 5_000) : 0;
    const response = await this.raw.wait({ runtimeId, handleId, timeout }, this.call(deadline));
    return response.result ?? create(TaskResultSchema);
  }

  /** Answers a pending Request and continues the suspended handles. */
  async resume(runtimeId: string, answer: AnswerInit): Promise<TaskResult> {
    const response = await this.raw.resume({ runtimeId, answer }, this.call());
    return response.result ?? create(TaskResultSchema);
  }

  /** Spawn + Wake + Wait: the settled (or PENDING) result of a fresh handle. */
  async run(runtimeId: string, agent: string, prompt: string, parent = "root"): Promise<TaskResult> {
    const handleId = await this.spawn(runtimeId, agent, parent);
    await this.wake(runtimeId, handleId, prompt);
    return this.wait(runtimeId, handleId);
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
    const response = await this.raw.inspect({ runtimeId, handleId }, this.call());
    return response.handle ?? create(HandleViewSchema);
  }

  /** Every handle of the runtime, in spawn order (it follows the pages of List to the last). */
  async list(runtimeId: string): Promise<HandleView[]> {
    const handles: HandleView[] = [];
    let pageToken = "";
    do {
      const response = await this.listPage(runtimeId, 0, pageToken);
      handles.push(...response.handles);
      pageToken = response.nextPageToken;
    } while (pageToken);
    return handles;
  }

  /**
   * One page of List: at most `pageSize` handles (0: the server's default) from `pageToken` on
   * (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async listPage(runtimeId: string, pageSize = 0, pageToken = ""): Promise<ListResponse> {
    return this.raw.list({ runtimeId, pageSize, pageToken }, this.call());
  }

  /** The handle's whole stored transcript (it follows the pages of GetTranscript to the last). */
  async transcript(runtimeId: string, handleId: string): Promise<Message[]> {
    const messages: Message[] = [];
    let pageToken = "";
    do {
      const response = await this.transcriptPage(runtimeId, handleId, 0, pageToken);
      messages.push(...response.messages);
      pageToken = response.nextPageToken;
    } while (pageToken);
    return messages;
  }

  /**
   * One page of GetTranscript: at most `pageSize` messages (0: the server's default) from
   * `pageToken` on (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async transcriptPage(runtimeId: string, handleId: string, pageSize = 0, pageToken = ""): Promise<GetTranscriptResponse> {
    return this.raw.getTranscript({ runtimeId, handleId, pageSize, pageToken }, this.call());
  }

  /** Every runtime of the caller's tenant, newest first (it follows the pages of ListRuntimes to the last). */
  async listRuntimes(): Promise<RuntimeSummary[]> {
    const runtimes: RuntimeSummary[] = [];
    let pageToken = "";
    do {
      const response = await this.listRuntimesPage(0, pageToken);
      runtimes.push(...response.runtimes);
      pageToken = response.nextPageToken;
    } while (pageToken);
    return runtimes;
  }

  /**
   * One page of ListRuntimes: at most `pageSize` runtimes (0: the server's default), newest first,
   * from `pageToken` on (empty for the first page); its `nextPageToken` is empty on the last page.
   */
  async listRuntimesPage(pageSize = 0, pageToken = ""): Promise<ListRuntimesResponse> {
    return this.raw.listRuntimes({ pageSize, pageToken }, this.call());
  }

  /**
   * Closes the runtime and deletes everything stored of it; `force` interrupts running handles
   * (without it a runtime with running handles is refused).
   */
  async deleteRuntime(runtimeId: string, force = false): Promise<void> {
    await this.raw.deleteRuntime({ runtimeId, force }, this.call());
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
  };
}

/** `RESOURCE_EXHAUSTED: <server message>`, like the Python client's AgentRuntimeError. */
export function describeError(error: unknown): string {
  if (error instanceof ConnectError) return `${grpcCodeName(error.code)}: ${error.rawMessage}`;
  return error instanceof Error ? error.message : String(error);
}
