"""How journal steps look on disk: versioned JSON, one object per step.

    {"v": 1, "k": "ModelReplied", "d": {...the step's fields...}}

`v` is the payload version. Any change to a step's fields (even a new field with a default:
an older server would drop it unseen) bumps PAYLOAD_VERSION and adds an upgrade from the
older version to UPGRADES, so that a store written by an older release always replays and
an older server refuses a newer store; tests/store/test_payloads.py pins the bytes
of every step kind at the current version so that no such change goes unnoticed. msgspec,
not pydantic: measured at 0.7 µs to encode and 1.4 µs to decode a model reply, against
1.5 and 3.0 µs (bench/encoders.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from pydantic import TypeAdapter

from ..domain.definitions.same_objects import SameObjects
from ..domain.journal import STEPS, Entry, Step
from ..domain.vocabulary import AgentSpec

PAYLOAD_VERSION = 7


def _unchanged(kind: str, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return kind, fields


_USAGE_KEYS = frozenset(("turns", "own_tokens", "total_tokens", "tool_calls"))


def _split_usage(kind: str, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """4 -> 5: tokens are kept as the providers bill them, with their cost (usage.Tokens,
    Cost and Usage, named tuples: arrays in the payload). A step written before has one
    figure per reply: it reads as input tokens (the totals stay exact; the split is
    unknown), and its cost as unpriced (no price was in force). docs/usage.md."""
    if kind == "ModelReplied":
        tokens = int(fields.get("tokens", 0))
        fields = {**fields, "split": [tokens, 0, 0, 0, 0], "cost": _old_cost(tokens)}
    return kind, _with_split_usages(fields)


def _old_cost(tokens: int) -> list[Any]:
    return [0, "", tokens == 0]


def _with_split_usages(value: Any) -> Any:
    """Every Usage inside a step (a reply's, a result's, an imported event's) gains its split."""
    if isinstance(value, list):
        return [_with_split_usages(item) for item in value]
    if not isinstance(value, dict):
        return value
    value = {key: _with_split_usages(item) for key, item in value.items()}
    for key, item in value.items():
        if isinstance(item, dict) and _USAGE_KEYS <= item.keys():
            own, total = int(item["own_tokens"]), int(item["total_tokens"])
            value[key] = [
                int(item["turns"]),
                own,
                total,
                int(item["tool_calls"]),
                int(item.get("subtree_tool_calls", 0)),
                [own, 0, 0, 0, 0],
                [total, 0, 0, 0, 0],
                _old_cost(own),
                _old_cost(total),
                False,
                False,
            ]
    return value


# version -> a function from that version's (kind, fields) to the next version's.
UPGRADES: dict[int, Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]]] = {
    # 2 added fields with defaults (a message's refusal, truncated and thinking; a result's
    # failure; a reply's estimated usage): a version 1 step reads as it is.
    1: _unchanged,
    # 3 added steps (Configured, Queued) and fields with defaults (an inbox item's trust,
    # coalesce key and count; a message's trust and summary flag).
    2: _unchanged,
    # 4 added a step (Replied: a call's answer, kept for its request id).
    3: _unchanged,
    # 5 split tokens as the providers bill them, and added their cost.
    4: _split_usage,
    # 6 added a field with a default (a result's output, of an agent with an output schema).
    5: _unchanged,
    # 7 added steps (Forked, Held, Rewound, Replaying) and a field with a default (a result's
    # figures inherited at a fork's cut).
    6: _unchanged,
}


class _Envelope(msgspec.Struct):
    v: int
    k: str
    d: msgspec.Raw


class PayloadTooNew(RuntimeError):
    pass


_AGENTS = TypeAdapter(tuple[AgentSpec, ...])
_ENCODED_DEFINITIONS: SameObjects[tuple[AgentSpec, ...], bytes] = SameObjects(64)
_encoder = msgspec.json.Encoder()
_envelope = msgspec.json.Decoder(_Envelope)
_decoders = {kind.__name__: msgspec.json.Decoder(kind) for kind in STEPS}
_KINDS = {kind: kind.__name__ for kind in STEPS}


Row = tuple[str, int, float, int, int, bytes]  # runtime_id, seq, at, first_event, last_event, step
# A store row holding a run of one runtime's entries (SQLite's group commits): runtime_id, and
# the first entry's seq, time and first event, the last entry's last event, the entries, the
# last entry's seq. The entries are one JSON array, `[[seq, at, first_event, last_event, step], ...]`.
GroupRow = tuple[str, int, float, int, int, bytes, int]


def journal_rows(runtime_id: str, expected: int, entries: Sequence[Entry]) -> tuple[list[Row], int]:
    """The rows a store writes for an append, checked (in sequence, encodable) and encoded all
    at once, so that nothing reaching a commit can fail; and the seq due next."""
    next_seq = check_sequence(runtime_id, expected, entries)
    return [(runtime_id, e.seq, e.at, e.first_event, e.last_event, encode(e.step)) for e in entries], next_seq


def payload_bytes(rows: Sequence[Row]) -> int:
    """What the rows' steps take in the store, as a tenant's store-bytes quota counts them."""
    return sum(len(row[5]) for row in rows)


def definitions_json(agents: tuple[AgentSpec, ...]) -> bytes:
    """A runtime's definitions as every store keeps them (and the store-bytes quota counts them):
    encoded once for definitions a host creates runtimes of again and again (the same object)."""
    encoded = _ENCODED_DEFINITIONS.get(agents)
    if encoded is None:
        encoded = _ENCODED_DEFINITIONS.put(agents, _AGENTS.dump_json(agents))
    return encoded


def check_sequence(runtime_id: str, expected: int, entries: Sequence[Entry]) -> int:
    """Entries must continue a runtime's journal without gap or repeat; the next seq after them."""
    for entry in entries:
        if entry.seq != expected:
            raise ValueError(f"runtime {runtime_id!r}: entry {entry.seq} appended where {expected} was due")
        expected += 1
    return expected


def encode(step: Step) -> bytes:
    try:
        data = _encoder.encode(step)
    except UnicodeEncodeError:
        # Text from outside (a provider's error, a tool's 202 body) may hold lone surrogates,
        # which UTF-8 cannot carry: they are stored as U+FFFD rather than wedge the journal.
        data = _encoder.encode(_valid_unicode(msgspec.to_builtins(step)))
    return b'{"v":%d,"k":"%s","d":%s}' % (PAYLOAD_VERSION, _KINDS[type(step)].encode(), data)


def _valid_unicode(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode()
    if isinstance(value, list):
        return [_valid_unicode(item) for item in value]
    if isinstance(value, dict):
        return {_valid_unicode(key): _valid_unicode(item) for key, item in value.items()}
    return value


def decode(payload: bytes | msgspec.Raw) -> Step:
    envelope = _envelope.decode(payload)
    if envelope.v == PAYLOAD_VERSION:
        step: Step = _decoders[envelope.k].decode(envelope.d)
        return step
    if envelope.v > PAYLOAD_VERSION:
        raise PayloadTooNew(f"a journal step of payload version {envelope.v}, newer than this server knows; upgrade the server")
    kind, fields = envelope.k, msgspec.json.decode(envelope.d)
    for version in range(envelope.v, PAYLOAD_VERSION):
        kind, fields = UPGRADES[version](kind, fields)
    upgraded: Step = msgspec.convert(fields, type=STEPS[[k.__name__ for k in STEPS].index(kind)])
    return upgraded


# A group row holds at most this many steps, and no more bytes than this after its first:
# a reader of part of a journal (a page of Watch's history) decodes a row's whole array, so
# rows stay small whatever one tick wrote (3,000 task children spawned at once, say).
GROUP_STEPS = 256
GROUP_BYTES = 1 << 20


def grouped(rows: Sequence[Row]) -> list[GroupRow]:
    """Rows as one group row per runtime (more for a long run of steps), in order: one B-tree
    insert a runtime instead of one a step (a group commit's SQLite work falls by half:
    bench/store.py)."""
    runs: list[list[Row]] = []
    filling: dict[str, tuple[list[Row], int]] = {}  # runtime -> its run being filled, and its steps' bytes
    for row in rows:
        run, size = filling.get(row[0], ([], 0))
        if not run or len(run) >= GROUP_STEPS or size + len(row[5]) > GROUP_BYTES:
            run, size = [], 0
            runs.append(run)
        run.append(row)
        filling[row[0]] = (run, size + len(row[5]))
    return [
        (
            run[0][0],
            run[0][1],
            run[0][2],
            run[0][3],
            run[-1][4],
            b"[%s]" % b",".join(b"[%d,%r,%d,%d,%s]" % (seq, at, first, last, step) for _, seq, at, first, last, step in run),
            run[-1][1],
        )
        for run in runs
    ]


GROUP = msgspec.json.Decoder(list[tuple[int, float, int, int, msgspec.Raw]])  # a group row's steps


def ungrouped(
    seq: int,
    at: float,
    first_event: int,
    last_event: int,
    stored: bytes,
    after_event: int | None = None,
    limit: int | None = None,
) -> list[Entry]:
    """The entries of a store row: a group row's, or the one step of a row written before
    groups (a step's payload is a JSON object, a group a JSON array). With `after_event`, only
    those with an event above it, at most `limit` of them: the others' steps are not decoded."""
    if stored[:1] != b"[":
        if after_event is not None and last_event <= after_event:
            return []
        return [Entry(seq, at, first_event, last_event - first_event + 1, decode(stored))]
    wanted = GROUP.decode(stored)
    if after_event is not None:
        wanted = [item for item in wanted if item[3] > after_event]
    return [Entry(s, a, f, last - f + 1, decode(step)) for s, a, f, last, step in wanted[:limit]]


def steps_in(stored: bytes) -> list[Step]:
    """The steps of a store row, a group row's or a one-step row's (a reader that needs no more)."""
    return [entry.step for entry in ungrouped(0, 0.0, 0, 0, stored)]
