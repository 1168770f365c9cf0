"""The web console's speed on a large tree (docs/console.md#speed), measured, never asserted.

A runtime of 200 handles (10 roots with 19 children each, every one run once by the scripted
model: about 1,400 events in its history), a server and a console in processes of their own.
Three figures, medians:

- the runtime page, rendered (GET, signed in: List, the pending Requests, the template);
- its live stream's first batch (Watch from the start with deltas, the history folded into the
  tree's rows: what makes the first page of the runtime live), one a run;
- a later page's first batch while that stream is open (it joins the feed: the tree as it stands);
- in headless Chromium (when Debian's chromium and chromium-driver are there): from navigation
  to every row shown and the stream live."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
from workload import _free_port, _wait_healthy

ROOTS, CHILDREN = 10, 19
RUNS = 20
VENV_BIN = Path(sys.executable).parent


async def build_tree(address: str) -> str:
    worker = pb.AgentDef(name="worker", script=pb.Script(replies=[pb.ScriptedReply(text="done " * 20, tokens=50)]))
    async with Client(address) as client:
        runtime_id = await client.create_runtime([worker], "bench-tree")
        for _ in range(ROOTS):
            root = await client.spawn(runtime_id, "worker")
            children = [await client.spawn(runtime_id, "worker", root) for _ in range(CHILDREN)]
            for handle_id in (root, *children):
                await client.wake(runtime_id, handle_id, "go")
            for handle_id in (root, *children):
                await client.wait(runtime_id, handle_id)
        listed = await client.list_handles(runtime_id)
        assert len(listed) == ROOTS * (CHILDREN + 1), len(listed)
        return runtime_id


async def http_figures(console: str, runtime_id: str) -> tuple[list[float], float, list[float]]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:  # (an IP address's cookies)
        # The server has no authentication: the console signs a person in without a form.
        signed = await session.get(f"{console}/runtimes")
        assert signed.status == 200 and signed.url.path == "/runtimes", signed.url
        pages: list[float] = []
        for _ in range(RUNS):
            started = time.perf_counter()
            response = await session.get(f"{console}/runtimes/{runtime_id}")
            body = await response.text()
            pages.append(time.perf_counter() - started)
            assert body.count("<tr data-id=") == ROOTS * (CHILDREN + 1)
        # The first page opens the runtime's feed (a Watch from the start) and stays open; the
        # later ones join it (what a second tab, or a reload, does).
        first, first_stream = await _first_batch(session, f"{console}/runtimes/{runtime_id}/live")
        joined = []
        try:
            for _ in range(RUNS // 2):
                response, took = await _first_batch(session, f"{console}/runtimes/{runtime_id}/live")
                response.close()
                joined.append(took)
        finally:
            first.close()
        return pages, first_stream, joined


async def _first_batch(session: aiohttp.ClientSession, url: str) -> tuple[aiohttp.ClientResponse, float]:
    """The live stream, open, and the seconds to its batch of every row."""
    started = time.perf_counter()
    live = await session.get(url)
    async for line in live.content:
        if line.startswith(b"data: ") and b'"rows"' in line:
            assert line.count(b'"id":') == ROOTS * (CHILDREN + 1)
            return live, time.perf_counter() - started
    raise RuntimeError("the live stream ended before its rows")


POLL = """
const state = document.getElementById('live-state');
return [state ? state.textContent.trim() : '', document.querySelectorAll('#tree tr[data-id]').length];
"""


def browser_figures(console: str, runtime_id: str) -> list[float]:
    try:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.wait import WebDriverWait

        from tests.support.console import CHROMEDRIVER, CHROMIUM, browser
    except ImportError:
        return []
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        return []
    driver = browser(Path(tempfile.mkdtemp(prefix="bench-chromium-")))
    loads = []
    try:
        driver.get(f"{console}/runtimes")  # (no sign-in: the server has no authentication)
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.ID, "open-server"))
        for _ in range(5):
            started = time.perf_counter()
            driver.get(f"{console}/runtimes/{runtime_id}")
            while True:
                # One script per poll: on a page without the badge it answers '' (find_element raised).
                live, rows = driver.execute_script(POLL)
                if live == "live" and rows == ROOTS * (CHILDREN + 1):
                    break
                if time.perf_counter() - started > 30:
                    raise RuntimeError(f"not live after 30 s: badge {live!r}, {rows} rows, at {driver.current_url}")
                time.sleep(0.005)
            loads.append(time.perf_counter() - started)
    finally:
        driver.quit()
    return loads


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent.parent))
    port, console_port = _free_port(), _free_port()
    address, console = f"127.0.0.1:{port}", f"http://127.0.0.1:{console_port}"
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "AGENTRUNTIME_STORE": f"sqlite:///{folder}/bench.db", "AGENTRUNTIME_METRICS_LISTEN": "off"}
        env["AGENTRUNTIME_LOG_LEVEL"] = "WARNING"
        server = subprocess.Popen([VENV_BIN / "agentruntime", "serve", "--listen", address], env=env)
        viewer = subprocess.Popen(
            [VENV_BIN / "agentruntime", "console", "--listen", f"127.0.0.1:{console_port}", "--target", address],
            stdout=subprocess.DEVNULL,
        )
        try:
            asyncio.run(_wait_healthy(address))
            runtime_id = asyncio.run(build_tree(address))
            pages, first_stream, joined = asyncio.run(http_figures(console, runtime_id))
            loads = browser_figures(console, runtime_id)
        finally:
            for process in (viewer, server):
                process.terminate()
                process.wait(30)
    handles = ROOTS * (CHILDREN + 1)
    print(f"console, a runtime of {handles} handles (median of {RUNS}):")
    print(f"  runtime page rendered (GET):            {statistics.median(pages) * 1000:7.1f} ms")
    print(f"  live stream's first batch (history):    {first_stream * 1000:7.1f} ms (the runtime's first page)")
    print(f"  a later page's first batch (joins):     {statistics.median(joined) * 1000:7.1f} ms")
    if loads:
        print(f"  Chromium: navigation to live, all rows: {statistics.median(loads) * 1000:7.1f} ms (median of {len(loads)})")
    else:
        print("  Chromium: not measured (no /usr/bin/chromium and chromedriver)")


if __name__ == "__main__":
    main()
