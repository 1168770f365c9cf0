"""The Answer each Request form makes (console/answers.answer_from_form), and what it refuses to
send: checked in the console before any call. Over plain HTTP against a real server: a JSON
answer the runtime could not take is a 400 page saying why (nothing sent), and the deepest the
console sends is one the runtime takes."""

from __future__ import annotations

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.console.answers import MAX_JSON_DEPTH, answer_from_form
from google.protobuf import json_format
from multidict import MultiDict

from tests.support.console_http import SECURITY_HEADERS, console_for, page_csrf, person, served, sign_in
from tests.support.servers import Served
from tests.support.tenants import ACME, Caller, reply, scripted

__all__ = ["served"]  # the fixture of tests/support/console_http, used here


def form(**fields: str) -> MultiDict[str]:
    return MultiDict({key.replace("__", ":"): value for key, value in fields.items()})


def test_an_approval_approved_or_denied_with_its_reason() -> None:
    assert answer_from_form(form(request="r1", decision="approve")) == pb.Answer(id="r1", ok=True)
    denied = answer_from_form(form(request="r1", decision="deny", reason=" change freeze "))
    assert denied == pb.Answer(id="r1", ok=False, reason="change freeze")


def test_relay_calls_get_one_output_each_marked_failed_when_ticked() -> None:
    answer = answer_from_form(
        form(request="r2", decision="answer", output__call_1="deployed", output__call_2="no disk", error__call_2="1")
    )
    assert answer.ok and [(o.call_id, o.output, o.is_error) for o in answer.outputs] == [
        ("call_1", "deployed", False),
        ("call_2", "no disk", True),
    ]


def test_a_question_takes_text_or_a_json_object() -> None:
    text = answer_from_form(form(request="r3", decision="answer", mode="text", answer="eu-west-1"))
    assert (text.ok, text.reason, text.HasField("data")) == (True, "eu-west-1", False)
    data = answer_from_form(form(request="r3", decision="answer", mode="json", answer='{"extend": {"max_turns": 20}}'))
    assert json_format.MessageToDict(data.data) == {"extend": {"max_turns": 20}}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"decision": "answer"}, "names no request"),
        ({"request": "r4", "decision": "maybe"}, "choose an answer"),
        ({"request": "r4", "decision": "answer", "mode": "json", "answer": "{oops"}, "not JSON"),
        ({"request": "r4", "decision": "answer", "mode": "json", "answer": "[1, 2]"}, "JSON object"),
        ({"request": "r4", "decision": "answer", "mode": "json", "answer": '{"n": NaN}'}, "not JSON"),
    ],
)
def test_what_cannot_be_an_answer_is_refused_with_the_reason(fields: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        answer_from_form(form(**fields))


async def asking_runtime(served: Served, runtime_id: str) -> tuple[str, pb.TaskResult]:
    acme = Caller(served.stub, ACME)
    asker = scripted("asker", reply(calls=(("ask", '{"question": "Which region?"}'),)), reply("noted", tokens=3))
    await acme("CreateRuntime", pb.CreateRuntimeRequest(runtime_id=runtime_id, agents=[asker]))
    handle_id, result = await acme.run(runtime_id, "asker", "deploy")
    assert result.status == pb.STATUS_PENDING
    return handle_id, result


NESTED_DEEP = '{"a": ' * 40 + "1" + "}" * 40
NESTED_VERY_DEEP = '{"a": ' * 5000 + "1" + "}" * 5000


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (NESTED_DEEP, "nested deeper than"),
        (NESTED_VERY_DEEP, "nested deeper than"),
        ('{"n": 1' + "0" * 400 + "}", "a number a double cannot hold"),
        ('{"n": 1e400}', "a number a double cannot hold"),
        ('{"n": 123456789012345678901}', "a number a double cannot hold"),
        ('{"n": NaN}', "not JSON"),
        ('{"text": "\\ud800"}', "not valid Unicode"),
        ('{"\\udfff": 1}', "not valid Unicode"),
    ],
    ids=["nested-40", "nested-5000", "400-digits", "1e400", "past-2^53", "nan", "lone-surrogate", "surrogate-key"],
)
async def test_a_json_answer_that_cannot_be_sent_is_a_400_page_saying_why(served: Served, answer: str, says: str) -> None:
    handle_id, result = await asking_runtime(served, "json-checked")
    async with console_for(served.port) as url, person() as http:
        await sign_in(http, url, ACME[1])
        csrf = await page_csrf(http, url, "/runtimes/json-checked")
        form = {"csrf": csrf, "request": result.pending.id, "decision": "answer", "mode": "json", "answer": answer}
        async with http.post(
            url + "/runtimes/json-checked/resume", data=form, headers={"Origin": url}, allow_redirects=False
        ) as sent:
            page = await sent.text()
            assert sent.status == 400, (sent.status, page[:300])
            assert says in page and all(name in sent.headers for name in SECURITY_HEADERS)
    waited = await Caller(served.stub, ACME)("Wait", pb.WaitRequest(runtime_id="json-checked", handle_id=handle_id))
    assert waited.result.status == pb.STATUS_PENDING  # nothing was sent


async def test_a_form_that_is_not_utf8_is_a_400_page(served: Served) -> None:
    async with console_for(served.port) as url, person() as http:
        await sign_in(http, url, ACME[1])
        body = b"csrf=x&answer=\xff\xfe"
        headers = {"Origin": url, "Content-Type": "application/x-www-form-urlencoded"}
        async with http.post(url + "/runtimes/any/resume", data=body, headers=headers, allow_redirects=False) as sent:
            assert sent.status == 400 and "UTF-8" in await sent.text()
            assert all(name in sent.headers for name in SECURITY_HEADERS)


async def test_the_deepest_json_answer_the_console_sends_is_one_the_runtime_takes(served: Served) -> None:

    handle_id, result = await asking_runtime(served, "json-deepest")
    # Objects in objects: the deepest protobuf nesting a JSON value of that depth makes.
    deepest = '{"a": ' * MAX_JSON_DEPTH + "1" + "}" * MAX_JSON_DEPTH
    async with console_for(served.port) as url, person() as http:
        await sign_in(http, url, ACME[1])
        csrf = await page_csrf(http, url, "/runtimes/json-deepest")
        form = {"csrf": csrf, "request": result.pending.id, "decision": "answer", "mode": "json", "answer": deepest}
        async with http.post(
            url + "/runtimes/json-deepest/resume", data=form, headers={"Origin": url}, allow_redirects=False
        ) as sent:
            assert sent.status == 303
    waited = await Caller(served.stub, ACME)("Wait", pb.WaitRequest(runtime_id="json-deepest", handle_id=handle_id))
    assert waited.result.status == pb.STATUS_DONE
