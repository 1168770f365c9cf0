// forkRuntime, replayRuntime and listRuntimes' forksOf against the loopback gRPC server (peer.ts):
// what each sends, one request id through retries, and replayRuntime's waiting loop, which sends
// the same request again while the response says `settled: false`.

import assert from "node:assert/strict";
import { after, before, beforeEach, describe, it, type TestContext } from "node:test";

import { durationMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  createClient,
  UnrecordedCalls,
  WAIT_MARGIN_MS,
  WAIT_SLICE_MS,
  type AgentRuntimeClient,
  type ClientOptions,
  type ReplayRuntimeRequest,
} from "../index.js";
import { Peer, refusal } from "./peer.js";

const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

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

/** No jitter: every backoff pause is 0. */
function noJitter(t: TestContext): void {
  t.mock.method(Math, "random", () => 0);
}

/** A replay request's timeout in ms (NaN: none). */
function sliceOf(request: ReplayRuntimeRequest | undefined): number {
  return request?.timeout === undefined ? Number.NaN : durationMs(request.timeout);
}

/** A replay request's fields but its timeout, to compare one attempt with another. */
function withoutTimeout(request: ReplayRuntimeRequest): unknown {
  return {
    sourceRuntimeId: request.sourceRuntimeId,
    agents: request.agents.map((agent) => agent.name),
    unrecordedCalls: request.unrecordedCalls,
    runtimeId: request.runtimeId,
    requestId: request.requestId,
  };
}

describe("forks and replays (a loopback gRPC server)", () => {
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

  describe("forkRuntime", () => {
    it("sends the source, the cut, the changes and a generated request id; returns the whole response", async () => {
      const response = await client().forkRuntime("rt-1", 6, {
        agents: [{ name: "worker", description: "a new worker" }],
        messages: [{ handleId: "root/worker.1", text: "try again" }],
        answers: [{ id: "req-1", ok: false, reason: "change freeze" }],
      });
      assert.equal(response.runtimeId, "fork-1");
      assert.equal(response.forkSeq, 6n);
      assert.deepEqual(response.heldHandleIds, ["root/worker.1"]);
      const [request] = peer.forkRequests;
      assert.equal(peer.forkRequests.length, 1);
      assert.equal(request?.sourceRuntimeId, "rt-1");
      assert.equal(request?.atSeq, 6n);
      assert.equal(request?.runtimeId, "");
      assert.deepEqual(
        request?.agents.map((agent) => agent.name),
        ["worker"],
      );
      assert.deepEqual(
        request?.messages.map((message) => [message.handleId, message.text]),
        [["root/worker.1", "try again"]],
      );
      assert.deepEqual(
        request?.answers.map((answer) => [answer.id, answer.ok, answer.reason]),
        [["req-1", false, "change freeze"]],
      );
      assert.match(request?.requestId as string, UUID_V4);
    });

    it("takes the fork's id and a bigint cut", async () => {
      const response = await client().forkRuntime("rt-1", 12n, { runtimeId: "my-fork" });
      assert.equal(response.runtimeId, "my-fork");
      assert.equal(peer.forkRequests[0]?.atSeq, 12n);
      assert.equal(peer.forkRequests[0]?.runtimeId, "my-fork");
    });

    it("is retried on UNAVAILABLE with the same request id, generated once", async (t) => {
      noJitter(t);
      peer.fail("ForkRuntime", unavailable(), unavailable());
      const response = await client().forkRuntime("rt-1", 3);
      assert.equal(response.forkSeq, 3n);
      const ids = peer.of("ForkRuntime").map((attempt) => attempt.requestId);
      assert.equal(ids.length, 3);
      assert.match(ids[0] as string, UUID_V4);
      assert.deepEqual(ids, [ids[0], ids[0], ids[0]]);
      // every attempt sends the same request
      assert.deepEqual(
        peer.forkRequests.map((request) => [request.sourceRuntimeId, request.atSeq, request.requestId]),
        ids.map((id) => ["rt-1", 3n, id]),
      );
      await client().forkRuntime("rt-1", 3);
      assert.notEqual(peer.of("ForkRuntime")[3]?.requestId, ids[0], "a fresh id for the next call");
    });

    it("is retried on UNAVAILABLE with the caller's request id", async (t) => {
      noJitter(t);
      peer.fail("ForkRuntime", unavailable(), refusal("RUNTIME_MOVING", 0));
      await client().forkRuntime("rt-1", 3, { requestId: "fork-once" });
      assert.deepEqual(
        peer.of("ForkRuntime").map((attempt) => attempt.requestId),
        ["fork-once", "fork-once", "fork-once"],
      );
    });

    for (const code of [Code.InvalidArgument, Code.NotFound, Code.FailedPrecondition]) {
      it(`${Code[code]}: one attempt, its error thrown`, async () => {
        peer.fail("ForkRuntime", new ConnectError("no", code));
        const error = await failure(client().forkRuntime("rt-1", 99));
        assert.equal(error.code, code);
        assert.equal(peer.of("ForkRuntime").length, 1);
      });
    }

    it("retry: false: one attempt, still with a request id", async () => {
      peer.fail("ForkRuntime", unavailable());
      const error = await failure(client({ retry: false }).forkRuntime("rt-1", 3));
      assert.equal(error.code, Code.Unavailable);
      assert.equal(peer.of("ForkRuntime").length, 1);
      assert.match(peer.of("ForkRuntime")[0]?.requestId as string, UUID_V4);
    });
  });

  describe("replayRuntime", () => {
    it("sends the request again, with the same request id, while it is not settled", async () => {
      peer.fail("ReplayRuntime", "timeout", "timeout");
      const response = await client().replayRuntime("rt-1", {
        agents: [{ name: "worker", description: "a better worker" }],
        unrecordedCalls: UnrecordedCalls.LIVE,
      });
      assert.equal(response.settled, true);
      assert.equal(response.runtimeId, "replay-1");
      assert.equal(response.diffs[0]?.replayed?.text, "done");
      const ids = peer.of("ReplayRuntime").map((attempt) => attempt.requestId);
      assert.equal(ids.length, 3);
      assert.match(ids[0] as string, UUID_V4);
      assert.deepEqual(ids, [ids[0], ids[0], ids[0]]);
      const first = peer.replayRequests[0] as ReplayRuntimeRequest;
      assert.deepEqual(withoutTimeout(first), {
        sourceRuntimeId: "rt-1",
        agents: ["worker"],
        unrecordedCalls: UnrecordedCalls.LIVE,
        runtimeId: "",
        requestId: ids[0],
      });
      for (const request of peer.replayRequests) {
        assert.deepEqual(withoutTimeout(request), withoutTimeout(first), "every attempt sends the same request");
        // Without a timeout of the caller's, every slice is the whole one: the requests are equal, timeout included.
        assert.equal(sliceOf(request), WAIT_SLICE_MS);
      }
    });

    it("bounds each attempt: the server is asked for one slice, under a deadline WAIT_MARGIN_MS longer", async () => {
      // a client timeoutMs far shorter than the slice does not cut it: the slice is the server's to wait
      await client({ timeoutMs: 1_000 }).replayRuntime("rt-1");
      const [attempt] = peer.of("ReplayRuntime");
      const deadline = attempt?.timeoutMs as number;
      const slice = sliceOf(peer.replayRequests[0]);
      assert.equal(slice, WAIT_SLICE_MS);
      assert.ok(
        deadline > WAIT_SLICE_MS + WAIT_MARGIN_MS - 1_000 && deadline <= WAIT_SLICE_MS + WAIT_MARGIN_MS,
        `the attempt's deadline: ${deadline} ms`,
      );
    });

    it("the caller's request id, on every attempt", async () => {
      peer.fail("ReplayRuntime", "timeout");
      await client().replayRuntime("rt-1", { requestId: "replay-once", runtimeId: "my-replay" });
      assert.deepEqual(
        peer.of("ReplayRuntime").map((attempt) => attempt.requestId),
        ["replay-once", "replay-once"],
      );
      assert.deepEqual(
        peer.replayRequests.map((request) => request.runtimeId),
        ["my-replay", "my-replay"],
      );
    });

    it("a failure between unsettled answers is retried with the same request id", async (t) => {
      noJitter(t);
      peer.fail("ReplayRuntime", "timeout", unavailable(), refusal("RUNTIME_MOVING", 0), "timeout");
      const response = await client().replayRuntime("rt-1");
      assert.equal(response.settled, true);
      const ids = peer.of("ReplayRuntime").map((attempt) => attempt.requestId);
      assert.equal(ids.length, 5);
      assert.equal(new Set(ids).size, 1);
    });

    it("with timeoutMs: the last unsettled response after it, each slice what is left", { timeout: 10_000 }, async () => {
      peer.failAlways("ReplayRuntime", "timeout");
      const started = performance.now();
      const response = await client().replayRuntime("rt-1", { timeoutMs: 300 });
      const took = performance.now() - started;
      assert.equal(response.settled, false);
      assert.ok(took >= 290 && took < 5_000, `returned after ${took} ms`);
      const slices = peer.replayRequests.map(sliceOf);
      assert.ok(slices.length >= 2);
      assert.ok(slices.every((slice) => slice <= 300), `slices ${slices.slice(0, 5).join(", ")} ...`);
      assert.equal(new Set(peer.of("ReplayRuntime").map((attempt) => attempt.requestId)).size, 1);
    });

    it("not retried on INVALID_ARGUMENT (a request id reused with another request)", async () => {
      peer.fail("ReplayRuntime", "timeout", new ConnectError("request id reused", Code.InvalidArgument));
      const error = await failure(client().replayRuntime("rt-1"));
      assert.equal(error.code, Code.InvalidArgument);
      assert.equal(peer.of("ReplayRuntime").length, 2);
    });

    it("retry: false: a failure is thrown at once, but an unsettled answer is still waited on", async () => {
      const c = client({ retry: false });
      peer.fail("ReplayRuntime", "timeout", unavailable());
      const error = await failure(c.replayRuntime("rt-1"));
      assert.equal(error.code, Code.Unavailable);
      assert.equal(peer.of("ReplayRuntime").length, 2);
    });

    it("the caller's abort during an attempt: CANCELED, no further attempt", async () => {
      peer.fail("ReplayRuntime", "timeout");
      peer.failAlways("ReplayRuntime", "hang");
      const stop = new AbortController();
      const call = client().replayRuntime("rt-1", { signal: stop.signal });
      await peer.arrived("ReplayRuntime", 2);
      stop.abort();
      const error = await failure(call);
      assert.equal(error.code, Code.Canceled);
      await client().inspect("rt-1", "root/worker.1"); // a full round trip on the peer after the abort
      assert.equal(peer.of("ReplayRuntime").length, 2);
    });
  });

  describe("listRuntimes: forksOf", () => {
    it("is sent on every form's call; absent, it is empty", async () => {
      const c = client();
      await c.listRuntimes({ forksOf: "rt-1" });
      await c.listRuntimesPage(10, "", { forksOf: "rt-2" });
      for await (const summary of c.iterateRuntimes(0, { forksOf: "rt-3" })) {
        assert.fail(`nothing listed, got ${summary.runtimeId}`);
      }
      await c.listRuntimesPage();
      assert.deepEqual(
        peer.listRuntimesRequests.map((request) => [request.forksOf, request.pageSize]),
        [
          ["rt-1", 0],
          ["rt-2", 10],
          ["rt-3", 0],
          ["", 0],
        ],
      );
    });
  });
});
