"""The Answer each Request form makes (console/pages.answer_from_form), and what it refuses to
send: checked in the console before any call."""

from __future__ import annotations

import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.console.pages import answer_from_form
from google.protobuf import json_format
from multidict import MultiDict


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
