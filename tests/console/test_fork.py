"""Forks in the console, over plain HTTP against a real server: a transcript's messages each with
the event seq to fork at (derived from the runtime's Watch history), a fork from one of them
that leads to the fork's page, which names its origin; and a fork's form without its CSRF token
refused with nothing forked."""

from __future__ import annotations

import re
from collections.abc import Callable

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.console.gateway import HandleHistory, message_seqs

from tests.support.console_http import console_for, page_csrf, person, served, sign_in
from tests.support.servers import Served
from tests.support.tenants import ACME, ASKER, Caller

__all__ = ["served"]  # the fixture of tests/support/console_http, used here

MESSAGE = re.compile(r'<li class="message (\w+)')
AT_SEQ = re.compile(r'name="at_seq" value="(\d+)"')
REQUEST_ID = re.compile(r'name="request_id" value="([^"]+)"')


def forms(page: str) -> list[tuple[str, int | None, str | None]]:
    """Each message of a transcript page: its role, the seq its fork form names (None: no form)
    and the form's request id."""
    found = []
    for part in page.split('<li class="message ')[1:]:
        role = part.split('"', 1)[0].split()[0]
        seq, request_id = AT_SEQ.search(part), REQUEST_ID.search(part)
        found.append((role, int(seq.group(1)) if seq else None, request_id.group(1) if request_id else None))
    return found


async def asked_and_answered(acme: Caller, runtime_id: str) -> tuple[str, list[pb.Event]]:
    """ASKER run once (a relay call answered, then its answer) and woken again: its handle, and
    the handle's events."""
    await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[ASKER]))
    handle, result = await acme.run(runtime_id, "asker", "go")
    assert result.status == pb.STATUS_PENDING
    answer = pb.Answer(
        id=result.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=result.pending.calls[0].id, output="x is 42")]
    )
    resumed = await acme("Resume", pb.ResumeRequest(runtime_id=runtime_id, answer=answer))
    assert resumed.result.status == pb.STATUS_DONE
    await acme("Wake", pb.WakeRequest(runtime_id=runtime_id, handle_id=handle, prompt="again"))
    waited = await acme("Wait", pb.WaitRequest(runtime_id=runtime_id, handle_id=handle))
    assert waited.result.status == pb.STATUS_DONE and waited.result.turns == 3
    events = []
    call = acme.stub.Watch(pb.WatchRequest(runtime_id=runtime_id), metadata=(("authorization", f"Bearer {ACME[1]}"),))
    async for response in call:
        events.append(response.event)
        if response.event.WhichOneof("payload") == "result" and response.event.result.turns == 3:
            break
    call.cancel()
    return handle, [event for event in events if event.handle_id == handle]


def seq_of(events: list[pb.Event], kind: str, test: Callable[[pb.Event], bool] | None = None) -> list[int]:
    return [event.seq for event in events if event.WhichOneof("payload") == kind and (test is None or test(event))]


async def test_each_message_of_a_transcript_names_the_event_to_fork_at(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    handle, events = await asked_and_answered(acme, "asked")
    running = seq_of(events, "state_changed", lambda e: e.state_changed.state == pb.HANDLE_STATE_RUNNING)
    replies = seq_of(events, "turn_ended")
    [result_of_call] = seq_of(events, "tool_call_ended")
    async with console_for(served.port) as url, person() as http:
        await sign_in(http, url, ACME[1])
        async with http.get(url + f"/runtimes/asked/transcript?handle={handle}") as page:
            assert page.status == 200
            shown = forms(await page.text())
    assert [role for role, _, _ in shown] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    go = max(seq for seq in running if seq < replies[0])  # the run's start (the only RUNNING before its first reply)
    again = max(seq for seq in running if replies[1] < seq < replies[2])  # the second run's start
    assert [seq for _, seq, _ in shown] == [go, replies[0], result_of_call, replies[1], again, replies[2]]
    assert go < replies[0] < result_of_call < replies[1] < again < replies[2]
    request_ids = [request_id for _, _, request_id in shown]
    assert len(set(request_ids)) == 6  # a form each: two forks from one page are two forks


def test_a_message_whose_event_is_unknown_gets_no_fork() -> None:
    history = HandleHistory(replies={1: 4, 2: 9}, results={"call_1_1": 7}, runs=[2, 8])
    page = [
        pb.Message(role="user", content="go"),
        pb.Message(role="assistant", turn=1, tool_calls=[pb.ToolCall(id="call_1_1", name="lookup")]),
        pb.Message(role="tool", tool_call_id="call_1_1"),
        pb.Message(role="assistant", turn=2),
        pb.Message(role="user", content="a completion gate's feedback"),  # recorded by no event
        pb.Message(role="user", content="summary", summary=True),
        pb.Message(role="assistant", turn=3),  # its reply's event not read (yet)
        pb.Message(role="user", content="waiting for its reply"),
    ]
    assert message_seqs(page, history, first_page=True) == [2, 4, 7, 9, None, None, None, None]
    # On a later page, a user message with no reply before it on the page: which user message
    # came first is unknown there.
    assert message_seqs(page[:2], history, first_page=False) == [None, 4]
    # A run stopped by an interrupt (its user message cut back), then another: the second's start.
    history = HandleHistory(replies={1: 4, 2: 20}, runs=[2, 6, 12])
    page = [
        pb.Message(role="user"),
        pb.Message(role="assistant", turn=1),
        pb.Message(role="user"),
        pb.Message(role="assistant", turn=2),
    ]
    assert message_seqs(page, history, first_page=True) == [2, 4, 12, 20]


async def test_a_fork_from_a_message_leads_to_the_fork_which_names_its_origin(served: Served) -> None:
    acme = Caller(served.stub, ACME)
    handle, events = await asked_and_answered(acme, "source")
    first_reply = seq_of(events, "turn_ended")[0]
    async with console_for(served.port) as url, person() as http:
        await sign_in(http, url, ACME[1])
        csrf = await page_csrf(http, url, f"/runtimes/source/transcript?handle={handle}")
        form = {"csrf": csrf, "at_seq": str(first_reply), "request_id": "fork-from-reply-1"}
        async with http.post(url + "/runtimes/source/fork", data=form, headers={"Origin": url}, allow_redirects=False) as sent:
            assert sent.status == 303, await sent.text()
            location = sent.headers["Location"]
        assert location.startswith("/runtimes/") and location != "/runtimes/source"
        fork_id = location.removeprefix("/runtimes/")
        async with http.get(url + location) as page:
            text = await page.text()
        assert f'Forked from <a href="/runtimes/source">source</a> at event #{first_reply}' in text
        assert f"Forked source at event #{first_reply}. Held until a Wake: {handle}." in text  # the flash
        # The same form sent again (a double click): the same fork, no second one.
        async with http.post(url + "/runtimes/source/fork", data=form, headers={"Origin": url}, allow_redirects=False) as again:
            assert (again.status, again.headers["Location"]) == (303, location)
        # Without its CSRF token: refused, nothing forked.
        bare = {"at_seq": str(first_reply), "request_id": "fork-without-csrf"}
        async with http.post(url + "/runtimes/source/fork", data=bare, headers={"Origin": url}, allow_redirects=False) as refused:
            assert refused.status == 403
        async with http.get(url + "/runtimes/source") as page:
            assert 'id="origin"' not in await page.text()  # the source is no fork
    forks = await acme("ListRuntimes", pb.ListRuntimesRequest(forks_of="source"))
    assert [summary.runtime_id for summary in forks.runtimes] == [fork_id]
    view = await acme("Inspect", pb.InspectRequest(runtime_id=fork_id, handle_id=handle))
    assert (view.forked_from, view.fork_seq, view.handle.state) == ("source", first_reply, pb.HANDLE_STATE_HELD)
    assert view.handle.turns == 1
