"""The edge's memo of decoded definitions (api/definitions_memo.py) and the domain's of objects
worked out once (domain/definitions/same_objects.py): what is kept, for whom, and how much."""

from __future__ import annotations

from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.api.definitions_memo import DecodedDefinitions
from agentruntime_server.domain.definitions.same_objects import SameObjects

from tests.support.build import agent, http_tool


def _agents(instructions: str = "Work.") -> list[pb.AgentDef]:
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    return [agent("worker", instructions=instructions, tools=[http_tool("ping", "http://127.0.0.1:9/ping", schema)])]


def test_the_same_definitions_of_one_tenant_decode_to_one_object() -> None:
    memo = DecodedDefinitions()
    first, found = memo.decode("acme", _agents())
    again, _ = memo.decode("acme", _agents())
    assert found == [] and again is first
    assert memo.decode("acme", _agents("Work harder."))[0] is not first
    assert memo.decode("globex", _agents())[0] is not first  # each tenant's apart
    assert memo.decode("globex", _agents())[0] == first  # (the same content)


def test_definitions_with_a_fault_are_not_kept() -> None:
    memo = DecodedDefinitions()
    wrong = [agent("worker", tools=[pb.ToolDef(name="ping")])]  # no kind of tool
    first, found = memo.decode("acme", wrong)
    assert found and len(memo) == 0
    again, found_again = memo.decode("acme", wrong)
    assert again is not first and found_again == found


def test_the_memo_keeps_the_latest_and_nothing_too_large() -> None:
    memo = DecodedDefinitions(kept=2, kept_bytes=2_000)
    one, _two, three = (memo.decode("acme", _agents(text))[0] for text in ("one", "two", "three"))
    assert len(memo) == 2 and memo.decode("acme", _agents("one"))[0] is not one
    assert memo.decode("acme", _agents("three"))[0] is three
    large, _ = memo.decode("acme", _agents("x" * 3_000))
    assert memo.decode("acme", _agents("x" * 3_000))[0] is not large


def test_same_objects_are_kept_by_identity_not_equality() -> None:
    kept: SameObjects[tuple[int, ...], str] = SameObjects(2)
    key = (1, 2)
    kept.put(key, "worked out")
    assert kept.get(key) == "worked out"
    assert kept.get(tuple([1, 2])) is None  # equal, but another object
    kept.put((3,), "b")
    kept.get(key)  # (used: the least recently used is (3,))
    kept.put((4,), "c")
    assert kept.get(key) == "worked out" and len(kept) == 2
