"""How the pages show the API's values: names, figures, budgets, JSON."""

from __future__ import annotations

import json
import re
from typing import Any

from agentruntime.cli.view import cost_text, failure_name, limit_name, state_name, status_name
from agentruntime.v1 import agent_runtime_pb2 as pb
from google.protobuf import json_format

__all__ = [
    "budget_text",
    "cost_text",
    "failure_name",
    "json_text",
    "limit_name",
    "state_name",
    "status_name",
    "struct_text",
    "tree_order",
]


def budget_text(budget: pb.Budget) -> str:
    """`turns 10 · tokens 5000 · cost 0.5` for the budget's set caps, `-` for none."""
    caps = []
    for name in ("max_turns", "max_tokens", "max_tool_calls", "max_children", "max_depth"):
        if budget.HasField(name):
            caps.append(f"{name.removeprefix('max_').replace('_', ' ')} {getattr(budget, name)}")
    if budget.HasField("max_cost"):
        caps.append(f"cost {budget.max_cost / 1_000_000:g}")
    if budget.HasField("max_wall_time"):
        caps.append(f"wall {budget.max_wall_time.ToTimedelta()}")
    if budget.on_exhausted == pb.ON_EXHAUSTED_ASK and caps:
        caps.append("asks when reached")
    return " · ".join(caps) or "-"


def json_text(text: str) -> str:
    """A JSON text indented for reading (as given when it is not JSON)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def struct_text(message: Any) -> str:
    return json.dumps(json_format.MessageToDict(message), indent=2, ensure_ascii=False)


_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def tree_order(handle_id: str) -> list[tuple[str, int]]:
    """Parents before children, siblings by agent and number (`writer.2` before `writer.10`)."""
    key = []
    for segment in handle_id.split("/"):
        found = _NUMBERED.match(segment)
        key.append((found.group(1), int(found.group(2))) if found else (segment, 0))
    return key
