"""Issue 12, tenants: another tenant's runtime is indistinguishable from a missing one (every
RPC, the store untouched), tenants with the same runtime id are independent (idempotency keys
included), ListRuntimes pages, DeleteRuntime, retention, quotas (the token quota across a
restart) and the audit log. Real servers on loopback, bearer tokens, SQLite store files read
through a read-only connection."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from agentruntime.client import Client
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.settings import Settings
from google.protobuf.message import Message as ProtoMessage
from google.rpc import error_details_pb2

from tests.support.poll import eventually
from tests.support.process import ServerProcess
from tests.support.servers import serve
from tests.support.tenants import (
    ACME,
    ACME_READER,
    ASKER,
    DEFAULT,
    GLOBEX,
    TOKENS,
    Caller,
    assert_quota,
    bearer,
    detail,
    details,
    refused,
    reply,
    scripted,
    tenant_server,
)
from tests.support.tool_server import ToolServer

SERVICE = pb.DESCRIPTOR.services_by_name["AgentRuntime"]


# ---- helpers ----


def violated_fields(error: grpc.aio.AioRpcError) -> list[str]:
    return [violation.field for violation in detail(error, error_details_pb2.BadRequest).field_violations]


SOLO = scripted("solo", reply("hello from solo"))
SLOW = scripted("slow", reply("slow done", delay=30))


def open_read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def tables(db: sqlite3.Connection) -> list[str]:
    return [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the store file, as a read-only connection sees it."""
    with closing(open_read_only(path)) as db:
        return {table: sorted(db.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr) for table in tables(db)}


def rows_naming(path: Path, key: str) -> dict[str, int]:
    """table.column -> how many rows hold exactly `key` there (tables and columns with none left out)."""
    found: dict[str, int] = {}
    with closing(open_read_only(path)) as db:
        for table in tables(db):
            for column in [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')]:
                (count,) = db.execute(f'SELECT COUNT(*) FROM "{table}" WHERE "{column}" = ?', (key,)).fetchone()
                if count:
                    found[f"{table}.{column}"] = count
    return found


Request = TypeVar("Request", bound=ProtoMessage)


def with_runtime(request: Request, runtime_id: str) -> Request:
    other = type(request)()
    other.CopyFrom(request)
    if isinstance(other, pb.ForkRuntimeRequest | pb.ReplayRuntimeRequest):
        other.source_runtime_id = runtime_id  # (the fork's or the replay's own id is left to the server)
    else:
        other.runtime_id = runtime_id  # type: ignore[attr-defined]  # each request given names a runtime
    return other


def shape(error: grpc.aio.AioRpcError, runtime_id: str) -> tuple[Any, ...]:
    """What a caller can read of an error, with the runtime id taken out."""
    text = (error.details() or "").replace(repr(runtime_id), "<id>")
    rest = []
    for item in details(error):
        copied = type(item)()
        copied.CopyFrom(item)
        if isinstance(copied, error_details_pb2.ResourceInfo) and copied.resource_name == runtime_id:
            copied.resource_name = "<id>"
        rest.append(copied.SerializeToString(deterministic=True))
    return error.code(), text, tuple(rest)


# ---- another tenant's runtime is a missing one ----


def requests_naming(runtime_id: str, handle_id: str, request_id: str, call_id: str) -> dict[str, list[ProtoMessage]]:
    """A request of every RPC that names a runtime (CreateRuntime and ListRuntimes name none of another's)."""
    answer = pb.Answer(id=request_id, ok=True, outputs=[pb.ToolOutput(call_id=call_id, output="42")])
    return {
        "Spawn": [
            pb.SpawnRequest(runtime_id=runtime_id, parent_id="root", agent="solo"),
            pb.SpawnRequest(runtime_id=runtime_id, parent_id=handle_id, agent="solo"),
        ],
        "Post": [pb.PostRequest(runtime_id=runtime_id, handle_id=handle_id, text="from another tenant")],
        "Wake": [pb.WakeRequest(runtime_id=runtime_id, handle_id=handle_id, prompt="from another tenant")],
        "Wait": [pb.WaitRequest(runtime_id=runtime_id, handle_id=handle_id)],
        "Resume": [pb.ResumeRequest(runtime_id=runtime_id, answer=answer)],
        "Interrupt": [pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id)],
        "Close": [
            pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id),
            pb.CloseRequest(runtime_id=runtime_id, handle_id=handle_id, force=True),
            pb.CloseRequest(runtime_id=runtime_id, handle_id="root", force=True),
        ],
        "Inspect": [pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id)],
        "List": [pb.ListRequest(runtime_id=runtime_id)],
        "GetTranscript": [pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id)],
        "Watch": [pb.WatchRequest(runtime_id=runtime_id), pb.WatchRequest(runtime_id=runtime_id, after_seq=1)],
        "DeleteRuntime": [
            pb.DeleteRuntimeRequest(runtime_id=runtime_id),
            pb.DeleteRuntimeRequest(runtime_id=runtime_id, force=True),
        ],
        "ForkRuntime": [
            pb.ForkRuntimeRequest(source_runtime_id=runtime_id, at_seq=1),
            pb.ForkRuntimeRequest(source_runtime_id=runtime_id, at_seq=10**9, answers=[answer]),
        ],
        "ReplayRuntime": [pb.ReplayRuntimeRequest(source_runtime_id=runtime_id)],
    }


async def what_a_sees(acme: Caller, handles: list[str]) -> list[ProtoMessage]:
    seen: list[ProtoMessage] = [await acme("List", pb.ListRequest(runtime_id="demo"))]
    for handle_id in handles:
        seen.append(await acme("Inspect", pb.InspectRequest(runtime_id="demo", handle_id=handle_id)))
        seen.append(await acme("GetTranscript", pb.GetTranscriptRequest(runtime_id="demo", handle_id=handle_id)))
        seen.append(await acme("Wait", pb.WaitRequest(runtime_id="demo", handle_id=handle_id)))
    listed = await acme("ListRuntimes", pb.ListRuntimesRequest())
    seen.append(listed)
    return seen


async def test_another_tenants_runtime_answers_every_rpc_as_a_missing_one_and_changes_nothing(tmp_path: Path) -> None:
    async with tenant_server(tmp_path) as served:
        acme, globex = Caller(served.stub, ACME), Caller(served.stub, GLOBEX)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="demo", agents=[SOLO, ASKER]))
        done_id, done = await acme.run("demo", "solo", "hi")
        assert done.status == pb.STATUS_DONE, done
        asked_id, asked = await acme.run("demo", "asker", "look it up")
        assert asked.status == pb.STATUS_PENDING, asked
        request_id, call_id = asked.pending.id, asked.pending.calls[0].id

        before = await what_a_sees(acme, [done_id, asked_id])  # Wait and the rest flush the store first
        rows_before = snapshot(tmp_path / "store.db")
        assert any(row[0] == "acme:demo" for row in rows_before["runtimes"])
        assert sum(row[0] == "acme:demo" for row in rows_before["journal"]) > 5

        ghost = f"nowhere-{uuid.uuid4().hex[:8]}"
        covered: set[str] = set()
        for handle_id in (done_id, asked_id):
            for method, requests in requests_naming("demo", handle_id, request_id, call_id).items():
                covered.add(method)
                for request in requests:
                    if method == "Watch":
                        assert isinstance(request, pb.WatchRequest)
                        error = await refused(globex.watch_first(request))
                        missing = await refused(globex.watch_first(with_runtime(request, ghost)))
                    else:
                        error = await refused(globex(method, request))
                        missing = await refused(globex(method, with_runtime(request, ghost)))
                    assert error.code() == grpc.StatusCode.NOT_FOUND, (method, request, error)
                    assert shape(error, "demo") == shape(missing, ghost), (method, error.details(), missing.details())
                    assert "acme" not in (error.details() or ""), error.details()
        # Every RPC of the service is covered: the two that name no runtime of another are below,
        # and ServeTools names none: its queues are per tenant (test_a_worker_serves_only_its_tenants_queue).
        assert covered | {"CreateRuntime", "ListRuntimes", "ServeTools"} == {method.name for method in SERVICE.methods}
        assert await globex.runtimes() == {}

        after = await what_a_sees(acme, [done_id, asked_id])
        assert after == before
        assert snapshot(tmp_path / "store.db") == rows_before

        inspected = await acme("Inspect", pb.InspectRequest(runtime_id="demo", handle_id=asked_id))
        assert inspected.handle.state == pb.HANDLE_STATE_SUSPENDED
        answer = pb.Answer(id=request_id, ok=True, outputs=[pb.ToolOutput(call_id=call_id, output="42")])
        resumed = await acme("Resume", pb.ResumeRequest(runtime_id="demo", answer=answer))
        assert resumed.result.status == pb.STATUS_DONE, resumed
        assert resumed.result.text == "answered"

        # CreateRuntime: globex may have its own "demo", and it is its own.
        created = await globex("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="demo", agents=[SOLO]))
        assert created.runtime_id == "demo"
        assert list((await globex("List", pb.ListRequest(runtime_id="demo"))).handles) == []
        theirs_id, theirs = await globex.run("demo", "solo", "globex's own")
        assert theirs.status == pb.STATUS_DONE
        assert theirs_id == done_id  # the same deterministic path, in another tree
        error = await refused(globex("Inspect", pb.InspectRequest(runtime_id="demo", handle_id=asked_id)))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert len((await acme("List", pb.ListRequest(runtime_id="demo"))).handles) == 2
        assert {key: value.handle_count for key, value in (await acme.runtimes()).items()} == {"demo": 2}
        assert {key: value.handle_count for key, value in (await globex.runtimes()).items()} == {"demo": 1}
        assert (await globex("List", pb.ListRequest(runtime_id="demo"))).handles[0].agent == "solo"
        mine = await acme("Inspect", pb.InspectRequest(runtime_id="demo", handle_id=done_id))
        inspected_before = before[1]  # what_a_sees: the List, then each handle's Inspect first
        assert isinstance(inspected_before, pb.InspectResponse)
        assert mine.handle == inspected_before.handle  # untouched by globex's run on its own "demo"


# ---- the same runtime id in two tenants ----


async def test_a_worker_serves_only_its_tenants_queue(tmp_path: Path) -> None:
    """Two tenants' workers on a queue of the same name: each gets its own tenant's calls."""
    ping = pb.ToolDef(name="ping", description="pings", worker=pb.WorkerTool(queue="shared"))
    caller = scripted("caller", reply(calls=(("ping", "{}"),)), reply("pinged"), tools=(ping,))
    async with tenant_server(tmp_path) as served:
        address = f"127.0.0.1:{served.running.port}"
        seen: dict[str, list[str]] = {"acme": [], "globex": []}
        tasks = []
        clients = []
        for tenant, token in (("acme", ACME[1]), ("globex", GLOBEX[1])):
            worker_client = Client(address, token=token)
            clients.append(worker_client)

            def answer(arguments: dict[str, Any], call: pb.WorkerCall, tenant: str = tenant) -> str:
                seen[tenant].append(call.call.idempotency_key)
                return f"pong from {tenant}'s worker"

            tasks.append(asyncio.ensure_future(worker_client.serve_tools("shared", {"ping": answer})))
        try:
            for entry in (ACME, GLOBEX):
                tenant_caller = Caller(served.stub, entry)
                await tenant_caller("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="same", agents=[caller]))
                handle_id, result = await tenant_caller.run("same", "caller", "go")
                assert result.status == pb.STATUS_DONE
                transcript = await tenant_caller("GetTranscript", pb.GetTranscriptRequest(runtime_id="same", handle_id=handle_id))
                assert [m.content for m in transcript.messages if m.role == "tool"] == [f"pong from {entry[0]}'s worker"]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for worker_client in clients:
                await worker_client.close_channel()
        assert seen == {"acme": ["acme:same/root/caller.1/call_1_1"], "globex": ["globex:same/root/caller.1/call_1_1"]}


async def test_tenants_with_the_same_runtime_id_are_independent_and_send_tools_different_keys(
    tmp_path: Path, tools: ToolServer
) -> None:
    echo = pb.ToolDef(name="echo", description="echoes", http=pb.HttpTool(url=tools.url("echo")))
    caller_agent = scripted("caller", reply(calls=(("echo", '{"n": 1}'),)), reply("called"), tools=(echo,))
    # A server with authentication reaches its own loopback only where ALLOW opens it.
    async with tenant_server(tmp_path, tool_egress_allow=["127.0.0.0/8", "::1/128"]) as served:
        default, acme = Caller(served.stub, DEFAULT), Caller(served.stub, ACME)
        for who in (default, acme):
            await who("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="demo", agents=[caller_agent]))
        default_handle, default_result = await default.run("demo", "caller", "the default tenant's question")
        acme_handle, acme_result = await acme.run("demo", "caller", "acme's question")
        assert default_result.status == acme_result.status == pb.STATUS_DONE
        assert default_handle == acme_handle  # the same path in each tree
        spare = await acme("Spawn", pb.SpawnRequest(runtime_id="demo", parent_id="root", agent="caller"))

        keys = []
        for who, handle_id, own, other in (
            (default, default_handle, "the default tenant's question", "acme's question"),
            (acme, acme_handle, "acme's question", "the default tenant's question"),
        ):
            transcript = await who("GetTranscript", pb.GetTranscriptRequest(runtime_id="demo", handle_id=handle_id))
            text = " ".join(message.content for message in transcript.messages)
            assert own in text and other not in text, text
            calls = [call for message in transcript.messages for call in message.tool_calls]
            assert len(calls) == 1
            keys.append((handle_id, calls[0].id))
        assert tools.keys == [
            f"demo/{keys[0][0]}/{keys[0][1]}",  # the default tenant: {runtime}/{handle}/{call}
            f"acme:demo/{keys[1][0]}/{keys[1][1]}",  # another tenant: {tenant}:{runtime}/{handle}/{call}
        ]
        assert tools.keys[0] != tools.keys[1]

        assert [view.handle_id for view in (await default("List", pb.ListRequest(runtime_id="demo"))).handles] == [default_handle]
        assert [view.handle_id for view in (await acme("List", pb.ListRequest(runtime_id="demo"))).handles] == [
            acme_handle,
            spare.handle_id,
        ]
        error = await refused(default("Inspect", pb.InspectRequest(runtime_id="demo", handle_id=spare.handle_id)))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert {key: value.handle_count for key, value in (await default.runtimes()).items()} == {"demo": 1}
        assert {key: value.handle_count for key, value in (await acme.runtimes()).items()} == {"demo": 2}
        assert await Caller(served.stub, GLOBEX).runtimes() == {}


# ---- ListRuntimes pages ----


async def test_list_runtimes_pages_are_stable_and_complete(tmp_path: Path) -> None:
    async with tenant_server(tmp_path) as served:
        acme, globex = Caller(served.stub, ACME), Caller(served.stub, GLOBEX)
        ids = [f"rt-{index:03d}" for index in range(250)]
        for runtime_id in ids:
            await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[SOLO]))
        for index in range(3):
            await globex("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=f"rt-{index:03d}", agents=[SOLO]))

        pages: list[tuple[str, list[pb.RuntimeSummary]]] = []
        token = ""
        while True:
            listed = await acme("ListRuntimes", pb.ListRuntimesRequest(page_size=40, page_token=token))
            pages.append((token, list(listed.runtimes)))
            if len(pages) == 2:  # a runtime created while paging
                await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="late", agents=[SOLO]))
            token = listed.next_page_token
            if not token:
                break
        assert [len(page) for _, page in pages] == [40] * 6 + [10]
        listed_ids = [summary.runtime_id for _, page in pages for summary in page]
        assert len(listed_ids) == len(set(listed_ids)) == 250
        assert listed_ids == list(reversed(ids))  # newest first
        times = [summary.create_time.ToNanoseconds() for _, page in pages for summary in page]
        assert times == sorted(times, reverse=True)
        assert all(summary.handle_count == 0 for _, page in pages for summary in page)

        # The pages already fetched are fetched again unchanged; the new one heads the first page.
        for page_token, page in pages[1:]:
            again = await acme("ListRuntimes", pb.ListRuntimesRequest(page_size=40, page_token=page_token))
            assert list(again.runtimes) == page
        first = await acme("ListRuntimes", pb.ListRuntimesRequest(page_size=40))
        assert first.runtimes[0].runtime_id == "late"
        assert [summary.runtime_id for summary in first.runtimes[1:]] == listed_ids[:39]
        assert len(await acme.runtimes()) == 251
        assert sorted(await globex.runtimes()) == ["rt-000", "rt-001", "rt-002"]

        second_token = pages[1][0]
        for who, page_token in (
            (acme, "not-a-token"),
            (acme, second_token + "x"),
            (acme, "bGF0ZXxhY21lOmxhdGV8MDAwMDAwMDAwMDAw"),  # a forged cursor
            (globex, second_token),  # another tenant's token
        ):
            error = await refused(who("ListRuntimes", pb.ListRuntimesRequest(page_size=40, page_token=page_token)))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (page_token, error)
            assert violated_fields(error) == ["page_token"], error
        error = await refused(acme("ListRuntimes", pb.ListRuntimesRequest(page_size=-1)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert violated_fields(error) == ["page_size"]
        assert len((await acme("ListRuntimes", pb.ListRuntimesRequest())).runtimes) == 100  # 0: 100


# ---- DeleteRuntime ----


async def test_delete_runtime_refuses_a_running_one_and_with_force_leaves_no_row(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    async with tenant_server(tmp_path) as served:
        default, acme = Caller(served.stub, DEFAULT), Caller(served.stub, ACME)
        started: dict[str, tuple[str, str]] = {}
        for who in (default, acme):
            await who("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="gone", agents=[SOLO, SLOW]))
            done_id, done = await who.run("gone", "solo", "settle first")
            assert done.status == pb.STATUS_DONE
            slow = await who("Spawn", pb.SpawnRequest(runtime_id="gone", parent_id="root", agent="slow"))
            await who("Wake", pb.WakeRequest(runtime_id="gone", handle_id=slow.handle_id, prompt="take your time"))
            started[who.tenant] = (done_id, slow.handle_id)
        await default("Inspect", pb.InspectRequest(runtime_id="gone", handle_id=started["default"][0]))  # flushes

        for who, key, other, other_key in ((default, "gone", acme, "acme:gone"), (acme, "acme:gone", None, "")):
            assert {"runtimes.id", "journal.runtime_id"} <= set(rows_naming(store, key)), rows_naming(store, key)
            error = await refused(who("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id="gone")))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
            assert (await who.runtimes())["gone"].running_count == 1
            slow_view = await who("Inspect", pb.InspectRequest(runtime_id="gone", handle_id=started[who.tenant][1]))
            assert slow_view.handle.state == pb.HANDLE_STATE_RUNNING

            await who("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id="gone", force=True))
            await asyncio.sleep(0.3)  # an interrupted run's last steps have had their chance to land
            await who("ListRuntimes", pb.ListRuntimesRequest())  # a flush-forcing RPC
            assert rows_naming(store, key) == {}
            for method, request in (
                ("List", pb.ListRequest(runtime_id="gone")),
                ("Wait", pb.WaitRequest(runtime_id="gone", handle_id=started[who.tenant][0])),
                ("Inspect", pb.InspectRequest(runtime_id="gone", handle_id=started[who.tenant][1])),
            ):
                error = await refused(who(method, request))
                assert error.code() == grpc.StatusCode.NOT_FOUND, (method, error)
            assert "gone" not in await who.runtimes()
            if other is not None:  # the other tenant's "gone" is untouched
                assert (await other.runtimes())["gone"].running_count == 1
                assert {"runtimes.id", "journal.runtime_id"} <= set(rows_naming(store, other_key))

        for who in (default, acme):  # the id can be created again, from scratch
            await who("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="gone", agents=[SOLO]))
            assert list((await who("List", pb.ListRequest(runtime_id="gone"))).handles) == []
            summary = (await who.runtimes())["gone"]
            assert (summary.handle_count, summary.running_count, summary.suspended_count) == (0, 0, 0)
            again_id, again = await who.run("gone", "solo", "anew")
            assert again_id == started[who.tenant][0]  # the handle counter starts over
            assert again.status == pb.STATUS_DONE and again.turns == 1
            events = []
            call = who.stub.Watch(pb.WatchRequest(runtime_id="gone"), metadata=bearer(who.token), timeout=5)
            async for response in call:
                events.append(response.event)
                if response.event.HasField("result"):
                    break
            call.cancel()
            assert events[0].seq == 1 and events[0].HasField("spawned"), events[0]
            assert [event.seq for event in events] == list(range(1, len(events) + 1))


# ---- retention ----


async def test_retention_deletes_settled_runtimes_and_keeps_suspended_and_running_ones(tmp_path: Path) -> None:
    slow = scripted("slow", reply("slow done", delay=3.5))
    async with tenant_server(tmp_path, retention=1.0) as served:
        acme = Caller(served.stub, ACME)
        for runtime_id in ("idle", "waiting", "busy"):
            await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[SOLO, ASKER, slow]))
        _, idle = await acme.run("idle", "solo", "done at once")
        assert idle.status == pb.STATUS_DONE
        _, waiting = await acme.run("waiting", "asker", "suspend")
        assert waiting.status == pb.STATUS_PENDING
        busy = await acme("Spawn", pb.SpawnRequest(runtime_id="busy", parent_id="root", agent="slow"))
        await acme("Wake", pb.WakeRequest(runtime_id="busy", handle_id=busy.handle_id, prompt="run long"))
        woke = time.monotonic()

        # A runtime with nothing running and nothing suspended that no step was written to for
        # the retention is deleted. A SUSPENDED one waits on its host (its Request may still be
        # answered): kept, AGENTRUNTIME_SUSPENDED_RETENTION being 0 (for ever). A running one is kept.
        async def idle_deleted() -> bool:
            return "idle" not in await acme.runtimes()

        await eventually(idle_deleted, "retention to delete the settled runtime", timeout=5)
        await asyncio.sleep(max(0.0, woke + 2.5 - time.monotonic()))  # over twice the retention since the others' last writes
        listed = await acme.runtimes()
        assert sorted(listed) == ["busy", "waiting"], listed
        assert listed["busy"].running_count == 1 and listed["waiting"].suspended_count == 1, listed
        error = await refused(acme("List", pb.ListRequest(runtime_id="idle")))
        assert error.code() == grpc.StatusCode.NOT_FOUND

        # The host answers long after: its Request is still there, and the run goes on.
        call = waiting.pending.calls[0]
        answer = pb.Answer(id=waiting.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="42")])
        resumed = await acme("Resume", pb.ResumeRequest(runtime_id="waiting", answer=answer))
        assert resumed.result.status == pb.STATUS_DONE and resumed.result.text == "answered", resumed
        waited = await acme("Wait", pb.WaitRequest(runtime_id="busy", handle_id=busy.handle_id))
        assert waited.result.status == pb.STATUS_DONE

        async def both_deleted() -> bool:
            return not await acme.runtimes()

        await eventually(both_deleted, "retention to delete the runtimes once settled", timeout=5)
        assert await acme.runtimes() == {}  # once settled, they are idle like the others


async def test_suspended_retention_deletes_runtimes_left_waiting_on_their_host(tmp_path: Path) -> None:
    """AGENTRUNTIME_SUSPENDED_RETENTION on its own: a runtime whose host never answers goes
    after it (its Request withdrawn with it), while RETENTION 0 keeps settled ones for ever."""
    async with tenant_server(tmp_path, retention=0.0, suspended_retention=1.0) as served:
        acme = Caller(served.stub, ACME)
        for runtime_id in ("settled", "waiting"):
            await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[SOLO, ASKER]))
        _, settled = await acme.run("settled", "solo", "done at once")
        assert settled.status == pb.STATUS_DONE
        _, waiting = await acme.run("waiting", "asker", "suspend")
        assert waiting.status == pb.STATUS_PENDING

        async def waiting_deleted() -> bool:
            return "waiting" not in await acme.runtimes()

        await eventually(waiting_deleted, "retention to delete the suspended runtime", timeout=5)
        # Written to before the other, it would have gone first in the same pass.
        assert sorted(await acme.runtimes()) == ["settled"]
        answer = pb.Answer(id=waiting.pending.id, ok=True)
        error = await refused(acme("Resume", pb.ResumeRequest(runtime_id="waiting", answer=answer)))
        assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_retention_is_on_by_default_for_settled_runtimes_only() -> None:
    defaults = Settings.model_construct()  # (not the environment's)
    assert (defaults.retention, defaults.suspended_retention) == (30 * 86400, 0)
    async with serve() as served:  # the test defaults leave retention as it is
        assert served.running.retention is not None and not served.running.retention.done()


# ---- quotas ----


async def test_quota_runtimes(tmp_path: Path) -> None:
    async with tenant_server(tmp_path, quota_runtimes=2) as served:
        acme, globex = Caller(served.stub, ACME), Caller(served.stub, GLOBEX)
        for runtime_id in ("one", "two"):
            await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[SOLO]))
        error = await refused(acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="three", agents=[SOLO])))
        assert_quota(error, "acme", "runtimes")
        assert "DeleteRuntime" in (error.details() or "")
        error = await refused(acme("CreateRuntime", pb.CreateRuntimeRequest(agents=[SOLO])))  # a generated id too
        assert_quota(error, "acme", "runtimes")
        assert sorted(await acme.runtimes()) == ["one", "two"]
        # Per tenant: globex has its own two.
        for runtime_id in ("one", "two"):
            await globex("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[SOLO]))
        assert_quota(await refused(globex("CreateRuntime", pb.CreateRuntimeRequest(agents=[SOLO]))), "globex", "runtimes")

        await acme("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id="one"))
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="three", agents=[SOLO]))
        assert sorted(await acme.runtimes()) == ["three", "two"]
        error = await refused(acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="four", agents=[SOLO])))
        assert_quota(error, "acme", "runtimes")


async def test_quota_running_handles(tmp_path: Path) -> None:
    slow = scripted("slow", reply("slow done", delay=1.0))
    async with tenant_server(tmp_path, quota_running_handles=1) as served:
        acme, globex = Caller(served.stub, ACME), Caller(served.stub, GLOBEX)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="q", agents=[slow, SOLO]))
        first = await acme("Spawn", pb.SpawnRequest(runtime_id="q", parent_id="root", agent="slow"))
        second = await acme("Spawn", pb.SpawnRequest(runtime_id="q", parent_id="root", agent="solo"))
        await acme("Wake", pb.WakeRequest(runtime_id="q", handle_id=first.handle_id, prompt="slowly"))
        error = await refused(acme("Wake", pb.WakeRequest(runtime_id="q", handle_id=second.handle_id, prompt="now")))
        assert_quota(error, "acme", "running_handles")
        assert "AGENTRUNTIME_QUOTA_RUNNING_HANDLES" in (error.details() or ""), error.details()
        refused_view = await acme("Inspect", pb.InspectRequest(runtime_id="q", handle_id=second.handle_id))
        assert refused_view.handle.state == pb.HANDLE_STATE_IDLE and refused_view.handle.turns == 0
        # Another tenant is not held back by acme's quota.
        await globex("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="q", agents=[SOLO]))
        _, theirs = await globex.run("q", "solo", "mine")
        assert theirs.status == pb.STATUS_DONE

        settled = await acme("Wait", pb.WaitRequest(runtime_id="q", handle_id=first.handle_id))
        assert settled.result.status == pb.STATUS_DONE
        await acme("Wake", pb.WakeRequest(runtime_id="q", handle_id=second.handle_id, prompt="now"))
        waited = await acme("Wait", pb.WaitRequest(runtime_id="q", handle_id=second.handle_id))
        assert waited.result.status == pb.STATUS_DONE


async def test_quota_tokens_per_day_stops_the_next_turn_and_survives_a_restart(
    tmp_path: Path, tools: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTRUNTIME_QUOTA_TOKENS_PER_DAY", "50")
    echo = pb.ToolDef(name="echo", description="echoes", http=pb.HttpTool(url=tools.url("echo")))
    first = scripted("first", reply("first done", tokens=30))
    second = scripted("second", reply(tokens=30, calls=(("echo", "{}"),)), reply("second done", tokens=30), tools=(echo,))
    server = ServerProcess(tmp_path / "store.db", "http://127.0.0.1:9/v1", tmp_path / "server.log")
    stub = await server.start()
    try:

        async def run(agent_name: str) -> tuple[str, pb.TaskResult]:
            spawned = await stub.Spawn(pb.SpawnRequest(runtime_id="spend", parent_id="root", agent=agent_name), timeout=30)
            await stub.Wake(pb.WakeRequest(runtime_id="spend", handle_id=spawned.handle_id, prompt="go"), timeout=30)
            waited = await stub.Wait(pb.WaitRequest(runtime_id="spend", handle_id=spawned.handle_id), timeout=30)
            return spawned.handle_id, waited.result

        await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="spend", agents=[first, second]), timeout=30)
        _, result = await run("first")
        assert (result.status, result.own_tokens, result.turns) == (pb.STATUS_DONE, 30, 1), result
        # 20 tokens left: the second run's first turn starts (and spends 30); its next one is refused.
        _, result = await run("second")
        assert result.status == pb.STATUS_INCOMPLETE, result
        assert result.limit == pb.LIMIT_MAX_TOKENS
        assert (result.turns, result.own_tokens, result.tool_calls) == (1, 30, 1), result
        assert "tenant" in result.text and "quota" in result.text, result.text
        assert tools.hits["echo"] == 1

        await server.stop()  # SIGKILL: the spend must already be in the store
        stub = await server.restart()
        _, result = await run("first")
        assert result.status == pb.STATUS_INCOMPLETE and result.limit == pb.LIMIT_MAX_TOKENS, result
        assert (result.turns, result.own_tokens) == (0, 0), result
        assert "quota" in result.text
    finally:
        await server.stop()


# ---- audit ----


def audit_records(records: list[logging.LogRecord]) -> list[tuple[str, str, str, str, str, str]]:
    return [
        (r.tenant, r.caller, r.rpc, r.runtime_id, r.handle_id, r.code)  # type: ignore[attr-defined]  # the audit record's extra fields
        for r in records
        if r.name == "agentruntime.audit"
    ]


async def test_every_mutating_rpc_writes_one_audit_record_and_no_token_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with tenant_server(tmp_path) as served:
        acme = Caller(served.stub, ACME)
        caplog.clear()
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="audited", agents=[SOLO, ASKER]))
        spawned = await acme("Spawn", pb.SpawnRequest(runtime_id="audited", parent_id="root", agent="asker"))
        handle = spawned.handle_id
        await acme("Wake", pb.WakeRequest(runtime_id="audited", handle_id=handle, prompt="ask"))
        waited = await acme("Wait", pb.WaitRequest(runtime_id="audited", handle_id=handle))
        pending = waited.result.pending
        await acme("Inspect", pb.InspectRequest(runtime_id="audited", handle_id=handle))
        await acme("List", pb.ListRequest(runtime_id="audited"))
        await acme("GetTranscript", pb.GetTranscriptRequest(runtime_id="audited", handle_id=handle))
        await acme("ListRuntimes", pb.ListRuntimesRequest())
        assert await acme.watch_first(pb.WatchRequest(runtime_id="audited")) is not None
        await acme("Post", pb.PostRequest(runtime_id="audited", handle_id=handle, text="note"))
        error = await refused(acme("Resume", pb.ResumeRequest(runtime_id="audited", answer=pb.Answer(id="nope", ok=True))))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        answer = pb.Answer(id=pending.id, ok=True, outputs=[pb.ToolOutput(call_id=pending.calls[0].id, output="42")])
        await acme("Resume", pb.ResumeRequest(runtime_id="audited", answer=answer))
        error = await refused(acme("Wake", pb.WakeRequest(runtime_id="audited", handle_id="root/nobody.9", prompt="x")))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        await acme("Interrupt", pb.InterruptRequest(runtime_id="audited", handle_id=handle))
        await acme("Close", pb.CloseRequest(runtime_id="audited", handle_id=handle))
        error = await refused(acme("Inspect", pb.InspectRequest(runtime_id="elsewhere", handle_id=handle)))  # read: none
        assert error.code() == grpc.StatusCode.NOT_FOUND
        await acme("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id="audited"))

        who = ("acme", "acme-ci")
        assert audit_records(caplog.records) == [
            (*who, "CreateRuntime", "audited", "", "OK"),
            (*who, "Spawn", "audited", "root", "OK"),
            (*who, "Wake", "audited", handle, "OK"),
            (*who, "Post", "audited", handle, "OK"),
            (*who, "Resume", "audited", "", "FAILED_PRECONDITION"),
            (*who, "Resume", "audited", "", "OK"),
            (*who, "Wake", "audited", "root/nobody.9", "NOT_FOUND"),
            (*who, "Interrupt", "audited", handle, "OK"),
            (*who, "Close", "audited", handle, "OK"),
            (*who, "DeleteRuntime", "audited", "", "OK"),
        ]
        for record in caplog.records:
            if record.name == "agentruntime.audit":
                message = record.getMessage()
                assert message.startswith("audit tenant=acme caller=acme-ci rpc="), message
                assert f"runtime={record.runtime_id or '-'}" in message  # type: ignore[attr-defined]  # an extra field
                assert f"handle={record.handle_id or '-'} code={record.code}" in message  # type: ignore[attr-defined]  # extra fields

        # Another tenant, another name; its NOT_FOUND on acme's runtime is audited as its own.
        globex = Caller(served.stub, GLOBEX)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="audited", agents=[SOLO]))
        caplog.clear()
        await refused(globex("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id="audited", force=True)))
        assert audit_records(caplog.records) == [("globex", "globex-ci", "DeleteRuntime", "audited", "", "NOT_FOUND")]
        # A runtime the server names is audited by that name.
        caplog.clear()
        named = await acme("CreateRuntime", pb.CreateRuntimeRequest(agents=[SOLO]))
        assert audit_records(caplog.records) == [(*who, "CreateRuntime", named.runtime_id, "", "OK")]

        logged = [record.getMessage() + repr(vars(record)) for record in caplog.records]
        for _, token, _, _ in TOKENS:
            assert not any(token in text for text in logged), token
        assert logged  # the server did log


async def test_a_denied_mutating_rpc_is_audited_with_the_callers_tenant_and_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with tenant_server(tmp_path) as served:
        await Caller(served.stub, ACME)("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="ro", agents=[SOLO]))
        reader = Caller(served.stub, ACME_READER)
        caplog.clear()
        error = await refused(reader("Spawn", pb.SpawnRequest(runtime_id="ro", parent_id="root", agent="solo")))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert audit_records(caplog.records) == [("acme", "acme-dashboard", "Spawn", "ro", "root", "PERMISSION_DENIED")]
        assert not any(ACME_READER[1] in record.getMessage() + repr(vars(record)) for record in caplog.records)


async def test_an_audit_field_escapes_every_unprintable_code_point_so_it_reads_back_as_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line separator is written \\u2028 (not \\x2028, which reads as a space and "28"), a
    right-to-left override and an astral code point each as the one code point they are."""
    caplog.set_level(logging.INFO)
    async with tenant_server(tmp_path) as served:
        acme = Caller(served.stub, ACME)
        caplog.clear()
        sent = "a\u2028b\u202ec\U0001f600d\x1be f\\x20"
        await refused(acme("Post", pb.PostRequest(runtime_id=sent, handle_id="root/x.1", text="hi")))
        [record] = [r for r in caplog.records if r.name == "agentruntime.audit"]
        message = record.getMessage()
        field = message.split(" runtime=", 1)[1].split(" ", 1)[0]
        assert field == "a\\u2028b\\u202ec\\U0001f600d\\x1be\\x20f\\x5cx20", message
        assert field.encode().decode("unicode_escape") == sent
        assert record.runtime_id == sent  # type: ignore[attr-defined]  # the structured field keeps the value


async def test_a_tenant_qualified_id_names_nothing_for_any_caller(tmp_path: Path) -> None:
    """The store keys another tenant's runtime `acme:demo`; as a runtime id it is not a slug,
    so no caller (the default tenant least of all, whose keys are bare ids) reaches it."""
    async with tenant_server(tmp_path) as served:
        acme, default = Caller(served.stub, ACME), Caller(served.stub, DEFAULT)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="demo", agents=[SOLO]))
        for method, request in (
            ("List", pb.ListRequest(runtime_id="acme:demo")),
            ("DeleteRuntime", pb.DeleteRuntimeRequest(runtime_id="acme:demo", force=True)),
            ("Spawn", pb.SpawnRequest(runtime_id="acme:demo", parent_id="root", agent="solo")),
        ):
            error = await refused(default(method, request))
            assert error.code() == grpc.StatusCode.NOT_FOUND, (method, error.details())
        listed = await acme("List", pb.ListRequest(runtime_id="demo"))
        assert list(listed.handles) == []  # untouched, still there
