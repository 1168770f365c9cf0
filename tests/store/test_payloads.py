"""The journal's on-disk payloads (store/payloads.py), pinned byte for byte.

One representative instance of every step kind (every field set, nested values included)
is encoded and compared with tests/fixtures/journal-payloads-v<PAYLOAD_VERSION>.jsonl, one
line per kind; each line decodes back to an equal step. A change to a step's fields (a
rename, a new field, a changed type) fails here until PAYLOAD_VERSION is bumped and an
upgrade from the older version is added to payloads.UPGRADES:

1. bump PAYLOAD_VERSION and add the upgrade;
2. write the new version's file (the old one stays: its lines must keep decoding, through
   the upgrades):  .venv/bin/python tests/store/test_payloads.py
   (it refuses to overwrite an existing file; --force exists for a file never released).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from agentruntime_server.domain.billing.usage import Cost, Tokens, Usage
from agentruntime_server.domain.journal import (
    STEPS,
    Answered,
    BudgetSet,
    CallFinished,
    CallStarted,
    CallSuspended,
    Closed,
    Compacted,
    Configured,
    EventsImported,
    Forked,
    Held,
    Imported,
    InDoubt,
    MessagesAppended,
    ModelReplied,
    Posted,
    Queued,
    Replaying,
    Replied,
    Rewound,
    RunStarted,
    Settled,
    Spawned,
    Step,
    Ticked,
    TurnStarted,
)
from agentruntime_server.domain.journal.recording import Recording, ReplayRoot
from agentruntime_server.domain.vocabulary import (
    Answer,
    Budget,
    Failure,
    FailureReason,
    HandleState,
    InboxItem,
    Limit,
    Message,
    OnExhausted,
    PendingRequest,
    RecordedCall,
    RuntimeOptions,
    Status,
    TaskResult,
    Thinking,
    ToolCall,
    ToolOutput,
    ToolResult,
    Trust,
    UnrecordedCalls,
)
from agentruntime_server.domain.watching.event_log import Event, EventKind
from agentruntime_server.store import payloads

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = FIXTURES / f"journal-payloads-v{payloads.PAYLOAD_VERSION}.jsonl"

HANDLE = "root/coordinator.1/worker.2"
CALL = ToolCall("call_3_1", "fetch", '{"url": "https://example.com/a", "n": 2}')
OTHER_CALL = ToolCall("call_3_2", "task", '{"agent": "explore", "prompt": "look"}')
SPLIT = Tokens(input=70, cache_read=30, cache_write=5, output=15, reasoning=6)
USAGE = Usage(
    turns=3,
    own_tokens=120,
    total_tokens=450,
    tool_calls=4,
    subtree_tool_calls=9,
    own_split=SPLIT,
    total_split=Tokens(300, 100, 10, 40, 12),
    own_cost=Cost(1_500, "USD", priced=False),
    total_cost=Cost(4_250, "USD", priced=False),
    own_estimated=True,
    total_estimated=True,
)
BUDGET = Budget(
    max_turns=8,
    max_tokens=4000,
    max_tool_calls=20,
    max_wall_time=90.5,
    max_children=3,
    max_depth=2,
    max_concurrent=2,
    on_exhausted=OnExhausted.ASK,
    max_cost=2_000_000,
)
ITEM = InboxItem(text="the build is red", channel="ci", sender="jenkins", trust=Trust.EXTERNAL, coalesce_key="ci-status", count=3)
THINKING = (Thinking("the first page first", "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxG"), Thinking(redacted_data="EmwKAhgBEgy3va3pzix"))
MESSAGE = Message(
    role="assistant",
    content="fetching both",
    tool_calls=(CALL, OTHER_CALL),
    tool_call_id="call_2_1",
    is_error=True,
    turn=3,
    trust=Trust.AGENT,
    summary=True,
    refusal=True,
    truncated=True,
    thinking=THINKING,
)
TOOL_MESSAGE = Message(role="tool", content="404 not found", tool_call_id="call_3_1", is_error=True, turn=3)
PENDING = PendingRequest(
    id=f"{HANDLE}/call_3_1:approval",
    kind="approval",
    prompt='Allow fetch? (fetch {"url": "https://example.com/a"})',
    url="https://approve.example/req/1",
    data={
        "calls": [{"id": "call_3_1", "name": "fetch", "idempotency_key": f"rt-1/{HANDLE}/call_3_1"}],
        "nested": {"ratio": 0.25, "flags": [True, False, None], "count": 7, "unicode": "é ✓"},
    },
    path=("root", "coordinator.1", "worker.2"),
    calls=((CALL, f"rt-1/{HANDLE}/call_3_1"), (OTHER_CALL, f"rt-1/{HANDLE}/call_3_2")),
    expires_at=1_800_000_000.5,
    from_tool=True,
)
RESULT = TaskResult(
    handle_id=HANDLE,
    text="partial: one page fetched",
    is_error=True,
    status=Status.PENDING,
    limit=Limit.MAX_TOKENS,
    pending=PENDING,
    usage=USAGE,
    failure=Failure(FailureReason.PROVIDER_UNAVAILABLE, "openai", 503, True, "server_error: overloaded"),
    output={"label": "bug", "confidence": 0.75, "tags": ["crash", "ui"], "nested": [{"deep": None}]},
    inherited=USAGE,
)
ANSWER = Answer(
    id=PENDING.id,
    ok=True,
    data={"approver": "ops@example.com", "scope": {"max": 3, "hosts": ["example.com"]}},
    reason="looks fine",
    outputs=(ToolOutput(call_id="call_3_1", output='{"status": 200}', is_error=True),),
)
EVENT = Event(
    seq=41,
    time=1_700_000_123.25,
    handle_id=HANDLE,
    kind=EventKind.TOOL_CALL_ENDED,
    parent_id="root/coordinator.1",
    agent="worker",
    state=HandleState.SUSPENDED,
    turn=3,
    tokens=40,
    own_tokens=120,
    total_tokens=450,
    tool_calls=4,
    usage_estimated=True,
    split=SPLIT,
    cost=Cost(99, "USD", priced=False),
    usage=USAGE,
    call=CALL,
    call_id="call_3_1",
    output="404 not found",
    is_error=True,
    pending=PENDING,
    result=RESULT,
)

# One of each kind, in the order of journal.STEPS (the order of the golden file's lines).
SAMPLES: tuple[Step, ...] = (
    Configured(RuntimeOptions(inbox_capacity=5, max_concurrent_model_calls=3)),
    Spawned(HANDLE, "root/coordinator.1", "worker", BUDGET, "call_1_1", 2),
    Posted(HANDLE, ITEM),
    Ticked(HANDLE, 1_700_000_456.5, 4),
    Queued(HANDLE, True),
    RunStarted(
        HANDLE,
        Message(
            "user",
            "go\n\n[from jenkins] the build is red",
            (CALL,),
            "call_0",
            True,
            1,
            Trust.EXTERNAL,
            True,
            True,
            True,
            THINKING,
        ),
        drained=2,
    ),
    TurnStarted(HANDLE, 3),
    ModelReplied(HANDLE, MESSAGE, 40, USAGE, estimated=True, split=Tokens(10, 20, 3, 7, 2), cost=Cost(731, "EUR", False)),
    CallStarted(HANDLE, CALL, effect=True, announce=False),
    CallSuspended(HANDLE, "call_3_1"),
    CallFinished(HANDLE, CALL, ToolResult("404 not found", is_error=True)),
    MessagesAppended(
        HANDLE, (TOOL_MESSAGE, Message("tool", "explored", (), "call_3_2", True, 3, Trust.AGENT, True, True, True, THINKING))
    ),
    Compacted(HANDLE, 6, MESSAGE),
    Settled(HANDLE, RESULT, HandleState.SUSPENDED, rollback_to=4, restored=(ITEM,)),
    Answered(PENDING.id, ANSWER, HANDLE, approved=("call_3_1",), rerun=("call_2_9",), for_tool=("call_3_1",)),
    BudgetSet(HANDLE, BUDGET),
    InDoubt(HANDLE, ("call_2_9", "call_3_1")),
    Closed(HANDLE),
    Imported(
        handle_id=HANDLE,
        usage=USAGE,
        state=HandleState.SUSPENDED,
        inbox=(ITEM,),
        transcript=(MESSAGE, TOOL_MESSAGE),
        tool_results={"call_3_1": ToolResult("404 not found", is_error=True)},
        started=("call_3_2",),
        last_result=RESULT,
        pending=PENDING,
        approved=("call_3_1",),
        in_doubt=("call_2_9",),
    ),
    EventsImported((EVENT,)),
    Replied("0b0e6f8c-4e52-4c8e-9a55-7a4f3f0b9d21", "Close", "9f2c1d", (HANDLE, "root/worker.2"), 2),
    Forked("rt-source", 57, ("worker",), (HANDLE,), ((HANDLE, BUDGET),)),
    Held(HANDLE),
    Rewound(HANDLE, 4, ITEM, idle=True),
    Replaying(
        Recording(
            "rt-recorded",
            UnrecordedCalls.HOST,
            (RecordedCall(HANDLE, 2, "fetch", CALL.arguments_json, ToolResult("404 not found", is_error=True)),),
            (ReplayRoot("root/coordinator.1", "coordinator", BUDGET, 1, (MESSAGE,), RESULT, ((HANDLE, "fetch", "{}"),)),),
        )
    ),
)


def encoded() -> list[bytes]:
    return [payloads.encode(step) for step in SAMPLES]


def golden_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def kind_of(line: bytes) -> str:
    kind: str = json.loads(line)["k"]
    return kind


# ---- the samples are what they claim to be ------------------------------------------------


def test_there_is_one_sample_of_every_step_kind_in_order() -> None:
    assert [type(step) for step in SAMPLES] == list(STEPS)


def _unset(value: Any, where: str) -> list[str]:
    """The fields, at any depth, left at their default or empty."""
    found: list[str] = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for spec in dataclasses.fields(value):
            field_value = getattr(value, spec.name)
            path = f"{where}.{spec.name}"
            if spec.default is not dataclasses.MISSING:
                default: Any = spec.default
            elif spec.default_factory is not dataclasses.MISSING:
                default = spec.default_factory()
            else:
                default = dataclasses.MISSING
            if (default is not dataclasses.MISSING and field_value == default) or (
                not isinstance(field_value, enum.Enum | bool) and not field_value
            ):
                found.append(path)
            found.extend(_unset(field_value, path))
    elif isinstance(value, tuple | list) and value:
        # A field left empty in one item counts as set when another item of the sequence sets it
        # (a tool message has no tool calls of its own; the assistant message next to it has).
        unset_in_all = set.intersection(*(set(_unset(item, f"{where}[*]")) for item in value))
        found.extend(sorted(unset_in_all))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.extend(_unset(item, f"{where}[{key!r}]"))
    return found


# Fields a representative sample leaves empty on purpose (the same type is pinned full elsewhere).
EMPTY_ON_PURPOSE = {"MessagesAppended.messages[*].tool_calls"}  # the runtime's messages make no calls (see ModelReplied)


@pytest.mark.parametrize("step", SAMPLES, ids=lambda step: type(step).__name__)
def test_every_field_of_every_sample_is_set(step: Step) -> None:
    assert set(_unset(step, type(step).__name__)) - EMPTY_ON_PURPOSE == set()


# ---- the bytes are pinned ---------------------------------------------------------------------


def test_the_golden_file_has_one_line_per_kind_in_order() -> None:
    assert GOLDEN.exists(), f"no {GOLDEN.name}: write it with `.venv/bin/python tests/store/test_payloads.py` (see the docstring)"
    assert [kind_of(line) for line in golden_lines(GOLDEN)] == [kind.__name__ for kind in STEPS]


@pytest.mark.parametrize("index", range(len(STEPS)), ids=[kind.__name__ for kind in STEPS])
def test_each_kind_encodes_to_the_pinned_bytes(index: int) -> None:
    pinned = golden_lines(GOLDEN)[index]
    assert payloads.encode(SAMPLES[index]) == pinned, (
        f"the on-disk form of {type(SAMPLES[index]).__name__} changed: bump payloads.PAYLOAD_VERSION, add an upgrade "
        "from the older version to payloads.UPGRADES, and write the new golden file (see this module's docstring)"
    )


@pytest.mark.parametrize("index", range(len(STEPS)), ids=[kind.__name__ for kind in STEPS])
def test_each_pinned_line_decodes_to_an_equal_step(index: int) -> None:
    step = payloads.decode(golden_lines(GOLDEN)[index])
    assert type(step) is STEPS[index]
    assert step == SAMPLES[index]


def test_the_envelope_names_the_version_and_the_kind() -> None:
    for line, step in zip(golden_lines(GOLDEN), SAMPLES, strict=True):
        envelope = json.loads(line)
        assert list(envelope) == ["v", "k", "d"]
        assert (envelope["v"], envelope["k"]) == (payloads.PAYLOAD_VERSION, type(step).__name__)


def golden_files() -> list[Path]:
    return sorted(FIXTURES.glob("journal-payloads-v*.jsonl"))


def test_a_reply_of_payload_4_reads_its_tokens_as_input_and_its_cost_as_unpriced() -> None:
    """Before 5 a reply had one figure: its split is unknown (docs/usage.md#older-journals)."""
    [line] = [line for line in golden_lines(FIXTURES / "journal-payloads-v4.jsonl") if kind_of(line) == "ModelReplied"]
    step = payloads.decode(line)
    assert isinstance(step, ModelReplied)
    assert step.split == Tokens(input=step.tokens) and step.split.total == step.tokens
    assert step.cost == Cost(0, "", priced=False)
    usage = step.usage
    assert (usage.own_split.total, usage.total_split.total) == (usage.own_tokens, usage.total_tokens)
    assert usage.own_cost.priced is False and usage.total_cost.priced is False


@pytest.mark.parametrize("path", golden_files(), ids=lambda path: path.name)
def test_every_version_ever_pinned_still_decodes(path: Path) -> None:
    """A store written by an older release replays: each older golden file's lines decode
    (through payloads.UPGRADES) to a step of the same kind."""
    match = re.fullmatch(r"journal-payloads-v(\d+)\.jsonl", path.name)
    assert match is not None and int(match.group(1)) <= payloads.PAYLOAD_VERSION
    for line in golden_lines(path):
        step = payloads.decode(line)
        assert type(step).__name__ == kind_of(line)


def test_a_payload_of_a_newer_version_is_refused() -> None:
    newer = b'{"v":99,"k":"Closed","d":{"handle_id":"root/worker.1"}}'
    with pytest.raises(payloads.PayloadTooNew, match="99"):
        payloads.decode(newer)
    with pytest.raises(payloads.PayloadTooNew):
        payloads.decode(payloads.encode(SAMPLES[0]).replace(b'"v":%d' % payloads.PAYLOAD_VERSION, b'"v":99', 1))


if __name__ == "__main__":
    if GOLDEN.exists() and "--force" not in sys.argv[1:]:
        sys.exit(
            f"{GOLDEN} exists: a released payload version is never rewritten. Bump payloads.PAYLOAD_VERSION "
            "(with an upgrade) to pin a new one; --force only for a file no release has shipped."
        )
    GOLDEN.write_bytes(b"".join(line + b"\n" for line in encoded()))
    print(f"wrote {GOLDEN} ({len(SAMPLES)} kinds, payload version {payloads.PAYLOAD_VERSION})")
