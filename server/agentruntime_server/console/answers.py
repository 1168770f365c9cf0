"""The Answer a Request's form describes, checked before anything is sent: a JSON answer must be
one the runtime can take (an object, no deeper than it decodes, numbers a double holds, valid
Unicode); anything else is a ValueError saying what is wrong."""

from __future__ import annotations

import json
import math
from typing import Any

from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import struct_pb2

MAX_FIELD = 256 * 1024  # characters of a form field (the runtime's own limit is in bytes: it says so)
# Objects and arrays within each other. The runtime decodes a message at most 100 levels deep,
# and each level of a JSON object is three (a Struct, its field, the Value): 20 is well within.
MAX_JSON_DEPTH = 20
SAFE_INTEGER = 2**53  # past it a double (what a JSON number becomes in the API) changes the number


class Unsendable(ValueError):
    """Valid JSON that the runtime cannot take as an answer's data."""


def text_field(form: Any, name: str) -> str:
    value = form.get(name, "")
    return value[:MAX_FIELD] if isinstance(value, str) else ""


def answer_from_form(form: Any) -> pb.Answer:
    """The Answer a Request's form describes; a ValueError says what is wrong with it."""
    answer = pb.Answer(id=text_field(form, "request"))
    if not answer.id:
        raise ValueError("the form names no request")
    decision = text_field(form, "decision")
    reason = text_field(form, "reason").strip()
    if decision in ("deny", "decline"):
        answer.ok = False
        answer.reason = reason
        return answer
    if decision not in ("approve", "answer"):
        raise ValueError("choose an answer")
    answer.ok = True
    answer.reason = reason
    calls = [name.removeprefix("output:") for name in form if isinstance(name, str) and name.startswith("output:")]
    for call_id in calls:
        output = text_field(form, f"output:{call_id}")
        answer.outputs.append(pb.ToolOutput(call_id=call_id, output=output, is_error=bool(form.get(f"error:{call_id}"))))
    text = text_field(form, "answer")
    if text_field(form, "mode") == "json" and text.strip():
        answer.data.CopyFrom(json_data(text))
    elif text.strip():
        answer.reason = text  # a text answer to the `ask` tool: what the model reads
    return answer


def json_data(text: str) -> struct_pb2.Struct:
    """A JSON object as the Struct an Answer carries, or a ValueError saying why it cannot be."""
    try:
        data = json.loads(text, parse_constant=_not_json, parse_float=_double, parse_int=_integer)
    except Unsendable:
        raise
    except RecursionError:
        raise Unsendable(f"the answer is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as error:
        raise ValueError(f"the answer is not JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError("the answer must be a JSON object, {...}")
    _check(data)
    struct = struct_pb2.Struct()
    struct.update(data)
    return struct


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is no JSON value")  # (Python's json reads NaN and Infinity)


def _double(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Unsendable(f"the answer holds {_cut(text)}, a number a double cannot hold")
    return value


def _integer(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > 16 or abs(int(text)) > SAFE_INTEGER:
        raise Unsendable(
            f"the answer holds {_cut(text)}, a number a double cannot hold exactly (past 2^53): write it as a string"
        )
    return int(text)


def _check(data: dict[str, Any]) -> None:
    """Depth and Unicode, walked without recursion (a value may be as deep as json read)."""
    pending: list[tuple[Any, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise Unsendable(f"the answer is nested deeper than {MAX_JSON_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
            for key, item in items:
                if key is not None:
                    _unicode(key)
                pending.append((item, depth + 1))
        elif isinstance(value, str):
            _unicode(value)


def _unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Unsendable(f"the answer holds {_cut(ascii(text))}, which is not valid Unicode (a lone surrogate)") from None


def _cut(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."
