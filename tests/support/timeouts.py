"""Per-test timeouts that end a test hung on an event loop too (tests/conftest.py registers the
hooks; the limit is pyproject.toml's `timeout`, or a test's `@pytest.mark.timeout`).

pytest-timeout's signal method raises from its SIGALRM handler. uvloop, which every test runs
on, calls Python signal handlers inside one of its own callbacks and swallows what they raise
("Exception in callback Loop._read_from_self"): a test awaiting for ever would hang the run.
So when the alarm finds an event loop running, it cancels the loop's tasks instead (the test's
or the fixture's among them, whose CancelledError traceback shows where it waited), and the
test's report says it timed out; with no loop running it raises as pytest-timeout does. A test
still not over GRACE seconds later (it swallowed the cancellation, or its teardown hangs) stops
the run as pytest-timeout's thread method does, after a line naming it."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest
import pytest_timeout  # type: ignore[import-untyped]

GRACE = 30.0  # seconds a cancelled test has to end before the run is stopped
TIMED_OUT = pytest.StashKey[float]()  # the alarm came (the item's timeout)
CANCELLED = pytest.StashKey[float]()  # ... and cancelled an event loop's tasks
REPORTED = pytest.StashKey[bool]()


def message(timeout: float) -> str:
    return f"Timeout (>{timeout:.1f}s) from pytest-timeout"


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own way

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if TIMED_OUT in item.stash:  # the second alarm: the cancelled test did not end
            sys.stderr.write(f"\n{item.nodeid}: still running {GRACE:.0f}s after its timeout; stopping the run\n")
            pytest_timeout.timeout_timer(item, settings)  # dumps the stacks, then os._exit(1)
        item.stash[TIMED_OUT] = settings.timeout
        signal.setitimer(signal.ITIMER_REAL, GRACE)
        loop = asyncio._get_running_loop()
        if loop is None:
            pytest_timeout.timeout_sigalrm(item, settings)  # raises pytest's Failed where the test is
            return
        item.stash[CANCELLED] = settings.timeout
        terminal = item.config.get_terminal_writer()
        terminal.sep("+", title=f"Timeout: {item.nodeid}")
        pytest_timeout.dump_stacks(terminal)  # the other threads'; the cancelled tasks' tracebacks follow
        for task in asyncio.all_tasks(loop):
            task.cancel(message(settings.timeout))

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout's cancel hook calls
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A test whose tasks were cancelled for its timeout fails as timed out, in the phase the
    alarm met (whatever its code made of the cancellation), with the traceback of where it was."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    timeout = item.stash.get(CANCELLED, None)
    if timeout is None or item.stash.get(REPORTED, False):
        return
    item.stash[REPORTED] = True
    report.outcome = "failed"
    report.longrepr = f"{message(timeout)}: {item.nodeid}\n{report.longreprtext}"


DEFAULT = 300.0  # pyproject.toml's timeout


def for_rounds(rounds: int, seconds_a_round: float) -> pytest.MarkDecorator:
    """The timeout of a hunt or a soak run for `rounds` rounds (their environment sets how many):
    the default, and a generous bound for each round on top."""
    return pytest.mark.timeout(DEFAULT + rounds * seconds_a_round)
