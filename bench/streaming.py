"""Streaming's cost and speed (docs/performance.md#streaming), measured, never asserted.

The bench workload (bench/workload.py: 18 model turns a root, C=20 roots in flight, no model
latency) with every reply carrying 200 characters of text, against a model server that
answers whole or, when asked (`stream: true`), as chat.completion.chunk events with the text
in 40 pieces. Two figures:

- CPU per model turn with streaming off (nobody watches with deltas: replies are read whole)
  and on (each root's runtime watched with deltas, so its replies stream), alternating, a
  runtime per root;
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
from workload import TURNS_PER_ROOT, _agents, _free_port, _proc_cpu_seconds, _reply, _wait_healthy, serve_model, server_env

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

    serve_model(port, complete)


async def run(
    watch: str, roots: int, batches: int, pause: float = 0.0, concurrency: int = 20, batched: bool = False
) -> dict[str, float]:
    """CPU per model turn (median over batches) and, streaming, the first-delta delays (ms).
    A runtime per root, as hosts use it (a runtime a task or a conversation). `watch`: `none`
    (Spawn, Wake, Wait), `events` (each root watched from its spawn without deltas, as a UI
    did before streaming) or `deltas` (watched with deltas, as a UI or a client's stream_run
    does: its turns stream because they are watched). `pause`: seconds between a streamed
    reply's pieces. `batched`: the watchers ask for their events in batches (WatchRequest.batch),
    as every client's watch and stream_run do."""
    model_port, server_port = _free_port(), _free_port()
    model = multiprocessing.Process(target=_model_server, args=(model_port, pause), daemon=True)
    model.start()
    with tempfile.TemporaryDirectory() as folder:
        env = server_env(folder, model_port)
        address = f"127.0.0.1:{server_port}"
        command = (sys.executable, "-m", "agentruntime_server", "serve", "--listen", address)
        server = await asyncio.create_subprocess_exec(*command, env=env)
        try:
            await _wait_healthy(address)
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.AgentRuntimeStub(channel)
                agents = _agents(model_port)
                delays: list[float] = []

                async def root() -> None:
                    runtime_id = (await stub.CreateRuntime(pb.CreateRuntimeRequest(agents=agents))).runtime_id
                    handle = (await stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="coordinator"))).handle_id
                    wake = pb.WakeRequest(runtime_id=runtime_id, handle_id=handle, prompt="go")
                    if watch != "none":
                        result = await _watched(stub, runtime_id, handle, wake, watch == "deltas", delays, batched)
                    else:
                        await stub.Wake(wake)
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


async def _watched(
    stub: Any, runtime_id: str, handle: str, wake: pb.WakeRequest, deltas: bool, delays: list[float], batch: bool = False
) -> pb.TaskResult:
    """What a UI (or a client's stream_run) does: Watch the root's runtime (with deltas or not),
    Wake the root once the Watch answered, time each turn's stamped first piece as it comes, and
    end at the root's result."""
    call: Any = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, deltas=deltas, batch=batch))
    woken = False
    try:
        async for response in call:
            if not woken:
                await stub.Wake(wake)
                woken = True
            if not response.HasField("delta"):
                for event in response.events or (response.event,):
                    if event.handle_id == handle and event.HasField("result"):
                        return event.result  # type: ignore[no-any-return]
                continue
            if response.delta.text.startswith(STAMP):
                stamp = int(response.delta.text[len(STAMP) :].split(";", 1)[0])
                delays.append((time.monotonic_ns() - stamp) / 1e9)
    finally:
        call.cancel()
    raise RuntimeError("the Watch ended before the root's result")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--roots", type=int, default=50, help="roots per batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each side")
    args = parser.parse_args()
    # Each watched side twice: one event a response (as before batches, and as a raw stub asks
    # by default) and batched (as every client's watch and stream_run asks).
    sides: dict[tuple[str, bool], list[float]] = {
        ("none", False): [],
        ("events", False): [],
        ("events", True): [],
        ("deltas", False): [],
        ("deltas", True): [],
    }
    for _ in range(args.runs):
        for (watch, batch), cpu in sides.items():
            cpu.append((await run(watch, args.roots, args.batches, batched=batch))["cpu_us_per_turn"])
    none, events, events_batched, deltas, deltas_batched = (statistics.median(cpu) for cpu in sides.values())
    pairs = ", ".join(f"{b / a:.2f}" for a, b in zip(sides[("events", True)], sides[("deltas", True)], strict=True))
    print(
        f"{'streaming, C=20, no latency':<34} CPU/turn: unwatched {none:.0f}µs; watched {events:.0f}µs, "
        f"{events_batched:.0f}µs batched ({events_batched / none:.2f}x); with deltas {deltas:.0f}µs, {deltas_batched:.0f}µs "
        f"batched ({deltas_batched / none:.2f}x; {deltas_batched / events_batched - 1:+.0%} for the deltas); 40 pieces a "
        f"reply; a runtime per root; medians of {args.runs} alternating runs; batched pairs {pairs})"
    )
    paced = [await run("deltas", max(args.roots // 2, 5), 2, pause=PAUSE, batched=True) for _ in range(args.runs)]
    p50 = statistics.median(r["first_delta_p50_ms"] for r in paced)
    p99 = statistics.median(r["first_delta_p99_ms"] for r in paced)
    print(
        f"{'streaming, C=20, paced pieces':<34} provider's first byte -> watcher's first delta p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms (pieces {PAUSE * 1000:g} ms apart after {FIRST_BYTE * 1000:g} ms; medians of {args.runs} runs, "
        f"{int(paced[0]['turns_timed'])} turns timed a run)"
    )


if __name__ == "__main__":
    asyncio.run(main())
