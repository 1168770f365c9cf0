"""What the hunts (tests/e2e/test_race_hunt.py, test_watch_hunt.py, test_worker_hunt.py) share:
the server's ERROR records as findings, the store each runs on (SQLite and PostgreSQL), the
reason of a refusal, and the race hunt's model, which the watch hunt drives too.

The model: four agents (a `lead` that delegates through `task` to a `worker` suspending on a
relay call and an `asker` or a `quick` one), answering after small random delays; every user
message a handle gets carries a tag (the host's texts `[h:<gen>:<handle>]`, the task prompts
`[c:<nonce>]`), so each model call is booked to the handle it is for by its body alone."""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from google.rpc import error_details_pb2, status_pb2

from tests.support.build import agent, struct
from tests.support.model_server import Reply, ScriptedModelServer

HOST_TAG = re.compile(r"\[h:(\d+):([^\]]+)\]")  # in every text the host sends a handle: who it is
CHILD_TAG = re.compile(r"\[c:([0-9a-f]+)\]")  # in every task prompt: which delegation it is
OUTPUT = re.compile(r"out-[0-9a-f]{12}")


def top_of(handle_id: str) -> str:
    return "/".join(handle_id.split("/")[:2])


def figures(item: pb.HandleView | pb.TaskResult) -> tuple[int, int, int, int]:
    return (item.turns, item.own_tokens, item.total_tokens, item.tool_calls)


def relay(name: str) -> pb.ToolDef:
    tool = pb.ToolDef(name=name, description=f"the {name} tool (the host runs it)", relay=pb.RelayTool())
    tool.input_schema.update({"type": "object"})
    return tool


AGENTS = [
    agent("lead", team=["asker", "quick", "worker"]),  # delegates a worker, with an asker or a quick one beside it
    agent("worker", tools=[relay("deploy")]),  # suspends on a tool_call Request
    agent("asker"),  # suspends on an input Request (the built-in ask)
    agent("quick"),
]
TOP_AGENTS = ["lead", "lead", "worker", "asker", "quick"]


@dataclass
class Seen:
    """One model call the model server answered, and whose it was."""

    key: str  # `h:<gen>:<handle>` for a handle the host talks to, `c:<nonce>` for a delegated child
    tokens: int
    at: float


class Model:
    """The scripts of the four agents, and the books: every call by whose it is. Every user
    message a handle gets carries its tag (the host's texts and the task prompts), so a call
    is known by its body alone."""

    def __init__(self, server: ScriptedModelServer, rng: random.Random) -> None:
        self.rng = rng
        self.seen: list[Seen] = []
        self.parent: dict[str, str] = {}  # a child's key -> its parent's key
        self.outputs_seen: set[str] = set()  # every Resume output any model was shown
        for name in ("lead", "worker", "asker", "quick"):
            server.script(name, self._script(name))

    @staticmethod
    def key(body: dict[str, Any]) -> str:
        users = [str(m["content"]) for m in body["messages"] if m["role"] == "user"]
        for text in users:
            if found := HOST_TAG.search(text):
                return f"h:{found.group(1)}:{found.group(2)}"
        for text in users:
            if found := CHILD_TAG.search(text):
                return f"c:{found.group(1)}"
        raise AssertionError(f"a model call with no tag: {body['messages']}")

    def top(self, key: str) -> str:
        """The `h:` key of the top-level handle a call's handle is in."""
        while key.startswith("c:"):
            key = self.parent[key]
        gen, _, handle = key[2:].partition(":")
        return f"h:{gen}:{top_of(handle)}"

    def _script(self, name: str) -> Callable[[dict[str, Any]], Reply]:
        def script(body: dict[str, Any]) -> Reply:
            key = self.key(body)
            messages = body["messages"]
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            results = [str(m["content"]) for m in messages[last_user + 1 :] if m["role"] == "tool"]
            for message in messages:
                if message["role"] == "tool":
                    self.outputs_seen.update(OUTPUT.findall(str(message["content"])))
            tokens = self.rng.randint(1, 40)
            delay = self.rng.uniform(0.0, 0.06)
            self.seen.append(Seen(key, tokens, time.monotonic()))
            if results:
                return Reply(text=f"{name} done: {' | '.join(results)[:200]}", tokens=tokens, delay=delay)
            if name == "lead":
                calls = [("task", {"agent": "worker", "prompt": self.delegate(key) + " deploy it"})]
                if self.rng.random() < 0.6:
                    other = self.rng.choice(["asker", "quick"])
                    calls.append(("task", {"agent": other, "prompt": self.delegate(key) + " help"}))
                return Reply(calls=calls, tokens=tokens, delay=delay)
            if name == "worker":
                return Reply(calls=[("deploy", {"version": "v2"})], tokens=tokens, delay=delay)
            if name == "asker":
                return Reply(calls=[("ask", {"question": "which one?"})], tokens=tokens, delay=delay)
            return Reply(text="quick answer", tokens=tokens, delay=delay)

        return script

    def delegate(self, parent_key: str) -> str:
        nonce = f"{self.rng.getrandbits(48):012x}"
        self.parent[f"c:{nonce}"] = parent_key
        return f"[c:{nonce}]"


class ServerErrors(logging.Handler):
    """ERROR records and tracebacks the server logs: a bug of ours, whatever the callers did."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info is not None:
            self.records.append(f"{record.name}: {record.getMessage()[:300]}")


def random_answer(rng: random.Random, request: pb.Request) -> pb.Answer:
    """An answer to `request` with a random output: one per call of a tool_call Request, else
    as `data`."""
    output = f"out-{rng.getrandbits(48):012x}"
    answer = pb.Answer(id=request.id, ok=True)
    if request.kind == "tool_call":
        answer.outputs.extend(pb.ToolOutput(call_id=call.id, output=output) for call in request.calls)
    else:
        answer.data.CopyFrom(struct({"answer": output}))
    return answer


def short(request: Any) -> str:
    return " ".join(str(request).split())[:160]


def reason_of(error: grpc.aio.AioRpcError) -> str:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    reason: str = info.reason
                    return reason
    return ""


@pytest.fixture
def server_errors() -> Iterator[ServerErrors]:
    errors = ServerErrors()
    logging.getLogger().addHandler(errors)
    yield errors
    logging.getLogger().removeHandler(errors)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite writes with no await inside; PostgreSQL awaits in loads, creates and deletes,
    where calls sent at once can meet."""
    if request.param == "postgres":
        return str(request.getfixturevalue("database"))
    return f"sqlite:///{tmp_path / 'store.db'}"
