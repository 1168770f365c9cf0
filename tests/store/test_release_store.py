"""A store written by the first release (tests/fixtures/store-v0.1.0.db, made by
tests/fixtures/make_release_store.py at that release) opens in this version and carries
on: its pending handle resumes with the exact figures, its transcripts and events read.
So does one written by release 0.2.0 (store-v0.2.0.db, the same script at c7f6988), whose
replies carry one token figure each: they read as input, unpriced (docs/usage.md#older-journals)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc

from tests.support.servers import serve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(params=["store-v0.1.0.db", "store-v0.2.0.db"])
async def stub(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[pb_grpc.AgentRuntimeAsyncStub]:
    store = tmp_path / "store.db"
    shutil.copyfile(FIXTURES / request.param, store)
    async with serve(store=f"sqlite:///{store}") as served:
        yield served.stub


async def test_a_pending_handle_of_the_release_resumes_with_exact_figures(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    waited = await stub.Wait(pb.WaitRequest(runtime_id="legacy-pending", handle_id="root/coordinator.1"))
    pending = waited.result.pending
    assert waited.result.status == pb.STATUS_PENDING
    assert list(pending.path) == ["root", "coordinator.1", "worker.1"] and [c.name for c in pending.calls] == ["fetch"]
    answer = pb.Answer(id=pending.id, ok=True, outputs=[pb.ToolOutput(call_id=pending.calls[0].id, output="42")])
    resumed = (await stub.Resume(pb.ResumeRequest(runtime_id="legacy-pending", answer=answer))).result
    assert (resumed.status, resumed.text, resumed.turns, resumed.own_tokens, resumed.total_tokens) == (
        pb.STATUS_DONE,
        "all done",
        2,
        200,
        220,
    )
    worker = await stub.Wait(pb.WaitRequest(runtime_id="legacy-pending", handle_id="root/coordinator.1/worker.1"))
    assert (worker.result.turns, worker.result.own_tokens, worker.result.tool_calls) == (2, 20, 1)


async def test_the_release_transcripts_and_events_read(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    transcript = await stub.GetTranscript(
        pb.GetTranscriptRequest(runtime_id="legacy-done", handle_id="root/coordinator.1/worker.1")
    )
    assert [m.role for m in transcript.messages] == ["user", "assistant", "tool", "assistant"]
    assert transcript.messages[2].content == "42" and transcript.messages[3].content == "fetched"
    listed = await stub.List(pb.ListRequest(runtime_id="legacy-done"))
    assert [(v.handle_id, v.state, v.total_tokens) for v in listed.handles] == [
        ("root/coordinator.1", pb.HANDLE_STATE_IDLE, 220),
        ("root/coordinator.1/worker.1", pb.HANDLE_STATE_IDLE, 20),
    ]
    stream = stub.Watch(pb.WatchRequest(runtime_id="legacy-done"))
    first = await stream.read()
    assert isinstance(first, pb.WatchResponse)
    assert first.event.seq == 1 and first.event.spawned.agent == "coordinator"
    stream.cancel()


async def test_list_runtimes_counts_the_release_runtimes_handles(stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    """The schema migration replays each release runtime once for what ListRuntimes shows."""
    listed = {row.runtime_id: row for row in (await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes}
    figures = {key: (row.handle_count, row.running_count, row.suspended_count) for key, row in listed.items()}
    assert figures == {"legacy-done": (2, 0, 0), "legacy-pending": (2, 0, 2)}, figures
    for runtime_id, row in listed.items():  # and what its handles spent: its roots' totals
        roots = [v for v in (await stub.List(pb.ListRequest(runtime_id=runtime_id))).handles if v.parent_id == "root"]
        assert row.total_tokens == sum(v.total_tokens for v in roots) > 0
        assert (row.total_cost.micros, row.total_cost.priced) == (0, all(v.total_cost.priced for v in roots))


def fields(usage: pb.Usage) -> tuple[int, ...]:
    return (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens, usage.output_tokens, usage.reasoning_tokens)


async def test_an_older_journal_keeps_its_totals_with_its_tokens_read_as_input_and_unpriced(
    stub: pb_grpc.AgentRuntimeAsyncStub,
) -> None:
    done = (await stub.Wait(pb.WaitRequest(runtime_id="legacy-done", handle_id="root/coordinator.1"))).result
    worker = (await stub.Wait(pb.WaitRequest(runtime_id="legacy-done", handle_id="root/coordinator.1/worker.1"))).result
    assert (done.own_tokens, done.total_tokens, worker.total_tokens) == (200, 220, 20)
    assert fields(done.own_usage) == (200, 0, 0, 0, 0) and done.own_usage.total_tokens == 200
    assert fields(done.total_usage) == (220, 0, 0, 0, 0) and done.total_usage.total_tokens == 220
    assert fields(worker.total_usage) == (20, 0, 0, 0, 0)
    assert (done.own_cost.micros, done.own_cost.priced, done.total_cost.priced) == (0, False, False)

    # Carried on: the new turns split as they come, the old ones stay input; the sums hold field by field.
    pending = (await stub.Wait(pb.WaitRequest(runtime_id="legacy-pending", handle_id="root/coordinator.1"))).result.pending
    answer = pb.Answer(id=pending.id, ok=True, outputs=[pb.ToolOutput(call_id=pending.calls[0].id, output="42")])
    lead = (await stub.Resume(pb.ResumeRequest(runtime_id="legacy-pending", answer=answer))).result
    child = (await stub.Wait(pb.WaitRequest(runtime_id="legacy-pending", handle_id="root/coordinator.1/worker.1"))).result
    assert (lead.own_usage.total_tokens, lead.total_usage.total_tokens) == (lead.own_tokens, lead.total_tokens) == (200, 220)
    assert child.total_usage.total_tokens == child.total_tokens == 20
    assert fields(lead.total_usage) == tuple(
        a + b for a, b in zip(fields(lead.own_usage), fields(child.total_usage), strict=True)
    )
    assert lead.own_usage.output_tokens > 0 and lead.own_usage.input_tokens > 0  # one old turn as input, one new as output
