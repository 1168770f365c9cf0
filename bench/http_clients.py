"""Model-call transport benchmark: httpx's default transport vs aiohttp, same loopback server.

Runs a stateless OpenAI-shaped server in a child process and drives it with C concurrent
request loops from each client. Prints requests/s (median of several batches)."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
from aiohttp import web

REPLY = json.dumps(
    {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    }
)
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def _serve(port: int) -> None:
    async def complete(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text=REPLY, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _batch(call: Callable[[], Awaitable[None]], concurrency: int, requests: int) -> float:
    per_loop = requests // concurrency

    async def loop() -> None:
        for _ in range(per_loop):
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return per_loop * concurrency / (time.perf_counter() - started)


async def measure(url: str, concurrency: int, requests: int, batches: int) -> dict[str, float]:
    results: dict[str, float] = {}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)) as client:

        async def httpx_call() -> None:
            response = await client.post(url, content=BODY, headers={"Content-Type": "application/json"})
            json.loads(response.content)

        await _batch(httpx_call, concurrency, requests // 4)  # warm-up
        results["httpx 0.28.1 AsyncClient (default transport)"] = statistics.median(
            [await _batch(httpx_call, concurrency, requests) for _ in range(batches)]
        )
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def aiohttp_call() -> None:
            async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as response:
                json.loads(await response.read())

        await _batch(aiohttp_call, concurrency, requests // 4)
        results["aiohttp 3.14.5 ClientSession (our choice)"] = statistics.median(
            [await _batch(aiohttp_call, concurrency, requests) for _ in range(batches)]
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    port = _free_port()
    server = multiprocessing.Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        print(f"{'client':<48} {'C':>3} {'requests/s (median)':>20}")
        for concurrency in (1, 20):
            for name, rate in asyncio.run(measure(url, concurrency, args.requests, args.batches)).items():
                print(f"{name:<48} {concurrency:>3} {rate:>20,.0f}")
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
