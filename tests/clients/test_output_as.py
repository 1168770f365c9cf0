"""The Python client's typed results (agentruntime.output) over a real server: a scripted
agent with an output_schema answers JSON offline, and output_as decodes it into a dataclass,
a pydantic model, a msgspec Struct or a TypedDict; what does not fit is an OutputError naming
its path; a result with no output is one too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import msgspec
import pydantic
import pytest
from agentruntime.client import Client
from agentruntime.output import OutputError, output_as, output_json
from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import json_format

from tests.support.servers import serve
from tests.support.typed import CLASSIFICATION

ROOT = Path(__file__).resolve().parents[2]

VERDICT_SCHEMA = CLASSIFICATION
REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "count": {"type": "number"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "score": {"type": "number"}},
                "required": ["name", "score"],
            },
        },
    },
    "required": ["title", "count", "items"],
}
VERDICT = {"label": "bug", "confidence": 0.75, "tags": ["crash", "ui"]}
REPORT = {"title": "weekly", "count": 3, "items": [{"name": "a", "score": 2}, {"name": "b", "score": 0.5}]}


def scripted(name: str, text: str, schema: dict[str, Any] | None = None, **fields: Any) -> pb.AgentDef:
    definition = json_format.ParseDict(
        {"name": name, "description": f"the {name} agent", "script": {"replies": [{"text": text, "tokens": 3}]}},
        pb.AgentDef(**fields),
    )
    if schema is not None:
        definition.output_schema.update(schema)
    return definition


AGENTS = [
    scripted("classifier", json.dumps(VERDICT), VERDICT_SCHEMA),
    scripted("reporter", json.dumps(REPORT), REPORT_SCHEMA),
    scripted("plain", "just prose"),
    scripted("stubborn", "not JSON at all", VERDICT_SCHEMA, completion=pb.CompletionGate(max_attempts=2)),
]


@dataclass
class Verdict:
    label: str
    confidence: float
    tags: list[str]


class VerdictModel(pydantic.BaseModel):
    label: str
    confidence: float
    tags: list[str]


@pydantic.dataclasses.dataclass
class StrictVerdict:
    label: str
    confidence: float = pydantic.Field(le=0.5)  # the host's own rule, past the schema's
    tags: list[str] = pydantic.Field(default_factory=list)


class VerdictStruct(msgspec.Struct):
    label: str
    confidence: float
    tags: list[str]


class ClosedVerdict(msgspec.Struct, forbid_unknown_fields=True):
    label: str
    confidence: float


class ClosedModel(pydantic.BaseModel, extra="forbid"):
    label: str
    confidence: float


class VerdictDict(TypedDict):
    label: str
    confidence: float
    tags: list[str]


@dataclass
class Item:
    name: str
    score: float


@dataclass
class Report:
    title: str
    count: int
    items: list[Item]


@dataclass
class WholeScores:
    name: str
    score: int


@dataclass
class ReportOfWholeScores:
    title: str
    count: int
    items: list[WholeScores]


class ItemModel(pydantic.BaseModel):
    name: str
    score: int


class ReportModel(pydantic.BaseModel):
    title: str
    count: int
    items: list[ItemModel]


@pytest.fixture
async def results() -> AsyncIterator[dict[str, pb.TaskResult]]:
    """Each agent's result, from one run each on a real server."""
    async with serve() as served, Client(f"127.0.0.1:{served.port}") as client:
        runtime_id = await client.create_runtime(AGENTS)
        yield {definition.name: await client.run(runtime_id, definition.name, "go") for definition in AGENTS}


async def test_a_typed_answer_decodes_into_a_dataclass_a_model_a_struct_and_a_typeddict(
    results: dict[str, pb.TaskResult],
) -> None:
    result = results["classifier"]
    assert result.status == pb.STATUS_DONE and json.loads(result.text) == VERDICT
    assert output_json(result) == VERDICT
    assert output_as(result, Verdict) == Verdict("bug", 0.75, ["crash", "ui"])
    assert output_as(result, VerdictModel) == VerdictModel(label="bug", confidence=0.75, tags=["crash", "ui"])
    assert output_as(result, VerdictStruct) == VerdictStruct("bug", 0.75, ["crash", "ui"])
    assert output_as(result, VerdictDict) == VERDICT
    nested = output_as(results["reporter"], Report)
    assert nested == Report("weekly", 3, [Item("a", 2), Item("b", 0.5)]) and type(nested.count) is int


async def test_a_value_that_does_not_fit_names_its_path(results: dict[str, pb.TaskResult]) -> None:
    @dataclass
    class TextConfidence:
        label: str
        confidence: str
        tags: list[str]

    @dataclass
    class NumberTags:
        label: str
        confidence: float
        tags: list[int]

    @dataclass
    class WithSeverity:
        label: str
        confidence: float
        tags: list[str]
        severity: str

    class ModelWithNumberTags(pydantic.BaseModel):
        label: str
        confidence: float
        tags: list[int]

    class ModelWithSeverity(pydantic.BaseModel):
        label: str
        severity: str

    verdict = results["classifier"]
    cases: list[tuple[type[Any], str, str]] = [
        (TextConfidence, "$.confidence", "Expected `str`, got `float`"),
        (NumberTags, "$.tags[0]", "Expected `int`, got `str`"),
        (WithSeverity, "$.severity", "missing required field `severity`"),
        (list[str], "$", "Expected `array`, got `object`"),
        (ClosedVerdict, "$.tags", "unknown field `tags`"),
        (ClosedModel, "$.tags", "Extra inputs are not permitted"),
        (ModelWithNumberTags, "$.tags[0]", "unable to parse string as an integer (and 1 more)"),
        (ModelWithSeverity, "$.severity", "Field required"),
        (StrictVerdict, "$.confidence", "less than or equal to 0.5"),  # a pydantic dataclass: pydantic judges it
    ]
    for model, path, words in cases:
        with pytest.raises(OutputError) as refused:
            output_as(verdict, model)
        assert refused.value.path == path, model
        assert path in str(refused.value) and words in str(refused.value), str(refused.value)
        assert isinstance(refused.value, ValueError)


async def test_a_whole_number_fits_an_int_and_a_fraction_does_not(results: dict[str, pb.TaskResult]) -> None:
    report = results["reporter"]  # score 2 then 0.5: the Value holds doubles, 2.0 is a whole number
    for model in (ReportOfWholeScores, ReportModel):
        with pytest.raises(OutputError) as refused:
            output_as(report, model)
        assert refused.value.path == "$.items[1].score", model
    decoded = output_as(report, dict[str, Any])
    assert decoded["count"] == 3 and type(decoded["count"]) is int and decoded["items"][1]["score"] == 0.5


async def test_no_output_is_an_error_saying_so(results: dict[str, pb.TaskResult]) -> None:
    plain, stubborn = results["plain"], results["stubborn"]
    assert (plain.status, plain.text) == (pb.STATUS_DONE, "just prose")
    assert (stubborn.status, stubborn.limit) == (pb.STATUS_INCOMPLETE, pb.LIMIT_COMPLETION)
    for result, status in ((plain, "STATUS_DONE"), (stubborn, "STATUS_INCOMPLETE")):
        assert not result.HasField("output") and output_json(result) is None
        for model in (Verdict, VerdictModel):
            with pytest.raises(OutputError) as refused:
                output_as(result, model)
            assert refused.value.path is None
            assert "carries no output" in str(refused.value) and status in str(refused.value)


def test_decoding_into_a_dataclass_never_imports_pydantic() -> None:
    probe = """
import sys
from dataclasses import dataclass
from agentruntime.output import output_as
from agentruntime.v1 import agent_runtime_pb2 as pb
@dataclass
class Verdict:
    label: str
result = pb.TaskResult(status=pb.STATUS_DONE)
result.output.struct_value.update({"label": "bug"})
assert output_as(result, Verdict) == Verdict("bug")
assert "pydantic" not in sys.modules, "pydantic was imported"
"""
    path = os.pathsep.join([str(ROOT / "server"), str(ROOT / "clients" / "python")])
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
