// A loopback gRPC server implementing AgentRuntime (Connect's Node adapter over HTTP/2), the
// peer of the retry tests: each method fails its next attempts as a test tells it to, then
// answers, and every attempt it sees is recorded with its request id; a Watch stream can be
// scripted (its responses, deltas and batches of events among them, then a drop or silence).
// ForkRuntime, ReplayRuntime and ListRuntimes requests are kept whole, to check what was sent.

import { once } from "node:events";
import * as http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";

import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import {
  AgentRuntime,
  Status,
  type ForkRuntimeRequest,
  type ListRuntimesRequest,
  type ReplayRuntimeRequest,
  type WatchResponseSchema,
} from "../gen/agentruntime/v1/agent_runtime_pb.js";
import { ErrorInfoSchema, RetryInfoSchema } from "../gen/google/rpc/error_details_pb.js";

/** What the peer does with one attempt instead of answering it. */
export type Fault =
  | ConnectError // fails it with this status (and its details)
  | "hang" // never answers: the attempt ends by its deadline or its cancellation
  | "reset" // kills the connection under it with a TCP RST (ECONNRESET), as a dying server's kernel may
  | "rst" // resets its HTTP/2 stream with CANCEL (as a server going away may)
  | "timeout"; // (Wait) answers at once with a STATUS_TIMEOUT result: the handle still runs; (ReplayRuntime) `settled: false`

/** One attempt the peer saw. */
export interface Attempt {
  method: string;
  /** The request's request_id ("" for the methods without one, and for a reset attempt). */
  requestId: string;
  /** performance.now() when it arrived. */
  at: number;
  /** The attempt's deadline as the peer read it from grpc-timeout (undefined: none). */
  timeoutMs: number | undefined;
}

/** UNAVAILABLE as the server refuses without having acted: ErrorInfo and RetryInfo. */
export function refusal(reason: string, retryDelayMs: number): ConnectError {
  return new ConnectError(`refused (${reason})`, Code.Unavailable, undefined, [
    { desc: ErrorInfoSchema, value: { reason, domain: "agentruntime.dev" } },
    { desc: RetryInfoSchema, value: { retryDelay: durationFromMs(retryDelayMs) } },
  ]);
}

/** Any status with a RetryInfo of `retryDelayMs`. */
export function withRetryInfo(code: Code, retryDelayMs: number): ConnectError {
  return new ConnectError("try again later", code, undefined, [
    { desc: RetryInfoSchema, value: { retryDelay: durationFromMs(retryDelayMs) } },
  ]);
}

/** One Watch stream as the peer plays it: what it sends, then how it ends. */
export interface WatchScript {
  send: MessageInitShape<typeof WatchResponseSchema>[];
  /** "drop": it then fails UNAVAILABLE, as a server going away; "hang" (the default): it stays open until cancelled. */
  end?: "drop" | "hang";
}

export class Peer {
  readonly attempts: Attempt[] = [];
  /**
   * What happened, in order: each attempt's method as it arrived, and `Watch answered` as a
   * Watch stream sends its first response (to check what a client waits for before a call).
   */
  readonly timeline: string[] = [];
  /** Each Watch request's after_seq, deltas and batch, in order. */
  readonly watchRequests: { afterSeq: bigint; deltas: boolean; batch: boolean }[] = [];
  /** Every ForkRuntime, ReplayRuntime and ListRuntimes request whose body was read, in order. */
  readonly forkRequests: ForkRuntimeRequest[] = [];
  readonly replayRequests: ReplayRuntimeRequest[] = [];
  readonly listRuntimesRequests: ListRuntimesRequest[] = [];
  private readonly watchScripts: WatchScript[] = [];
  private readonly faults = new Map<string, Fault[]>();
  private readonly always = new Map<string, Fault>();
  private readonly waiters: { done: () => void; ready: () => boolean }[] = [];
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private readonly sockets = new Set<Socket>();
  private server: http2.Http2Server | undefined;
  /** host:port once started. */
  address = "";

  /** Forgets the attempts seen and every fault not met yet. */
  reset(): void {
    this.attempts.length = 0;
    this.timeline.length = 0;
    this.faults.clear();
    this.always.clear();
    this.watchRequests.length = 0;
    this.watchScripts.length = 0;
    this.forkRequests.length = 0;
    this.replayRequests.length = 0;
    this.listRuntimesRequests.length = 0;
  }

  /** The next Watch streams play these scripts, one each, in order (then the default stream). */
  scriptWatch(...scripts: WatchScript[]): this {
    this.watchScripts.push(...scripts);
    return this;
  }

  /** The next attempts of `method` (the RPC's name, `Spawn`) meet these faults, one each, in order. */
  fail(method: string, ...faults: Fault[]): this {
    this.faults.set(method, [...(this.faults.get(method) ?? []), ...faults]);
    return this;
  }

  /** Every attempt of `method` from now on meets `fault` (after the queued ones). */
  failAlways(method: string, fault: Fault): this {
    this.always.set(method, fault);
    return this;
  }

  /** The attempts of `method` seen so far. */
  of(method: string): Attempt[] {
    return this.attempts.filter((attempt) => attempt.method === method);
  }

  /** Resolves once `count` attempts of `method` have arrived (at once if they have). */
  arrived(method: string, count: number): Promise<void> {
    return new Promise((done) => {
      const ready = () => this.of(method).length >= count;
      if (ready()) done();
      else this.waiters.push({ done, ready });
    });
  }

  async start(): Promise<this> {
    const adapter = connectNodeAdapter({ routes: (router: ConnectRouter) => this.routes(router) });
    this.server = http2.createServer((request, response) => {
      const method = request.url.split("/").pop() ?? "";
      const fault = this.peek(method);
      if (fault === "reset" || fault === "rst") {
        // Before the body is read: the attempt is recorded without its request id.
        this.next(method);
        this.record(method, "", undefined);
        // HTTP/2 hides a session's socket; the raw ones are kept as they connect (the tests make
        // one call at a time, so the others are idle and their clients just reconnect).
        if (fault === "reset") for (const socket of this.sockets) socket.resetAndDestroy();
        else request.stream.close(http2.constants.NGHTTP2_CANCEL);
        return;
      }
      adapter(request, response);
    });
    this.server.on("connection", (socket: Socket) => {
      this.sockets.add(socket);
      socket.once("close", () => this.sockets.delete(socket));
    });
    this.server.on("session", (session) => {
      this.sessions.add(session);
      session.once("close", () => this.sessions.delete(session));
    });
    this.server.listen(0, "127.0.0.1");
    await once(this.server, "listening");
    this.address = `127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async stop(): Promise<void> {
    for (const session of this.sessions) session.destroy();
    const server = this.server;
    if (server) await new Promise<void>((done) => server.close(() => done()));
  }

  private peek(method: string): Fault | undefined {
    return this.faults.get(method)?.[0] ?? this.always.get(method);
  }

  private next(method: string): Fault | undefined {
    const queued = this.faults.get(method);
    if (queued && queued.length > 0) return queued.shift();
    return this.always.get(method);
  }

  private record(method: string, requestId: string, timeoutMs: number | undefined): void {
    this.attempts.push({ method, requestId, at: performance.now(), timeoutMs });
    this.timeline.push(method);
    for (const waiter of [...this.waiters]) {
      if (!waiter.ready()) continue;
      this.waiters.splice(this.waiters.indexOf(waiter), 1);
      waiter.done();
    }
  }

  /** Records the attempt, then meets its fault (throws, or hangs until it is cancelled) or returns `answer()`. */
  private async attempt<T>(method: string, requestId: string, context: HandlerContext, answer: (fault?: Fault) => T): Promise<T> {
    this.record(method, requestId, context.timeoutMs());
    const fault = this.next(method);
    if (fault instanceof ConnectError) throw fault;
    if (fault === "hang") {
      if (!context.signal.aborted) await once(context.signal, "abort");
      throw new ConnectError("the attempt ended unanswered", Code.Canceled);
    }
    return answer(fault);
  }

  /**
   * Watch: after the attempt's fault (if any), the next script's responses (as written, whatever
   * the request's `batch`) and its end, or without one the event after `afterSeq` (in `events`
   * when the request asked for batches, else in `event`), then nothing until cancelled.
   */
  private async *watchStream(
    afterSeq: bigint,
    deltas: boolean,
    batch: boolean,
    context: HandlerContext,
  ): AsyncGenerator<MessageInitShape<typeof WatchResponseSchema>> {
    this.watchRequests.push({ afterSeq, deltas, batch });
    await this.attempt("Watch", "", context, () => undefined);
    const script = this.watchScripts.shift();
    const next = { seq: afterSeq + 1n, handleId: "root/worker.1" };
    const send = script?.send ?? [batch ? { events: [next] } : { event: next }];
    for (const [i, response] of send.entries()) {
      if (i === 0) this.timeline.push("Watch answered");
      yield response;
    }
    if (script?.end === "drop") throw new ConnectError("the server went away", Code.Unavailable);
    if (!context.signal.aborted) await once(context.signal, "abort");
  }

  private routes(router: ConnectRouter): void {
    router.service(AgentRuntime, {
      createRuntime: (request, context) =>
        this.attempt("CreateRuntime", request.requestId, context, () => ({ runtimeId: request.runtimeId || "rt-1" })),
      spawn: (request, context) =>
        this.attempt("Spawn", request.requestId, context, () => ({ handleId: `${request.parentId}/${request.agent}.1` })),
      post: (request, context) => this.attempt("Post", request.requestId, context, () => ({ inboxSize: 1 })),
      wake: (request, context) => this.attempt("Wake", request.requestId, context, () => ({ queued: true })),
      resume: (request, context) =>
        this.attempt("Resume", request.requestId, context, () => ({ result: { status: Status.DONE, text: "resumed" } })),
      interrupt: (request, context) => this.attempt("Interrupt", request.requestId, context, () => ({ interrupted: true })),
      close: (request, context) =>
        this.attempt("Close", request.requestId, context, () => ({ closedHandleIds: [request.handleId] })),
      deleteRuntime: (request, context) => this.attempt("DeleteRuntime", request.requestId, context, () => ({})),
      inspect: (request, context) =>
        this.attempt("Inspect", "", context, () => ({ handle: { handleId: request.handleId } })),
      list: (_request, context) => this.attempt("List", "", context, () => ({ handles: [] })),
      getTranscript: (_request, context) => this.attempt("GetTranscript", "", context, () => ({ messages: [] })),
      listRuntimes: (request, context) => {
        this.listRuntimesRequests.push(request);
        return this.attempt("ListRuntimes", "", context, () => ({ runtimes: [] }));
      },
      forkRuntime: (request, context) => {
        this.forkRequests.push(request);
        return this.attempt("ForkRuntime", request.requestId, context, () => ({
          runtimeId: request.runtimeId || "fork-1",
          forkSeq: request.atSeq,
          heldHandleIds: ["root/worker.1"],
        }));
      },
      replayRuntime: (request, context) => {
        this.replayRequests.push(request);
        return this.attempt("ReplayRuntime", request.requestId, context, (fault) => {
          const settled = fault !== "timeout";
          const done = { handleId: "root/worker.1", status: Status.DONE, text: "done" };
          return {
            runtimeId: request.runtimeId || "replay-1",
            settled,
            diffs: [{ handleId: "root/worker.1", recorded: done, ...(settled ? { replayed: done } : {}) }],
          };
        });
      },
      wait: (request, context) =>
        this.attempt("Wait", "", context, (fault) => ({
          result:
            fault === "timeout"
              ? { handleId: request.handleId, status: Status.TIMEOUT }
              : { handleId: request.handleId, status: Status.DONE, text: "done" },
        })),
      watch: (request, context) => this.watchStream(request.afterSeq, request.deltas, request.batch, context),
    });
  }
}
