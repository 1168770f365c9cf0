"""Claims of README.md and the docs/ pages that no other test pins: each test quotes the sentence it
checks and names its page.

Servers run in process on loopback (embedded scripted model, memory store) and are called
through the generated stubs, except the configuration table, which is checked against
the one settings model and the `serve` parser it documents, and the pages' links, which must
all resolve. The README's Python program runs as a process of its own."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import annotated_types
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.cli import main as serve_main
from agentruntime_server.providers.base import RETRYABLE_REASONS
from agentruntime_server.settings import Settings
from google.protobuf import json_format
from google.rpc import error_details_pb2
from pydantic import SecretStr

from tests.support.build import agent, create, duration, run, spawn, status_details, wait
from tests.support.servers import serve

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
Code = grpc.StatusCode


async def refused(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def reason(error: grpc.aio.AioRpcError) -> str:
    [info] = [d for d in status_details(error) if isinstance(d, error_details_pb2.ErrorInfo)]
    return str(info.reason)


def violations(error: grpc.aio.AioRpcError) -> list[error_details_pb2.BadRequest.FieldViolation]:
    [bad_request] = [d for d in status_details(error) if isinstance(d, error_details_pb2.BadRequest)]
    return list(bad_request.field_violations)


def scripted(name: str, *replies: pb.ScriptedReply, **fields: Any) -> pb.AgentDef:
    return agent(name, script=pb.Script(replies=list(replies)), **fields)


def ask(question: str) -> pb.ScriptedReply:
    return pb.ScriptedReply(tool_calls=[pb.ScriptedToolCall(name="ask", arguments_json=json.dumps({"question": question}))])


async def from_example(stub: pb_grpc.AgentRuntimeAsyncStub, name: str) -> str:
    request = json_format.Parse((ROOT / "examples" / name).read_text(), pb.CreateRuntimeRequest())
    return (await stub.CreateRuntime(request)).runtime_id


# ---- Configuration -------------------------------------------------------------------


def _configuration_rows() -> list[list[str]]:
    text = (DOCS / "configuration.md").read_text()
    table = text.split("| flag ", 1)[1].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table.splitlines()[2:]]


def _documented(cell: str, value: Any) -> Any:
    """The default a cell states, in the type of the setting's; None when it is prose."""
    if cell.startswith("empty"):
        return ""
    literal = re.fullmatch(r"`([^`]*)`(?: \(.*\))?", cell)
    if literal is None:
        return None
    word = literal.group(1)
    if isinstance(value, bool):
        return word == "true"
    if isinstance(value, int | float):
        return type(value)(word)
    if isinstance(value, dict | list):
        return json.loads(word)
    return word


def test_the_configuration_table_is_the_settings_model(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/configuration.md: "Flags override `AGENTRUNTIME_*` environment variables, which override the defaults
    (one settings model: `server/agentruntime_server/settings.py`)." Every setting is in the
    table under its variable, with the default the table states and the flag it names."""
    with pytest.raises(SystemExit):
        serve_main(["serve", "--help"])
    serve_flags = set(re.findall(r"--[a-z-]+", capsys.readouterr().out))
    defaults = Settings.model_construct()
    documented: set[str] = set()
    for flags_cell, variables_cell, default_cell, _ in _configuration_rows():
        names = re.findall(r"`(AGENTRUNTIME_[A-Z_]+|_[A-Z_]+)`", variables_cell)
        fields = [name.removeprefix("AGENTRUNTIME_").lower() for name in names]
        # `AGENTRUNTIME_AUTH_JWKS`, `_ISSUER`: the short forms share the first name's prefix.
        fields = [fields[0].rsplit("_", 1)[0] + field if field.startswith("_") else field for field in fields]
        cells = default_cell.split(", ") if len(fields) > 1 and default_cell.count(", ") == len(fields) - 1 else [default_cell]
        for field, cell in zip(fields, cells * len(fields), strict=False):
            assert field in Settings.model_fields, f"configuration.md documents AGENTRUNTIME_{field.upper()}, which is no setting"
            documented.add(field)
            value = getattr(defaults, field)
            value = value.get_secret_value() if isinstance(value, SecretStr) else value
            stated = _documented(cell, value)
            if stated is not None:
                assert stated == value, f"AGENTRUNTIME_{field.upper()}: configuration.md says {cell}, the default is {value!r}"
        for flag in re.findall(r"`(--[a-z-]+)`", flags_cell):
            assert flag in serve_flags, f"configuration.md documents `serve {flag}`, which serve does not take"
            assert flag[2:].replace("-", "_") in fields, f"{flag} is documented on the row of {names}"
    assert documented == set(Settings.model_fields), f"undocumented: {set(Settings.model_fields) - documented}"


UNITS = {"KiB": 1024, "MiB": 1024 * 1024, "s": 1, "h": 3600, "days": 86400}
AMOUNT = r"[\d,.]+(?: (?:KiB|MiB|s|h|days))?"
RANGE = re.compile(rf"\((?:(at least|above) ({AMOUNT})|({AMOUNT}) to ({AMOUNT}))\)$")


def _amount(text: str) -> float:
    number, _, unit = text.partition(" ")
    return float(number.replace(",", "")) * (UNITS[unit] if unit else 1)


def _documented_bounds(meaning: str) -> dict[str, float]:
    """The range a row's meaning ends with: `(at least 1)`, `(above 0)`, `(1 KiB to 1 MiB)`; none: 0 or more."""
    found = RANGE.search(meaning)
    if found is None:
        return {"ge": 0}
    kind, low, low_of_two, high = found.groups()
    if kind is not None:
        return {"ge" if kind == "at least" else "gt": _amount(low)}
    return {"ge": _amount(low_of_two), "le": _amount(high)}


def _enforced_bounds(field: str) -> dict[str, float]:
    """The bounds the settings model puts on a setting."""
    kinds = (annotated_types.Ge, annotated_types.Gt, annotated_types.Le, annotated_types.Lt)
    return {
        type(bound).__name__.lower(): float(getattr(bound, type(bound).__name__.lower()))
        for bound in Settings.model_fields[field].metadata
        if isinstance(bound, kinds)
    }


NUMBERS = sorted(field for field, info in Settings.model_fields.items() if re.search(r"\b(int|float)\b", str(info.annotation)))


def test_the_configuration_table_gives_each_number_its_range() -> None:
    """docs/configuration.md: "A number is 0 or more unless its row gives its range, bounds included: `(at least 1)`,
    `(above 0)`, `(1 KiB to 1 MiB)`." Each row's range is the one the settings model enforces."""
    stated: dict[str, dict[str, float]] = {}
    for _, variables_cell, _, meaning in _configuration_rows():
        for name in re.findall(r"`AGENTRUNTIME_([A-Z_]+)`", variables_cell):
            stated[name.lower()] = _documented_bounds(meaning)
    wrong = {
        field: (stated.get(field), _enforced_bounds(field)) for field in NUMBERS if stated.get(field) != _enforced_bounds(field)
    }
    assert not wrong, f"configuration.md's range (first) against the settings' (second): {wrong}"


def _outside_and_at(bounds: dict[str, float], integral: bool) -> tuple[list[float], list[float]]:
    """Values just outside the bounds, and the bounds themselves (or just inside an open one)."""
    step = 1 if integral else 0.5
    outside, inside = [], []
    if "ge" in bounds:
        outside.append(bounds["ge"] - step)
        inside.append(bounds["ge"])
    if "gt" in bounds:
        outside.append(bounds["gt"])
        inside.append(bounds["gt"] + step)
    if "le" in bounds:
        outside.append(bounds["le"] + step)
        inside.append(bounds["le"])
    return outside, inside


@pytest.mark.parametrize("field", NUMBERS)
def test_a_number_outside_its_range_is_refused_at_start(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/configuration.md: "A value outside it, or not a number, stops `agentruntime serve` at start with one line
    naming the variable": the settings `serve` reads refuse it, and take the bounds themselves."""
    integral = "int" in str(Settings.model_fields[field].annotation)
    outside, inside = _outside_and_at(_enforced_bounds(field), integral)
    variable = f"AGENTRUNTIME_{field.upper()}"
    for value in outside:
        monkeypatch.setenv(variable, str(int(value) if integral else value))
        with pytest.raises(ValueError) as refused:
            Settings()
        assert [error["loc"] for error in refused.value.errors()] == [(field,)], (variable, value)  # type: ignore[attr-defined]
    for value in inside:
        monkeypatch.setenv(variable, str(int(value) if integral else value))
        assert getattr(Settings(), field) == value


def test_serve_names_the_setting_out_of_range_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/configuration.md: "$ AGENTRUNTIME_MAX_TEXT_BYTES=100 agentruntime serve" prints
    "error: AGENTRUNTIME_MAX_TEXT_BYTES: Input should be greater than or equal to 1024" (exit code 2)."""
    page = (DOCS / "configuration.md").read_text()
    command, line = re.findall(r"^\$ (AGENTRUNTIME_MAX_TEXT_BYTES=\S+) agentruntime serve\n(error: .*)$", page, re.M)[0]
    monkeypatch.setenv(*command.split("=", 1))
    with pytest.raises(SystemExit) as exited:
        serve_main(["serve"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_a_price_table_given_inline_stops_the_start(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/configuration.md: "`AGENTRUNTIME_PRICES` is the path of a JSON file ... the JSON itself in the variable is
    taken for a path, and stops the start"."""
    monkeypatch.setenv("AGENTRUNTIME_PRICES", '{"currency": "USD", "prices": []}')
    monkeypatch.setenv("AGENTRUNTIME_STORE", "memory://")
    monkeypatch.setenv("AGENTRUNTIME_METRICS_LISTEN", "off")
    monkeypatch.setenv("AGENTRUNTIME_LISTEN", "127.0.0.1:0")
    with pytest.raises(SystemExit) as exited:
        serve_main(["serve"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith('error: AGENTRUNTIME_PRICES {"currency": "USD", "prices": []}: cannot read it')


# ---- Walkthroughs ----------------------------------------------------------------------


async def test_the_grpcurl_walkthrough_figures_are_the_server_s() -> None:
    """docs/walkthrough.md: "The coordinator spent 184 tokens itself over 2 turns; the bill for the whole tree is
    296, because its two children spent 57 and 55 (184 + 57 + 55 = 296)." and "The
    children's budgets were carved from what the coordinator had left when it spawned them"
    (9 turns, 19945 tokens)."""
    async with serve() as served:
        runtime_id = await from_example(served.stub, "agents.json")
        assert runtime_id == "demo"
        handle_id, result = await run(served.stub, runtime_id, "coordinator", "How does the Python GIL affect CPU-bound threads?")
        assert handle_id == "root/coordinator.1"
        assert (result.status, result.turns, result.own_tokens, result.total_tokens, result.tool_calls) == (
            pb.STATUS_DONE,
            2,
            184,
            296,
            2,
        )
        listed = (await served.stub.List(pb.ListRequest(runtime_id=runtime_id))).handles
        assert [
            (view.handle_id, view.own_tokens, view.total_tokens, view.budget.max_turns, view.budget.max_tokens) for view in listed
        ] == [
            ("root/coordinator.1", 184, 296, 10, 20000),
            ("root/coordinator.1/explore.1", 57, 57, 9, 19945),
            ("root/coordinator.1/summarize.1", 55, 55, 9, 19945),
        ]


async def test_the_suspension_walkthrough_is_the_server_s() -> None:
    """docs/suspension.md: "every tool call carries the key `{runtime}/{handle}/{call_id}`: ... relay calls carry
    it in `pending.calls[].idempotency_key`", and "The lead's first turn was not bought again
    (2 turns, 200 own tokens: one before the suspension, one after)"."""
    async with serve() as served:
        stub = served.stub
        runtime_id = await from_example(stub, "release.json")
        _, pending = await run(stub, runtime_id, "lead", "Ship v2.")
        assert pending.status == pb.STATUS_PENDING
        assert (pending.pending.id, pending.pending.kind, list(pending.pending.path)) == (
            "root/lead.1/release.1/call_1_1:tool_call",
            "tool_call",
            ["root", "lead.1", "release.1"],
        )
        [deploy] = pending.pending.calls
        assert (deploy.id, deploy.name, deploy.idempotency_key) == (
            "call_1_1",
            "deploy",
            "release/root/lead.1/release.1/call_1_1",
        )
        assert (pending.turns, pending.own_tokens, pending.total_tokens) == (1, 100, 110)
        answer = pb.Answer(
            id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id="call_1_1", output="deployed v2 at 12:00")]
        )
        done = (await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
        assert (done.status, done.text, done.turns, done.own_tokens, done.total_tokens, done.tool_calls) == (
            pb.STATUS_DONE,
            "Release finished: v2 is live.",
            2,
            200,
            220,
            1,
        )
        release = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id="root/lead.1/release.1"))).handle
        assert release.turns == 2  # "`release` made 2 model calls in all"


# ---- Errors ----------------------------------------------------------------------------


async def test_each_failed_precondition_names_its_reason() -> None:
    """docs/errors.md: "`FAILED_PRECONDITION` | ... Wait on a handle never woken; ... Wake on a closed, suspended
    or running handle; Close of a running handle without `force` ...; Resume with ... another
    answer to one already answered | `ErrorInfo.reason`: `HANDLE_CLOSED`, `HANDLE_SUSPENDED`,
    `HANDLE_RUNNING`, `NEVER_RUN`, `NO_SUCH_REQUEST`, `ALREADY_ANSWERED`"."""
    async with serve() as served:
        stub = served.stub
        runtime_id = await create(
            stub,
            scripted("asker", ask("which version?"), pb.ScriptedReply(text="done")),
            scripted("slow", pb.ScriptedReply(text="late", delay=duration(30))),
        )
        idle = await spawn(stub, runtime_id, "asker")
        never = await refused(stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=idle), timeout=10))
        assert (never.code(), reason(never)) == (Code.FAILED_PRECONDITION, "NEVER_RUN")

        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=idle, prompt="ship"))
        suspended = await wait(stub, runtime_id, idle)
        assert suspended.status == pb.STATUS_PENDING, suspended
        woken = await refused(stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=idle, prompt="again")))
        assert (woken.code(), reason(woken)) == (Code.FAILED_PRECONDITION, "HANDLE_SUSPENDED")

        answer = pb.Answer(id=suspended.pending.id, ok=True)
        answer.data.update({"answer": "v2"})
        await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))
        other = pb.Answer(id=suspended.pending.id, ok=False, reason="changed my mind")
        twice = await refused(stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=other)))
        assert (twice.code(), reason(twice)) == (Code.FAILED_PRECONDITION, "ALREADY_ANSWERED")

        busy = await spawn(stub, runtime_id, "slow")
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=busy, prompt="go"))
        closing = await refused(stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=busy)))
        assert (closing.code(), reason(closing)) == (Code.FAILED_PRECONDITION, "HANDLE_RUNNING")
        await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=busy, force=True))


async def test_a_closed_handle_refuses_posts_and_children_as_handle_closed() -> None:
    """docs/errors.md: "`FAILED_PRECONDITION` | ... Post to a closed handle or Spawn under one ... |
    `ErrorInfo.reason`: `HANDLE_CLOSED`, ...": the reason a host branches on, whichever call
    met the closed handle."""
    async with serve() as served:
        stub = served.stub
        runtime_id = await create(stub, scripted("a", pb.ScriptedReply(text="ok")))
        handle_id = await spawn(stub, runtime_id, "a")
        await stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id))
        posted = await refused(stub.Post(pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="hello")))
        assert (posted.code(), reason(posted)) == (Code.FAILED_PRECONDITION, "HANDLE_CLOSED")
        spawned = await refused(stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, parent_id=handle_id, agent="a")))
        assert (spawned.code(), reason(spawned)) == (Code.FAILED_PRECONDITION, "HANDLE_CLOSED")


async def test_an_error_is_bounded_whatever_the_request_holds() -> None:
    """docs/limits.md: "an error | 600 characters of message and at most 10 field violations of 200
    characters: a bad id always gets its real code"."""
    async with serve() as served:
        bad = [pb.AgentDef(name=f"{n} {'x' * 300}", description="d") for n in range(15)]
        error = await refused(served.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="bounded", agents=bad)))
        assert error.code() == Code.INVALID_ARGUMENT
        found = violations(error)
        assert len(found) == 10, found
        assert all(len(v.field) <= 200 and len(v.description) <= 200 for v in found), found
        assert len(error.details() or "") <= 600, error.details()


async def test_a_watcher_that_falls_behind_is_told_where_to_watch_again() -> None:
    """docs/configuration.md: "`AGENTRUNTIME_WATCH_BUFFER` | `1000` | events a Watch consumer may fall behind before it
    is told to reconnect" (`RESOURCE_EXHAUSTED`, `WATCH_LAGGING`), and a Watch from the seq it
    names gets the rest, no gap."""
    async with serve(watch_buffer=1) as served:
        stub = served.stub
        runtime_id = await create(stub, scripted("a", pb.ScriptedReply(text="ok", tokens=3)))
        handle_id = await spawn(stub, runtime_id, "a")
        behind = stub.Watch(pb.WatchRequest(runtime_id=runtime_id), timeout=30)
        first = await behind.read()  # read from the history: the watcher is subscribed
        assert isinstance(first, pb.WatchResponse)
        seen = [first.event.seq]
        # A settled run publishes its result and its state change at once: two events for
        # a buffer of one, however fast this watcher reads.
        await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="go"))
        assert (await wait(stub, runtime_id, handle_id)).status == pb.STATUS_DONE
        with pytest.raises(grpc.aio.AioRpcError) as lagged:
            while (response := await behind.read()) is not grpc.aio.EOF:
                assert isinstance(response, pb.WatchResponse)
                seen.append(response.event.seq)
        assert (lagged.value.code(), reason(lagged.value)) == (Code.RESOURCE_EXHAUSTED, "WATCH_LAGGING")
        after = int(re.findall(r"after_seq=(\d+)", lagged.value.details() or "")[-1])
        assert after == seen[-1]
        rest = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, after_seq=after), timeout=30)
        resumed: list[int] = []
        async for response in rest:
            resumed.append(response.event.seq)
            if response.event.HasField("result"):
                break
        rest.cancel()
        assert seen + resumed == list(range(1, len(seen) + len(resumed) + 1))


# ---- Budgets and lifecycle bounds ------------------------------------------------------


async def test_a_budget_of_zero_is_a_limit_not_unset() -> None:
    """docs/budgets.md: "A `Budget` ... has eight optional limits (below); unset means unlimited, and unset is not 0."
    with "`max_turns` ... before every model call | `INCOMPLETE` + `LIMIT_MAX_TURNS`"."""
    async with serve() as served:
        runtime_id = await create(served.stub, scripted("a", pb.ScriptedReply(text="paid", tokens=5)))
        _, stopped = await run(served.stub, runtime_id, "a", "go", budget=pb.Budget(max_turns=0))
        assert (stopped.status, stopped.limit, stopped.turns, stopped.own_tokens) == (
            pb.STATUS_INCOMPLETE,
            pb.LIMIT_MAX_TURNS,
            0,
            0,
        )
        _, unlimited = await run(served.stub, runtime_id, "a", "go", budget=pb.Budget())
        assert (unlimited.status, unlimited.turns, unlimited.own_tokens) == (pb.STATUS_DONE, 1, 5)


NUMBER_WORDS = {"six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def test_the_pages_count_the_budget_s_limits() -> None:
    """README.md: "[Budgets and stops](docs/budgets.md) | the eight limits", and docs/budgets.md: "has eight optional
    limits (below)": as many as `Budget` has fields besides `on_exhausted`, each a row of the page's table."""
    limits = [field.name for field in pb.Budget.DESCRIPTOR.fields if field.name != "on_exhausted"]
    readme = re.search(r"\| the (\w+) limits,", (ROOT / "README.md").read_text())
    page = (DOCS / "budgets.md").read_text()
    stated = re.search(r"has (\w+) optional\s+limits", page)
    assert readme is not None and stated is not None
    assert NUMBER_WORDS[readme.group(1)] == NUMBER_WORDS[stated.group(1)] == len(limits), limits
    assert sorted(re.findall(r"^\| `(max_\w+)` \|", page, re.M)) == sorted(limits)


def test_the_failures_table_advises_retrying_only_what_may_succeed_later() -> None:
    """docs/budgets.md, Failures: a reason the server never marks `retryable` is not advised to be tried again, and
    each reason it may mark so says `retryable` (providers/base.py: RETRYABLE_REASONS)."""
    page = (DOCS / "budgets.md").read_text().split("## Failures", 1)[1]
    rows = re.findall(r"^\| `FAILURE_REASON_(\w+)` \| (.*) \| (.*) \|$", page, re.M)
    retryable = {reason.name for reason in RETRYABLE_REASONS}
    assert {reason for reason, _, _ in rows} >= retryable
    for reason, when, advice in rows:
        said = re.sub(r"[Nn]ot `?retryable`?|[Dd]o not retry|does not retry", "", f"{when} {advice}")
        if reason in retryable:
            assert "`retryable`" in said, f"{reason}: {when} | {advice}"
        else:
            assert not re.search(r"retry|try again", said, re.I), f"{reason} is never retryable: {advice}"


async def test_a_close_grace_is_at_most_ten_minutes() -> None:
    """docs/lifecycle.md: "`grace` (a Duration, at most 10 minutes) lets running handles settle on their own for
    that long, then interrupts the rest"."""
    async with serve() as served:
        runtime_id = await create(served.stub, scripted("a", pb.ScriptedReply(text="ok")))
        handle_id = await spawn(served.stub, runtime_id, "a")
        error = await refused(served.stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id, grace=duration(601))))
        assert error.code() == Code.INVALID_ARGUMENT
        assert [v.field for v in violations(error)] == ["grace"]
        closed = await served.stub.Close(pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id, grace=duration(600)))
        assert list(closed.closed_handle_ids) == [handle_id]


@pytest.mark.parametrize(("every", "accepted"), [(0.999, False), (1, True), (30 * 86400, True), (30 * 86400 + 1, False)])
async def test_a_heartbeat_period_is_from_one_second_to_thirty_days(every: float, accepted: bool) -> None:
    """docs/lifecycle.md: "`AgentDef.heartbeat {every, prompt}` (every 1 s to 30 days)"."""
    beating = scripted("a", pb.ScriptedReply(text="ok"), heartbeat=pb.Heartbeat(every=duration(every), prompt="tick"))
    async with serve() as served:
        request = pb.CreateRuntimeRequest(runtime_id="beats", agents=[beating])
        if accepted:
            assert (await served.stub.CreateRuntime(request)).runtime_id == "beats"
            return
        error = await refused(served.stub.CreateRuntime(request))
        assert error.code() == Code.INVALID_ARGUMENT
        assert [v.field for v in violations(error)] == ["agents[0].heartbeat.every"]


async def test_a_create_refused_by_a_shutdown_is_unavailable() -> None:
    """docs/errors.md: "`UNAVAILABLE` | the server is shutting down": a CreateRuntime that
    reaches a server already draining is to be retried at its replacement, like any call
    a shutdown refuses (it was FAILED_PRECONDITION, which clients do not retry)."""
    async with serve() as served:
        await served.running.service.drain(0)
        error = await refused(served.stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[scripted("a")])))
        assert error.code() == Code.UNAVAILABLE
        assert "shutting down" in str(error.details())


# ---- The pages themselves --------------------------------------------------------------

PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted(DOCS.glob("*.md")),
    *sorted((ROOT / "clients").glob("*/README.md")),
    ROOT / "tests" / "vectors" / "README.md",
]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(page: Path) -> str:
    """A page without its code: a link or a heading inside a code block is no link or heading."""
    return CODE_SPAN.sub("", FENCE.sub("", page.read_text()))


def _anchors(page: Path) -> set[str]:
    """The fragments GitHub gives a page: a slug per heading (a repeated one numbered), and every explicit id."""
    text = FENCE.sub("", page.read_text())
    anchors = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_relative_link_of_the_pages_resolves() -> None:
    """Every link from README.md, CHANGELOG.md, a docs/ page, a client's README or the vectors' README to a file
    of the repository names one that exists, and its #fragment a heading or an id of that page."""
    broken: list[str] = []
    for page in PAGES:
        for target in LINK.findall(_prose(page)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif fragment and (resolved.suffix != ".md" or fragment not in _anchors(resolved)):
                broken.append(f"{where}: no such anchor")
    assert not broken, "\n".join(broken)


FILE_NAMED = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|sh|db|json|proto|binpb))`")
PACKAGE = ROOT / "server" / "agentruntime_server"


def test_every_file_the_pages_name_exists() -> None:
    """A file README.md, CHANGELOG.md or a docs/ page names in code (`tests/api/test_quotas.py`, `store/payloads.py`) is in
    the repository, from its root or from the server's package: a file moved or renamed takes its
    mentions along."""
    missing: list[str] = []
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]:
        for name in FILE_NAMED.findall(FENCE.sub("", page.read_text())):
            if "/" in name or name.endswith(".py"):
                if not (ROOT / name).exists() and not (PACKAGE / name).exists():
                    missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert not missing, "\n".join(missing)


def test_the_readme_is_short_and_links_every_docs_page() -> None:
    """README.md is at most 250 lines; everything else is one docs/ page a topic, each linked from it."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = {(ROOT / target).resolve() for target in LINK.findall(_prose(ROOT / "README.md"))}
    assert {page.resolve() for page in DOCS.glob("*.md")} <= linked


async def test_the_readme_python_program_prints_what_the_readme_says() -> None:
    """README.md: "the coordinator delegates the prompt to `explore` and answers with what it got:
    2 turns, 47 tokens of its own, 73 for the tree", run as written (its address aside) in a
    process of its own, against a server on the embedded scripted model."""
    readme = (ROOT / "README.md").read_text()
    program = readme.split("**Python**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert '"127.0.0.1:50051"' in program
    async with serve() as served:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            program.replace('"127.0.0.1:50051"', f'"127.0.0.1:{served.port}"'),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(child.communicate(), timeout=60)
    assert child.returncode == 0, err.decode()
    assert out.decode().split() == ["STATUS_DONE", "2", "47", "73"]
