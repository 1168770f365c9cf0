"""Streaming's cost and speed (docs/performance.md#streaming), measured, never asserted.

The bench workload (bench/workload.py: 18 model turns a root, C=20 roots in flight, no model
latency) with every reply carrying 200 characters of text, against a model server that
answers whole or, when asked (`stream: true`), as chat.completion.chunk events with the text
in 40 pieces. Two figures:

- CPU per model turn with streaming off (the default: nobody watches with deltas) and on
  (AGENTRUNTIME_STREAM_REPLIES=always, and a watcher with deltas on the runtime), alternating;
- the time from the provider's first byte of a reply to the watching client's first delta of
  that turn, p50 and p99 over every turn: the model server stamps its first text piece with
  CLOCK_MONOTONIC (one clock for every process of the machine) as it writes it."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))
from workload import TURNS_PER_ROOT, _agents, _free_port, _proc_cpu_seconds, _reply, _wait_healthy, server_env

PIECES = 40
PIECE = "x" * 5  # 40 pieces of 5 characters: a 200-character reply
PAUSE = 0.01  # between pieces, for the latency figure: a fast model writing (100 pieces a second)
# Before its first byte, in the latency run: a model's time to its first token (an instant
# answer would time the journal's commit of the turn's TurnStarted, which its deltas follow).
FIRST_BYTE = 0.05
STAMP = "t="  # the first piece: t=<monotonic ns>; (then padded to the piece's size)


def _chunk(delta: dict[str, object], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": choices}
    if usage:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _model_server(port: int, pause: float) -> None:
    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        whole = _reply(body)
        message = whole["choices"][0]["message"]
        if not body.get("stream"):
            message["content"] = (message["content"] or "") + PIECE * PIECES
            return web.Response(text=json.dumps(whole), content_type="application/json")
        if pause:
            await asyncio.sleep(FIRST_BYTE)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunk({"role": "assistant", "content": f"{STAMP}{time.monotonic_ns()};"}))
        if message["content"]:
            await response.write(_chunk({"content": message["content"]}))
        for _ in range(PIECES - 1):
            if pause:
                await asyncio.sleep(pause)
            await response.write(_chunk({"content": PIECE}))
        for index, call in enumerate(message.get("tool_calls") or ()):
            await response.write(_chunk({"tool_calls": [{"index": index, **call}]}))
        await response.write(_chunk({}, whole["choices"][0]["finish_reason"]))
        await response.write(_chunk({}, usage=whole["usage"]))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def lookup(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="42")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/lookup", lookup)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def run(streaming: bool, roots: int, batches: int, pause: float = 0.0, concurrency: int = 20) -> dict[str, float]:
    """CPU per model turn (median over batches) and, streaming, the first-delta delays (ms).
    `pause`: seconds between a streamed reply's pieces."""
    model_port, server_port = _free_port(), _free_port()
    model = multiprocessing.Process(target=_model_server, args=(model_port, pause), daemon=True)
    model.start()
    with tempfile.TemporaryDirectory() as folder:
        env = server_env(folder, model_port, AGENTRUNTIME_STREAM_REPLIES="always" if streaming else "watched")
        address = f"127.0.0.1:{server_port}"
        command = (sys.executable, "-m", "agentruntime_server", "serve", "--listen", address)
        server = await asyncio.create_subprocess_exec(*command, env=env)
        try:
            await _wait_healthy(address)
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.AgentRuntimeStub(channel)
                runtime_id = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=_agents(model_port)))).runtime_id
                delays: list[float] = []
                watcher = asyncio.ensure_future(_watch(stub, runtime_id, delays)) if streaming else None

                async def root() -> None:
                    handle = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="coordinator"))).handle_id
                    await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle, prompt="go"))
                    result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle))).result
                    if result.status != pb.STATUS_DONE or not result.text.endswith(PIECE):
                        raise RuntimeError(f"unexpected result: {result}")

                async def batch() -> float:
                    gate = asyncio.Semaphore(concurrency)

                    async def gated() -> None:
                        async with gate:
                            await root()

                    before = _proc_cpu_seconds(server.pid)
                    await asyncio.gather(*(gated() for _ in range(roots)))
                    return (_proc_cpu_seconds(server.pid) - before) / (roots * TURNS_PER_ROOT)

                await batch()  # warm-up
                delays.clear()
                cpu = statistics.median([await batch() for _ in range(batches)])
                if watcher is not None:
                    if watcher.done():
                        watcher.result()  # the watcher's failure
                    watcher.cancel()
                figures = {"cpu_us_per_turn": cpu * 1e6}
                if delays:
                    delays.sort()
                    figures["first_delta_p50_ms"] = delays[len(delays) // 2] * 1000
                    figures["first_delta_p99_ms"] = delays[min(len(delays) - 1, int(len(delays) * 0.99))] * 1000
                    figures["turns_timed"] = len(delays)
                return figures
        finally:
            server.terminate()
            await server.wait()
            model.terminate()
            model.join()


async def _watch(stub: pb_grpc.AgentRuntimeStub, runtime_id: str, delays: list[float]) -> None:
    """A watcher with deltas (what a UI runs): each turn's stamped first piece, timed when it
    first comes. One that falls too far behind reconnects from its last seq, as the clients do."""
    seen, timed = 0, set()
    while True:
        try:
            call: Any = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=seen, deltas=True))
            async for response in call:
                if response.HasField("event"):
                    seen = response.event.seq
                    continue
                delta = response.delta
                if delta.text.startswith(STAMP) and (delta.handle_id, delta.turn) not in timed:
                    now = time.monotonic_ns()
                    timed.add((delta.handle_id, delta.turn))
                    delays.append((now - int(delta.text[len(STAMP) :].split(";", 1)[0])) / 1e9)
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--roots", type=int, default=50, help="roots per batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each side")
    args = parser.parse_args()
    off: list[dict[str, float]] = []
    on: list[dict[str, float]] = []
    for _ in range(args.runs):
        off.append(await run(False, args.roots, args.batches))
        on.append(await run(True, args.roots, args.batches))
    quiet = statistics.median(r["cpu_us_per_turn"] for r in off)
    loud = statistics.median(r["cpu_us_per_turn"] for r in on)
    pairs = ", ".join(f"{b['cpu_us_per_turn'] / a['cpu_us_per_turn']:.2f}" for a, b in zip(off, on, strict=True))
    print(
        f"{'streaming, C=20, no latency':<34} off {quiet:.0f}µs, on {loud:.0f}µs CPU/turn: {loud / quiet - 1:+.0%} "
        f"(40 pieces a reply, medians of {args.runs} alternating runs; pairs {pairs})"
    )
    paced = [await run(True, max(args.roots // 2, 5), 2, pause=PAUSE) for _ in range(args.runs)]
    p50 = statistics.median(r["first_delta_p50_ms"] for r in paced)
    p99 = statistics.median(r["first_delta_p99_ms"] for r in paced)
    print(
        f"{'streaming, C=20, paced pieces':<34} provider's first byte -> watcher's first delta p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms (pieces {PAUSE * 1000:g} ms apart; medians of {args.runs} runs, "
        f"{int(paced[0]['turns_timed'])} turns timed a run)"
    )


if __name__ == "__main__":
    asyncio.run(main())
