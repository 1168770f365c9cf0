"""One runtime's life as the journal records it: two agents (a coordinator delegating to a worker)
and `story`, the groups of steps a runtime appends together, every step kind among them; and
`figures`, everything a journal builds in a tree as plain values. The store contract, the
replica and the domain tests append, replay and compare it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agentruntime_server.domain.billing.usage import Cost, Tokens
from agentruntime_server.domain.journal import (
    Answered,
    BudgetSet,
    CallFinished,
    CallStarted,
    CallSuspended,
    Closed,
    Compacted,
    Configured,
    Forked,
    Held,
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
    Tree,
    TurnStarted,
)
from agentruntime_server.domain.journal.recording import Recording
from agentruntime_server.domain.vocabulary import (
    AgentSpec,
    Answer,
    Budget,
    CompletionGate,
    Guardrail,
    GuardrailAction,
    HandleState,
    HttpExecutor,
    InboxItem,
    Limit,
    Message,
    OnExhausted,
    OnInterrupted,
    PendingRequest,
    RelayExecutor,
    RuntimeOptions,
    ScriptedReply,
    ScriptedToolCall,
    Status,
    TaskResult,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolSpec,
    UnrecordedCalls,
)

COORDINATOR = "root/coordinator.1"
WORKER = "root/coordinator.1/worker.1"
SPARE = "root/worker.1"

AGENTS = (
    AgentSpec(
        name="coordinator",
        description="the coordinator agent",
        instructions="Delegate, then charge.",
        model="gpt-test",
        tools=(
            ToolSpec(
                name="charge",
                description="charges a card",
                input_schema={"type": "object", "properties": {"cents": {"type": "integer"}}, "required": ["cents"]},
                executor=HttpExecutor("https://pay.example/charge", {"authorization": "Bearer s3cret"}, 5.0),
                approval_required=True,
                approval_prompt="Charge?",
                on_interrupted=OnInterrupted.ASK,
            ),
        ),
        team=("worker",),
        budget=Budget(max_turns=5, max_tokens=1000, max_tool_calls=10, max_wall_time=60.5, max_children=3, max_depth=2),
        completion=CompletionGate(max_attempts=2, must_match="done"),
        guardrails=(Guardrail("charge", GuardrailAction.REQUIRE_APPROVAL, "money moves"),),
        script=(ScriptedReply("hello", (ScriptedToolCall("task", '{"agent": "worker"}'),), 7, 0.25),),
        provider="scripted",
    ),
    AgentSpec(
        name="worker",
        description="the worker agent",
        tools=(
            ToolSpec("fetch", "the host's fetch", {}, RelayExecutor()),
            ToolSpec("ping", "pings", {"type": "object"}, HttpExecutor("http://127.0.0.1:9/ping")),
        ),
    ),
)


def story(tree: Tree) -> Iterator[tuple[Step, ...]]:
    """One runtime's life, as the groups of steps the runtime records together: a
    coordinator delegates to a worker that suspends on a relay call, the host answers, both
    finish; the coordinator's next effect is in flight at a crash (in doubt), its run is
    interrupted and rolled back; handles close. Every step kind a runtime records is here.
    A generator, so that each group is built from the tree as the steps before it left it."""

    def replied(handle_id: str, message: Message, split: Tokens, cost: Cost) -> ModelReplied:
        after = tree.handles[handle_id].usage.after_reply(split, cost)
        return ModelReplied(handle_id, message, split.total, after, split=split, cost=cost)

    def result(handle_id: str, status: Status, text: str = "", **more: Any) -> TaskResult:
        return TaskResult(handle_id, text, status=status, usage=tree.handles[handle_id].usage, **more)

    budget = Budget(max_turns=5, max_tokens=1000, max_tool_calls=10, max_wall_time=60.5, max_children=3, max_depth=2)
    first_note, second_note = InboxItem("first note", "ops", "alice"), InboxItem("second note", "ops", "bob")
    yield (Configured(RuntimeOptions(inbox_capacity=10, max_concurrent_model_calls=2)),)
    yield (Spawned(COORDINATOR, "", "coordinator", budget, "", 1),)
    yield Posted(COORDINATOR, first_note), Posted(COORDINATOR, second_note), Replied("req-post-2", "Post", "d2", number=2)
    yield (RunStarted(COORDINATOR, Message("user", "go\n\n[ops from alice] first note"), drained=1),)
    yield (Queued(COORDINATOR, True),)
    yield (Queued(COORDINATOR, False),)
    yield (TurnStarted(COORDINATOR, 1),)
    task = ToolCall("call_1_1", "task", '{"agent": "worker", "prompt": "fetch it"}')
    reply = Message("assistant", "delegating", (task,), turn=1)
    yield (replied(COORDINATOR, reply, Tokens(60, 20, 5, 15, 4), Cost(1_250, "USD")),)
    yield (CallStarted(COORDINATOR, task),)
    yield (Spawned(WORKER, COORDINATOR, "worker", Budget(max_turns=4, max_tokens=900), "call_1_1", 1),)
    yield (Ticked(WORKER, 1_700_000_100.5, 2),)
    yield (RunStarted(WORKER, Message("user", "fetch it")),)
    yield (TurnStarted(WORKER, 1),)
    fetch, ping = ToolCall("call_1_1", "fetch", "{}"), ToolCall("call_1_2", "ping", '{"n": 1}')
    yield (replied(WORKER, Message("assistant", "fetching", (fetch, ping), turn=1), Tokens(7, output=3), Cost(40, "USD")),)
    yield (CallStarted(WORKER, ping, effect=True),)
    yield (CallSuspended(WORKER, ping.id),)
    yield (CallStarted(WORKER, ping, effect=True),)
    yield (CallFinished(WORKER, ping, ToolResult("pong")),)
    yield (CallStarted(WORKER, fetch),)
    key = f"rt/{WORKER}/call_1_1"
    request = PendingRequest(
        id=f"{WORKER}/call_1_1:tool_call",
        kind="tool_call",
        prompt="Run fetch and Resume with one output per call",
        data={"calls": [{"id": "call_1_1", "name": "fetch", "arguments_json": "{}", "idempotency_key": key}]},
        path=tuple(WORKER.split("/")),
        calls=((fetch, key),),
    )
    yield (
        Settled(WORKER, result(WORKER, Status.PENDING, pending=request), HandleState.SUSPENDED),
        Settled(COORDINATOR, result(COORDINATOR, Status.PENDING, pending=request), HandleState.SUSPENDED),
    )
    answer = Answer(
        request.id, ok=True, data={"by": "host", "n": 2, "nested": [1, 2.5, None]}, outputs=(ToolOutput("call_1_1", "42"),)
    )
    yield (
        Answered(request.id, answer, WORKER, approved=("call_1_1",)),
        BudgetSet(WORKER, Budget(max_turns=6, max_tokens=900, on_exhausted=OnExhausted.ASK)),
        CallFinished(WORKER, fetch, ToolResult("42")),
        Replied("req-resume-1", "Resume", "d3"),
    )
    yield (RunStarted(WORKER, None),)
    yield (Compacted(WORKER, 1, Message("user", "Summary of the conversation so far:\nfetching", summary=True)),)
    yield (
        MessagesAppended(
            WORKER, (Message("tool", "42", tool_call_id="call_1_1"), Message("tool", "pong", tool_call_id="call_1_2"))
        ),
    )
    yield (TurnStarted(WORKER, 2),)
    yield (replied(WORKER, Message("assistant", "fetched", turn=2), Tokens(2, 6, output=2), Cost(priced=False)),)
    yield (Settled(WORKER, result(WORKER, Status.DONE, "fetched"), HandleState.IDLE),)
    yield (RunStarted(COORDINATOR, None),)
    yield (CallStarted(COORDINATOR, task, announce=False),)  # reattached to its settled child
    yield (
        CallFinished(COORDINATOR, task, ToolResult("fetched")),
        MessagesAppended(COORDINATOR, (Message("tool", "fetched", tool_call_id="call_1_1"),)),
    )
    yield (TurnStarted(COORDINATOR, 2),)
    charge = ToolCall("call_2_1", "charge", '{"cents": 5}')
    yield (
        replied(COORDINATOR, Message("assistant", "charging", (charge,), turn=2), Tokens(30, 50, output=20), Cost(999, "USD")),
    )
    yield (CallStarted(COORDINATOR, charge, effect=True),)
    # The process dies here; recovery finds the charge in doubt, and the run is interrupted.
    yield (InDoubt(COORDINATOR, ("call_2_1",)),)
    yield (
        Settled(
            COORDINATOR,
            result(COORDINATOR, Status.INTERRUPTED, "interrupted", is_error=True, limit=Limit.NONE),
            HandleState.IDLE,
            rollback_to=1,
            restored=(first_note,),
        ),
        MessagesAppended(COORDINATOR, (Message("tool", "not run: the run stopped", tool_call_id="call_2_1", is_error=True),)),
    )
    # A fork's and a replay's own steps (they stand here for those a fork of it would record).
    yield (Forked("rt-source", 40, ("worker",), (), ((WORKER, Budget(max_turns=6, max_tokens=900)),)),)
    yield Held(COORDINATOR), Rewound(COORDINATOR, 1, InboxItem("a note at the fork", "ops", "carol"), idle=True)
    yield (Replaying(Recording("rt-source", UnrecordedCalls.LIVE)),)
    yield (Spawned(SPARE, "", "worker", Budget(), "", 1),)
    yield Closed(SPARE), Closed(WORKER)


def figures(tree: Tree) -> dict[str, Any]:
    """Everything the journal builds in a tree, as plain comparable values."""
    handles = {
        handle.id: {
            "parent": handle.parent_id,
            "agent": handle.agent,
            "budget": handle.budget,
            "child_key": handle.child_key,
            "seq": handle.seq,
            "state": handle.state,
            "usage": handle.usage,
            "children": [child.id for child in handle.children],
            "spawned_per_agent": dict(handle.spawned_per_agent),
            "children_by_key": {key: child.id for key, child in handle.children_by_key.items()},
            "inbox": list(handle.inbox),
            "transcript": list(handle.transcript),
            "tool_results": dict(handle.tool_results),
            "started": set(handle.started),
            "last_result": handle.last_result,
            "pending": handle.pending,
            "approved": set(handle.approved),
            "in_doubt": set(handle.in_doubt),
        }
        for handle in tree.handles.values()
    }
    return {
        "handles": handles,
        "order": list(tree.handles),
        "top_level_per_agent": dict(tree.top_level_per_agent),
        "requests": {request_id: handle.id for request_id, handle in tree.requests.items()},
        "answered": dict(tree.answered),
        "running": tree.running,
    }
