// The client's retries and request ids against a loopback gRPC server (peer.ts) that fails the
// attempts it is told to and records the request id of every attempt it sees.

import assert from "node:assert/strict";
import { after, before, beforeEach, describe, it, type TestContext } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import {
  createClient,
  errorDetails,
  Status,
  Trust,
  type AgentRuntimeClient,
  type ClientOptions,
  type MutationOptions,
} from "../index.js";
import { Peer, refusal, withRetryInfo, type Fault } from "./peer.js";

const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** Each mutating method, called with `options`, and the RPC it makes. */
const MUTATIONS: [string, (client: AgentRuntimeClient, options?: MutationOptions) => Promise<unknown>][] = [
  ["CreateRuntime", (client, options) => client.createRuntime([], "", options)],
  ["Spawn", (client, options) => client.spawn("rt-1", "worker", "root", undefined, options)],
  ["Post", (client, options) => client.post("rt-1", "root/worker.1", "a note", "", "", options)],
  ["Wake", (client, options) => client.wake("rt-1", "root/worker.1", "go", options)],
  ["Resume", (client, options) => client.resume("rt-1", { id: "req-1", ok: true }, options)],
  ["Interrupt", (client, options) => client.interrupt("rt-1", "root/worker.1", options)],
  ["Close", (client, options) => client.close("rt-1", "root/worker.1", false, options)],
  ["DeleteRuntime", (client, options) => client.deleteRuntime("rt-1", false, options)],
  ["ForkRuntime", (client, options) => client.forkRuntime("rt-1", 6, options)],
  ["ReplayRuntime", (client, options) => client.replayRuntime("rt-1", options)],
];

/** Each method that reads, and its RPC. */
const READS: [string, (client: AgentRuntimeClient) => Promise<unknown>][] = [
  ["Inspect", (client) => client.inspect("rt-1", "root/worker.1")],
  ["List", (client) => client.listPage("rt-1")],
  ["GetTranscript", (client) => client.transcriptPage("rt-1", "root/worker.1")],
  ["ListRuntimes", (client) => client.listRuntimesPage()],
];

const unavailable = () => new ConnectError("the server is not there", Code.Unavailable);

/** The ConnectError a promise rejects with (an assertion error if it fulfils or rejects otherwise). */
async function failure(promise: Promise<unknown>): Promise<ConnectError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof ConnectError, `expected a ConnectError, got ${String(error)}`);
    return error;
  }
  assert.fail("the call succeeded");
}

/** The pauses between the peer's attempts of `method`, in ms. */
function gaps(peer: Peer, method: string): number[] {
  const times = peer.of(method).map((attempt) => attempt.at);
  return times.slice(1).map((at, i) => at - (times[i] as number));
}

/** No jitter: every backoff pause is 0, so a pause the peer sees is RetryInfo's. */
function noJitter(t: TestContext): void {
  t.mock.method(Math, "random", () => 0);
}

describe("retries and request ids (a loopback gRPC server)", () => {
  let peer: Peer;
  const clients: AgentRuntimeClient[] = [];
  const client = (options: ClientOptions = {}): AgentRuntimeClient => {
    const made = createClient(peer.address, { keepalive: false, ...options });
    clients.push(made);
    return made;
  };

  before(async () => {
    peer = await new Peer().start();
  });
  beforeEach(() => peer.reset());
  after(async () => {
    for (const made of clients) made.disconnect();
    await peer.stop();
  });

  describe("request ids", () => {
    for (const [method, call] of MUTATIONS) {
      it(`${method}: one generated UUID v4 on every attempt of a call, a fresh one per call`, async (t) => {
        noJitter(t);
        const c = client();
        peer.fail(method, unavailable(), refusal("RUNTIME_MOVING", 0));
        await call(c);
        const ids = peer.of(method).map((attempt) => attempt.requestId);
        assert.equal(ids.length, 3);
        assert.match(ids[0] as string, UUID_V4);
        assert.deepEqual(ids, [ids[0], ids[0], ids[0]]);
        await call(c);
        const next = peer.of(method)[3]?.requestId;
        assert.match(next as string, UUID_V4);
        assert.notEqual(next, ids[0]);
      });

      it(`${method}: the caller's request id on every attempt`, async (t) => {
        noJitter(t);
        peer.fail(method, unavailable());
        await call(client(), { requestId: `mine-${method}` });
        assert.deepEqual(
          peer.of(method).map((attempt) => attempt.requestId),
          [`mine-${method}`, `mine-${method}`],
        );
      });
    }

    it("call(): a request of your own, retried with one id: options.requestId, else the request's, else a UUID", async (t) => {
      noJitter(t);
      const c = client();
      peer.fail("Post", unavailable()).fail("Close", unavailable()).fail("Spawn", unavailable());
      const posted = await c.call("post", { runtimeId: "rt-1", handleId: "root/worker.1", text: "x", trust: Trust.EXTERNAL });
      assert.equal(posted.inboxSize, 1);
      const closed = await c.call("close", { runtimeId: "rt-1", handleId: "root/worker.1", requestId: "its-own" });
      assert.deepEqual(closed.closedHandleIds, ["root/worker.1"]);
      await c.call("spawn", { runtimeId: "rt-1", parentId: "root", agent: "worker", requestId: "its-own" }, { requestId: "given" });
      const [post, close, spawn] = ["Post", "Close", "Spawn"].map((method) => peer.of(method).map((attempt) => attempt.requestId));
      assert.equal(post?.length, 2);
      assert.match(post?.[0] as string, UUID_V4);
      assert.equal(post?.[1], post?.[0]);
      assert.deepEqual(close, ["its-own", "its-own"]);
      assert.deepEqual(spawn, ["given", "given"]);
    });

    it("call(): a read is retried and sent as it is", async (t) => {
      noJitter(t);
      peer.fail("Inspect", unavailable());
      const response = await client().call("inspect", { runtimeId: "rt-1", handleId: "root/worker.1" });
      assert.equal(response.handle?.handleId, "root/worker.1");
      assert.equal(peer.of("Inspect").length, 2);
    });

    it("run(): its Spawn and its Wake each keep one id (the caller's) through their retries, and its Wait is retried", async (t) => {
      noJitter(t);
      peer.fail("Spawn", unavailable()).fail("Wake", refusal("SERVER_DRAINING", 0)).fail("Wait", unavailable());
      const result = await client().run("rt-1", "worker", "go", "root", { spawnRequestId: "s-1", wakeRequestId: "w-1" });
      assert.equal(result.status, Status.DONE);
      assert.deepEqual(
        peer.attempts.map((attempt) => `${attempt.method} ${attempt.requestId}`),
        ["Spawn s-1", "Spawn s-1", "Wake w-1", "Wake w-1", "Wait ", "Wait "],
      );
    });

    it("run(): generated ids, one for the Spawn and another for the Wake", async () => {
      await client().run("rt-1", "worker", "go");
      const [spawn, wake] = [peer.of("Spawn")[0]?.requestId, peer.of("Wake")[0]?.requestId];
      assert.match(spawn as string, UUID_V4);
      assert.match(wake as string, UUID_V4);
      assert.notEqual(spawn, wake);
    });
  });

  describe("what is retried", () => {
    for (const [method, call] of READS) {
      it(`${method} (a read) is retried on UNAVAILABLE`, async (t) => {
        noJitter(t);
        peer.fail(method, unavailable(), unavailable());
        await call(client());
        assert.equal(peer.of(method).length, 3);
      });
    }

    it("a CANCELLED from the server (not the caller's) is retried", async (t) => {
      noJitter(t);
      peer.fail("Spawn", new ConnectError("the server began to shut down", Code.Canceled));
      assert.equal(await client().spawn("rt-1", "worker"), "root/worker.1");
      assert.equal(peer.of("Spawn").length, 2);
    });

    it("a connection killed under the call (ECONNRESET: Connect's ABORTED) is retried, with the same request id", async (t) => {
      noJitter(t);
      peer.fail("Wake", "reset");
      const error = await failure(client({ retry: false }).wake("rt-1", "root/worker.1", "go"));
      assert.equal(error.code, Code.Aborted); // what the retry below gets past
      peer.fail("Wake", "reset", "reset");
      assert.equal(await client().wake("rt-1", "root/worker.1", "go", { requestId: "w-reset" }), true);
      assert.deepEqual(
        peer.of("Wake").map((attempt) => attempt.requestId),
        ["", "", "", "w-reset"], // a killed attempt's body was never read
      );
    });

    it("a stream reset under the call (RST_STREAM CANCEL: Connect's CANCELED) is retried", async (t) => {
      noJitter(t);
      peer.fail("Interrupt", "rst");
      const error = await failure(client({ retry: false }).interrupt("rt-1", "root/worker.1"));
      assert.equal(error.code, Code.Canceled);
      peer.fail("Interrupt", "rst");
      assert.equal(await client().interrupt("rt-1", "root/worker.1", { requestId: "i-rst" }), true);
      assert.deepEqual(
        peer.of("Interrupt").map((attempt) => attempt.requestId),
        ["", "", "i-rst"],
      );
    });

    it("an attempt's own deadline (DEADLINE_EXCEEDED) is retried while the call's has not passed", async (t) => {
      noJitter(t);
      peer.fail("Post", "hang");
      assert.equal(await client({ timeoutMs: 200 }).post("rt-1", "root/worker.1", "a note"), 1);
      const [first, second] = peer.of("Post");
      assert.equal(peer.of("Post").length, 2);
      assert.equal(first?.requestId, second?.requestId);
      assert.ok(first?.timeoutMs !== undefined && first.timeoutMs <= 200, `the attempt's deadline: ${first?.timeoutMs}`);
    });

    it("any code with RetryInfo is retried, after at least its retry_delay", async (t) => {
      noJitter(t);
      peer.fail("Spawn", withRetryInfo(Code.ResourceExhausted, 300), withRetryInfo(Code.FailedPrecondition, 200));
      assert.equal(await client().spawn("rt-1", "worker"), "root/worker.1");
      const [first, second] = gaps(peer, "Spawn");
      assert.equal(peer.of("Spawn").length, 3);
      assert.ok((first as number) >= 300 && (second as number) >= 200, `pauses ${first}, ${second}`);
    });

    it("an UNAVAILABLE with RetryInfo is retried after its retry_delay, not sooner", async (t) => {
      noJitter(t);
      peer.fail("Inspect", refusal("STORE_UNAVAILABLE", 250));
      await client().inspect("rt-1", "root/worker.1");
      const [pause] = gaps(peer, "Inspect");
      assert.ok((pause as number) >= 250, `pause ${pause}`);
    });

    it("the pauses have full jitter: uniform in [0, min(5 s, 100 ms * 2^n)]", async (t) => {
      // Math.random's largest draws: each pause is (just under) its ceiling, 100, 200, 400 ms.
      t.mock.method(Math, "random", () => 1 - Number.EPSILON);
      peer.fail("List", unavailable(), unavailable(), unavailable());
      await client().listPage("rt-1");
      const pauses = gaps(peer, "List");
      assert.equal(pauses.length, 3);
      for (const [n, pause] of pauses.entries()) {
        const ceiling = 100 * 2 ** n;
        assert.ok(pause >= ceiling - 5 && pause < ceiling + 150, `pause ${n}: ${pause} ms, ceiling ${ceiling}`);
      }
    });

    it("errorDetails decodes RetryInfo beside ErrorInfo", async () => {
      peer.fail("Spawn", refusal("STORE_BROKEN", 1_500));
      const error = await failure(client({ retry: false }).spawn("rt-1", "worker"));
      const details = errorDetails(error);
      assert.equal(details.errorInfo?.reason, "STORE_BROKEN");
      assert.equal(details.retryInfo?.retryDelay?.seconds, 1n);
      assert.equal(details.retryInfo?.retryDelay?.nanos, 500_000_000);
    });
  });

  describe("what is not retried", () => {
    for (const code of [Code.NotFound, Code.InvalidArgument, Code.FailedPrecondition, Code.Internal, Code.Unknown, Code.Aborted]) {
      it(`${Code[code]} without RetryInfo: one attempt, its error thrown`, async () => {
        peer.fail("Wake", new ConnectError("no", code));
        const error = await failure(client().wake("rt-1", "root/worker.1", "go"));
        assert.equal(error.code, code);
        assert.equal(peer.of("Wake").length, 1);
      });
    }

    it("a DEADLINE_EXCEEDED sent by the server before the attempt's deadline", async () => {
      peer.fail("Inspect", new ConnectError("the server's own deadline", Code.DeadlineExceeded));
      const error = await failure(client().inspect("rt-1", "root/worker.1"));
      assert.equal(error.code, Code.DeadlineExceeded);
      assert.equal(peer.of("Inspect").length, 1);
    });

    it("the caller's abort during an attempt: CANCELED, no further attempt", async () => {
      peer.failAlways("Spawn", "hang");
      const stop = new AbortController();
      const call = client().spawn("rt-1", "worker", "root", undefined, { signal: stop.signal });
      await peer.arrived("Spawn", 1);
      stop.abort();
      const error = await failure(call);
      assert.equal(error.code, Code.Canceled);
      peer.failAlways("Spawn", unavailable()); // a retry would now be seen at once
      await client().inspect("rt-1", "root/worker.1"); // a full round trip on the peer after the abort
      assert.equal(peer.of("Spawn").length, 1);
    });

    it("the caller's abort during the pause before a retry: CANCELED at once, no further attempt", async () => {
      peer.fail("Close", refusal("RUNTIME_MOVING", 30_000));
      const stop = new AbortController();
      const started = performance.now();
      const call = client().close("rt-1", "root/worker.1", false, { signal: stop.signal });
      await peer.arrived("Close", 1);
      stop.abort();
      const error = await failure(call);
      assert.equal(error.code, Code.Canceled);
      assert.ok(performance.now() - started < 5_000, "the 30 s pause was cut short");
      assert.equal(peer.of("Close").length, 1);
    });

    it("an already aborted signal: no attempt at all", async () => {
      const error = await failure(client().post("rt-1", "h", "x", "", "", { signal: AbortSignal.abort() }));
      assert.equal(error.code, Code.Canceled);
      assert.equal(peer.of("Post").length, 0);
    });
  });

  describe("retry: false", () => {
    for (const fault of [unavailable(), refusal("RUNTIME_MOVING", 0)] as Fault[]) {
      it(`one attempt on ${fault instanceof ConnectError ? fault.rawMessage : fault}, still with a request id`, async () => {
        peer.fail("Spawn", fault);
        const error = await failure(client({ retry: false }).spawn("rt-1", "worker"));
        assert.equal(error.code, Code.Unavailable);
        assert.equal(peer.of("Spawn").length, 1);
        assert.match(peer.of("Spawn")[0]?.requestId as string, UUID_V4);
      });
    }

    it("the caller's request id is sent; reads and Wait are made once too", async () => {
      const c = client({ retry: false });
      peer.fail("Wake", unavailable()).fail("Inspect", unavailable()).fail("Wait", unavailable());
      await failure(c.wake("rt-1", "root/worker.1", "go", { requestId: "w-once" }));
      await failure(c.inspect("rt-1", "root/worker.1"));
      await failure(c.wait("rt-1", "root/worker.1"));
      assert.deepEqual(
        peer.attempts.map((attempt) => `${attempt.method} ${attempt.requestId}`),
        ["Wake w-once", "Inspect ", "Wait "],
      );
    });
  });

  // A broken bound would retry for ever: each test fails after 10 s instead.
  describe("the window", { timeout: 10_000 }, () => {
    it("retryWindowMs bounds a call's retries: the last error after it, not before", async (t) => {
      noJitter(t);
      peer.failAlways("Spawn", refusal("STORE_BROKEN", 100));
      const started = performance.now();
      const error = await failure(client({ retryWindowMs: 700 }).spawn("rt-1", "worker"));
      const took = performance.now() - started;
      // The last refusal, or (on a loaded machine, a pause that ended late) the deadline of an
      // attempt started with little of the window left.
      assert.ok([Code.Unavailable, Code.DeadlineExceeded].includes(error.code), `code ${Code[error.code]}`);
      assert.ok(took >= 550 && took < 5_000, `gave up after ${took} ms`);
      assert.ok(peer.of("Spawn").length >= 3, `${peer.of("Spawn").length} attempts`);
      const ids = new Set(peer.of("Spawn").map((attempt) => attempt.requestId));
      assert.equal(ids.size, 1);
    });

    it("a call's own timeoutMs bounds its retries in place of the window", async (t) => {
      noJitter(t);
      peer.failAlways("Inspect", refusal("STORE_BROKEN", 100));
      const started = performance.now();
      await failure(client({ retryWindowMs: 60_000 }).inspect("rt-1", "root/worker.1", { timeoutMs: 500 }));
      const took = performance.now() - started;
      assert.ok(took >= 400 && took < 5_000, `gave up after ${took} ms`);
    });

    it("no pause is taken that would end past the deadline: a long retry_delay ends the call at once", async () => {
      peer.fail("Wake", refusal("SERVER_DRAINING", 10_000));
      const started = performance.now();
      const error = await failure(client({ retryWindowMs: 3_000 }).wake("rt-1", "root/worker.1", "go"));
      assert.equal(error.code, Code.Unavailable);
      assert.ok(performance.now() - started < 2_500, "it did not sleep into the deadline");
      assert.equal(peer.of("Wake").length, 1);
    });

    it("an attempt's deadline is the client's timeoutMs, capped by what is left of the window", async (t) => {
      noJitter(t);
      peer.fail("Post", "hang", "hang");
      await failure(client({ timeoutMs: 300, retryWindowMs: 500 }).post("rt-1", "root/worker.1", "x"));
      const deadlines = peer.of("Post").map((attempt) => attempt.timeoutMs as number);
      assert.equal(deadlines.length, 2);
      assert.ok((deadlines[0] as number) <= 300 && (deadlines[0] as number) > 200, `first ${deadlines[0]}`);
      assert.ok(deadlines[1] as number <= 200, `second ${deadlines[1]} (what was left of 500 ms)`);
    });

    it("wait(): a run of failures longer than the window throws the last one (a server that refuses for ever)", async (t) => {
      noJitter(t);
      peer.failAlways("Wait", refusal("STORE_BROKEN", 100));
      const started = performance.now();
      const error = await failure(client({ retryWindowMs: 600 }).wait("rt-1", "root/worker.1"));
      const took = performance.now() - started;
      assert.equal(errorDetails(error).errorInfo?.reason, "STORE_BROKEN");
      assert.ok(took >= 500 && took < 5_000, `gave up after ${took} ms`);
    });

    it("wait(): an answer between failures starts the window again", async (t) => {
      noJitter(t);
      const refusals = (n: number) => Array.from({ length: n }, () => refusal("RUNTIME_MOVING", 100));
      // 4 refusals (some 400 ms), a STATUS_TIMEOUT answer, 4 more: never 8 in a row in a 600 ms window.
      peer.fail("Wait", ...refusals(4), "timeout", ...refusals(4));
      const result = await client({ retryWindowMs: 600 }).wait("rt-1", "root/worker.1");
      assert.equal(result.status, Status.DONE);
      assert.equal(peer.of("Wait").length, 10);
    });

    it("watch(): reopened after an error with RetryInfo, at least retry_delay later; the window ends a run of them", async () => {
      const c = client({ retryWindowMs: 1_000 });
      peer.fail("Watch", withRetryInfo(Code.Internal, 300));
      const events = c.watch("rt-1", 0, { backoffMs: 1 });
      const first = await events.next();
      assert.equal(first.value?.seq, 1n);
      assert.ok((gaps(peer, "Watch")[0] as number) >= 300);
      await events.return(undefined);

      peer.attempts.length = 0;
      peer.failAlways("Watch", refusal("STORE_BROKEN", 300));
      const error = await failure(c.watch("rt-1", 0, { backoffMs: 1, maxRetries: 1_000 }).next());
      assert.equal(errorDetails(error).errorInfo?.reason, "STORE_BROKEN");
      // pauses of 300 ms add up to at most the 1 s window: 3 reconnections, 4 attempts
      assert.equal(peer.of("Watch").length, 4);
    });
  });
});
