"""The per-test timeout (tests/support/timeouts.py over pytest-timeout) in a pytest of its own,
on uvloop as every test runs: a test awaiting for ever and one blocked in a call each fail
with their name and "Timeout", and the tests after them still run. Without the plugin the
first would hang the run (uvloop swallows what pytest-timeout's signal handler raises)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from agentruntime_server.process.event_loop import DEFAULT_LOOP, loop_factory

pytest_plugins = ["tests.support.timeouts"]


def pytest_asyncio_loop_factories(config, item):
    return {DEFAULT_LOOP: loop_factory(DEFAULT_LOOP)}
"""

HUNG = """
import asyncio
import time

import pytest


@pytest.fixture
async def never_ready():
    await asyncio.Event().wait()
    yield


@pytest.mark.timeout(1)
async def test_awaits_for_ever():
    await asyncio.Event().wait()


@pytest.mark.timeout(1)
async def test_swallows_its_cancellation():
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        pass


@pytest.mark.timeout(1)
async def test_waits_on_a_fixture(never_ready):
    pass


@pytest.mark.timeout(1)
def test_sleeps_for_ever():
    time.sleep(600)


async def test_after_them():
    await asyncio.sleep(0)
"""


def test_a_hung_test_fails_with_its_name_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_hung.py").write_text(HUNG)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "test_hung.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    summary = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert sorted(line.split(" - ")[0] for line in summary) == [
        "ERROR test_hung.py::test_waits_on_a_fixture",
        "FAILED test_hung.py::test_awaits_for_ever",
        "FAILED test_hung.py::test_sleeps_for_ever",
        "FAILED test_hung.py::test_swallows_its_cancellation",
    ], done.stdout
    assert all("Timeout (>1.0s)" in line for line in summary), summary
    assert done.stdout.splitlines()[-1].startswith("3 failed, 1 passed, 1 error"), done.stdout[-2000:]
