"""Results' values become google.protobuf.Values (api/values.py): a large one is converted off the
event loop first, and what the loop then copies is the same Value it would have made itself."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from agentruntime_server.api import values
from agentruntime_server.api.values import OFF_LOOP_FROM, ValueConverter
from google.protobuf import json_format, struct_pb2

LARGE = {"rows": [{"k": index, "s": "abc", "f": index * 0.5} for index in range(30_000)]}
SMALL = {"n": 1, "deep": [[["ok"]]], "none": []}


class Turns:
    """Counts the loop's turns through a task that yields at every one."""

    def __init__(self) -> None:
        self.count = 0
        self._task = asyncio.ensure_future(self._turn())

    async def _turn(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)

    async def started(self) -> None:
        await asyncio.sleep(0)  # the loop runs ready callbacks in order: the task's first turn first
        assert self.count == 1

    def stop(self) -> None:
        self._task.cancel()


async def counted(value: object, size: int) -> int:
    """How often the loop turned while a value of `size` bytes was prepared."""
    turns = Turns()
    await turns.started()
    before = turns.count
    await ValueConverter().prepare(value, size, "a test's value")
    during = turns.count - before
    turns.stop()
    return during


async def test_a_large_value_is_converted_while_the_loop_goes_on() -> None:
    size = len(json.dumps(LARGE))
    assert size >= OFF_LOOP_FROM
    assert await counted(LARGE, size) >= 1  # the loop ran other work during the conversion


async def test_a_small_value_is_left_to_the_copy_on_the_loop() -> None:
    assert await counted(SMALL, len(json.dumps(SMALL))) == 0


async def test_the_prepared_value_is_copied_as_the_loop_would_have_converted_it(monkeypatch: pytest.MonkeyPatch) -> None:
    converter = ValueConverter()
    threads: list[int] = []
    converted = values._converted

    def recorded(value: object) -> bytes | str:
        threads.append(threading.get_ident())
        return converted(value)

    monkeypatch.setattr(values, "_converted", recorded)  # records the thread, converts as before
    await converter.prepare(LARGE, len(json.dumps(LARGE)), "a test's value")
    prepared = struct_pb2.Value()
    assert converter.copy(LARGE, prepared, "a test's value")
    monkeypatch.undo()
    assert threads and threads[0] != threading.get_ident()  # converted once, in another thread
    assert len(threads) == 1  # the copy read what prepare kept
    assert json_format.MessageToDict(prepared) == LARGE
    fresh = struct_pb2.Value()
    assert ValueConverter().copy(LARGE, fresh, "a test's value")
    assert fresh == prepared
