"""The console under test: a runtime server (tokens of acme, globex and default; the OpenAI-shaped
model server and a tool server on loopback), the console in front of it, all on an event loop
of their own thread, and headless Chromium (Debian's chromium and chromium-driver) driven by
Selenium, so that test bodies stay synchronous as a person's clicks are."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.console.app import build
from agentruntime_server.console.target import Target
from aiohttp import web
from google.protobuf.message import Message as ProtoMessage
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from tests.support.model_server import ScriptedModelServer
from tests.support.servers import Served, serve
from tests.support.tenants import TOKENS, bearer, write_tokens
from tests.support.tool_server import ToolServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Where the docs' screenshots are written when this is set (docs/console.md says how).
SCREENSHOTS = os.environ.get("AGENTRUNTIME_CONSOLE_SCREENSHOTS", "")
T = TypeVar("T")


class Stack:
    """Servers on a loop of their own thread; `call` runs a coroutine there."""

    def __init__(self, workdir: Path, auth: str = "tokens") -> None:
        self.workdir = workdir
        self.auth = auth  # "none": a runtime without authentication (what make run serves)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="console-stack", daemon=True)
        self.stack = AsyncExitStack()
        self.model = ScriptedModelServer()
        self.tools = ToolServer()
        self.console_url = ""
        self.served: Served | None = None

    def call(self, coroutine: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def start(self) -> None:
        self.thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        await self.model.start()
        await self.tools.start()
        tokens = self.workdir / "tokens.json"
        write_tokens(tokens)
        prices = self.workdir / "prices.json"
        rates = {"model": "*", "input": 2.5, "cache_read": 0.25, "cache_write": 3.125, "output": 10.0}
        table = [{"provider": provider, **rates} for provider in ("scripted", "openai")]
        prices.write_text(json.dumps({"currency": "USD", "prices": table}))
        self.served = await self.stack.enter_async_context(
            serve(
                auth=self.auth,
                auth_tokens_file=str(tokens) if self.auth == "tokens" else "",
                store=f"sqlite:///{self.workdir / 'store.db'}",
                llm_style="openai",
                llm_base_url=self.model.base_url,
                llm_api_key="sk-console-test-never-shown",
                prices=str(prices),
                tool_egress_allow=["127.0.0.0/8"],  # the test's tool server (closed by default with authentication on)
            )
        )
        runner = web.AppRunner(build(Target(f"127.0.0.1:{self.served.port}")), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.stack.push_async_callback(runner.cleanup)
        port = runner.addresses[0][1]
        self.console_url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        async def stopping() -> None:
            await self.stack.aclose()
            await self.model.stop()
            await self.tools.stop()

        self.call(stopping())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    def rpc(self, tenant: tuple[str, str, list[str], str], method: str, request: ProtoMessage, timeout: float = 30) -> Any:
        """A gRPC call as the tenant (the API a host uses, beside the person's browser)."""
        assert self.served is not None
        stub = self.served.stub

        async def calling() -> Any:
            return await getattr(stub, method)(request, metadata=bearer(tenant[1]), timeout=timeout)

        return self.call(calling(), timeout + 5)

    def create(self, tenant: tuple[str, str, list[str], str], runtime_id: str, *agents: pb.AgentDef) -> str:
        request = pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=list(agents))
        return str(self.rpc(tenant, "CreateRuntime", request).runtime_id)

    def start_run(self, tenant: tuple[str, str, list[str], str], runtime_id: str, agent: str, prompt: str) -> str:
        spawned = self.rpc(tenant, "Spawn", pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent=agent))
        self.rpc(tenant, "Wake", pb.WakeRequest(runtime_id=runtime_id, handle_id=spawned.handle_id, prompt=prompt))
        return str(spawned.handle_id)

    def wait(self, tenant: tuple[str, str, list[str], str], runtime_id: str, handle_id: str) -> pb.TaskResult:
        request = pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id)
        request.timeout.FromSeconds(30)
        result: pb.TaskResult = self.rpc(tenant, "Wait", request, timeout=40).result
        return result


def browser(profile: Path) -> WebDriver:
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.fail("the console's tests need Debian's chromium and chromium-driver: `make test` installs them (apt-get)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # As root on a closed network: no sandbox, nothing fetched in the background.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--window-size=1440,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


def stack_of(auth: str) -> Iterator[Stack]:
    workdir = Path(tempfile.mkdtemp(prefix="agentruntime-console-"))
    running = Stack(workdir, auth)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from stack_of("tokens")


@pytest.fixture(scope="module")
def open_stack() -> Iterator[Stack]:
    """A runtime without authentication (AGENTRUNTIME_AUTH=none) and its console."""
    yield from stack_of("none")


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    profile = Path(tempfile.mkdtemp(prefix="agentruntime-chromium-"))
    driving = browser(profile)
    driving.set_page_load_timeout(30)
    try:
        yield driving
    finally:
        driving.quit()
        shutil.rmtree(profile, ignore_errors=True)


def until(driver: WebDriver, condition: Callable[[WebDriver], T], what: str, timeout: float = 20) -> T:
    # (an element read as the page navigates away is stale: asked again on the next poll)
    waiting = WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,))
    return waiting.until(condition, message=f"waited {timeout}s for {what}")


def sign_in(driver: WebDriver, stack: Stack, token: str, expect: str = "/runtimes") -> None:
    driver.delete_all_cookies()
    driver.get(stack.console_url + "/signin")
    form = driver.find_element(By.ID, "token")
    form.send_keys(token)
    driver.find_element(By.ID, "signin").click()
    try:
        until(driver, lambda d: d.current_url.endswith(expect) and d.find_elements(By.TAG_NAME, "main"), f"{expect}, signed in")
    except TimeoutException:
        raise AssertionError(f"not signed in: at {driver.current_url}: {driver.page_source[:2000]}") from None


def row(driver: WebDriver, handle_id: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'#tree tr[data-id="{handle_id}"]')


def cell(driver: WebDriver, handle_id: str, name: str) -> str:
    return str(row(driver, handle_id).find_element(By.CLASS_NAME, name).text)


def screenshot(driver: WebDriver, name: str) -> None:
    """For the docs, when AGENTRUNTIME_CONSOLE_SCREENSHOTS names a folder."""
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        time.sleep(0.3)  # (the last frame painted)
        driver.save_screenshot(str(Path(SCREENSHOTS) / f"{name}.png"))


ACME, GLOBEX = TOKENS[0], TOKENS[1]
