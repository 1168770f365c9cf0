"""Journal payload encoders: why store/payloads.py uses msgspec.

Encode and decode of two representative journal steps (a model reply with two tool calls,
and a settled result with a pending Request), with msgspec (what payloads.py does, bare and
in its versioned envelope), pydantic's TypeAdapter (dump_json / validate_json) and, when it
is installed, orjson (encode only: it decodes to dicts, not steps). orjson is not a
dependency of the server; it is measured only if present. Figures are measured, never
asserted: microseconds per call, the median of several runs of 10,000 calls."""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
from agentruntime_server.domain.billing.usage import Usage
from agentruntime_server.domain.journal import ModelReplied, Settled, Step
from agentruntime_server.domain.vocabulary import HandleState, Message, PendingRequest, Status, TaskResult, ToolCall
from agentruntime_server.store import payloads
from pydantic import TypeAdapter

CALLS = 10_000
RUNS = 7

HANDLE = "root/coordinator.1/worker.1"
FETCH = ToolCall("call_2_1", "fetch", '{"url": "https://example.com/reports/2024/q3.csv", "timeout": 10}')
SEARCH = ToolCall("call_2_2", "search", '{"query": "quarterly revenue by region", "limit": 5}')
USAGE = Usage(turns=2, own_tokens=1830, total_tokens=1830, tool_calls=3, subtree_tool_calls=3)

MODEL_REPLIED = ModelReplied(
    HANDLE,
    Message("assistant", "I'll fetch the report and search for context.", (FETCH, SEARCH), turn=2),
    tokens=912,
    usage=USAGE,
)
REQUEST = PendingRequest(
    id=f"{HANDLE}/call_2_1:tool_call",
    kind="tool_call",
    prompt="Run fetch and Resume with one output per call",
    data={
        "calls": [
            {
                "id": FETCH.id,
                "name": FETCH.name,
                "arguments_json": FETCH.arguments_json,
                "idempotency_key": f"rt-1/{HANDLE}/call_2_1",
            }
        ]
    },
    path=tuple(HANDLE.split("/")),
    calls=((FETCH, f"rt-1/{HANDLE}/call_2_1"),),
)
SETTLED = Settled(HANDLE, TaskResult(HANDLE, status=Status.PENDING, pending=REQUEST, usage=USAGE), HandleState.SUSPENDED)

Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any] | None]


def per_call_us(function: Callable[[], object]) -> float:
    """Median microseconds per call over RUNS runs of CALLS calls."""
    samples = []
    for _ in range(RUNS):
        started = time.perf_counter()
        for _ in range(CALLS):
            function()
        samples.append((time.perf_counter() - started) / CALLS * 1e6)
    return statistics.median(samples)


def optional_orjson_dumps() -> Callable[[Any], bytes] | None:
    try:
        module = importlib.import_module("orjson")
    except ImportError:
        return None
    dumps: Callable[[Any], bytes] = module.dumps
    return dumps


def codecs(kind: type[Step]) -> dict[str, Codec | None]:
    encoder = msgspec.json.Encoder()
    decoder = msgspec.json.Decoder(kind)
    adapter: TypeAdapter[Any] = TypeAdapter(kind)
    dumps = optional_orjson_dumps()
    return {
        "msgspec": (encoder.encode, decoder.decode),
        "msgspec + envelope (payloads.py)": (payloads.encode, payloads.decode),
        "pydantic TypeAdapter": (adapter.dump_json, adapter.validate_json),
        "orjson": None if dumps is None else (dumps, None),
    }


def main() -> None:
    print(f"journal payload encoders: µs per call, median of {RUNS} runs of {CALLS:,}")
    print(f"{'step':<14} {'encoder':<34} {'encode':>8} {'decode':>8} {'bytes':>6}")
    for label, step in (("ModelReplied", MODEL_REPLIED), ("Settled", SETTLED)):
        for name, codec in codecs(type(step)).items():
            if codec is None:
                print(f"{label:<14} {name:<34} {'not installed':>17}")
                continue
            encode, decode = codec
            data = encode(step)
            encoded = f"{per_call_us(lambda: encode(step)):8.2f}"  # noqa: B023 (called before the loop moves on)
            decoded = f"{'—':>8}"
            if decode is not None:
                assert decode(data) == step, f"{name} does not round-trip {label}"
                decoded = f"{per_call_us(lambda: decode(data)):8.2f}"  # noqa: B023
            print(f"{label:<14} {name:<34} {encoded} {decoded} {len(data):>6}")


if __name__ == "__main__":
    main()
