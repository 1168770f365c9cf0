"""A delegating run to fork and replay (a lead, two workers, an http tool called three times,
an approval and a relay call), and the helpers that drive a runtime to its end and read its
events (tests/api/test_forks.py, test_replays.py)."""

from __future__ import annotations

import json
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from google.protobuf import json_format

from tests.support.build import agent, http_tool
from tests.support.model_server import Reply, ScriptedModelServer, last_user, tool_results
from tests.support.tool_server import ToolServer

LEAD = "root/lead.1"


def definitions(tools: ToolServer, lead_instructions: str = "Lead.") -> list[pb.AgentDef]:
    commit = http_tool("commit", tools.url("commit"))
    commit.approval.CopyFrom(pb.ApprovalPolicy(required=True, prompt="Commit?"))
    deploy = pb.ToolDef(name="deploy", description="deploys", relay=pb.RelayTool())
    return [
        agent("lead", instructions=lead_instructions, team=["worker"], tools=[deploy]),
        agent("worker", instructions="Work.", tools=[http_tool("fetch", tools.url("fetch")), commit]),
    ]


def script(model: ScriptedModelServer) -> None:
    def lead(body: dict[str, Any]) -> Reply:
        done = tool_results(body)
        if done == 0:
            return Reply(calls=[("task", {"agent": "worker", "prompt": "part A"})], tokens=11)
        if done == 1:
            return Reply(calls=[("task", {"agent": "worker", "prompt": "part B"})], tokens=12)
        if done == 2:
            return Reply(calls=[("deploy", {"where": "prod"})], tokens=13)
        return Reply(text="lead done", tokens=14)

    def worker(body: dict[str, Any]) -> Reply:
        done, part = tool_results(body), last_user(body)
        if "part A" in part:
            steps: list[Reply] = [
                Reply(calls=[("fetch", {"page": 1})], tokens=5),
                Reply(calls=[("fetch", {"page": 2})], tokens=6),
            ]
            final = "A done"
        else:
            steps = [Reply(calls=[("fetch", {"page": 3})], tokens=7), Reply(calls=[("commit", {})], tokens=8)]
            final = "B done"
        return steps[done] if done < len(steps) else Reply(text=final, tokens=9)

    model.script("lead", lead)
    model.script("worker", worker)


async def finish(
    stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str = LEAD, approve: bool = True, prompt: str = "ship it"
) -> pb.TaskResult:
    """Drives the handle to its end: woken on `prompt` if it never ran, a held run woken,
    approvals answered, the relay call given its output."""
    for _ in range(12):
        view = (await stub.Inspect(pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id))).handle
        if view.state == pb.HANDLE_STATE_IDLE and view.last_status == pb.STATUS_UNSPECIFIED:
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt=prompt))
        elif view.state == pb.HANDLE_STATE_HELD or any(
            v.state == pb.HANDLE_STATE_HELD for v in (await stub.List(pb.ListRequest(runtime_id=runtime_id))).handles
        ):
            await stub.Wake(pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id))
        result = (await stub.Wait(pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id), timeout=60)).result
        if result.status != pb.STATUS_PENDING:
            return result
        pending = result.pending
        if pending.kind == "approval":
            answer = pb.Answer(id=pending.id, ok=approve, reason="" if approve else "not today")
        else:
            answer = pb.Answer(
                id=pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="deployed") for call in pending.calls]
            )
        await stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer), timeout=60)
    raise AssertionError(f"{handle_id} did not finish")


async def events(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, upto: int) -> list[pb.Event]:
    """The runtime's events 1..upto (it has them all already)."""
    found: list[pb.Event] = []
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, batch=True), timeout=30)
    try:
        async for response in call:
            found.extend(response.events or [response.event])
            if found and found[-1].seq >= upto:
                break
    finally:
        call.cancel()
    return [event for event in found if event.seq <= upto]


async def last_seq(stub: pb_grpc.AgentRuntimeAsyncStub, runtime_id: str, handle_id: str = LEAD) -> int:
    """The seq of the last event of a runtime whose `handle_id` (its only top-level handle) has
    settled, idle, for good: its state change to IDLE after a result that is not PENDING."""
    settled = False
    call = stub.Watch(pb.WatchRequest(runtime_id=runtime_id, batch=True), timeout=30)
    try:
        async for response in call:
            for event in response.events or [response.event]:
                if event.handle_id != handle_id:
                    continue
                if event.WhichOneof("payload") == "result":
                    settled = event.result.status != pb.STATUS_PENDING
                elif (
                    settled
                    and event.WhichOneof("payload") == "state_changed"
                    and event.state_changed.state == pb.HANDLE_STATE_IDLE
                ):
                    return event.seq
    finally:
        call.cancel()
    raise AssertionError(f"{handle_id} never settled")


def figures_at(events: list[pb.Event]) -> dict[str, dict[str, int]]:
    """Each handle's turns, own and total tokens and tool calls, from the events alone: its
    own figures from its turn_ended and tool_call_ended events, a total as its own plus its
    children's totals."""
    own: dict[str, dict[str, int]] = {}
    parents: dict[str, str] = {}
    for event in events:
        mine = own.setdefault(event.handle_id, {"turns": 0, "own_tokens": 0, "tool_calls": 0})
        kind = event.WhichOneof("payload")
        if kind == "spawned":
            parents[event.handle_id] = event.spawned.parent_id
        elif kind == "turn_ended":
            mine["turns"] += 1
            mine["own_tokens"] = event.turn_ended.own_tokens
        elif kind == "tool_call_ended":
            mine["tool_calls"] += 1

    def total(handle_id: str) -> int:
        return own[handle_id]["own_tokens"] + sum(total(child) for child, parent in parents.items() if parent == handle_id)

    return {
        handle_id: {**figures, "total_tokens": total(handle_id)} for handle_id, figures in own.items() if handle_id in parents
    }


def journal_json(event: pb.Event) -> str:
    return json.dumps(json_format.MessageToDict(event), sort_keys=True)
