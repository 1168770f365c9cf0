"""A runtime's live pages over plain HTTP against a real server: what makes them read the Requests
again, a session's cap on its live pages, and the pages of one token sharing one Watch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.console.limits import Limits

from tests.support.build import duration
from tests.support.console_http import console_for, live_messages, page_csrf, person, served, sign_in, started_calls
from tests.support.poll import eventually
from tests.support.servers import Served
from tests.support.tenants import ACME, Caller, reply, scripted, tenant_server

__all__ = ["served"]  # the fixture of tests/support/console_http, used here


async def test_a_run_that_asks_nothing_does_not_make_live_pages_read_the_requests_again(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    asker = scripted("asker", reply(calls=(("ask", '{"question": "Which region?"}'),)))
    agents = [scripted("worker", reply("done", tokens=3)), asker]
    await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="quiet", agents=agents))

    def rows(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [row for message in messages if message["t"] == "rows" for row in message["rows"]]

    async with console_for(served.port) as url, person() as http:
        await sign_in(http, url, ACME[1])
        async with http.get(url + "/runtimes/quiet/live") as stream:
            worker, result = await acme.run("quiet", "worker", "work")
            assert result.status == pb.STATUS_DONE
            done = await live_messages(stream, lambda got: any(r["id"] == worker and r["result"] == "done" for r in rows(got)))
            # A run that asks: its Requests are read again (the page's cue is the message after its row).
            spawned = await acme("Spawn", pb.SpawnRequest(runtime_id="quiet", parent_id="root", agent="asker"))
            await acme("Wake", pb.WakeRequest(runtime_id="quiet", handle_id=spawned.handle_id, prompt="ask"))
            asked = await live_messages(stream, lambda got: {"t": "requests"} in got)
    assert {"t": "requests"} not in done
    first = asked.index({"t": "requests"})
    assert any(row["id"] == spawned.handle_id for row in rows(asked[:first]))


async def test_a_sessions_live_streams_are_capped_the_oldest_told_to_stop(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="watched", agents=[scripted("a", reply("x"))]))
    limits = Limits(live_streams_per_session=2)
    async with console_for(served.port, limits=limits) as url, person() as http:
        await sign_in(http, url, ACME[1])
        streams = []
        for _ in range(3):  # one after another: each has sent something (it is counted) before the next
            streams.append(await http.get(url + "/runtimes/watched/live"))
            assert await streams[-1].content.readline()
        first, second, third = streams
        try:
            told = await live_messages(first, lambda messages: any(m["t"] == "gone" for m in messages))
            assert "live pages" in told[-1]["message"]
            for stream in (second, third):
                assert stream.status == 200
        finally:
            for stream in (first, second, third):
                stream.close()


async def test_live_pages_of_one_runtime_and_one_token_share_one_watch(tmp_path: Path) -> None:
    async with tenant_server(tmp_path, metrics_listen="127.0.0.1:0") as served:
        acme = Caller(served.stub, ACME)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="shared", agents=[scripted("a", reply("x", tokens=4))]))
        ran = [(await acme.run("shared", "a", "go"))[0] for _ in range(3)]
        before = await started_calls(served)
        async with console_for(served.port) as url, person() as first, person() as second:
            await sign_in(first, url, ACME[1])
            await sign_in(second, url, ACME[1])  # another session, the same token

            def all_rows(got: list[dict[str, Any]]) -> bool:
                return {row["id"] for message in got if message["t"] == "rows" for row in message["rows"]} >= set(ran)

            async with first.get(url + "/runtimes/shared/live") as one, second.get(url + "/runtimes/shared/live") as other:
                assert all_rows(await live_messages(one, all_rows))
                assert all_rows(await live_messages(other, all_rows))  # the tree as it stands, not the history again
                watches = (await started_calls(served))["Watch"] - before["Watch"]
        assert watches == 1


async def test_a_feed_ends_its_watch_when_its_last_page_goes_mid_stream(tmp_path: Path) -> None:
    # A reply streamed in thousands of pieces: the feed is reading when its last page goes.
    spoken = reply("0123456789" * 2000, tokens=40)
    spoken.stream_chunk_chars = 4
    spoken.stream_pause.CopyFrom(duration(0.001))
    async with tenant_server(tmp_path, metrics_listen="127.0.0.1:0") as served:
        acme = Caller(served.stub, ACME)
        await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id="chatty", agents=[scripted("a", spoken, spoken)]))
        async with console_for(served.port) as url, person() as http:
            await sign_in(http, url, ACME[1])
            csrf = await page_csrf(http, url)
            async with http.get(url + "/runtimes/chatty/live") as stream:
                assert await stream.content.readline()  # (its Watch is open: the turn streams to it)
                spawned = await acme("Spawn", pb.SpawnRequest(runtime_id="chatty", parent_id="root", agent="a"))
                await acme("Wake", pb.WakeRequest(runtime_id="chatty", handle_id=spawned.handle_id, prompt="talk"))
                await live_messages(stream, lambda got: any(message["t"] == "text" for message in got))
                async with http.post(url + "/signout", data={"csrf": csrf}, headers={"Origin": url}) as out:
                    assert out.status == 200 and out.url.path == "/signin"  # the session's pages end with it

                async def watch_ended() -> bool:
                    return (await started_calls(served, "grpc_server_handled_total"))["Watch"] == 1

                await eventually(watch_ended, "the feed's Watch to end", timeout=10)
                assert (await started_calls(served))["Watch"] == 1
