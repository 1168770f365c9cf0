"""`agentruntime console` as a process: the names it answers to (--allow-host and
AGENTRUNTIME_CONSOLE_ALLOWED_HOSTS), a name that is none refused at start, and a failed sign-in
in its log without the token."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from tests.support.console_http import person, post_signin, signin_form
from tests.support.poll import eventually
from tests.support.process import free_port
from tests.support.tenants import tenant_server


def text_of(log: Path) -> str:
    return log.read_text()


@asynccontextmanager
async def console_process(target: str, log: Path, *flags: str, env: dict[str, str] | None = None) -> AsyncIterator[str]:
    port = free_port()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentruntime_server", "console", "--listen", f"127.0.0.1:{port}", "--target", target, *flags,
            env={**os.environ, **(env or {})}, stdout=out, stderr=out,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    async def answers() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as health:
                return health.status == 200
        except aiohttp.ClientConnectionError:
            assert process.returncode is None, text_of(log)
            return False

    try:
        await eventually(answers, "the console to answer", timeout=30)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def test_the_console_answers_to_the_names_it_is_given_and_logs_failed_sign_ins(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    names = {"AGENTRUNTIME_CONSOLE_ALLOWED_HOSTS": "console.example, ops.example:8443"}
    async with tenant_server(tmp_path) as served:
        target = f"127.0.0.1:{served.port}"
        async with console_process(target, log, "--allow-host", "proxy.example", env=names) as url, person() as http:
            for host, status in (
                ("console.example", 200),
                ("proxy.example:443", 200),
                ("ops.example:8443", 200),
                ("ops.example:9000", 421),
                ("rebind.example", 421),
            ):
                async with http.get(url + "/healthz", headers={"Host": host}) as answer:
                    assert answer.status == status, host
            csrf = await signin_form(http, url)
            assert (await post_signin(http, url, csrf, "wrong-token-never-logged")).status == 401
    logged = text_of(log)
    assert "sign-in refused from 127.0.0.1" in logged and "wrong-token-never-logged" not in logged


async def test_an_allowed_host_that_is_no_name_stops_the_start(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentruntime_server", "console", "--allow-host", "evil.example/path",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2 and b"--allow-host 'evil.example/path' is no host name" in stderr
