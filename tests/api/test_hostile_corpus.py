"""A generated corpus of bad requests, for every RPC (issue 9).

Hypothesis strategies draw requests that are bad by construction: a valid CreateRuntime
definition with one to three known-bad mutations, ids and texts no runtime or handle has,
texts and durations outside their bounds, answers that do not fit their Request, and raw
bytes that are not a valid request message (garbage, invalid UTF-8 in a string field,
Structs nested past protobuf's recursion limit). A table adds each kind of mistake once,
so every run has them. 634 cases run: 470 drawn (the sum of the tests' max_examples) and
164 from the table, against a real server on a real SQLite file. Each asserts four things:

1. the call fails with a canonical client code (INVALID_ARGUMENT, NOT_FOUND,
   FAILED_PRECONDITION, ALREADY_EXISTS, OUT_OF_RANGE, or RESOURCE_EXHAUSTED that is not
   about metadata), never OK, INTERNAL or UNKNOWN;
2. its message is short (at most 1000 characters);
3. nothing in the store changed (every table, read after a call that flushes the group
   commit) and the handles List shows did not change either;
4. the server logged no traceback (no record with exc_info, no "Traceback", none of
   gRPC's "Exception calling application" / "Exception deserializing request" lines, no
   ERROR record).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import re
import sqlite3
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.protobuf import duration_pb2, text_format
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.server_thread import ServerThread

Code = grpc.StatusCode
ALLOWED = {
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.FAILED_PRECONDITION,
    Code.ALREADY_EXISTS,
    Code.OUT_OF_RANGE,
    Code.RESOURCE_EXHAUSTED,
}
MAX_DETAILS = 1000
CALL_TIMEOUT = 30.0
SERVICE = "/agentruntime.v1.AgentRuntime"
METHODS = [method.name for method in pb.DESCRIPTOR.services_by_name["AgentRuntime"].methods]
GRPC_FAULTS = ("Exception calling application", "Exception deserializing request", "Exception iterating responses")

KIB = 1024
TEXT_LIMIT = 256 * KIB  # Post text, Wake prompt, Resume output/reason/data
MAX_DURATION_SECONDS = 315_576_000_000
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# Placeholders a strategy puts where the test needs an id only the running server knows.
IDLE, CLOSED, FULL, PENDING = "@idle", "@closed", "@full", "@pending"
LIVE_REQUEST, LIVE_CALL = "@live-request", "@live-call"
PLACEHOLDER_HANDLES = (IDLE, CLOSED, FULL, PENDING)
EXISTING_RUNTIMES = ("base", "control")
# The handles `base` has (checked when it is built): generated ids must be none of them.
EXISTING_HANDLE = re.compile(r"root/worker\.[1-4]")

# The documented grammar of names (fullmatch: no trailing newline slips through).
AGENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
RUNTIME_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a request id, as the proto documents it

HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
# Hypothesis reprs each drawn call; texts past the server's limits make those reprs large.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")


# ---- the server, its log and its store ------------------------------------------------------


class Records(logging.Handler):
    """Every log record of the process (the server runs in it, on its own thread)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.reported: set[int] = set()  # indexes of bad records a case already failed on

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def bad_since(self, mark: int) -> list[str]:
        found = [index for index in range(mark, len(self.records)) if _is_bad(self.records[index])]
        self.reported.update(found)
        return [_describe(self.records[index]) for index in found]

    def unreported(self) -> list[str]:
        """Bad records no case was charged with (logged between two cases, or at shutdown)."""
        return [_describe(record) for index, record in enumerate(self.records) if _is_bad(record) and index not in self.reported]


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a record whose args do not fit its format
        return str(record.msg)


def _is_bad(record: logging.LogRecord) -> bool:
    text = _message(record)
    return (
        record.exc_info is not None
        or record.exc_text is not None
        or record.stack_info is not None
        or record.levelno >= logging.ERROR
        or "Traceback" in text
        or any(fault in text for fault in GRPC_FAULTS)
    )


def _describe(record: logging.LogRecord) -> str:
    """The record's line and, for a traceback, its exception and innermost frame."""
    line = f"{record.levelname} {record.name}: {_message(record)[:500]}"
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        line += f" | {type(error).__name__}: {str(error)[:300]}{where}"
    return line


class StoreReader:
    """A read-only view of the server's SQLite file: every table, every row, sorted."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)

    def snapshot(self) -> dict[str, list[str]]:
        self.db.execute("BEGIN")
        try:
            tables = [row[0] for row in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            state = {"user_version": [repr(self.db.execute("PRAGMA user_version").fetchone())]}
            for table in tables:
                state[table] = sorted(repr(row) for row in self.db.execute(f'SELECT * FROM "{table}"'))
            return state
        finally:
            self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


@dataclass
class Corpus:
    channel: grpc.Channel
    stub: pb_grpc.AgentRuntimeStub  # on a blocking channel: the corpus calls one by one
    store: StoreReader
    log: Records
    handles: dict[str, str]  # placeholder -> real handle id
    request_id: str
    call_id: str

    def state(self) -> tuple[Any, ...]:
        # A successful RPC acknowledges: the server's group commit is flushed before it answers.
        listed = self.stub.List(pb.ListRequest(runtime_id="base"), timeout=CALL_TIMEOUT)
        views = tuple(view.SerializeToString(deterministic=True) for view in listed.handles)
        return views, self.store.snapshot()

    def refuse(self, case: Case | RawCase) -> None:
        """The four assertions, for one bad request. Everything is observed before anything
        is asserted, so that a failure says all that went wrong with the case."""
        mark = len(self.log.records)
        before = self.state()
        reply: object = None
        try:
            reply = case.invoke(self)
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
        else:
            code, details = Code.OK, ""
        after = self.state()
        logged = self.log.bad_since(mark)
        changed = [table for table in after[1] if after[1][table] != before[1].get(table)]
        if after[0] != before[0]:
            changed.append("List of base")
        seen = f"{case!r}\n-> {code.name}: {details[:600]}"
        if changed:
            seen += f"\n-> changed: {changed}"
        if logged:
            seen += "\n-> logged: " + "\n   ".join(logged)
        assert code is not Code.OK, f"accepted, reply {_short(reply, 300)}: {seen}"
        assert code in ALLOWED, seen
        assert code is not Code.RESOURCE_EXHAUSTED or "metadata" not in details.lower(), seen
        assert len(details) <= MAX_DETAILS, f"a {len(details)}-character message: {seen}"
        assert not changed, seen
        assert not logged, seen


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corpus]:
    records = Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    path = tmp_path_factory.mktemp("hostile") / "store.db"
    server = ServerThread("hostile-corpus-server", llm_style="scripted", store=f"sqlite:///{path}")
    try:
        port = server.start()
        store = StoreReader(path)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield _build_base(channel, store, records)
        store.close()
    finally:
        server.stop()
        root.removeHandler(records)
        root.setLevel(level)
    bad = records.unreported()
    assert not bad, "the server logged faults outside any case:\n" + "\n".join(bad)


def _build_base(channel: grpc.Channel, store: StoreReader, records: Records) -> Corpus:
    """Runtime `base`: an idle handle, a closed one, one with a full inbox (100 messages) and
    one suspended on a relay call; runtime `control`: the unmutated CreateRuntime template."""
    stub = pb_grpc.AgentRuntimeStub(channel)
    relay_call = pb.ScriptedToolCall(name="deploy", arguments_json='{"q": "v2"}')
    worker = pb.AgentDef(
        name="worker",
        description="the worker",
        instructions="deploy when asked",
        tools=[
            pb.ToolDef(name="lookup", description="looks up", http=pb.HttpTool(url="http://127.0.0.1:9/lookup")),
            pb.ToolDef(name="deploy", description="deploys", relay=pb.RelayTool()),
        ],
        team=["helper"],
        script=pb.Script(replies=[pb.ScriptedReply(tool_calls=[relay_call], tokens=7), pb.ScriptedReply(text="done", tokens=3)]),
    )
    worker.tools[1].input_schema.update({"type": "object", "properties": {"q": {"type": "string"}}})
    helper = pb.AgentDef(name="helper", script=pb.Script(replies=[pb.ScriptedReply(text="ok", tokens=1)]))
    stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="base", agents=[worker, helper]))

    def spawn() -> str:
        return str(stub.Spawn(pb.SpawnRequest(runtime_id="base", parent_id="root", agent="worker")).handle_id)

    idle, closed, full, pending = spawn(), spawn(), spawn(), spawn()
    assert all(EXISTING_HANDLE.fullmatch(handle) for handle in (idle, closed, full, pending))
    stub.Close(pb.CloseRequest(runtime_id="base", handle_id=closed))
    for n in range(100):
        stub.Post(pb.PostRequest(runtime_id="base", handle_id=full, text=f"message {n}"))
    stub.Wake(pb.WakeRequest(runtime_id="base", handle_id=pending, prompt="ship v2"))
    result = stub.Wait(pb.WaitRequest(runtime_id="base", handle_id=pending), timeout=CALL_TIMEOUT).result
    assert result.status == pb.STATUS_PENDING and result.pending.kind == "tool_call", result
    # The template every CreateRuntime case mutates is valid: each mutation is what makes it bad.
    control = template()
    control.runtime_id = "control"
    stub.CreateRuntime(control)
    corpus = Corpus(
        channel=channel,
        stub=stub,
        store=store,
        log=records,
        handles={IDLE: idle, CLOSED: closed, FULL: full, PENDING: pending},
        request_id=result.pending.id,
        call_id=result.pending.calls[0].id,
    )
    views = {view.handle_id: view for view in stub.List(pb.ListRequest(runtime_id="base")).handles}
    assert views[full].inbox_size == 100 and views[closed].state == pb.HANDLE_STATE_CLOSED
    assert views[pending].state == pb.HANDLE_STATE_SUSPENDED and views[idle].state == pb.HANDLE_STATE_IDLE
    return corpus


# ---- cases ----------------------------------------------------------------------------------


def _short(message: object, limit: int = 1500) -> str:
    try:
        if isinstance(message, ProtoMessage):
            text = text_format.MessageToString(message, as_utf8=True, as_one_line=True)
        else:
            text = repr(message)
    except Exception as error:  # a message too deep to print
        text = f"<{type(message).__name__}: not printable ({error})>"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


@dataclass(frozen=True)
class Case:
    """One RPC with a request message; placeholders are resolved against the running server."""

    method: str
    request: ProtoMessage
    what: str = ""

    def __repr__(self) -> str:
        label = f"{self.what}: " if self.what else ""
        return f"{label}{self.method}({_short(self.request)})"

    def resolved(self, corpus: Corpus) -> ProtoMessage:
        request = type(self.request)()
        request.CopyFrom(self.request)
        for name in ("handle_id", "parent_id"):
            if name in request.DESCRIPTOR.fields_by_name and getattr(request, name) in corpus.handles:
                setattr(request, name, corpus.handles[getattr(request, name)])
        if isinstance(request, pb.ResumeRequest):
            if request.answer.id == LIVE_REQUEST:
                request.answer.id = corpus.request_id
            for output in request.answer.outputs:
                if output.call_id == LIVE_CALL:
                    output.call_id = corpus.call_id
        return request

    def invoke(self, corpus: Corpus) -> object:
        request = self.resolved(corpus)
        if self.method == "Watch":
            assert isinstance(request, pb.WatchRequest)
            return _first(corpus.stub.Watch(request, timeout=CALL_TIMEOUT))
        return getattr(corpus.stub, self.method)(request, timeout=CALL_TIMEOUT)


@dataclass(frozen=True)
class RawCase:
    """Bytes sent as the request of a method: not a valid message of its type."""

    method: str
    what: str
    build: Callable[[Corpus], bytes] = field(repr=False, compare=False)

    def __repr__(self) -> str:
        return f"{self.method}(raw bytes: {self.what})"

    def invoke(self, corpus: Corpus) -> object:
        data = self.build(corpus)
        path = f"{SERVICE}/{self.method}"
        # No serializers: the bytes go as they are, and come back as bytes.
        if self.method == "Watch":
            stream: grpc.UnaryStreamMultiCallable[bytes, bytes] = corpus.channel.unary_stream(path)
            return _first(stream(data, timeout=CALL_TIMEOUT))
        unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = corpus.channel.unary_unary(path)
        return unary(data, timeout=CALL_TIMEOUT)


def _first(stream: Any) -> object:
    """Watch's first response (or its error); the stream is cancelled either way."""
    try:
        return next(stream)
    except StopIteration:
        return "the stream ended without an error"
    finally:
        stream.cancel()


# ---- primitive strategies -------------------------------------------------------------------


def _repeat(text: str, count: int) -> str:
    return text * count


def oversized(limit: int) -> st.SearchStrategy[str]:
    """Texts of more than `limit` UTF-8 bytes (one repeated character, cheap to draw)."""

    def build(char: str, extra: int) -> str:
        width = len(char.encode())
        return char * (limit // width + 1 + extra)

    return st.builds(build, st.characters(codec="utf-8"), st.integers(0, 4 * KIB))


def _not_runtime(value: str) -> bool:
    return value not in EXISTING_RUNTIMES


def _not_handle(value: str) -> bool:
    return not EXISTING_HANDLE.fullmatch(value) and value not in PLACEHOLDER_HANDLES


LONG_IDS = st.builds(_repeat, st.characters(codec="utf-8"), st.integers(65, 10_000))
ODD_IDS = st.sampled_from(
    [
        "",
        " ",
        "base ",
        " base",
        "BASE",
        "base\n",
        "base\x00",
        "../base",
        "base/../base",
        "名前",
        "🙂" * 100,
        "x" * 10_000,
        "%2e%2e",
    ]
)
# Runtime ids no runtime has: empty, unicode, very long, slug-like.
UNKNOWN_RUNTIMES = st.one_of(
    ODD_IDS,
    st.text(max_size=80),
    st.from_regex(RUNTIME_ID, fullmatch=True),
    LONG_IDS,
).filter(_not_runtime)
HANDLE_LIKE = st.builds(
    lambda agent, n, tail: f"root/{agent}.{n}{tail}",
    st.sampled_from(["worker", "helper", "ghost", "Worker"]),
    st.integers(0, 2**40),
    st.sampled_from(["", "/helper.1", "/", "\n", ".0"]),
)
# Handle ids no handle of `base` has.
UNKNOWN_HANDLES = st.one_of(
    ODD_IDS,
    st.sampled_from(["root", "root/", "root/worker", "root/worker.0", "root/worker.5"]),
    HANDLE_LIKE,
    st.text(max_size=80),
    LONG_IDS,
).filter(_not_handle)
ANY_HANDLE = st.one_of(st.sampled_from(PLACEHOLDER_HANDLES), UNKNOWN_HANDLES)
ANY_RUNTIME = st.one_of(st.sampled_from(EXISTING_RUNTIMES), UNKNOWN_RUNTIMES)
SMALL_TEXT = st.text(max_size=300)
SOME_TEXT = st.text(min_size=1, max_size=300)


def duration(seconds: int, nanos: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


NANOS = st.integers(-999_999_999, 999_999_999)
# Durations outside google.protobuf.Duration's range or sign rule: bad wherever they appear.
INVALID_DURATIONS = st.one_of(
    st.builds(
        duration, st.integers(MAX_DURATION_SECONDS + 1, INT64_MAX) | st.integers(INT64_MIN, -MAX_DURATION_SECONDS - 1), NANOS
    ),
    st.builds(duration, st.integers(-(10**6), 10**6), st.integers(10**9, 2**31 - 1) | st.integers(-(2**31), -(10**9))),
    st.builds(duration, st.integers(1, 10**9), st.integers(-999_999_999, -1)),
    st.builds(duration, st.integers(-(10**9), -1), st.integers(1, 999_999_999)),
    st.sampled_from([duration(2**62, 0), duration(0, 2 * 10**9), duration(5, -1)]),
)
NEGATIVE_DURATIONS = st.builds(duration, st.integers(-(10**9), -1), st.integers(-999_999_999, 0)) | st.builds(
    duration, st.just(0), st.integers(-999_999_999, -1)
)
ZERO_OR_NEGATIVE = NEGATIVE_DURATIONS | st.just(duration(0, 0))


def longer_than(seconds: int) -> st.SearchStrategy[duration_pb2.Duration]:
    return st.builds(duration, st.just(seconds), st.integers(1, 999_999_999)) | st.builds(
        duration, st.integers(seconds + 1, MAX_DURATION_SECONDS), st.integers(0, 999_999_999)
    )


BAD_WAIT_TIMEOUTS = INVALID_DURATIONS | NEGATIVE_DURATIONS | longer_than(86_400)
GOOD_WAIT_TIMEOUTS = st.none() | st.builds(duration, st.integers(0, 86_399), st.integers(0, 999_999_999))
BAD_TOOL_TIMEOUTS = INVALID_DURATIONS | ZERO_OR_NEGATIVE | longer_than(600)
BAD_WALL_TIMES = INVALID_DURATIONS | ZERO_OR_NEGATIVE | longer_than(30 * 86_400)
BAD_DELAYS = INVALID_DURATIONS | NEGATIVE_DURATIONS | longer_than(600)

JSON_SCALARS = st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
JSON_OBJECTS = st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=5)
NOT_JSON_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf])


def _with_number(data: dict[str, Any], key: str, number: float) -> dict[str, Any]:
    return {**data, key: [1, {"deep": number}]}


# Objects a Struct can carry but JSON cannot (NaN, ±Infinity), for JSON-only fields.
NON_JSON_OBJECTS = st.builds(_with_number, JSON_OBJECTS, st.text(max_size=10), NOT_JSON_NUMBERS)


# ---- CreateRuntime: a valid template and known-bad mutations ---------------------------------

HTTP_URL = "http://127.0.0.1:9/lookup"


def template() -> pb.CreateRuntimeRequest:
    """A valid request exercising every part of an AgentDef (`control` is created from it)."""
    lookup = pb.ToolDef(
        name="lookup",
        description="looks things up",
        http=pb.HttpTool(url=HTTP_URL, headers={"X-Api-Key": "secret-value"}, timeout=duration(5, 0)),
        on_interrupted=pb.ON_INTERRUPTED_RETRY,
    )
    lookup.input_schema.update(
        {
            "type": "object",
            "properties": {"q": {"type": "string", "pattern": "^[a-z]+$"}, "n": {"$ref": "#/$defs/count"}},
            "$defs": {"count": {"type": "integer", "minimum": 0}},
        }
    )
    deploy = pb.ToolDef(name="deploy", description="deploys", relay=pb.RelayTool(), approval=pb.ApprovalPolicy(required=True))
    main = pb.AgentDef(
        name="main",
        description="the main agent",
        instructions="do the work",
        model="m-1",
        tools=[lookup, deploy],
        team=["helper"],
        budget=pb.Budget(max_turns=5, max_tokens=1000, max_wall_time=duration(60, 0), max_concurrent=2),
        completion=pb.CompletionGate(max_attempts=2, must_match="done"),
        guardrails=[pb.Guardrail(tool="deploy", action=pb.GUARDRAIL_ACTION_REQUIRE_APPROVAL, reason="careful")],
        script=pb.Script(
            replies=[
                pb.ScriptedReply(
                    tool_calls=[pb.ScriptedToolCall(name="lookup", arguments_json='{"q": "x"}')],
                    tokens=5,
                    delay=duration(0, 1000),
                ),
                pb.ScriptedReply(text="done", tokens=5),
            ]
        ),
    )
    helper = pb.AgentDef(name="helper", description="helps", script=pb.Script(replies=[pb.ScriptedReply(text="ok", tokens=1)]))
    # No runtime id: a request the server wrongly accepts is accepted again when Hypothesis
    # replays it (a fixed id would make the replay ALREADY_EXISTS).
    return pb.CreateRuntimeRequest(agents=[main, helper])


Apply = Callable[[pb.CreateRuntimeRequest], object]  # changes the request in place; what it returns is dropped


@dataclass(frozen=True)
class Mutation:
    what: str
    apply: Apply = field(repr=False, compare=False)

    def __repr__(self) -> str:
        return self.what


def _show(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


def _main(request: pb.CreateRuntimeRequest) -> pb.AgentDef:
    return request.agents[0]


def _lookup(request: pb.CreateRuntimeRequest) -> pb.ToolDef:
    return request.agents[0].tools[0]


def _reply(request: pb.CreateRuntimeRequest) -> pb.ScriptedReply:
    return request.agents[0].script.replies[0]


def rename_agent(index: int, name: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        request.agents[index].name = name

    return Mutation(f"agents[{index}].name = {_show(name)}", apply)


def rename_tool(index: int, name: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        _main(request).tools[index].name = name

    return Mutation(f"tools[{index}].name = {_show(name)}", apply)


def add_team_mate(name: str) -> Mutation:
    return Mutation(f"team += {_show(name)}", lambda request: _main(request).team.append(name))


def set_schema(what: str, schema: dict[str, Any]) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        tool = _lookup(request)
        tool.ClearField("input_schema")
        tool.input_schema.update(schema)

    return Mutation(f"input_schema: {what}", apply)


def nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def with_pattern(pattern: str, where: str) -> dict[str, Any]:
    if where == "pattern":
        return {"type": "object", "properties": {"q": {"type": "string", "pattern": pattern}}}
    return {"type": "object", "patternProperties": {pattern: {"type": "string"}}}


BAD_REFS = [
    "file:///etc/passwd",
    "http://127.0.0.1:9/x",
    "https://json-schema.org/draft/2020-12/schema",
    "#/nope",
    "#/$defs/missing",
    "#nope",
    "other.json#/a",
    "//evil.example/x",
    "urn:uuid:1",
]
BAD_PATTERNS = ["(a)\\1", "(?=a)b", "(?<=a)b", "(?!a)", "a++", "(", "[z-a]", "a{1001}", "\\", "x" * 1025, "(a|b)" * 410]
SCHEMA_MUTATIONS = st.one_of(
    st.builds(
        lambda ref: set_schema(f"$ref {ref}", {"type": "object", "properties": {"a": {"$ref": ref}}}), st.sampled_from(BAD_REFS)
    ),
    st.builds(lambda ref: set_schema(f"top $ref {ref}", {"type": "object", "$ref": ref}), st.sampled_from(BAD_REFS)),
    st.builds(
        lambda keyword, ref: set_schema(f"{keyword} {ref}", {"type": "object", "properties": {"a": {keyword: ref}}}),
        st.sampled_from(["$dynamicRef", "$recursiveRef"]),
        st.sampled_from(["http://127.0.0.1:9/x", "file:///etc/passwd"]),
    ),
    st.sampled_from(
        [
            set_schema("$ref #", {"$ref": "#"}),
            set_schema("object with $ref #", {"type": "object", "$ref": "#"}),
            set_schema(
                "$ref cycle",
                {"type": "object", "$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
            ),
            set_schema("$id", {"type": "object", "$id": "http://127.0.0.1:9/schema"}),
            set_schema("unknown $schema", {"$schema": "http://127.0.0.1:9/meta", "type": "object"}),
            set_schema("no type", {"properties": {"a": {"type": "string"}}}),
            set_schema("type array", {"type": "array"}),
            set_schema("type string", {"type": "string"}),
            set_schema("type 12", {"type": 12}),
            set_schema("type list", {"type": ["object", "null"]}),
            set_schema("invalid keyword value", {"type": "object", "minProperties": -1}),
            set_schema("required not a list", {"type": "object", "required": "a"}),
            set_schema("properties a list", {"type": "object", "properties": []}),
            set_schema(
                "unevaluated with patternProperties",
                {"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False},
            ),
            set_schema("over 64 KiB", {"type": "object", "description": "x" * (70 * KIB)}),
            set_schema("40 levels", nested_schema(40)),
        ]
    ),
    st.builds(lambda depth: set_schema(f"{depth} levels", nested_schema(depth)), st.integers(17, 60)),
    st.builds(
        lambda pattern, where: set_schema(f"{where} {_show(pattern)}", with_pattern(pattern, where)),
        st.sampled_from(BAD_PATTERNS),
        st.sampled_from(["pattern", "patternProperties"]),
    ),
    st.builds(
        lambda key, number: set_schema(f"{key} = {number}", {"type": "object", key: number}),
        st.sampled_from(["maximum", "minimum", "multipleOf", "default"]),
        NOT_JSON_NUMBERS,
    ),
    st.builds(
        lambda number: set_schema(f"nested number {number}", {"type": "object", "properties": {"a": {"const": [number]}}}),
        NOT_JSON_NUMBERS,
    ),
)

BAD_AGENT_NAMES = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "has space",
            "a" * 65,
            "1abc",
            "_x",
            "-x",
            "a.b",
            "a/b",
            "ünï",
            "名前",
            "a\n",
            "helper\n",
            "main\t",
            "a\x00",
            "🙂",
        ]
    ),
    st.text(max_size=70).filter(lambda name: not AGENT_NAME.fullmatch(name)),
)
BAD_TOOL_NAMES = st.one_of(
    st.sampled_from(["", "two words", "a" * 65, "1tool", "tool.name", "tool/name", "outil-é", "lookup\n", "t\x00"]),
    st.text(max_size=70).filter(lambda name: not AGENT_NAME.fullmatch(name)),
)
UNKNOWN_AGENT_NAMES = st.text(max_size=70).filter(lambda name: name not in ("main", "helper"))
BAD_URLS = st.one_of(
    st.sampled_from(
        [
            "",
            "not a url",
            "ftp://host/x",
            "file:///etc/passwd",
            "http://",
            "http:///path",
            "http://exa mple.com/",
            "http://host\n/",
            "https://host:99999/",
            "http://host:-1/",
            "javascript:alert(1)",
            "//host/x",
            "http://[::1/x",
            "http://127.0.0.1:9/" + "x" * 3000,
        ]
    ),
    st.text(max_size=60).filter(lambda url: not url.lower().startswith("http")),
    st.builds(lambda n: "https://host.example/" + "a" * n, st.integers(2048, 5000)),
)
BAD_HEADER_NAMES = st.one_of(
    st.sampled_from(["", "X Y", "X:Y", "X\nY", "X-Key\n", "ü", "a" * 129, "(x)", "x\x00", " X"]),
    st.sampled_from(
        ["Idempotency-Key", "idempotency-key", "HOST", "Content-Length", "Transfer-Encoding", "Connection", "Content-Type"]
    ),
)
BAD_HEADER_VALUES = st.one_of(
    st.sampled_from(["a\r\nInjected: 1", "a\nb", "a\rb", "nul\x00byte"]),
    st.builds(lambda n: "v" * n, st.integers(8 * KIB + 1, 9 * KIB)),
)
BUDGET_COUNTS = ["max_turns", "max_tokens", "max_tool_calls", "max_children", "max_depth"]
BAD_ARGUMENTS = st.one_of(
    st.sampled_from(["{", "nope", "[1]", "1", '"s"', "null", "true", "{'a': 1}", "NaN", '{"a": 1} trailing', "[" * 50_000]),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(1000, 60_000)),
    st.integers(1, 100).map(lambda extra: '{"a": "' + "x" * (TEXT_LIMIT + extra) + '"}'),
    st.text(min_size=1, max_size=40).filter(lambda text: not _is_json_object(text)),
)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def _set_header(name: str, value: str) -> Mutation:
    return Mutation(
        f"headers[{_show(name, 30)}] = {_show(value, 30)}", lambda request: _lookup(request).http.headers.__setitem__(name, value)
    )


def _many_headers(count: int) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        for n in range(count):
            _lookup(request).http.headers[f"X-H{n}"] = "v"

    return Mutation(f"{count} headers", apply)


def _set_timeout(value: duration_pb2.Duration) -> Mutation:
    return Mutation(f"http.timeout = {_show(value)}", lambda request: _lookup(request).http.timeout.CopyFrom(value))


def _set_url(url: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        _lookup(request).http.url = url

    return Mutation(f"http.url = {_show(url)}", apply)


def _budget_count(name: str, value: int) -> Mutation:
    return Mutation(f"budget.{name} = {value}", lambda request: setattr(_main(request).budget, name, value))


def _wall_time(value: duration_pb2.Duration) -> Mutation:
    return Mutation(f"budget.max_wall_time = {_show(value)}", lambda request: _main(request).budget.max_wall_time.CopyFrom(value))


def _tokens(value: int) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        _reply(request).tokens = value

    return Mutation(f"script tokens = {value}", apply)


def _delay(value: duration_pb2.Duration) -> Mutation:
    return Mutation(f"script delay = {_show(value)}", lambda request: _reply(request).delay.CopyFrom(value))


def _arguments(text: str) -> Mutation:
    return Mutation(
        f"script arguments = {_show(text)}",
        lambda request: _reply(request).tool_calls.add(name="lookup", arguments_json=text),
    )


def _call_unknown_tool(name: str) -> Mutation:
    return Mutation(f"script calls {_show(name)}", lambda request: _reply(request).tool_calls.add(name=name, arguments_json="{}"))


def _guardrail(tool: str, action: int) -> Mutation:
    return Mutation(
        f"guardrail {_show(tool)} action {action}", lambda request: _main(request).guardrails.add(tool=tool, action=action)
    )


def _on_interrupted(value: int) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        _lookup(request).on_interrupted = pb.OnInterrupted.ValueType(value)

    return Mutation(f"on_interrupted = {value}", apply)


def _must_match(pattern: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        _main(request).completion.must_match = pattern

    return Mutation(f"must_match = {_show(pattern)}", apply)


def _judge(name: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        _main(request).completion.judge_agent = name

    return Mutation(f"judge_agent = {_show(name)}", apply)


def _max_attempts(value: int) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        _main(request).completion.max_attempts = value

    return Mutation(f"max_attempts = {value}", apply)


def _runtime_id(value: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        request.runtime_id = value

    return Mutation(f"runtime_id = {_show(value)}", apply)


def _request_id(value: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        request.request_id = value

    return Mutation(f"request_id = {_show(value)}", apply)


def _provider(name: str) -> Mutation:
    # An agent with a script is not checked against the providers: this one has none.
    return Mutation(
        f"unscripted agent with provider {_show(name)}", lambda request: request.agents.add(name="remote", provider=name)
    )


def _structural(what: str) -> Mutation:
    def apply(request: pb.CreateRuntimeRequest) -> None:
        main, helper = request.agents[0], request.agents[1]
        if what == "duplicate agent":
            request.agents.add().CopyFrom(helper)
        elif what == "team: [self]":
            main.team.append(main.name)
        elif what == "two-agent cycle":
            helper.team.append(main.name)
        elif what == "judge cycle":
            helper.completion.judge_agent = main.name
        elif what == "self judge":
            main.completion.judge_agent = main.name
        elif what == "team names a mate twice":
            main.team.append(main.team[0] if main.team else "helper")
            main.team.append(main.team[0])
        elif what == "tool without executor":
            main.tools.add(name="noexec", description="nobody runs it")
        elif what == "duplicate tool":
            main.tools.add().CopyFrom(main.tools[1])
        elif what == "guardrail without action":
            main.guardrails.add(tool="lookup")
        elif what == "more than 100 agents":
            for n in range(100):
                request.agents.add(name=f"extra{n}")
        elif what == "129 tools":
            for n in range(129):
                main.tools.add(name=f"relay{n}", relay=pb.RelayTool())
        elif what == "101 team mates":
            main.team.extend(f"mate{n}" for n in range(101))
        elif what == "129 guardrails":
            for _ in range(129):
                main.guardrails.add(tool="deploy", action=pb.GUARDRAIL_ACTION_DENY)
        elif what == "1001 replies":
            for _ in range(1001):
                main.script.replies.add(text="x")
        elif what == "description over 16 KiB":
            main.description = "d" * (16 * KIB + 1)
        elif what == "instructions over 256 KiB":
            main.instructions = "i" * (256 * KIB + 1)
        elif what == "model over 256 characters":
            main.model = "m" * 257
        elif what == "model with a newline":
            main.model = "gpt\n4"
        elif what == "tool description over 16 KiB":
            main.tools[0].description = "d" * (16 * KIB + 1)
        elif what == "approval prompt over 16 KiB":
            main.tools[1].approval.prompt = "p" * (16 * KIB + 1)
        elif what == "guardrail reason over 16 KiB":
            main.guardrails[0].reason = "r" * (16 * KIB + 1)
        elif what == "reply text over 256 KiB":
            main.script.replies[1].text = "t" * (256 * KIB + 1)
        elif what == "extra tool named 'extra\\n'":
            main.tools.add(name="extra\n", relay=pb.RelayTool())
        elif what == "extra agent named 'extra\\n'":
            request.agents.add(name="extra\n")
        else:
            raise AssertionError(what)

    return Mutation(what, apply)


STRUCTURAL = [
    "duplicate agent",
    "team: [self]",
    "two-agent cycle",
    "judge cycle",
    "self judge",
    "team names a mate twice",
    "tool without executor",
    "duplicate tool",
    "guardrail without action",
    "more than 100 agents",
    "129 tools",
    "101 team mates",
    "129 guardrails",
    "1001 replies",
    "description over 16 KiB",
    "instructions over 256 KiB",
    "model over 256 characters",
    "model with a newline",
    "tool description over 16 KiB",
    "approval prompt over 16 KiB",
    "guardrail reason over 16 KiB",
    "reply text over 256 KiB",
    "extra tool named 'extra\\n'",
    "extra agent named 'extra\\n'",
]

MUTATIONS = st.one_of(
    st.builds(rename_agent, st.sampled_from([0, 1]), BAD_AGENT_NAMES),
    st.builds(rename_tool, st.sampled_from([0, 1]), BAD_TOOL_NAMES | st.sampled_from(["task", "ask"])),
    st.builds(add_team_mate, UNKNOWN_AGENT_NAMES),
    st.builds(_structural, st.sampled_from(STRUCTURAL)),
    SCHEMA_MUTATIONS,
    st.builds(_set_url, BAD_URLS),
    st.builds(_set_timeout, BAD_TOOL_TIMEOUTS),
    st.builds(
        _set_header, BAD_HEADER_NAMES, st.just("v") | st.text(max_size=20).filter(lambda v: not re.search("[\r\n\x00]", v))
    ),
    st.builds(_set_header, st.sampled_from(["X-Ok", "Authorization"]), BAD_HEADER_VALUES),
    st.builds(_many_headers, st.integers(33, 40)),
    st.builds(_budget_count, st.sampled_from(BUDGET_COUNTS), st.integers(INT64_MIN, -1)),
    st.builds(_budget_count, st.just("max_concurrent"), st.integers(INT64_MIN, 0)),
    st.builds(_wall_time, BAD_WALL_TIMES),
    st.builds(_tokens, st.integers(INT64_MIN, -1) | st.integers(100_000_001, INT64_MAX) | st.sampled_from([-1, 2**62])),
    st.builds(_delay, BAD_DELAYS),
    st.builds(_arguments, BAD_ARGUMENTS),
    st.builds(_call_unknown_tool, st.text(max_size=30).filter(lambda name: name not in ("lookup", "deploy", "task", "ask"))),
    st.builds(_guardrail, st.just("deploy"), st.sampled_from([3, 4, 999, -1, 2**31 - 1, -(2**31)])),
    st.builds(_guardrail, st.text(max_size=30).filter(lambda name: name not in ("lookup", "deploy", "task", "ask")), st.just(1)),
    st.builds(_on_interrupted, st.sampled_from([3, 999, -5, -1, 2**31 - 1])),
    st.builds(_must_match, st.sampled_from(BAD_PATTERNS) | st.builds(lambda n: "a" * n, st.integers(1025, 3000))),
    st.builds(_judge, UNKNOWN_AGENT_NAMES.filter(bool)),
    st.builds(_max_attempts, st.integers(-(2**31), -1)),
    st.builds(_provider, st.text(min_size=1, max_size=40).filter(lambda name: name != "scripted")),
    st.builds(
        _request_id,
        st.sampled_from(["has space", "a" * 65, "x" * 10_000, "名前", "id\n", "a.b", "a/b"])
        | st.text(min_size=1, max_size=80).filter(lambda value: not REQUEST_ID.fullmatch(value)),
    ),
    st.builds(
        _runtime_id,
        st.one_of(
            st.sampled_from(["has space", "../etc", "a" * 65, "x" * 10_000, "名前", "fresh\n", "-x", ".x", "a/b"]),
            st.text(min_size=1, max_size=80).filter(lambda value: not RUNTIME_ID.fullmatch(value)),
            LONG_IDS,
        ),
    ),
)


def _mutated(mutations: list[Mutation]) -> Case:
    request = template()
    for mutation in mutations:
        mutation.apply(request)
    return Case("CreateRuntime", request, " + ".join(map(repr, mutations)))


CREATE_CASES = st.one_of(
    st.builds(_mutated, st.lists(MUTATIONS, min_size=1, max_size=3)),
    st.just(Case("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="fresh"), "no agents")),
    st.just(Case("CreateRuntime", pb.CreateRuntimeRequest(), "no agents, no id")),
    st.sampled_from(EXISTING_RUNTIMES).map(lambda rid: _mutated([_runtime_id(rid)])),
)


# ---- the other RPCs -------------------------------------------------------------------------


def _bad_budget(name: str, value: int | duration_pb2.Duration) -> pb.Budget:
    budget = pb.Budget(max_turns=3)
    if isinstance(value, duration_pb2.Duration):
        budget.max_wall_time.CopyFrom(value)
    else:
        setattr(budget, name, value)
    return budget


BAD_BUDGETS = st.one_of(
    st.builds(_bad_budget, st.sampled_from(BUDGET_COUNTS), st.integers(INT64_MIN, -1)),
    st.builds(_bad_budget, st.just("max_concurrent"), st.integers(INT64_MIN, 0)),
    st.builds(_bad_budget, st.just("max_wall_time"), BAD_WALL_TIMES),
)


def spawn(runtime_id: str, parent_id: str, agent: str, budget: pb.Budget | None = None) -> Case:
    return Case("Spawn", pb.SpawnRequest(runtime_id=runtime_id, parent_id=parent_id, agent=agent, budget=budget))


SPAWN_CASES = st.one_of(
    st.builds(spawn, UNKNOWN_RUNTIMES, st.sampled_from(["", "root"]), st.sampled_from(["worker", "helper"])),
    st.builds(spawn, st.just("base"), st.sampled_from(["", "root", IDLE]), UNKNOWN_AGENT_NAMES.filter(lambda n: n != "worker")),
    st.builds(spawn, st.just("base"), UNKNOWN_HANDLES.filter(lambda h: h not in ("", "root")), st.just("worker")),
    st.builds(spawn, st.just("base"), st.just(CLOSED), st.sampled_from(["worker", "helper"])),
    st.builds(spawn, st.just("base"), st.sampled_from(["root", IDLE, FULL]), st.just("worker"), BAD_BUDGETS),
)


def post(runtime_id: str, handle_id: str, text: str, channel: str = "", sender: str = "") -> Case:
    return Case("Post", pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text=text, channel=channel, sender=sender))


LIVE_HANDLES = st.sampled_from([IDLE, FULL, PENDING])
POST_CASES = st.one_of(
    st.builds(post, UNKNOWN_RUNTIMES, ANY_HANDLE, SMALL_TEXT),
    st.builds(post, st.just("base"), UNKNOWN_HANDLES, SMALL_TEXT),
    st.builds(post, st.just("base"), st.just(CLOSED), SMALL_TEXT | oversized(TEXT_LIMIT)),
    st.builds(post, st.just("base"), LIVE_HANDLES, st.just(""), SMALL_TEXT, SMALL_TEXT),
    st.builds(post, st.just("base"), LIVE_HANDLES, oversized(TEXT_LIMIT)),
    st.builds(post, st.just("base"), st.just(FULL), SOME_TEXT, st.text(max_size=20), st.text(max_size=20)),
    st.builds(post, st.just("base"), st.sampled_from([IDLE, PENDING]), SOME_TEXT, oversized(256)),
    st.builds(post, st.just("base"), st.sampled_from([IDLE, PENDING]), SOME_TEXT, st.just(""), oversized(256)),
)


def wake(runtime_id: str, handle_id: str, prompt: str) -> Case:
    return Case("Wake", pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=prompt))


WAKE_CASES = st.one_of(
    st.builds(wake, UNKNOWN_RUNTIMES, ANY_HANDLE, SMALL_TEXT),
    st.builds(wake, st.just("base"), UNKNOWN_HANDLES, SMALL_TEXT),
    st.builds(wake, st.just("base"), st.sampled_from([CLOSED, PENDING]), SMALL_TEXT),
    st.builds(wake, st.just("base"), st.just(IDLE), st.just("")),
    st.builds(wake, ANY_RUNTIME, ANY_HANDLE, oversized(TEXT_LIMIT)),
)


def wait(runtime_id: str, handle_id: str, timeout: duration_pb2.Duration | None) -> Case:
    return Case("Wait", pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id, timeout=timeout))


WAIT_CASES = st.one_of(
    st.builds(wait, ANY_RUNTIME, ANY_HANDLE, BAD_WAIT_TIMEOUTS),
    st.builds(wait, UNKNOWN_RUNTIMES, ANY_HANDLE, GOOD_WAIT_TIMEOUTS),
    st.builds(wait, st.just("base"), UNKNOWN_HANDLES, GOOD_WAIT_TIMEOUTS),
    st.builds(wait, st.just("base"), st.sampled_from([IDLE, FULL]), GOOD_WAIT_TIMEOUTS),
)


def answer(
    answer_id: str,
    ok: bool,
    outputs: list[tuple[str, str]],
    data: dict[str, Any] | None = None,
    reason: str = "",
) -> pb.Answer:
    message = pb.Answer(id=answer_id, ok=ok, reason=reason, outputs=[pb.ToolOutput(call_id=c, output=o) for c, o in outputs])
    if data is not None:
        message.data.update(data)
    return message


def resume(runtime_id: str, message: pb.Answer) -> Case:
    return Case("Resume", pb.ResumeRequest(runtime_id=runtime_id, answer=message))


OUTPUT = st.tuples(st.sampled_from([LIVE_CALL, "call_9_9", ""]) | st.text(max_size=20), st.text(max_size=50))
DATA = st.none() | JSON_OBJECTS | NON_JSON_OBJECTS
UNKNOWN_REQUEST_IDS = st.one_of(
    st.sampled_from(["req-x", "root/worker.4/call_1_1:approval", "root/worker.4/call_9_9:tool_call", "x" * 600]),
    st.text(min_size=1, max_size=80),
    LONG_IDS,
).filter(lambda rid: rid != LIVE_REQUEST)
BAD_CALL_IDS = (st.text(max_size=30) | st.sampled_from(["call_1_2", "call_2_1", "scripted_1"])).filter(lambda c: c != LIVE_CALL)
RESUME_CASES = st.one_of(
    # No such runtime, or no answer id, or no live request of that id.
    st.builds(
        resume,
        UNKNOWN_RUNTIMES,
        st.builds(answer, st.just(LIVE_REQUEST) | UNKNOWN_REQUEST_IDS, st.booleans(), st.lists(OUTPUT, max_size=2), DATA),
    ),
    st.builds(resume, st.just("base"), st.builds(answer, st.just(""), st.booleans(), st.lists(OUTPUT, max_size=2), DATA)),
    st.builds(resume, st.just("base"), st.builds(answer, UNKNOWN_REQUEST_IDS, st.booleans(), st.lists(OUTPUT, max_size=2), DATA)),
    # The live relay request, answered wrongly.
    st.builds(
        resume,
        st.just("base"),
        st.builds(answer, st.just(LIVE_REQUEST), st.just(False), st.lists(OUTPUT, min_size=1, max_size=3), DATA),
    ),
    st.builds(
        resume,
        st.just("base"),
        st.builds(
            answer,
            st.just(LIVE_REQUEST),
            st.booleans(),
            st.tuples(BAD_CALL_IDS, st.text(max_size=20)).map(lambda o: [(LIVE_CALL, "ok"), o]),
            DATA,
        ),
    ),
    st.builds(
        resume,
        st.just("base"),
        st.builds(answer, st.just(LIVE_REQUEST), st.booleans(), st.just([(LIVE_CALL, "a"), (LIVE_CALL, "b")]), DATA),
    ),
    st.builds(
        resume,
        st.just("base"),
        st.builds(answer, st.just(LIVE_REQUEST), st.just(True), oversized(TEXT_LIMIT).map(lambda o: [(LIVE_CALL, o)])),
    ),
    st.builds(
        resume,
        st.just("base"),
        st.builds(answer, st.just(LIVE_REQUEST), st.booleans(), st.just([]), st.none(), oversized(TEXT_LIMIT)),
    ),
    st.builds(
        resume,
        st.just("base"),
        st.builds(answer, st.just(LIVE_REQUEST), st.booleans(), st.just([]), oversized(TEXT_LIMIT).map(lambda big: {"big": big})),
    ),
)


def handle_call(method: str) -> Callable[[str, str], Case]:
    request_type = getattr(pb, f"{method}Request")
    return lambda runtime_id, handle_id: Case(method, request_type(runtime_id=runtime_id, handle_id=handle_id))


def handle_cases(method: str) -> st.SearchStrategy[Case]:
    """No such runtime, no such handle, or no handle id: for Interrupt, Close, Inspect, GetTranscript."""
    build = handle_call(method)
    return st.one_of(
        st.builds(build, UNKNOWN_RUNTIMES, ANY_HANDLE),
        st.builds(build, st.sampled_from(EXISTING_RUNTIMES), UNKNOWN_HANDLES),
    )


def close(runtime_id: str, handle_id: str, force: bool) -> Case:
    return Case("Close", pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id, force=force))


CLOSE_CASES = st.one_of(
    st.builds(close, UNKNOWN_RUNTIMES, ANY_HANDLE, st.booleans()),
    # `root` closes a whole runtime (a valid Close since the lifecycle issue), so it is no
    # unknown handle here.
    st.builds(close, st.sampled_from(EXISTING_RUNTIMES), UNKNOWN_HANDLES.filter(lambda h: h != "root"), st.booleans()),
)


def _token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _scope(*names: str) -> str:
    """As the server binds a page token to its listing (api/paging.py)."""
    return hashlib.sha256("\0".join(names).encode()).hexdigest()[:12]


LIST_SCOPE = _scope("List", "base")
TRANSCRIPT_SCOPE = _scope("GetTranscript", "base", "root/worker.1")
# Page tokens no listing of `base` ever gave: random text, negative or non-numeric offsets,
# another listing's scope, an offset Python will not parse.
BAD_TOKENS = st.one_of(
    st.text(min_size=1, max_size=80),
    st.builds(
        lambda n, scope: _token(f"{n}:{scope}"), st.integers(INT64_MIN, -1), st.sampled_from([LIST_SCOPE, TRANSCRIPT_SCOPE])
    ),
    st.builds(lambda n: _token(f"{n}:{'0' * 12}"), st.integers(0, 10**6)),
    st.sampled_from(
        [
            _token(f"abc:{LIST_SCOPE}"),
            _token(f"1.5:{LIST_SCOPE}"),
            _token(f"{'9' * 5000}:{LIST_SCOPE}"),
            _token(f"{'9' * 5000}:{TRANSCRIPT_SCOPE}"),
            _token(LIST_SCOPE),
            _token(f"0:{LIST_SCOPE}")[:-1] + "!",
            "====",
            "é" * 16,
        ]
    ),
)


def list_case(runtime_id: str, page_size: int, page_token: str) -> Case:
    return Case("List", pb.ListRequest(runtime_id=runtime_id, page_size=page_size, page_token=page_token))


PAGE_SIZES = st.integers(-(2**31), 2**31 - 1)
LIST_CASES = st.one_of(
    st.builds(list_case, UNKNOWN_RUNTIMES, PAGE_SIZES, st.just("") | BAD_TOKENS),
    st.builds(list_case, st.sampled_from(EXISTING_RUNTIMES), st.integers(-(2**31), -1), st.just("") | BAD_TOKENS),
    st.builds(list_case, st.just("base"), st.integers(0, 2**31 - 1), BAD_TOKENS),
)


def transcript(runtime_id: str, handle_id: str, page_size: int = 0, page_token: str = "") -> Case:
    request = pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id, page_size=page_size, page_token=page_token)
    return Case("GetTranscript", request)


TRANSCRIPT_CASES = st.one_of(
    st.builds(transcript, UNKNOWN_RUNTIMES, ANY_HANDLE, PAGE_SIZES, st.just("") | BAD_TOKENS),
    st.builds(transcript, st.just("base"), UNKNOWN_HANDLES, PAGE_SIZES, st.just("") | BAD_TOKENS),
    st.builds(
        transcript, st.just("base"), st.sampled_from(PLACEHOLDER_HANDLES), st.integers(-(2**31), -1), st.just("") | BAD_TOKENS
    ),
    st.builds(transcript, st.just("base"), st.sampled_from(PLACEHOLDER_HANDLES), st.integers(0, 2**31 - 1), BAD_TOKENS),
)


def watch(runtime_id: str, after_seq: int) -> Case:
    return Case("Watch", pb.WatchRequest(runtime_id=runtime_id, after_seq=after_seq))


WATCH_CASES = st.one_of(
    st.builds(watch, UNKNOWN_RUNTIMES, st.integers(INT64_MIN, INT64_MAX)),
    st.builds(watch, st.sampled_from(EXISTING_RUNTIMES), st.integers(INT64_MIN, -1)),
)


# ---- raw bytes ------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or message)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def text(number: int, value: str) -> bytes:
    return ld(number, value.encode())


def decodes(method: str, data: bytes) -> bool:
    request_type = getattr(pb, f"{method}Request")
    try:
        request_type.FromString(data)
    except DecodeError:
        return False
    return True


# Endings no parser accepts: wire types 6 and 7, an unterminated group, a truncated varint,
# a length past the end, an overlong varint, a stray end-group.
BAD_TAILS = [
    b"\x0f",
    b"\x0e\x01",
    b"\x0b",
    b"\x08\x80",
    b"\x0a\x80\x80\x80\x80\x10",
    b"\x12\x7f",
    b"\x08" + b"\xff" * 11,
    b"\x0c",
]


def _garbage(method: str, prefix: bytes, tail: bytes) -> RawCase:
    data = prefix + tail
    return RawCase(method, f"garbage {data[:48].hex()}… ({len(data)} bytes)", lambda corpus: data)


# Filtered on the bytes, before they are a case (a case's bytes may depend on the corpus).
GARBAGE = (
    st.tuples(st.sampled_from(METHODS), st.binary(max_size=300), st.sampled_from(BAD_TAILS))
    .filter(lambda drawn: not decodes(drawn[0], drawn[1] + drawn[2]))
    .map(lambda drawn: _garbage(*drawn))
)

INVALID_UTF8 = st.builds(
    lambda head, bad, tail: head.encode() + bad + tail.encode(),
    st.text(max_size=10),
    st.sampled_from([b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc3", b"\x80", b"\xf8\x88\x80\x80\x80"]),
    st.text(max_size=10),
)


def _base_handle(corpus: Corpus) -> bytes:
    return text(1, "base") + text(2, corpus.handles[IDLE])


def _relay_tool(extra: bytes) -> bytes:
    return text(1, "t") + ld(4, b"") + extra


# Where a string field holding invalid UTF-8 goes, per method: (label, bytes around it).
def _utf8_sites(method: str) -> list[tuple[str, Callable[[Corpus, bytes], bytes]]]:
    if method == "ListRuntimes":  # its only string is the page token (field 2)
        return [("page_token", lambda corpus, bad: ld(2, bad))]
    sites: list[tuple[str, Callable[[Corpus, bytes], bytes]]] = [("runtime_id", lambda corpus, bad: ld(1, bad))]
    handle_methods = {"Post", "Wake", "Wait", "Interrupt", "Close", "Inspect", "GetTranscript"}
    if method in handle_methods:
        sites.append(("handle_id", lambda corpus, bad: text(1, "base") + ld(2, bad)))
    if method == "Post":
        sites += [
            ("text", lambda corpus, bad: _base_handle(corpus) + ld(3, bad)),
            ("channel", lambda corpus, bad: _base_handle(corpus) + text(3, "hi") + ld(4, bad)),
            ("sender", lambda corpus, bad: _base_handle(corpus) + text(3, "hi") + ld(5, bad)),
        ]
    if method == "Wake":
        sites.append(("prompt", lambda corpus, bad: _base_handle(corpus) + ld(3, bad)))
    if method == "Spawn":
        sites += [
            ("agent", lambda corpus, bad: text(1, "base") + text(2, "root") + ld(3, bad)),
            ("parent_id", lambda corpus, bad: text(1, "base") + ld(2, bad) + text(3, "worker")),
        ]
    if method == "List":
        sites.append(("page_token", lambda corpus, bad: text(1, "base") + ld(3, bad)))
    if method == "GetTranscript":
        sites.append(("page_token", lambda corpus, bad: _base_handle(corpus) + ld(4, bad)))
    if method == "Resume":
        sites += [
            ("answer.id", lambda corpus, bad: text(1, "base") + ld(2, ld(1, bad))),
            ("answer.reason", lambda corpus, bad: text(1, "base") + ld(2, text(1, corpus.request_id) + ld(4, bad))),
            (
                "answer.outputs[0].output",
                lambda corpus, bad: (
                    text(1, "base") + ld(2, text(1, corpus.request_id) + ld(5, text(1, corpus.call_id) + ld(2, bad)))
                ),
            ),
            (
                "answer.data key",
                lambda corpus, bad: text(1, "base") + ld(2, text(1, corpus.request_id) + ld(3, ld(1, ld(1, bad)))),
            ),
        ]
    if method == "CreateRuntime":
        sites += [
            ("agents[0].name", lambda corpus, bad: text(1, "fresh") + ld(2, ld(1, bad))),
            ("agents[0].team[0]", lambda corpus, bad: text(1, "fresh") + ld(2, text(1, "a") + ld(6, bad))),
            ("tools[0].name", lambda corpus, bad: text(1, "fresh") + ld(2, text(1, "a") + ld(5, ld(1, bad) + ld(4, b"")))),
            (
                "tools[0].http.headers key",
                lambda corpus, bad: (
                    text(1, "fresh")
                    + ld(2, text(1, "a") + ld(5, text(1, "t") + ld(5, text(1, HTTP_URL) + ld(2, ld(1, bad) + text(2, "v")))))
                ),
            ),
            (
                "tools[0].input_schema key",
                lambda corpus, bad: text(1, "fresh") + ld(2, text(1, "a") + ld(5, _relay_tool(ld(3, ld(1, ld(1, bad)))))),
            ),
            (
                "tools[0].input_schema string value",
                lambda corpus, bad: (
                    text(1, "fresh") + ld(2, text(1, "a") + ld(5, _relay_tool(ld(3, ld(1, text(1, "type") + ld(2, ld(3, bad)))))))
                ),
            ),
        ]
    return sites


def _utf8_case(method: str, index: int, bad: bytes) -> RawCase:
    sites = _utf8_sites(method)
    label, build = sites[index % len(sites)]
    return RawCase(method, f"invalid UTF-8 {bad!r} in {label}", lambda corpus: build(corpus, bad))


UTF8_CASES = st.builds(_utf8_case, st.sampled_from(METHODS), st.integers(0, 20), INVALID_UTF8)


def nested_value(kinds: list[bool]) -> bytes:
    """A google.protobuf.Value nested once per kind: True a Struct {"a": ...}, False a ListValue [...]."""
    value = ld(3, b"leaf")  # string_value
    for is_struct in kinds:
        value = ld(5, ld(1, text(1, "a") + ld(2, value))) if is_struct else ld(6, ld(1, value))
    return value


def _deep_struct(kinds: list[bool]) -> bytes:
    """A Struct {"a": <value nested len(kinds) deep>}."""
    return ld(1, text(1, "a") + ld(2, nested_value(kinds)))


def _deep_case(method: str, kinds: list[bool]) -> RawCase:
    what = f"a Struct nested {len(kinds)} levels deep"
    schema = _deep_struct(kinds)
    if method == "CreateRuntime":
        request = text(1, "fresh") + ld(2, text(1, "a") + ld(5, _relay_tool(ld(3, schema))))
        return RawCase(method, f"{what} in agents[0].tools[0].input_schema", lambda corpus: request)
    # Declining (ok unset) with an output: refused even if the data decoded.
    return RawCase(
        method,
        f"{what} in answer.data",
        lambda corpus: (
            text(1, "base") + ld(2, text(1, corpus.request_id) + ld(3, schema) + ld(5, text(1, corpus.call_id) + text(2, "x")))
        ),
    )


DEEP_CASES = st.builds(
    _deep_case, st.sampled_from(["CreateRuntime", "Resume"]), st.lists(st.booleans(), min_size=60, max_size=400)
) | st.sampled_from(["CreateRuntime", "Resume"]).map(lambda method: _deep_case(method, [True] * 200))

RAW_CASES = st.one_of(GARBAGE, UTF8_CASES, DEEP_CASES)


# ---- a table: each kind of mistake once, on every run ----------------------------------------

CREATE_TABLE = [
    *(rename_agent(0, name) for name in ["has space", "a" * 65, "ünïcode", "", "a\n"]),
    *(rename_tool(0, name) for name in ["task", "ask", "two words"]),
    add_team_mate("ghost"),
    *(_structural(what) for what in STRUCTURAL),
    *(set_schema(f"$ref {ref}", {"type": "object", "properties": {"a": {"$ref": ref}}}) for ref in BAD_REFS[:4]),
    set_schema("$ref #", {"$ref": "#"}),
    set_schema("object with $ref #", {"type": "object", "$ref": "#"}),
    set_schema("type array", {"type": "array"}),
    set_schema("40 levels", nested_schema(40)),
    set_schema("over 64 KiB", {"type": "object", "description": "x" * (70 * KIB)}),
    set_schema("pattern (a)\\1", with_pattern("(a)\\1", "pattern")),
    set_schema("2 KB pattern", with_pattern("(a|b)" * 410, "patternProperties")),
    set_schema("maximum NaN", {"type": "object", "maximum": math.nan}),
    set_schema("default -Infinity", {"type": "object", "default": -math.inf}),
    *(
        mutate(value)
        for mutate in (_set_timeout, _wall_time, _delay)
        for value in (duration(2**62, 0), duration(0, 2 * 10**9), duration(5, -1), duration(-1, 0))
    ),
    _set_timeout(duration(0, 0)),
    _set_timeout(duration(601, 0)),
    _wall_time(duration(31 * 86_400, 0)),
    _delay(duration(601, 0)),
    _guardrail("deploy", 999),
    _guardrail("deploy", -1),
    _guardrail("nope", 1),
    *(_on_interrupted(value) for value in (3, 999, -5)),
    *(_set_header(name, "v") for name in ("X Y", "", "X:Y", "Idempotency-Key", "Host", "X-Key\n", "Host\n")),
    *(_set_header("X-Ok", value) for value in ("a\r\nInjected: 1", "nul\x00byte", "v" * (9 * KIB))),
    _many_headers(40),
    _budget_count("max_turns", -1),
    _budget_count("max_tokens", INT64_MIN),
    _budget_count("max_concurrent", 0),
    _tokens(-1),
    _tokens(2**62),
    _arguments("{"),
    _arguments("[1]"),
    _call_unknown_tool("nope"),
    *(_set_url(url) for url in ("ftp://host/x", "not a url", "http://exa mple.com/", "http://127.0.0.1:9/" + "x" * 3000)),
    *(_runtime_id(value) for value in ("has space", "../etc", "x" * 10_000, "fresh\n", "base")),
    _must_match("(a)\\1"),
    _must_match("a" * 1025),
    _max_attempts(-1),
    _judge("ghost"),
    _provider("nope"),
]

OTHER_TABLE = [
    spawn("nope", "root", "worker"),
    spawn("base", "root", "ghost"),
    spawn("base", "root/x.9", "worker"),
    spawn("base", CLOSED, "worker"),
    spawn("base", "root", "worker", pb.Budget(max_tokens=-5)),
    spawn("base", "root", "worker", pb.Budget(max_wall_time=duration(2**62, 0))),
    post("base", FULL, "one more"),
    post("base", IDLE, ""),
    post("base", IDLE, "x" * (TEXT_LIMIT + 1)),
    post("base", CLOSED, "x"),
    post("base", IDLE, "x", channel="c" * 257),
    wake("base", CLOSED, "x"),
    wake("base", PENDING, "x"),
    wake("base", IDLE, ""),
    wake("base", IDLE, "é" * (TEXT_LIMIT // 2 + 1)),
    wait("base", IDLE, None),
    wait("base", IDLE, duration(-1, 0)),
    wait("base", PENDING, duration(86_401, 0)),
    wait("base", PENDING, duration(2**62, 0)),
    wait("base", PENDING, duration(0, 2 * 10**9)),
    resume("base", answer("", True, [])),
    resume("base", answer("req-x", True, [])),
    resume("base", answer(LIVE_REQUEST, False, [(LIVE_CALL, "x")])),
    resume("base", answer(LIVE_REQUEST, True, [("nope", "x")])),
    resume("base", answer(LIVE_REQUEST, True, [(LIVE_CALL, "x" * (TEXT_LIMIT + 1))])),
    resume("base", answer(LIVE_REQUEST, False, [(LIVE_CALL, "x")], {"x": math.nan})),
    resume("base", answer("req-x", True, [], {"x": math.inf})),
    Case("Interrupt", pb.InterruptRequest(runtime_id="base", handle_id="root/ghost.1")),
    close("base", "root/ghost.1", True),
    Case("Inspect", pb.InspectRequest(runtime_id="base")),
    list_case("nope", 0, ""),
    list_case("base", -1, ""),
    list_case("base", 0, "bogus"),
    transcript("base", IDLE, -1),
    transcript("base", IDLE, 0, _token(f"-1:{TRANSCRIPT_SCOPE}")),
    watch("nope", 0),
    watch("base", -1),
]

RAW_TABLE = [
    *(_utf8_case(method, 0, b"\xff\xfe") for method in METHODS),
    *(_garbage(method, b"", b"\x0f") for method in METHODS),
    _deep_case("CreateRuntime", [True] * 200),
    _deep_case("Resume", [True] * 200),
]
TABLE: list[Case | RawCase] = [*(_mutated([mutation]) for mutation in CREATE_TABLE), *OTHER_TABLE, *RAW_TABLE]


# ---- the tests ------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(case=CREATE_CASES)
def test_create_runtime(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=30, deadline=None, suppress_health_check=HEALTH)
@given(case=SPAWN_CASES)
def test_spawn(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=30, deadline=None, suppress_health_check=HEALTH)
@given(case=POST_CASES)
def test_post(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=25, deadline=None, suppress_health_check=HEALTH)
@given(case=WAKE_CASES)
def test_wake(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=30, deadline=None, suppress_health_check=HEALTH)
@given(case=WAIT_CASES)
def test_wait(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=40, deadline=None, suppress_health_check=HEALTH)
@given(case=RESUME_CASES)
def test_resume(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=15, deadline=None, suppress_health_check=HEALTH)
@given(case=handle_cases("Interrupt"))
def test_interrupt(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=15, deadline=None, suppress_health_check=HEALTH)
@given(case=CLOSE_CASES)
def test_close(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=15, deadline=None, suppress_health_check=HEALTH)
@given(case=handle_cases("Inspect"))
def test_inspect(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=20, deadline=None, suppress_health_check=HEALTH)
@given(case=LIST_CASES)
def test_list(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=20, deadline=None, suppress_health_check=HEALTH)
@given(case=TRANSCRIPT_CASES)
def test_get_transcript(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=20, deadline=None, suppress_health_check=HEALTH)
@given(case=WATCH_CASES)
def test_watch(corpus: Corpus, case: Case) -> None:
    corpus.refuse(case)


@settings(max_examples=90, deadline=None, suppress_health_check=HEALTH)
@given(case=RAW_CASES)
def test_raw_bytes(corpus: Corpus, case: RawCase) -> None:
    corpus.refuse(case)


def _case_id(case: Case | RawCase) -> str:
    label = case.what if isinstance(case, Case) and case.what else repr(case)
    return f"{case.method}:{re.sub(r'[^A-Za-z0-9_.$#-]+', '_', label)[:60]}"


@pytest.mark.parametrize("case", TABLE, ids=_case_id)
def test_table(corpus: Corpus, case: Case | RawCase) -> None:
    corpus.refuse(case)
