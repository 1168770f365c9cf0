"""Review fixes on budgets and stops: a child whose budget asks, carved to its parent's
remaining tokens or tool calls, stops with its parent's limit instead of asking a question
no extension can answer (the parent's budget caps every one); a judge's turns are its own,
so the answer of a handle's last allowed turn is judged. And the slack of a subtree's token
budget under children running at once is what the README says: one turn per handle."""

from __future__ import annotations

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.api.test_budget_workers_review import delegates
from tests.support.build import agent, create, http_tool, run, views
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.tool_server import ToolServer


async def test_a_child_that_asks_stops_at_its_parents_token_budget_used_up_with_its_own(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    model.script("lead", delegates("w:a"))  # 10 tokens
    model.script("w", lambda body: Reply(calls=[("nothing", {})], tokens=30))
    runtime_id = await create(
        stub,
        agent("lead", team=["w"], budget=pb.Budget(max_tokens=50)),
        agent("w", budget=pb.Budget(on_exhausted=pb.ON_EXHAUSTED_ASK)),
    )
    handle_id, result = await run(stub, runtime_id, "lead", "go")
    # The child was carved the lead's 40 tokens left: when it used them up, so had the lead,
    # and any extension was refused as capped by the lead's budget. It stops instead.
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TOKENS), result
    [child] = [view for key, view in (await views(stub, runtime_id)).items() if key != handle_id]
    assert (child.budget.max_tokens, child.total_tokens) == (40, 60)
    assert (child.state, child.last_status, child.pending_kind) == (pb.HANDLE_STATE_IDLE, pb.STATUS_INCOMPLETE, "")
    assert result.total_tokens == result.own_tokens + child.total_tokens == 70


async def test_a_child_that_asks_stops_at_its_parents_tool_call_budget_used_up_with_its_own(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer, tools: ToolServer
) -> None:
    model.script("lead", delegates("w:a"))
    model.script("w", lambda body: Reply(calls=[("ping", {})] * 3) if tool_results(body) == 0 else Reply(text="pinged"))
    runtime_id = await create(
        stub,
        agent("lead", team=["w"], budget=pb.Budget(max_tool_calls=3)),
        agent("w", tools=[http_tool("ping", tools.url("ping"))], budget=pb.Budget(on_exhausted=pb.ON_EXHAUSTED_ASK)),
    )
    handle_id, result = await run(stub, runtime_id, "lead", "go")
    # The task call is under way: the child is carved 2 calls, and its 2 use up the lead's too.
    assert tools.hits["ping"] == 2
    assert result.status == pb.STATUS_DONE, result  # the lead's model reads the child's stop
    [child] = [view for key, view in (await views(stub, runtime_id)).items() if key != handle_id]
    assert (child.budget.max_tool_calls, child.tool_calls) == (2, 2)
    assert (child.state, child.last_status, child.pending_kind) == (pb.HANDLE_STATE_IDLE, pb.STATUS_INCOMPLETE, "")


async def test_a_child_that_asks_with_room_in_its_parents_budget_still_asks(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    model.script("lead", delegates("w:a"))
    model.script("w", lambda body: Reply(calls=[("nothing", {})], tokens=30))
    runtime_id = await create(
        stub,
        agent("lead", team=["w"], budget=pb.Budget(max_tokens=500)),
        agent("w", budget=pb.Budget(max_tokens=40, on_exhausted=pb.ON_EXHAUSTED_ASK)),
    )
    _, result = await run(stub, runtime_id, "lead", "go")
    assert result.status == pb.STATUS_PENDING and result.pending.kind == "budget"
    assert result.pending.data["limit"] == "LIMIT_MAX_TOKENS" and list(result.pending.path)[-1] == "w.1"


async def test_the_answer_of_the_last_allowed_turn_is_judged(stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer) -> None:
    model.script("a", lambda body: Reply(text="the answer", tokens=10))
    model.script("j", lambda body: Reply(text="PASS", tokens=5))
    runtime_id = await create(
        stub,
        agent("a", budget=pb.Budget(max_turns=1), completion=pb.CompletionGate(judge_agent="j", max_attempts=2)),
        agent("j", budget=pb.Budget(max_turns=3)),
    )
    handle_id, result = await run(stub, runtime_id, "a", "go")
    # The judge was carved the 0 turns the judged handle had left, and never judged.
    assert (result.status, result.text, result.limit) == (pb.STATUS_DONE, "the answer", pb.LIMIT_UNSPECIFIED), result
    assert (result.turns, result.own_tokens, result.total_tokens) == (1, 10, 15)
    [judge] = [view for key, view in (await views(stub, runtime_id)).items() if key != handle_id]
    assert (judge.budget.max_turns, judge.turns, judge.last_status) == (3, 1, pb.STATUS_DONE)


async def test_children_running_at_once_pass_a_token_budget_by_at_most_one_turn_each(
    stub: pb_grpc.AgentRuntimeStub, model: ScriptedModelServer
) -> None:
    model.script("lead", delegates("w:a", "w:b", "w:c"))  # 10 tokens
    model.script("w", lambda body: Reply(calls=[("nothing", {})], tokens=40, delay=0.2))
    runtime_id = await create(stub, agent("lead", team=["w"], budget=pb.Budget(max_tokens=100)), agent("w"))
    handle_id, result = await run(stub, runtime_id, "lead", "go")
    assert (result.status, result.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_MAX_TOKENS)
    children = [view for key, view in (await views(stub, runtime_id)).items() if key != handle_id]
    assert result.total_tokens == result.own_tokens + sum(child.total_tokens for child in children)
    # A turn's tokens are known when it ends: the budget is passed by the turns under way
    # when it is reached, at most one per handle of the subtree (README, Budgets and stops).
    assert result.total_tokens < 100 + 40 * len(children)
    assert all(child.last_status == pb.STATUS_INCOMPLETE for child in children)
