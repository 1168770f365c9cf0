// streamRun: which deltas a consumer is handed (DeltaFilter), and the helper against the loopback
// gRPC server (peer.ts) playing Watch streams that carry deltas, drop mid-turn and start over;
// then watch() and streamRun on Watch batches (WatchResponse.events) and on single events.

import assert from "node:assert/strict";
import { after, before, beforeEach, describe, it } from "node:test";

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  DeltaSchema,
  Status,
  createClient,
  type AgentRuntimeClient,
  type ClientOptions,
  type Delta,
  type Event,
  type StreamRunItem,
  type StreamRunOptions,
  type WatchResponseSchema,
} from "../index.js";
import { DeltaFilter } from "../stream.js";
import { Peer } from "./peer.js";

type Response = MessageInitShape<typeof WatchResponseSchema>;

const HANDLE = "root/writer.1";

function text(index: number, value: string, handleId = HANDLE, turn = 1): Response {
  return { delta: { handleId, turn: BigInt(turn), index: BigInt(index), piece: { case: "text", value } } };
}

function reset(handleId = HANDLE, turn = 1): Response {
  return { delta: { handleId, turn: BigInt(turn), index: 0n, piece: { case: "reset", value: { reason: "retry" } } } };
}

function event(seq: number, handleId = HANDLE): Response {
  return { event: { seq: BigInt(seq), handleId, payload: { case: "turnStarted", value: { turn: 1n } } } };
}

function result(seq: number, value: string, handleId = HANDLE): Response {
  return {
    event: { seq: BigInt(seq), handleId, payload: { case: "result", value: { handleId, status: Status.DONE, text: value } } },
  };
}

/** One response holding the events of `responses` together (WatchRequest.batch), in that order. */
function batch(...responses: Response[]): Response {
  return { events: responses.map((response) => response.event ?? {}) };
}

/** A delta as DeltaFilter sees it. */
function delta(response: Response): Delta {
  return create(DeltaSchema, response.delta);
}

/** A delta item written short: `text 0 Stream`, `reset 0`, `thinking 2 hm`; a result: `result <text>`. */
function describeItem(item: StreamRunItem): string {
  if (item.result !== undefined) return `result ${item.result.text}`;
  const piece = item.delta.piece;
  const value = piece.case === "text" || piece.case === "thinking" ? ` ${piece.value}` : "";
  return `${piece.case} ${item.delta.index}${value}`;
}

/** Every item of a streamRun, written short. */
async function items(stream: AsyncIterable<StreamRunItem>): Promise<string[]> {
  const seen: string[] = [];
  for await (const item of stream) seen.push(describeItem(item));
  return seen;
}

describe("DeltaFilter (what a consumer is handed once)", () => {
  it("hands over each index of a turn once, in order, and skips what a reconnect sends again", () => {
    const filter = new DeltaFilter();
    const admitted = [0, 1, 2, 0, 1, 2, 3].map((i) => filter.admit(delta(text(i, "x"))));
    assert.deepEqual(admitted, [true, true, true, false, false, false, true]);
  });

  it("keeps each (handle, turn) apart", () => {
    const filter = new DeltaFilter();
    assert.ok(filter.admit(delta(text(0, "a"))));
    assert.ok(filter.admit(delta(text(0, "b", HANDLE, 2))), "the same index of another turn");
    assert.ok(filter.admit(delta(text(0, "c", "root/other.1"))), "the same index of another handle");
    assert.ok(!filter.admit(delta(text(0, "a"))));
  });

  it("always hands over a reset, which makes index 1 the next expected", () => {
    const filter = new DeltaFilter();
    const sent = [text(0, "a"), text(1, "b"), text(2, "c"), reset(), text(1, "B"), reset(), text(1, "B"), text(2, "C")];
    const admitted = sent.map((response) => filter.admit(delta(response)));
    assert.deepEqual(admitted, [true, true, true, true, true, true, true, true]);
    assert.ok(!filter.admit(delta(text(2, "C"))));
  });

  it("a piece past a gap is handed over, and the expected index follows it", () => {
    const filter = new DeltaFilter();
    assert.ok(filter.admit(delta(text(0, "a"))));
    assert.ok(filter.admit(delta(text(3, "d"))));
    assert.ok(!filter.admit(delta(text(2, "c"))));
    assert.ok(filter.admit(delta(text(4, "e"))));
  });
});

describe("streamRun (a loopback gRPC server)", () => {
  let peer: Peer;
  const clients: AgentRuntimeClient[] = [];
  const client = (options: ClientOptions = {}): AgentRuntimeClient => {
    const made = createClient(peer.address, { keepalive: false, ...options });
    clients.push(made);
    return made;
  };
  const fast: StreamRunOptions = { backoffMs: 1 };

  before(async () => {
    peer = await new Peer().start();
  });
  beforeEach(() => peer.reset());
  after(async () => {
    for (const made of clients) made.disconnect();
    await peer.stop();
  });

  it("spawns and wakes with its request ids, watches from seq 0 with deltas, hands over the handle's deltas, then its result", async () => {
    peer.scriptWatch({
      send: [
        event(1),
        text(0, "Stream"),
        text(0, "someone else's", "root/other.1"),
        text(1, "ing"),
        result(2, "the other's", "root/other.1"),
        result(3, "Streaming"),
        text(2, "after the result"),
      ],
    });
    const stream = client().streamRun("rt-1", "writer", "write", "root", { spawnRequestId: "s-1", wakeRequestId: "w-1" });
    assert.deepEqual(await items(stream), ["text 0 Stream", "text 1 ing", "result Streaming"]);
    assert.deepEqual(
      peer.attempts.map((attempt) => `${attempt.method} ${attempt.requestId}`),
      ["Spawn s-1", "Watch ", "Wake w-1"],
    );
    assert.deepEqual(peer.watchRequests, [{ afterSeq: 0n, deltas: true, batch: true }]);
  });

  it("wakes only once the Watch has answered (a provider's turn streams only to watchers there when it starts)", async () => {
    peer.scriptWatch({ send: [event(1), text(0, "a"), result(2, "a")] });
    assert.deepEqual(await items(client().streamRun("rt-1", "writer", "write")), ["text 0 a", "result a"]);
    assert.deepEqual(peer.timeline, ["Spawn", "Watch", "Watch answered", "Wake"]);
  });

  it("a Watch that drops before its first response is reopened before the Wake, which waits for the new one's", async () => {
    peer.fail("Watch", new ConnectError("the server went away", Code.Unavailable));
    peer.scriptWatch({ send: [], end: "drop" }, { send: [event(1), text(0, "a"), result(2, "a")] });
    const stream = client().streamRun("rt-1", "writer", "write", "root", { ...fast, wakeRequestId: "w-1" });
    assert.deepEqual(await items(stream), ["text 0 a", "result a"]);
    assert.deepEqual(peer.timeline, ["Spawn", "Watch", "Watch", "Watch", "Watch answered", "Wake"]);
    assert.deepEqual(peer.watchRequests.map((request) => request.afterSeq), [0n, 0n, 0n]);
  });

  it("after a drop mid-turn, reconnects from the last event's seq and skips the pieces the server sends again", async () => {
    peer.scriptWatch(
      { send: [event(1), text(0, "Stream"), text(1, "ing")], end: "drop" },
      { send: [text(0, "Stream"), text(1, "ing"), text(2, " lets"), result(2, "Streaming lets")] },
    );
    const disconnects: (Code | undefined)[] = [];
    const stream = client().streamRun("rt-1", "writer", "write", "root", {
      ...fast,
      onDisconnect: (error) => disconnects.push(error?.code),
    });
    assert.deepEqual(await items(stream), ["text 0 Stream", "text 1 ing", "text 2  lets", "result Streaming lets"]);
    // Deltas are not journaled: the reconnection asks from the last event, not from a delta.
    assert.deepEqual(peer.watchRequests, [
      { afterSeq: 0n, deltas: true, batch: true },
      { afterSeq: 1n, deltas: true, batch: true },
    ]);
    assert.deepEqual(disconnects, [Code.Unavailable]);
  });

  it("hands over every reset, even one a reconnect sends again, and the turn's pieces after it", async () => {
    peer.scriptWatch(
      { send: [text(0, "a"), text(1, "b"), reset(), text(1, "A")], end: "drop" },
      { send: [reset(), text(1, "A"), text(2, "B"), result(1, "AB")] },
    );
    const stream = client().streamRun("rt-1", "writer", "write", "root", fast);
    assert.deepEqual(await items(stream), [
      "text 0 a",
      "text 1 b",
      "reset 0",
      "text 1 A",
      "reset 0",
      "text 1 A",
      "text 2 B",
      "result AB",
    ]);
  });

  it("new pieces count as progress: a long turn streamed across more drops than maxRetries is not given up on", async () => {
    peer.scriptWatch(
      { send: [event(1), text(0, "a")], end: "drop" },
      { send: [text(0, "a"), text(1, "b")], end: "drop" },
      { send: [text(0, "a"), text(1, "b"), reset(), text(1, "B")], end: "drop" },
      { send: [reset(), text(1, "B"), text(2, "C"), result(2, "BC")] },
    );
    const stream = client().streamRun("rt-1", "writer", "write", "root", { ...fast, maxRetries: 1 });
    assert.deepEqual(await items(stream), [
      "text 0 a",
      "text 1 b",
      "reset 0",
      "text 1 B",
      "reset 0",
      "text 1 B",
      "text 2 C",
      "result BC",
    ]);
    assert.equal(peer.of("Watch").length, 4);
  });

  it("a reset is no progress: a stream that only restarts the turn and drops is given up after maxRetries", async () => {
    const again = { send: [reset()], end: "drop" as const };
    peer.scriptWatch(again, again, again);
    const stream = client().streamRun("rt-1", "writer", "write", "root", { ...fast, maxRetries: 1 });
    await assert.rejects(items(stream), (error: unknown) => error instanceof ConnectError && error.code === Code.Unavailable);
    assert.equal(peer.of("Watch").length, 2);
  });

  it("repeated deltas do not count as progress: a stream that re-sends a turn and drops is given up after maxRetries", async () => {
    const again = { send: [text(0, "a"), text(1, "b")], end: "drop" as const };
    peer.scriptWatch(again, again, again);
    const stream = client().streamRun("rt-1", "writer", "write", "root", { ...fast, maxRetries: 2 });
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const item of stream) seen.push(describeItem(item));
      })(),
      (error: unknown) => error instanceof ConnectError && error.code === Code.Unavailable,
    );
    assert.deepEqual(seen, ["text 0 a", "text 1 b"]);
    assert.equal(peer.of("Watch").length, 3);
  });

  it("an abort rejects with CANCELED (no result came) and ends the Watch", async () => {
    peer.scriptWatch({ send: [event(1), text(0, "a")] });
    const stop = new AbortController();
    const stream = client().streamRun("rt-1", "writer", "write", "root", { signal: stop.signal });
    const first = await stream.next();
    assert.equal(first.value === undefined ? "" : describeItem(first.value), "text 0 a");
    stop.abort();
    await assert.rejects(stream.next(), (error: unknown) => error instanceof ConnectError && error.code === Code.Canceled);
  });

  it("watch() still asks for no deltas", async () => {
    const events = client().watch("rt-1", 0);
    assert.equal((await events.next()).value?.seq, 1n);
    await events.return(undefined);
    assert.deepEqual(peer.watchRequests, [{ afterSeq: 0n, deltas: false, batch: true }]);
  });
});

// A client that ignored a batch would wait on its Watch for ever: the suite fails instead.
describe("Watch batches (a loopback gRPC server)", { timeout: 20_000 }, () => {
  let peer: Peer;
  const clients: AgentRuntimeClient[] = [];
  const client = (): AgentRuntimeClient => {
    const made = createClient(peer.address, { keepalive: false });
    clients.push(made);
    return made;
  };
  const fast: StreamRunOptions = { backoffMs: 1 };

  before(async () => {
    peer = await new Peer().start();
  });
  beforeEach(() => peer.reset());
  after(async () => {
    for (const made of clients) made.disconnect();
    await peer.stop();
  });

  /** The seqs of the first `count` events of `stream`, then it is left (the Watch cancelled). */
  async function seqs(stream: AsyncGenerator<Event, void, undefined>, count: number): Promise<bigint[]> {
    const seen: bigint[] = [];
    for await (const item of stream) {
      seen.push(item.seq);
      if (seen.length === count) break;
    }
    return seen;
  }

  it("watch(): hands a batch's events over one at a time, in order, and reconnects after the last event of the last batch", async () => {
    peer.scriptWatch(
      { send: [batch(event(1), event(2), event(3)), batch(event(4), event(5))], end: "drop" },
      { send: [batch(event(6), event(7))] },
    );
    const handed: string[] = [];
    const stream = client().watch("rt-1", 0, { ...fast, onDisconnect: () => handed.push("drop") });
    for await (const item of stream) {
      handed.push(`${item.seq}`);
      if (item.seq === 7n) break;
    }
    assert.deepEqual(handed, ["1", "2", "3", "4", "5", "drop", "6", "7"]);
    assert.deepEqual(peer.watchRequests, [
      { afterSeq: 0n, deltas: false, batch: true },
      { afterSeq: 5n, deltas: false, batch: true },
    ]);
  });

  it("watch(): one event a response in `event` (a server from before batches) is handed over and resumed from as before", async () => {
    peer.scriptWatch({ send: [event(1), event(2)], end: "drop" }, { send: [event(3)] });
    assert.deepEqual(await seqs(client().watch("rt-1", 0, fast), 3), [1n, 2n, 3n]);
    assert.deepEqual(
      peer.watchRequests.map((request) => request.afterSeq),
      [0n, 2n],
    );
  });

  it("watch(): an event of a batch already handed over is not handed over again", async () => {
    peer.scriptWatch({ send: [batch(event(1), event(2))], end: "drop" }, { send: [batch(event(2), event(3))] });
    assert.deepEqual(await seqs(client().watch("rt-1", 0, fast), 3), [1n, 2n, 3n]);
  });

  it("watch(): leaving the loop in the middle of a batch cancels the Watch; the next one starts after the last event handed over", async () => {
    peer.scriptWatch({ send: [batch(event(1), event(2), event(3))] });
    assert.deepEqual(await seqs(client().watch("rt-1", 0), 2), [1n, 2n]);
    peer.scriptWatch({ send: [batch(event(3), event(4))] });
    assert.deepEqual(await seqs(client().watch("rt-1", 2n), 2), [3n, 4n]);
    assert.deepEqual(
      peer.watchRequests.map((request) => request.afterSeq),
      [0n, 2n],
    );
  });

  it("streamRun: batches between deltas, a drop after a batch, the reconnection from its last event", async () => {
    peer.scriptWatch(
      {
        send: [
          batch(event(1), event(2, "root/other.1")),
          text(0, "Stream"),
          batch(event(3, "root/other.1"), event(4)),
          text(1, "ing"),
        ],
        end: "drop",
      },
      { send: [text(0, "Stream"), text(1, "ing"), text(2, " on"), batch(event(5, "root/other.1"), result(6, "Streaming on"))] },
    );
    const stream = client().streamRun("rt-1", "writer", "write", "root", fast);
    assert.deepEqual(await items(stream), ["text 0 Stream", "text 1 ing", "text 2  on", "result Streaming on"]);
    assert.deepEqual(peer.watchRequests, [
      { afterSeq: 0n, deltas: true, batch: true },
      { afterSeq: 4n, deltas: true, batch: true },
    ]);
    assert.deepEqual(peer.timeline, ["Spawn", "Watch", "Watch answered", "Wake", "Watch", "Watch answered"]);
  });
});
