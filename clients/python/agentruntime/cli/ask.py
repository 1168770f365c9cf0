"""Asking the human at the terminal (or reading standard input) for the Answer to a Request."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable

from google.protobuf import struct_pb2

from agentruntime.v1 import agent_runtime_pb2 as pb


class NoAnswer(Exception):
    """Standard input ended before the question was answered."""


class LineReader:
    """Lines of standard input, read without blocking the event loop (Watch goes on meanwhile).

    Pipes and terminals are polled; a regular file never blocks, so it is read directly."""

    def __init__(self, fd: int | None = None) -> None:
        self.fd = sys.stdin.fileno() if fd is None else fd
        self._buffer = b""
        self._eof = False

    async def readline(self) -> str | None:
        """The next line without its newline; None at the end of input."""
        while b"\n" not in self._buffer and not self._eof:
            chunk = await self._read()
            self._eof = not chunk
            self._buffer += chunk
        if not self._buffer:
            return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", errors="replace").rstrip("\r")

    async def _read(self) -> bytes:
        loop = asyncio.get_running_loop()
        while True:
            ready: asyncio.Future[None] = loop.create_future()
            try:
                loop.add_reader(self.fd, _set_once, ready)
            except (OSError, ValueError):  # a regular file cannot be polled; it never blocks
                return os.read(self.fd, 65536)
            try:
                await ready
            finally:
                loop.remove_reader(self.fd)
            with contextlib.suppress(BlockingIOError):
                return os.read(self.fd, 65536)


# Shows a question (no newline) before a line is read.
Say = Callable[[str], None]


class Asker:
    def __init__(self, reader: LineReader, say: Say, interactive: bool) -> None:
        self.reader = reader
        self.say = say
        self.interactive = interactive  # a person types the lines: follow-up questions are fine

    async def line(self, question: str) -> str:
        self.say(question)
        line = await self.reader.readline()
        if line is None:
            raise NoAnswer(question.strip().rstrip(":"))
        if not self.interactive:  # nobody typed it: show what was read
            self.say(line + "\n")
        return line

    async def answer(self, request: pb.Request) -> pb.Answer:
        """The Answer to `request`, one question at a time."""
        answer = pb.Answer(id=request.id)
        kind = request.kind
        if kind == "tool_call":
            answer.ok = True
            for call in request.calls:
                output = await self.line(f"output of {call.name} {call.id} ({call.arguments_json}): ")
                answer.outputs.add(call_id=call.id, output=output)
        elif kind == "input":
            text = await self.line("your answer: ")
            answer.ok = True
            answer.data.CopyFrom(_struct({"answer": text}))
        elif kind == "in_doubt":
            await self._in_doubt(request, answer)
        else:  # approval, authorization and kinds this CLI does not know: yes or no
            reply = await self.line("approve? [y/n, or 'n REASON']: ")
            verdict, _, reason = reply.strip().partition(" ")
            answer.ok = verdict.lower() in ("y", "yes")
            if not answer.ok and not reason.strip() and self.interactive:
                reason = await self.line("reason (optional): ")
            answer.reason = reason.strip()
        return answer

    async def _in_doubt(self, request: pb.Request, answer: pb.Answer) -> None:
        reply = await self.line("the call may have run: [u]se an output, [r]e-run it, or [f]ail it? ")
        choice, _, rest = reply.strip().partition(" ")
        choice = choice.lower()[:1]
        if choice == "u":
            answer.ok = True
            output = rest or await self.line("output: ")
            for call in request.calls:
                answer.outputs.add(call_id=call.id, output=output)
        elif choice == "r":
            answer.ok = True
        else:
            answer.ok = False
            answer.reason = rest.strip() or "failed by the operator"


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _struct(data: dict[str, str]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(data)
    return value
