"""Model-call transport benchmark: the server's own client (agentruntime_server/http/) against aiohttp
and httpx's default transport, on asyncio's event loop and on uvloop, same loopback server.

Runs a stateless OpenAI-shaped server in a child process (on uvloop, so that it is not the
bottleneck) and drives it with C concurrent request loops from each client. Prints
requests/s and the client process's CPU per request (medians of several batches); with
`--busy N`, every request is followed by N µs of the loop's own work, as in a server whose
loop is never idle (a client that hands its replies over from another thread pays for it
then). Measured, never asserted."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import aiohttp
import httpx
import uvloop
from agentruntime_server.http import HttpClient
from aiohttp import web

REPLY = json.dumps(
    {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    }
)
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi " * 200}]}).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
Call = Callable[[], Awaitable[None]]


def _serve(port: int) -> None:
    async def complete(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text=REPLY, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=uvloop.new_event_loop())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _work(micros: int) -> None:
    until = time.perf_counter() + micros / 1e6
    while time.perf_counter() < until:
        pass


async def _batch(call: Call, concurrency: int, requests: int, busy: int) -> tuple[float, float]:
    """requests/s and µs of this process's CPU per request (the loop's own work taken out)."""
    per_loop = requests // concurrency

    async def loop() -> None:
        for _ in range(per_loop):
            await call()
            if busy:
                _work(busy)

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    done = per_loop * concurrency
    return done / (time.perf_counter() - started), ((time.process_time() - cpu) / done) * 1e6 - busy


async def _clients(url: str, concurrency: int, stack: AsyncExitStack) -> dict[str, Call]:
    ours = HttpClient(concurrency)
    stack.push_async_callback(ours.close)

    async def ours_call() -> None:
        response = await ours.post(url, BODY, HEADERS, timeout=120, max_body=1 << 20)
        json.loads(response.body)

    session = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)))
    timeout = aiohttp.ClientTimeout(total=120)

    async def aiohttp_call() -> None:
        async with session.post(url, data=BODY, headers=HEADERS, timeout=timeout, allow_redirects=False) as response:
            json.loads(await response.read())

    client = await stack.enter_async_context(httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)))

    async def httpx_call() -> None:
        response = await client.post(url, content=BODY, headers=HEADERS)
        json.loads(response.content)

    return {
        "agentruntime http_client (httptools)": ours_call,
        "aiohttp 3.14.5 ClientSession": aiohttp_call,
        "httpx 0.28.1 AsyncClient (default)": httpx_call,
    }


async def measure(url: str, concurrency: int, requests: int, batches: int, busy: int) -> dict[str, tuple[float, float]]:
    results: dict[str, tuple[float, float]] = {}
    async with AsyncExitStack() as stack:
        for name, call in (await _clients(url, concurrency, stack)).items():
            await _batch(call, concurrency, requests // 4, busy)  # warm-up: connections made
            runs = [await _batch(call, concurrency, requests, busy) for _ in range(batches)]
            results[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="µs of the loop's own work after each request")
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
        print(f"{'client':<40} {'loop':<8} {'C':>3} {'requests/s':>11} {'CPU/request':>12}")
        for loop_name, factory in (("asyncio", asyncio.new_event_loop), ("uvloop", uvloop.new_event_loop)):
            for concurrency in (1, 20):
                with asyncio.Runner(loop_factory=factory) as runner:
                    results = runner.run(measure(url, concurrency, args.requests, args.batches, args.busy))
                for name, (rate, cpu) in results.items():
                    print(f"{name:<40} {loop_name:<8} {concurrency:>3} {rate:>11,.0f} {cpu:>10.0f}µs")
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
