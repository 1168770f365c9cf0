"""A stateful test: random sequences of the verbs against one runtime, invariants after each.

Hypothesis drives one runtime of a real server (SQLite store, the embedded scripted model)
through Spawn, Post, Wake, Wait, Resume (right, wrong and twice), Interrupt, Close,
Inspect, List, GetTranscript and Watch. The agents delegate (`task`, in parallel too), call
a relay tool, ask the host, need approvals and run into small budgets (turns, tokens, tool
calls, wall time, a budget that asks). After every step the documented invariants are
checked: canonical codes only; total_tokens >= own_tokens and a parent's total is its own
plus its children's totals; no figure decreases; CLOSED is final; SUSPENDED holds a
Request; limit/pending/failure are set iff their status says so; the event log has no gap,
never changes its past and agrees with Inspect; a transcript only grows (an Interrupt rolls
its run back); Wait and a retried Resume repeat their result; a closed handle takes no Post
or Wake.

`AGENTRUNTIME_STATEFUL_EXAMPLES` runs more examples (e.g. 300) to hunt; CI runs a few."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.support.build import agent, duration, struct
from tests.support.server_thread import ServerThread

Code = grpc.StatusCode
CLIENT_CODES = {
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.FAILED_PRECONDITION,
    Code.RESOURCE_EXHAUSTED,
}
CALL_TIMEOUT = 30.0
INBOX_CAPACITY = 3
S = pb.HandleState
SETTLED_STATES = {S.HANDLE_STATE_IDLE, S.HANDLE_STATE_SUSPENDED, S.HANDLE_STATE_CLOSED}
IN_FLIGHT = {S.HANDLE_STATE_RUNNING, S.HANDLE_STATE_QUEUED}
EXAMPLES = int(os.environ.get("AGENTRUNTIME_STATEFUL_EXAMPLES", "0"))


# ---- the agents ---------------------------------------------------------------------------


def reply(
    text: str = "", calls: tuple[tuple[str, dict[str, Any]], ...] = (), tokens: int = 10, delay: float = 0.0
) -> pb.ScriptedReply:
    scripted = pb.ScriptedReply(
        text=text,
        tool_calls=[pb.ScriptedToolCall(name=name, arguments_json=json.dumps(args)) for name, args in calls],
        tokens=tokens,
    )
    if delay:
        scripted.delay.CopyFrom(duration(delay))
    return scripted


def task(name: str) -> tuple[str, dict[str, Any]]:
    return ("task", {"agent": name, "prompt": f"please, {name}"})


def scripted(name: str, *replies: pb.ScriptedReply, **fields: Any) -> pb.AgentDef:
    return agent(name, script=pb.Script(replies=list(replies)), **fields)


def relay(name: str, approval: bool = False) -> pb.ToolDef:
    tool = pb.ToolDef(name=name, description=f"the {name} tool (the host runs it)", relay=pb.RelayTool())
    tool.input_schema.update({"type": "object"})
    if approval:
        tool.approval.CopyFrom(pb.ApprovalPolicy(required=True, prompt=f"may I {name}?"))
    return tool


AGENTS = [
    # Delegates one child, then two at once, then answers.
    scripted(
        "lead",
        reply(calls=(task("worker"),), tokens=10),
        reply(calls=(task("asker"), task("quick")), tokens=10),
        reply("lead done", tokens=10),
        team=["asker", "quick", "worker"],
        budget=pb.Budget(max_tool_calls=6),
    ),
    # The host runs its tool (a tool_call Request).
    scripted(
        "worker", reply(calls=(("deploy", {"version": "v2"}),), tokens=5), reply("deployed", tokens=5), tools=[relay("deploy")]
    ),
    # The built-in ask (an input Request).
    scripted("asker", reply(calls=(("ask", {"question": "which one?"}),), tokens=5), reply("thanks", tokens=5)),
    # An approval, then (approved) the relay call itself.
    scripted(
        "gated", reply(calls=(("publish", {}),), tokens=4), reply("published", tokens=4), tools=[relay("publish", approval=True)]
    ),
    scripted("quick", reply("quick", tokens=3, delay=0.02)),
    scripted("slow", reply("slow", tokens=7, delay=0.4)),
    # Runs past its wall time.
    scripted("sleepy", reply("late", tokens=2, delay=0.5), budget=pb.Budget(max_wall_time=duration(0.1))),
    # Delegates for ever: stopped by its turns or its tool calls.
    scripted("looper", reply(calls=(task("quick"),), tokens=6), team=["quick"], budget=pb.Budget(max_turns=3, max_tool_calls=2)),
    # Spends past its tokens.
    scripted("greedy", reply(calls=(task("quick"),), tokens=40), team=["quick"], budget=pb.Budget(max_tokens=50)),
    # Asks the host for more turns when it runs out.
    scripted(
        "needy",
        reply(calls=(task("quick"),), tokens=5),
        team=["quick"],
        budget=pb.Budget(max_turns=1, on_exhausted=pb.ON_EXHAUSTED_ASK),
    ),
]
AGENT_NAMES = [a.name for a in AGENTS]
PICK = st.integers(0, 2**16)


# ---- the server, on a thread of its own so that the machine's rules stay synchronous ---------


class Errors(logging.Handler):
    """ERROR records and tracebacks the server logs: a bug of ours, whatever the caller did."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info is not None:
            self.records.append(f"{record.name}: {record.getMessage()[:500]}")


class Harness:
    def __init__(self) -> None:
        self.directory = tempfile.TemporaryDirectory()
        self.server = ServerThread(
            "stateful-server", store=f"sqlite:///{Path(self.directory.name) / 'store.db'}", inbox_capacity=INBOX_CAPACITY
        )
        self.errors = Errors()
        logging.getLogger().addHandler(self.errors)
        port = self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.AgentRuntimeStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.server.stop()
        logging.getLogger().removeHandler(self.errors)
        self.directory.cleanup()


HARNESS: Harness | None = None


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    global HARNESS
    HARNESS = Harness()
    try:
        yield HARNESS
    finally:
        HARNESS.close()
        HARNESS = None


# ---- checks shared by the machine and the regression tests ---------------------------------


def check_result(result: pb.TaskResult, where: str) -> None:
    assert result.total_tokens >= result.own_tokens, f"{where}: total < own in {result}"
    assert (result.limit != pb.LIMIT_UNSPECIFIED) == (result.status == pb.STATUS_INCOMPLETE), (
        f"{where}: limit iff INCOMPLETE: {result}"
    )
    assert result.HasField("pending") == (result.status == pb.STATUS_PENDING), f"{where}: pending iff PENDING: {result}"
    assert result.HasField("failure") == (result.status == pb.STATUS_ERROR), f"{where}: failure iff ERROR: {result}"
    assert result.failure.reason != pb.FAILURE_REASON_RUNTIME, f"{where}: the runtime failed: {result}"
    assert result.status != pb.STATUS_UNSPECIFIED, f"{where}: {result}"


def check_tree(views: dict[str, pb.HandleView]) -> None:
    """The bill adds up: every parent's total is its own plus its children's totals."""
    children: dict[str, list[pb.HandleView]] = {}
    for view in views.values():
        children.setdefault(view.parent_id, []).append(view)
    for view in views.values():
        assert view.total_tokens >= view.own_tokens, f"total < own: {view}"
        below = sum(child.total_tokens for child in children.get(view.handle_id, []))
        assert view.total_tokens == view.own_tokens + below, (
            f"{view.handle_id}: total {view.total_tokens} != own {view.own_tokens} + children {below}"
        )
        assert (view.state == S.HANDLE_STATE_SUSPENDED) == bool(view.pending_kind), f"pending_kind iff SUSPENDED: {view}"


def figures(item: pb.HandleView | pb.TaskResult) -> tuple[int, int, int, int]:
    return (item.turns, item.own_tokens, item.total_tokens, item.tool_calls)


# ---- the machine ------------------------------------------------------------------------------


class Fault(Exception):
    """A call answered with a code no caller mistake may get."""


class RuntimeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert HARNESS is not None
        self.harness = HARNESS
        self.stub = HARNESS.stub
        self.errors_seen = len(HARNESS.errors.records)
        self.runtime = f"st-{uuid.uuid4().hex[:12]}"
        self.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id=self.runtime, agents=AGENTS), timeout=CALL_TIMEOUT)
        self.handles: list[str] = []  # every handle the runtime has (host-spawned and delegated)
        self.high: dict[str, tuple[int, int, int, int]] = {}  # the highest figures read of each handle
        self.closed: set[str] = set()
        self.transcripts: dict[str, list[bytes]] = {}
        self.events: list[bytes] = []  # every event read so far, serialized
        self.answered: list[pb.Answer] = []  # answers the server took, to send again
        self.views: dict[str, pb.HandleView] = {}

    # -- calling ---------------------------------------------------------------------------

    def call(self, method: str, request: Any, expect: set[Code] | None = None) -> Any:
        """The reply, or None for a canonical client error (the code must be in `expect`)."""
        try:
            return getattr(self.stub, method)(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            code = error.code()
            allowed = CLIENT_CODES if expect is None else expect
            if code not in allowed:
                raise Fault(f"{method}({request}) answered {code}: {error.details()}") from None
            return None

    def listing(self) -> dict[str, pb.HandleView]:
        listed = self.stub.List(pb.ListRequest(runtime_id=self.runtime), timeout=CALL_TIMEOUT)
        views = {view.handle_id: view for view in listed.handles}
        for handle_id in views:
            if handle_id not in self.handles:
                self.handles.append(handle_id)
        return views

    def saw(self, handle_id: str, item: pb.HandleView | pb.TaskResult, where: str) -> None:
        """No figure decreases between two reads of the same handle."""
        now = figures(item)
        before = self.high.get(handle_id, (0, 0, 0, 0))
        assert all(a >= b for a, b in zip(now, before, strict=True)), (
            f"{where}: the figures (turns, own, total, tool calls) of {handle_id} went from {before} to {now}"
        )
        self.high[handle_id] = now

    def quiet(self, views: dict[str, pb.HandleView]) -> bool:
        return not any(view.state in IN_FLIGHT for view in views.values())

    def settle(self, seconds: float = 3.0) -> dict[str, pb.HandleView]:
        """Lets runs in flight finish (every script ends within a second or so)."""
        views = self.listing()
        for _ in range(int(seconds / 0.02)):
            if self.quiet(views):
                break
            time.sleep(0.02)
            views = self.listing()
        return views

    def some_handle(self, pick: int) -> str:
        """Mostly an open handle: a closed one only refuses. (Drawn as a number, not from the
        list: what the list holds depends on the server's timing, and hypothesis replays
        draws.)"""
        open_handles = [handle for handle in self.handles if handle not in self.closed]
        among = open_handles if open_handles and pick % 5 else self.handles
        return among[pick // 5 % len(among)]

    # -- rules -----------------------------------------------------------------------------

    @rule(pick=PICK, agent_name=st.sampled_from(AGENT_NAMES), under_root=st.booleans(), override=st.booleans())
    def spawn(self, pick: int, agent_name: str, under_root: bool, override: bool) -> None:
        parent = "root" if under_root or not self.handles else self.some_handle(pick)
        budget = pb.Budget(max_turns=2, max_children=1) if override else None
        spawned = self.call("Spawn", pb.SpawnRequest(runtime_id=self.runtime, parent_id=parent, agent=agent_name, budget=budget))
        if parent in self.closed:
            assert spawned is None, f"Spawn under closed {parent} was accepted"
        if spawned is not None:
            assert spawned.handle_id not in self.handles
            self.handles.append(spawned.handle_id)

    @rule(pick=PICK, agent_name=st.sampled_from(AGENT_NAMES), under_root=st.booleans())
    def spawn_and_wake(self, pick: int, agent_name: str, under_root: bool) -> None:
        self.spawn(pick, agent_name, under_root, override=False)
        self.wake(pick, self.handles[-1] if self.handles else None)

    @rule(pick=PICK, text=st.sampled_from(["hello", "status?", "more work"]))
    def post(self, pick: int, text: str) -> None:
        if not self.handles:
            return
        handle = self.some_handle(pick)
        posted = self.call("Post", pb.PostRequest(runtime_id=self.runtime, handle_id=handle, text=text))
        if handle in self.closed:
            assert posted is None, f"Post to closed {handle} was accepted"

    @rule(pick=PICK)
    def wake(self, pick: int, handle: str | None = None) -> None:
        if not self.handles:
            return
        handle = handle or self.some_handle(pick)
        before = self.listing().get(handle)
        woken = self.call("Wake", pb.WakeRequest(runtime_id=self.runtime, handle_id=handle, prompt="go"))
        if handle in self.closed or (before is not None and before.state == S.HANDLE_STATE_SUSPENDED):
            assert woken is None, f"Wake of {handle} ({before}) was accepted"

    @rule(pick=PICK, timeout=st.sampled_from([0.0, 0.05, 0.3]))
    def wait(self, pick: int, timeout: float) -> None:
        if not self.handles:
            return
        handle = self.some_handle(pick)
        waited = self.call("Wait", pb.WaitRequest(runtime_id=self.runtime, handle_id=handle, timeout=duration(timeout)))
        if waited is None:
            assert handle not in self.closed, f"Wait on closed {handle} failed"
            return
        result = waited.result
        check_result(result, f"Wait({handle})")
        self.saw(handle, result, "Wait")
        if handle in self.closed:
            assert result.status == pb.STATUS_CLOSED, f"Wait on closed {handle}: {result}"
        views = self.listing()
        if self.quiet(views) and result.status != pb.STATUS_TIMEOUT:
            again = self.call("Wait", pb.WaitRequest(runtime_id=self.runtime, handle_id=handle, timeout=duration(0)))
            assert again is not None
            assert (again.result.status, again.result.text, again.result.pending) == (
                result.status,
                result.text,
                result.pending,
            ), f"two Waits on settled {handle}: {result} then {again.result}"

    def live_requests(self) -> list[pb.Request]:
        requests = {}
        for handle_id, view in self.listing().items():
            if view.state == S.HANDLE_STATE_SUSPENDED:
                waited = self.call("Wait", pb.WaitRequest(runtime_id=self.runtime, handle_id=handle_id, timeout=duration(0)))
                if waited is not None and waited.result.status == pb.STATUS_PENDING:
                    requests[waited.result.pending.id] = waited.result.pending
        return list(requests.values())

    @staticmethod
    def answer_for(request: pb.Request, ok: bool, extend_by: int) -> pb.Answer:
        answer = pb.Answer(id=request.id, ok=ok, reason="" if ok else "no")
        if request.kind == "tool_call" and ok:
            answer.outputs.extend(pb.ToolOutput(call_id=call.id, output=f"ran {call.name}") for call in request.calls)
        elif request.kind == "input" and ok:
            answer.data.CopyFrom(struct({"answer": "the first"}))
        elif request.kind == "budget" and ok:
            field = request.data["field"] if "field" in request.data else "max_turns"
            used = request.data["used"] if "used" in request.data else 0
            assert isinstance(used, (int, float)), used  # a figure
            answer.data.CopyFrom(struct({"extend": {field: int(used) + extend_by}}))
        return answer

    @rule(
        pick=PICK,
        how=st.sampled_from(["right", "right", "right", "twice", "wrong_id", "other_answer", "bad_output", "again"]),
        ok=st.booleans(),
        extend_by=st.integers(1, 2),
    )
    def resume(self, pick: int, how: str, ok: bool, extend_by: int) -> None:
        if how == "again":
            if not self.answered:
                return
            answer = self.answered[pick % len(self.answered)]
            resumed = self.call("Resume", pb.ResumeRequest(runtime_id=self.runtime, answer=answer))
            if resumed is not None:
                check_result(resumed.result, "Resume again")
                self.saw(resumed.result.handle_id, resumed.result, "Resume again")
            return
        requests = self.live_requests()
        if not requests:
            return
        request = requests[pick % len(requests)]
        answer = self.answer_for(request, ok, extend_by)
        if how == "wrong_id":
            answer.id = request.id + "x"
            resumed = self.call("Resume", pb.ResumeRequest(runtime_id=self.runtime, answer=answer), {Code.FAILED_PRECONDITION})
            assert resumed is None
            return
        if how == "bad_output":
            answer.ok = True
            answer.outputs.append(pb.ToolOutput(call_id="no-such-call", output="x"))
            resumed = self.call("Resume", pb.ResumeRequest(runtime_id=self.runtime, answer=answer), {Code.INVALID_ARGUMENT})
            assert resumed is None
            return
        resumed = self.call("Resume", pb.ResumeRequest(runtime_id=self.runtime, answer=answer))
        if resumed is None:
            return
        self.answered.append(answer)
        result = resumed.result
        check_result(result, "Resume")
        self.saw(result.handle_id, result, "Resume")
        if how == "twice":
            again = self.call("Resume", pb.ResumeRequest(runtime_id=self.runtime, answer=answer))
            assert again is not None, "the same Resume again was refused"
            check_result(again.result, "Resume twice")
            self.saw(again.result.handle_id, again.result, "Resume twice")
            if self.quiet(self.listing()):
                assert (again.result.handle_id, again.result.status, again.result.text) == (
                    result.handle_id,
                    result.status,
                    result.text,
                ), f"a retried Resume: {result} then {again.result}"
        elif how == "other_answer":
            other = pb.Answer(id=answer.id, ok=not answer.ok, reason="changed my mind")
            changed = self.call("Resume", pb.ResumeRequest(runtime_id=self.runtime, answer=other), {Code.FAILED_PRECONDITION})
            assert changed is None, "the same Request answered twice, differently"

    @rule(pick=PICK)
    def interrupt(self, pick: int) -> None:
        if not self.handles:
            return
        handle = self.some_handle(pick)
        self.call("Interrupt", pb.InterruptRequest(runtime_id=self.runtime, handle_id=handle))
        # An interrupted run is rolled back: its transcript entries are dropped (documented).
        for other in list(self.transcripts):
            if other == handle or other.startswith(handle + "/"):
                del self.transcripts[other]

    @rule(pick=PICK, whole=st.sampled_from([False, False, False, False, True]), force=st.booleans(), now=st.booleans())
    def close(self, pick: int, whole: bool, force: bool, now: bool) -> None:
        if not now or (not whole and not self.handles):
            return  # (drawn as often as the others, Close would leave little open to drive)
        target = "root" if whole else self.some_handle(pick)
        closed = self.call("Close", pb.CloseRequest(runtime_id=self.runtime, handle_id=target, force=force))
        if closed is None:
            return
        self.closed.update(closed.closed_handle_ids)
        views = self.listing()
        scope = [h for h in views if target == "root" or h == target or h.startswith(target + "/")]
        for handle_id in scope:
            assert views[handle_id].state == S.HANDLE_STATE_CLOSED, f"Close({target}) left {views[handle_id]}"
        self.closed.update(scope)
        for handle_id in scope:
            posted = self.call(
                "Post", pb.PostRequest(runtime_id=self.runtime, handle_id=handle_id, text="hi"), {Code.FAILED_PRECONDITION}
            )
            woken = self.call(
                "Wake", pb.WakeRequest(runtime_id=self.runtime, handle_id=handle_id, prompt="go"), {Code.FAILED_PRECONDITION}
            )
            assert posted is None and woken is None

    # Runs and answers are where the bugs hide: they get drawn more often than the reads.
    @rule(pick=PICK)
    def wake_more(self, pick: int) -> None:
        self.wake(pick)

    @rule(pick=PICK, ok=st.sampled_from([True, True, False]), extend_by=st.integers(1, 2))
    def resume_more(self, pick: int, ok: bool, extend_by: int) -> None:
        self.resume(pick, "right", ok, extend_by)

    @rule(pick=PICK)
    def inspect(self, pick: int) -> None:
        if not self.handles:
            return
        handle = self.some_handle(pick)
        view = self.stub.Inspect(pb.InspectRequest(runtime_id=self.runtime, handle_id=handle), timeout=CALL_TIMEOUT).handle
        self.saw(handle, view, "Inspect")
        assert view.total_tokens >= view.own_tokens

    @rule(pick=PICK)
    def transcript(self, pick: int) -> None:
        if not self.handles:
            return
        handle = self.some_handle(pick)
        page = self.stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=self.runtime, handle_id=handle), timeout=CALL_TIMEOUT)
        now = [message.SerializeToString(deterministic=True) for message in page.messages]
        before = self.transcripts.get(handle, [])
        assert now[: len(before)] == before, f"the transcript of {handle} changed its past: {before} then {now}"
        self.transcripts[handle] = now

    @rule()
    def watch(self) -> None:
        views = self.settle()
        events = self.read_events()
        if self.quiet(views) and self.quiet(self.listing()):
            self.check_events_agree(events, views)

    def read_events(self) -> list[pb.Event]:
        """The whole history: the events so far (a stream that waits for more is cut short)."""
        events: list[pb.Event] = []
        stream = self.stub.Watch(pb.WatchRequest(runtime_id=self.runtime, after_seq=0), timeout=0.3)
        try:
            for response in stream:
                events.append(response.event)
        except grpc.RpcError as error:
            if error.code() != Code.DEADLINE_EXCEEDED:
                raise Fault(f"Watch answered {error.code()}: {error.details()}") from None
        assert [event.seq for event in events] == list(range(1, len(events) + 1)), "the event log has a gap"
        raw = [event.SerializeToString(deterministic=True) for event in events]
        assert raw[: len(self.events)] == self.events[: len(raw)], "the event log changed its past"
        self.events = raw if len(raw) > len(self.events) else self.events
        return events

    def check_events_agree(self, events: list[pb.Event], views: dict[str, pb.HandleView]) -> None:
        last_state: dict[str, int] = {}
        last_result: dict[str, pb.TaskResult] = {}
        turn_ended: dict[str, pb.TurnEnded] = {}
        for event in events:
            kind = event.WhichOneof("payload")
            if kind == "state_changed":
                last_state[event.handle_id] = event.state_changed.state
            elif kind == "result":
                check_result(event.result, f"RESULT event {event.seq}")
                last_result[event.handle_id] = event.result
            elif kind == "turn_ended":
                before = turn_ended.get(event.handle_id)
                if before is not None:
                    assert event.turn_ended.own_tokens >= before.own_tokens
                    assert event.turn_ended.total_tokens >= before.total_tokens
                turn_ended[event.handle_id] = event.turn_ended
        for handle_id, view in views.items():
            assert last_state.get(handle_id, S.HANDLE_STATE_IDLE) == view.state, (
                f"{handle_id}: the last StateChanged says {last_state.get(handle_id)}, Inspect {view}"
            )
            result = last_result.get(handle_id)
            if result is None:
                assert view.last_status == pb.STATUS_UNSPECIFIED, f"{handle_id} settled with no RESULT event: {view}"
                continue
            assert result.status == view.last_status, f"{handle_id}: the last RESULT event {result} vs {view}"
            assert (result.turns, result.own_tokens, result.tool_calls) == (view.turns, view.own_tokens, view.tool_calls), (
                f"{handle_id}: the last RESULT event's figures {result} vs Inspect {view}"
            )
            assert result.total_tokens <= view.total_tokens
            ended = turn_ended.get(handle_id)
            if ended is not None:
                assert ended.own_tokens <= view.own_tokens

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        views = self.listing()
        check_tree(views)
        for handle_id, view in views.items():
            self.saw(handle_id, view, "List")
            before = self.views.get(handle_id)
            if before is not None and before.state == S.HANDLE_STATE_CLOSED:
                assert view.state == S.HANDLE_STATE_CLOSED, f"closed {handle_id} came back: {view}"
            if handle_id in self.closed:
                assert view.state == S.HANDLE_STATE_CLOSED, f"closed {handle_id} is {view}"
        self.views = views
        assert self.harness.errors.records[self.errors_seen :] == [], "the server logged an error"

    def teardown(self) -> None:
        try:
            views = self.settle()
            self.read_events()
            if self.quiet(views):
                self.check_events_agree(self.read_events(), self.listing())
        finally:
            self.call("Close", pb.CloseRequest(runtime_id=self.runtime, handle_id="root", force=True))


def run_machine(examples: int, steps: int) -> None:
    current = settings.default
    assert current is not None  # hypothesis loads its default profile on import
    RuntimeMachine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=examples <= 10,
        database=None if examples <= 10 else current.database,
    )
    RuntimeMachine.TestCase().runTest()


def test_random_sequences_of_verbs_keep_the_invariants(harness: Harness) -> None:
    run_machine(EXAMPLES or 6, 25 if not EXAMPLES else 40)
