"""Request ids through the runtime's verbs and the service's CreateRuntime and DeleteRuntime
(domain/runtime/request_ids.py): a call sent again with its id and the same request gets its
first answer and changes nothing; the same id with another request, or on another call, is
REQUEST_ID_REUSED; an answer counts for the request id TTL (moved by the fake clock) and a
runtime keeps its newest answers only, the oldest going first."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from agentruntime_server.domain.errors import InvalidArgument, NotFound
from agentruntime_server.domain.limits import Limits
from agentruntime_server.domain.runtime.request_ids import RequestKey
from agentruntime_server.domain.runtime.runtime import Runtime
from agentruntime_server.domain.vocabulary import Answer, RelayExecutor, Status, TaskResult, ToolOutput, ToolSpec

from tests.domain.harness import Bench, agent, bench_with, reply
from tests.domain.kit_tenancy import restarted, reused, written

WORKER = agent("worker", reply("done", tokens=7))
SLOW = agent("slow", reply("slow done", delay=10))
APPROVE = ToolSpec("approve", "the host approves", {"type": "object"}, RelayExecutor())
ASKER = agent("asker", reply(calls=(("approve", {}),)), reply("approved"), tools=(APPROVE,))


def key(request_id: str, digest: str = "first") -> RequestKey:
    """A call's request id, and the edge's digest of what the request said."""
    return RequestKey(request_id, digest)


def approval(result: TaskResult, output: str = "yes") -> Answer:
    assert result.pending is not None, result
    [(call, _)] = result.pending.calls
    return Answer(id=result.pending.id, ok=True, outputs=(ToolOutput(call.id, output),))


async def refused_as_reused(call: Awaitable[object]) -> None:
    with pytest.raises(InvalidArgument) as raised:
        await call
    assert reused(raised.value), raised.value
    assert "send a new id for a new request" in str(raised.value)


# ---- each verb sent again -------------------------------------------------------------------


async def test_a_spawn_sent_again_answers_its_handle_and_spawns_nothing(bench: Bench) -> None:
    runtime = await bench.create(WORKER)
    first = await runtime.spawn("root", "worker", None, request=key("s"))
    steps = await written(bench, runtime)
    again = await runtime.spawn("root", "worker", None, request=key("s"))
    assert again.id == first.id == "root/worker.1"
    assert (list(runtime.handles), await written(bench, runtime)) == (["root/worker.1"], steps)


async def test_a_post_sent_again_answers_the_inbox_size_it_made_and_posts_once(bench: Bench) -> None:
    runtime = await bench.create(WORKER)
    handle_id = await bench.spawn(runtime, "worker")
    assert [await runtime.post(handle_id, "a note", "", "host", request=key("p")) for _ in range(2)] == [1, 1]
    assert await runtime.post(handle_id, "another", "", "host") == 2
    assert await runtime.post(handle_id, "a note", "", "host", request=key("p")) == 1  # its first answer, still
    assert [item.text for item in runtime.handle(handle_id).inbox] == ["a note", "another"]


async def test_a_wake_sent_three_times_at_once_runs_once_and_answers_each(bench: Bench) -> None:
    runtime = await bench.create(WORKER)
    handle_id = await bench.spawn(runtime, "worker")
    answers = await asyncio.gather(*(runtime.wake(handle_id, "go", request=key("w")) for _ in range(3)))
    assert answers == [True, True, True]
    result = await runtime.wait(handle_id, None)
    assert (result.status, result.usage.turns) == (Status.DONE, 1)
    assert await runtime.wake(handle_id, "go", request=key("w"))  # settled since: the first answer, no run
    await bench.clock.settle()
    assert runtime.handle(handle_id).usage.turns == 1 and runtime.runs.get(handle_id) is None


async def test_an_interrupt_sent_again_answers_as_the_first_did(bench: Bench) -> None:
    runtime = await bench.create(SLOW)
    handle_id = await bench.spawn(runtime, "slow")
    await runtime.wake(handle_id, "go")
    assert await runtime.interrupt(handle_id, request=key("i"))  # it stopped the run
    assert (await runtime.wait(handle_id, None)).status is Status.INTERRUPTED
    assert not await runtime.interrupt(handle_id)  # nothing runs now
    assert await runtime.interrupt(handle_id, request=key("i"))  # the repeat: what the first said


async def test_a_close_sent_again_answers_the_handles_it_closed(bench: Bench) -> None:
    runtime = await bench.create(WORKER)
    spawned = [await bench.spawn(runtime, "worker") for _ in range(2)]
    assert await runtime.close("root", force=False, request=key("c")) == spawned
    steps = await written(bench, runtime)
    assert await runtime.close("root", force=False, request=key("c")) == spawned  # not [] (nothing left open)
    assert await written(bench, runtime) == steps


async def test_a_resume_sent_again_gets_the_result_of_the_run_it_continued(bench: Bench) -> None:
    runtime = await bench.create(ASKER)
    asked = await bench.run(runtime, "asker", "ask")
    assert asked.status is Status.PENDING
    first = await runtime.resume(approval(asked), request=key("r"))
    assert (first.status, first.text, first.usage.turns) == (Status.DONE, "approved", 2)
    again = await runtime.resume(approval(asked), request=key("r"))
    assert (again.status, again.text, again.usage.turns) == (Status.DONE, "approved", 2)
    assert runtime.handle(asked.handle_id).usage.turns == 2  # the run went on once


# ---- the same id with another request, or on another call -------------------------------------


@dataclass
class Scene:
    """A runtime with a handle of each kind a verb acts on."""

    runtime: Runtime
    idle: str  # a worker: spawned, never run
    slow: str  # running
    asked: TaskResult  # suspended on the host's approval


Verb = Callable[[Scene, RequestKey], Awaitable[object]]
VERBS: dict[str, Verb] = {
    "Spawn": lambda scene, request: scene.runtime.spawn("root", "worker", None, request=request),
    "Post": lambda scene, request: scene.runtime.post(scene.idle, "a note", "", "host", request=request),
    "Wake": lambda scene, request: scene.runtime.wake(scene.idle, "go", request=request),
    "Interrupt": lambda scene, request: scene.runtime.interrupt(scene.slow, request=request),
    "Close": lambda scene, request: scene.runtime.close(scene.idle, force=False, request=request),
    "Resume": lambda scene, request: scene.runtime.resume(approval(scene.asked), request=request),
}


async def scene(bench: Bench) -> Scene:
    runtime = await bench.create(WORKER, SLOW, ASKER)
    idle, slow = await bench.spawn(runtime, "worker"), await bench.spawn(runtime, "slow")
    asked = await bench.run(runtime, "asker", "ask")
    await runtime.wake(slow, "go")
    return Scene(runtime, idle, slow, asked)


@pytest.mark.parametrize("rpc", list(VERBS))
async def test_the_same_id_with_another_request_or_on_another_call_is_refused_and_changes_nothing(bench: Bench, rpc: str) -> None:
    acted = await scene(bench)
    await VERBS[rpc](acted, key("id-1"))
    steps, states = await written(bench, acted.runtime), acted.runtime.list_handles()
    await refused_as_reused(VERBS[rpc](acted, key("id-1", digest="another")))
    other = "Post" if rpc == "Spawn" else "Spawn"
    await refused_as_reused(VERBS[other](acted, key("id-1")))  # an id of one call is no other call's
    assert (await written(bench, acted.runtime), acted.runtime.list_handles()) == (steps, states)


async def test_a_refused_call_records_no_answer_and_its_id_may_act_later(bench: Bench) -> None:
    """Refused without an effect (no such handle yet), a call keeps no answer: sent again once it
    can succeed, it acts (its caller never saw an answer that it acted on)."""
    runtime = await bench.create(WORKER)
    with pytest.raises(NotFound):
        await runtime.wake("root/worker.1", "go", request=key("w"))
    await bench.spawn(runtime, "worker")
    assert await runtime.wake("root/worker.1", "go", request=key("w"))
    assert (await runtime.wait("root/worker.1", None)).status is Status.DONE


# ---- how long, and how many, answers are kept ------------------------------------------------


async def test_an_answer_stands_for_the_request_id_ttl_then_the_id_acts_again() -> None:
    bench = await bench_with(limits=Limits(request_id_ttl=60))
    runtime = await bench.create(WORKER)
    assert (await runtime.spawn("root", "worker", None, request=key("s"))).id == "root/worker.1"
    await bench.clock.advance(60)
    assert (await runtime.spawn("root", "worker", None, request=key("s"))).id == "root/worker.1"  # 60 s old: it stands
    await runtime.post("root/worker.1", "x", "", "host", request=key("p", digest="one"))
    await bench.clock.advance(0.5)
    assert (await runtime.spawn("root", "worker", None, request=key("s"))).id == "root/worker.2"  # past it: a new call
    assert (await runtime.spawn("root", "worker", None, request=key("s"))).id == "root/worker.2"  # whose answer stands
    await refused_as_reused(runtime.post("root/worker.1", "y", "", "host", request=key("p", digest="two")))
    await bench.clock.advance(60)
    assert await runtime.post("root/worker.1", "y", "", "host", request=key("p", digest="two")) == 2  # not reused past it


async def test_a_runtime_keeps_its_newest_answers_and_the_oldest_goes_first() -> None:
    bench = await bench_with(limits=Limits(request_ids_kept=3))
    runtime = await bench.create(WORKER)

    async def spawn(request_id: str) -> str:
        return str((await runtime.spawn("root", "worker", None, request=key(request_id))).id)

    assert [await spawn(request_id) for request_id in "abcd"] == [f"root/worker.{n}" for n in range(1, 5)]
    assert (await spawn("d"), await spawn("b")) == ("root/worker.4", "root/worker.2")  # kept: b, c, d
    assert await spawn("a") == "root/worker.5"  # a went first: a new spawn, its answer kept in b's place
    assert (await spawn("a"), await spawn("c")) == ("root/worker.5", "root/worker.3")
    assert await spawn("b") == "root/worker.6"  # reading b's answer did not keep it longer


async def test_answers_are_journaled_and_another_process_answers_them(bench: Bench) -> None:
    runtime = await bench.create(WORKER, runtime_id="rt")
    spawned = await runtime.spawn("root", "worker", None, request=key("s"))
    await runtime.wake(spawned.id, "go", request=key("w"))
    await runtime.wait(spawned.id, None)
    other = restarted(bench)
    loaded = await other.service.runtime("rt")
    assert (await loaded.spawn("root", "worker", None, request=key("s"))).id == spawned.id
    assert await loaded.wake(spawned.id, "go", request=key("w"))
    await bench.clock.settle()
    assert (len(loaded.handles), loaded.handle(spawned.id).usage.turns) == (1, 1)
    await refused_as_reused(loaded.wake(spawned.id, "go", request=key("w", digest="another")))


# ---- CreateRuntime and DeleteRuntime: answers kept per tenant ---------------------------------


async def test_a_create_runtime_sent_again_answers_the_runtime_it_created(bench: Bench) -> None:
    created = await bench.service.create_runtime("", (WORKER,), tenant="acme", request=key("c"))
    assert await bench.service.create_runtime("", (WORKER,), tenant="acme", request=key("c")) == created  # the id it chose
    assert await bench.store.count_runtimes("acme") == 1
    await refused_as_reused(bench.service.create_runtime("", (SLOW,), tenant="acme", request=key("c", digest="duo")))
    assert await bench.store.count_runtimes("acme") == 1
    theirs = await bench.service.create_runtime("", (WORKER,), tenant="globex", request=key("c"))  # per tenant
    assert theirs != created and await bench.store.count_runtimes("globex") == 1


async def test_a_delete_runtime_sent_again_answers_as_the_first_and_create_outlives_it(bench: Bench) -> None:
    created = await bench.service.create_runtime("", (WORKER,), request=key("c"))
    await bench.service.delete_runtime(created, force=False, request=key("d"))
    await bench.service.delete_runtime(created, force=False, request=key("d"))  # not NOT_FOUND: its first answer
    with pytest.raises(NotFound):
        await bench.service.delete_runtime(created, force=False)  # gone: only the repeat is answered
    await refused_as_reused(bench.service.delete_runtime(created, force=True, request=key("d", digest="forced")))
    assert await bench.service.create_runtime("", (WORKER,), request=key("c")) == created  # kept per tenant
    assert await bench.store.count_runtimes("default") == 0  # and created nothing


async def test_a_request_id_of_a_runtimes_own_call_is_not_a_delete_of_it(bench: Bench) -> None:
    created = await bench.service.create_runtime("", (WORKER,), request=key("made"))
    runtime = await bench.service.runtime(created)
    await runtime.spawn("root", "worker", None, request=key("spawned"))
    for used in ("spawned", "made"):
        await refused_as_reused(bench.service.delete_runtime(created, force=False, request=key(used)))
        assert list(runtime.handles) == ["root/worker.1"] and await bench.store.runtime_exists(created)
    other = await bench.service.create_runtime("", (WORKER,))
    await bench.service.delete_runtime(other, force=False, request=key("made"))  # ids are per runtime
    assert not await bench.store.runtime_exists(other)


async def test_past_the_ttl_create_and_delete_ids_act_again() -> None:
    bench = await bench_with(limits=Limits(request_id_ttl=60))
    first = await bench.service.create_runtime("", (WORKER,), request=key("c"))
    runtime = await bench.service.runtime(first)
    await runtime.spawn("root", "worker", None, request=key("spawned"))
    await bench.clock.advance(61)
    second = await bench.service.create_runtime("", (WORKER,), request=key("c"))
    assert second != first and await bench.store.count_runtimes("default") == 2  # a new CreateRuntime
    await bench.service.delete_runtime(first, force=False, request=key("spawned"))  # the Spawn's id: no longer its
    assert not await bench.store.runtime_exists(first)
