"""Typed results: a TaskResult's `output` decoded into the host's own type.

An agent with an `output_schema` answers JSON that the runtime has validated against it;
`TaskResult.output` carries it (set iff the agent has a schema and the run is DONE). The
helper turns it into a pydantic model (pydantic is optional: it is never imported here, a
model class brings it) or a dataclass, a `msgspec.Struct`, a `TypedDict` or any type
msgspec converts to:

    @dataclass
    class Verdict:
        label: str
        confidence: float
        tags: list[str]

    verdict = output_as(result, Verdict)

A value that does not fit raises `OutputError`, naming the path that did not fit
(`$.confidence`, `$.tags[1]`); so does a result with no output."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from google.protobuf import struct_pb2

from agentruntime.v1 import agent_runtime_pb2 as pb

T = TypeVar("T")

# msgspec names where a value did not fit at the end of its message: "... - at `$.tags[0]`".
_AT = re.compile(r"^(?P<message>.*) - at `(?P<path>\$[^`]*)`$", re.DOTALL)
# A missing or unknown field's message names the field, its location the object holding it.
_FIELD = re.compile(r"^Object (?:missing required|contains unknown) field `(?P<field>[^`]*)`$")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class OutputError(ValueError):
    """A result's output that could not be decoded: `path` is where the value did not fit, as
    a JSONPath from the output's root (`$` is the whole value; a missing field is the path it
    should have been at, an unknown one the path it is at); None when the result carries no
    output at all."""

    def __init__(self, message: str, path: str | None) -> None:
        super().__init__(message)
        self.path = path


def output_json(result: pb.TaskResult) -> Any:
    """The result's output as plain JSON (dict, list, str, float or int, bool, None); None
    when it carries none. A number with no fraction is an int (the Value holds a double)."""
    return _plain(result.output) if result.HasField("output") else None


def output_as(result: pb.TaskResult, model: type[T]) -> T:
    """The result's output decoded into `model`: a pydantic model or pydantic dataclass
    (validated by pydantic), else a dataclass, msgspec Struct, TypedDict or other type that
    msgspec converts to (strictly: no string to number, no fraction into an int). Unknown
    fields are dropped as the type's library drops them by default.

    Raises OutputError when there is no output (a run that did not end DONE, or an agent
    without an output_schema) or when the value does not fit `model`."""
    if not result.HasField("output"):
        status = pb.Status.Name(result.status)
        raise OutputError(
            f"the result of {result.handle_id or 'the handle'} carries no output ({status}: a result has one "
            "only when its agent has an output_schema and the run is DONE)",
            None,
        )
    value = _plain(result.output)
    name = getattr(model, "__qualname__", repr(model))
    if hasattr(model, "__pydantic_validator__"):  # a pydantic BaseModel or pydantic dataclass
        return _pydantic(value, model, name)
    try:
        return msgspec.convert(value, model)
    except msgspec.ValidationError as error:
        message, path = _msgspec_path(str(error))
        raise OutputError(f"the output does not fit {name} at {path}: {message}", path) from error


def _pydantic(value: Any, model: type[T], name: str) -> T:
    import pydantic  # only here, and the model's own import has loaded it already

    try:
        return pydantic.TypeAdapter(model).validate_python(value)
    except pydantic.ValidationError as error:
        problems = error.errors()
        first = problems[0]
        path = _jsonpath(first["loc"])
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise OutputError(f"the output does not fit {name} at {path}: {first['msg']}{more}", path) from error


def _msgspec_path(text: str) -> tuple[str, str]:
    """msgspec's message without its location, and the location ("$" when it names none); a
    missing field's path is where it should have been, an unknown one's where it is."""
    at = _AT.match(text)
    message, path = (at["message"], at["path"]) if at else (text, "$")
    field = _FIELD.match(message)
    if field:
        path += _step(field["field"])
    return message, path


def _jsonpath(loc: tuple[int | str, ...]) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else _step(part) for part in loc)


def _step(field: str) -> str:
    return f".{field}" if _IDENTIFIER.fullmatch(field) else f"[{field!r}]"


def _plain(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {key: _plain(item) for key, item in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_plain(item) for item in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        # JSON has one number type: 3 and 3.0 are the same value, and an int field takes it.
        return int(number) if number.is_integer() else number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None
