"""JSON Schemas a caller defines (tool input schemas, agents' output schemas, MCP tools'
output schemas): checked completely at CreateRuntime, compiled once.

A schema is a caller's code. It may only refer inside itself (`#/...`, anchors): the
validator's registry knows the JSON Schema metaschemas and nothing else and never
retrieves anything, so no `$ref` reads a file or reaches the network. Patterns run on
RE2 (linear time). Size, depth and the size with every reference expanded are bounded (so
no reference fan-out makes one validation walk millions of nodes), a reference must land on
a subschema, and a schema that recurses without end is refused before it can be called.

Values are checked against them on every call and answer. A plain schema (the keywords most
tools use, no pattern, reference or dialect of its own) is checked first by jsonschema-rs, 75
times faster than jsonschema; what it finds valid is valid, and anything else is judged by
jsonschema, whose message the model is shown (ArgumentsSchema). Where that happens depends on
what it may cost: on the event loop when a bound says it is cheap (ArgumentsSchema.here), in a
checker process with a time budget otherwise (schema_checks.py)."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import jsonschema_rs
import re2
import referencing.exceptions
from jsonschema.protocols import Validator
from jsonschema_specifications import REGISTRY as METASCHEMAS

from ..limits import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, MAX_SCHEMA_EXPANDED_NODES
from .patterns import PatternError, compile_pattern
from .same_objects import SameObjects
from .schema_keywords import KEYWORDS
from .schema_keywords import cut as _cut

REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
ANCHOR_KEYWORDS = ("$anchor", "$dynamicAnchor")
# Keywords whose values are data, not subschemas: never read as schema keywords.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "description", "title", "$comment"})

# What can go wrong while validating with a caller's schema: anything (a recursion, a
# reference that does not resolve, a keyword applied to what it does not expect). It is
# reported to the model as the tool's error result, never raised out of the turn.
VALIDATION_FAULTS = (Exception,)


class SchemaProblem(ValueError):
    pass


class CheckNotDone(Exception):
    """A value could not be judged against a schema: the reason (a time budget spent, a fault
    of the schema's while applied) is told to whoever sent the value."""


@functools.cache
def _linear(base: type[Validator]) -> type[Validator]:
    """The dialect's validator with every keyword of more than linear cost done again in
    linear time (schema_keywords.py)."""
    extended: type[Validator] = jsonschema.validators.extend(base, KEYWORDS)  # type: ignore[no-untyped-call]
    return extended


def _dialect(schema: dict[str, Any]) -> type[Validator]:
    known: type[Validator] | None = jsonschema.validators.validator_for(schema, default=None)  # type: ignore[arg-type]
    if "$schema" in schema and known is None:
        raise SchemaProblem(f"unknown $schema {_cut(schema['$schema'])}; leave it out for JSON Schema 2020-12")
    return known or jsonschema.Draft202012Validator


def compile_schema(schema: dict[str, Any]) -> Validator:
    """A validator for a schema that check() accepted. Build it once per tool, reuse it."""
    return _linear(_dialect(schema))(schema, registry=METASCHEMAS)


# The keywords of a plain schema, on which jsonschema-rs and jsonschema agree (and a test
# holds them to it: tests/properties/test_tool_schemas.py): values, literals and subschemas.
_PLAIN_VALUES = frozenset(
    {
        "type", "required", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "format",
        "description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
    }
)  # fmt: skip
_PLAIN_LITERALS = frozenset({"enum", "const"})  # of strings, booleans and null: no number equality to differ on
_PLAIN_SUBSCHEMA = frozenset({"items", "additionalProperties", "not"})
_PLAIN_SUBSCHEMA_LISTS = frozenset({"prefixItems", "anyOf", "allOf", "oneOf"})


def plain(schema: Any) -> bool:
    """Whether a schema uses only the keywords of a plain one."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for keyword, value in schema.items():
        if keyword in _PLAIN_VALUES:
            continue
        if keyword in _PLAIN_LITERALS:
            literals = value if keyword == "enum" else [value]
            if not isinstance(literals, list) or not all(item is None or isinstance(item, str | bool) for item in literals):
                return False
        elif keyword in _PLAIN_SUBSCHEMA:
            if not plain(value):
                return False
        elif keyword in _PLAIN_SUBSCHEMA_LISTS:
            if not isinstance(value, list) or not all(plain(item) for item in value):
                return False
        elif keyword == "properties":
            if not isinstance(value, dict) or not all(plain(item) for item in value.values()):
                return False
        else:
            return False
    return True


class Elsewhere:
    """The verdict costs more than the event loop may spend on it: judge it off the loop."""


ELSEWHERE = Elsewhere()

# The bound on a check's cost: the schema's nodes (data included) times the instance's length
# as JSON. No plain schema makes a validator visit more (instance node, schema node) pairs than
# that (each schema node applies once to each instance node it reaches: no references, no
# recursion). Measured per unit of it on the costliest plain shapes (a hundred `allOf` branches
# over every item): jsonschema-rs 2.3 ns, jsonschema about 1 µs. So the event loop runs
# jsonschema-rs up to 2M units (5 ms at worst, a tool call's arguments are a few thousand) and
# jsonschema's message for an invalid instance up to 10,000 (10 ms at worst); the rest is judged
# off the loop (schema_checks.py).
FAST_UNITS = 2_000_000
MESSAGE_UNITS = 10_000

# What JSON text may hold that reads as a number no bound can judge: NaN, an infinity, or a
# number too large for a double (an exponent of three digits, or 309 digits in a row), which
# json reads as infinite. Text without them needs no walk for them (re2: linear, 0.6 ms for
# 290 KB).
_NOT_FINITE_HINT = re2.compile(r"NaN|Infinity|[eE]\+?\d{3}|\d{309}")


def compiled(schema: dict[str, Any]) -> ArgumentsSchema:
    """The schema compiled, once per schema object: the definitions of runtimes a host creates
    again and again are one object (same_objects.py), and so are their schemas."""
    found = _COMPILED.get(schema)
    return found if found is not None else _COMPILED.put(schema, ArgumentsSchema(schema))


class ArgumentsSchema:
    """A schema that check() accepted, compiled once: a tool's input schema, an agent's output
    schema, an MCP tool's output schema."""

    __slots__ = ("_fast", "_full", "_weight", "text")

    def __init__(self, schema: dict[str, Any]) -> None:
        self._full = compile_schema(schema)
        self.text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)  # what a judge elsewhere compiles
        self._fast: Any = None
        self._weight = 0
        if plain(schema):
            try:
                self._fast = jsonschema_rs.validator_for(schema, validate_formats=False)
                self._weight = _nodes(schema)
            except Exception:  # what it cannot compile, jsonschema checks alone
                pass

    @property
    def fast(self) -> bool:
        return self._fast is not None

    def here(self, instance: Any, text: str) -> str | Elsewhere | None:
        """The verdict on an instance (parsed from `text`) when reaching it costs the event
        loop little (FAST_UNITS, MESSAGE_UNITS); ELSEWHERE otherwise."""
        if self._fast is None:
            return ELSEWHERE  # references, uniqueItems, numbers in enums: no bound on the cost
        units = self._weight * max(len(text), 1)
        if units > FAST_UNITS:
            return ELSEWHERE
        if self._fast_valid(instance, text):
            return None
        if units > MESSAGE_UNITS:
            return ELSEWHERE
        return self._message(instance)

    def problem(self, instance: Any) -> str | None:
        """The first thing wrong with the instance (jsonschema's best match), or None, whatever
        it costs: off the event loop only. Raises what a caller's schema can raise while it is
        applied (VALIDATION_FAULTS)."""
        if self._fast is not None and self._fast_valid(instance, None):
            return None
        return self._message(instance)

    def _fast_valid(self, instance: Any, text: str | None) -> bool:
        """jsonschema-rs finds it valid (what it finds valid is valid)."""
        try:
            if not self._fast.is_valid(instance):
                return False
        except Exception:  # a value it cannot take (a lone surrogate, a key not a string): jsonschema judges
            return False
        # jsonschema-rs takes an infinite number (a model's `Infinity`, which Python's json
        # reads) as within any bound (hypothesis found it): such instances go to jsonschema.
        return (text is not None and _NOT_FINITE_HINT.search(text) is None) or _finite(instance)

    def _message(self, instance: Any) -> str | None:
        error = jsonschema.exceptions.best_match(self._full.iter_errors(instance))
        return None if error is None else str(error.message)


def _nodes(value: Any) -> int:
    """The JSON nodes of a value (a schema: 64 KiB at most)."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _finite(value: Any) -> bool:
    """No number in the value is infinite or NaN."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def check(schema: dict[str, Any]) -> None:
    """Raises SchemaProblem naming the first thing wrong with a tool's input schema."""
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaProblem(f"is {size} bytes as JSON; the limit is {MAX_SCHEMA_BYTES}")
    anchors: dict[str, Any] = {}
    references: list[str] = []
    uses = {"patternProperties": False, "unevaluatedProperties": False}
    for node, depth in _walk(schema, 1):
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaProblem(f"nests deeper than {MAX_SCHEMA_DEPTH} levels")
        for keyword in ("$id", "id"):
            if isinstance(node.get(keyword), str):
                raise SchemaProblem(f"{keyword} is not allowed: references resolve only inside the schema itself")
        for keyword in REFERENCE_KEYWORDS:
            if isinstance(node.get(keyword), str):
                references.append(node[keyword])
        for keyword in ANCHOR_KEYWORDS:
            if isinstance(node.get(keyword), str):
                anchors[node[keyword]] = node
        if isinstance(node.get("pattern"), str):
            _check_pattern(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            uses["patternProperties"] = True
            for pattern in node["patternProperties"]:
                _check_pattern(pattern)
        if "unevaluatedProperties" in node:
            uses["unevaluatedProperties"] = True
    if all(uses.values()):
        raise SchemaProblem("unevaluatedProperties together with patternProperties is not supported")
    dialect = _dialect(schema)
    try:
        if not metaschema_allows(schema):
            dialect.check_schema(schema)  # its verdict, and its message
    except jsonschema.exceptions.SchemaError as exc:
        raise SchemaProblem(f"not a valid JSON Schema: {_cut(exc.message, 200)}") from None
    if schema.get("type") != "object":
        raise SchemaProblem("tool arguments are a JSON object: the schema's type must be 'object'")
    for reference in references:
        _target(schema, reference, anchors)
    try:
        expanded = _expanded_size(schema, anchors)
    except RecursionError:
        raise SchemaProblem("has references nested too deeply to expand") from None
    if expanded > MAX_SCHEMA_EXPANDED_NODES:
        raise SchemaProblem(
            f"has more than {MAX_SCHEMA_EXPANDED_NODES:,} nodes with its references expanded; "
            "refer to shared definitions less often or flatten them"
        )
    try:
        compile_schema(schema).is_valid({})  # a schema that recurses without end fails here, not mid-run
    except RecursionError:
        raise SchemaProblem("refers to itself without end (a $ref cycle that never reaches a keyword)") from None
    except referencing.exceptions.Unresolvable as exc:
        raise SchemaProblem(f"has a reference that does not resolve inside the schema: {_cut(str(exc), 200)}") from None


def metaschema_allows(schema: dict[str, Any]) -> bool:
    """Whether jsonschema-rs finds the schema valid against its dialect's metaschema: 1-2 ms
    for a 60 KiB schema where jsonschema's check_schema takes 300-500 ms (7 ms for ten plain
    properties: 0.6 s of the event loop for an MCP server's 90 tools). What it allows, jsonschema
    allows too (tests/properties/test_tool_schemas.py holds them to it), but for `regex` formats, which
    jsonschema checks with Python's `re` and RE2 has judged already (_check_pattern)."""
    if str(schema.get("$schema", "")).rstrip("#").endswith("draft-04/schema"):
        # jsonschema-rs lets an empty `enum` through draft 4's metaschema, which asks for a
        # value at least (hypothesis found it): a draft-04 schema is judged by jsonschema alone.
        return False
    try:
        return bool(jsonschema_rs.meta.is_valid(schema))
    except Exception:  # a value it cannot take (an integer past 64 bits): jsonschema judges
        return False


def _check_pattern(pattern: str) -> None:
    try:
        compile_pattern(pattern)
    except PatternError as exc:
        raise SchemaProblem(f"pattern {_cut(pattern)} {exc}") from None


def _target(schema: dict[str, Any], reference: str, anchors: dict[str, Any]) -> Any:
    """The subschema a reference lands on; SchemaProblem when it lands outside the schema,
    on nothing, or on data (an enum's value, a default, a list of required names)."""
    if not reference.startswith("#"):
        raise SchemaProblem(f"$ref {_cut(reference)} points outside the schema; only references inside it (#/...) are allowed")
    fragment = reference[1:]
    if fragment and not fragment.startswith("/"):
        if fragment not in anchors:
            raise SchemaProblem(f"$ref {_cut(reference)} names no anchor of the schema")
        return anchors[fragment]
    node: Any = schema
    for part in fragment.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node and key not in DATA_KEYWORDS:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise SchemaProblem(f"$ref {_cut(reference)} does not resolve to a subschema inside the schema")
    if not isinstance(node, dict | bool):
        raise SchemaProblem(f"$ref {_cut(reference)} does not resolve to a subschema inside the schema")
    return node


def _expanded_size(schema: dict[str, Any], anchors: dict[str, Any]) -> int:
    """How many nodes the schema has with every reference replaced by what it refers to
    (a reference back into its own path counts once). Each subschema is sized once; sizing
    stops early past the limit."""
    return _Sizer(schema, anchors).size(schema)


class _Sizer:
    """_expanded_size's walk. A class, not a nested function that calls itself: such a function
    and its closure are a reference cycle, left to the collector with the schema it holds."""

    __slots__ = ("anchors", "path", "schema", "sized")

    def __init__(self, schema: dict[str, Any], anchors: dict[str, Any]) -> None:
        self.schema = schema
        self.anchors = anchors
        self.sized: dict[int, int] = {}
        self.path: set[int] = set()

    def size(self, node: Any) -> int:
        if isinstance(node, list):
            return 1 + sum(self.size(item) for item in node)
        if not isinstance(node, dict):
            return 1
        if id(node) in self.sized:
            return self.sized[id(node)]
        if id(node) in self.path:
            return 1
        self.path.add(id(node))
        total = 1
        for key, value in node.items():
            if key in DATA_KEYWORDS:
                continue
            if key in REFERENCE_KEYWORDS and isinstance(value, str):
                total += self.size(_target(self.schema, value, self.anchors))
            else:
                total += self.size(value)
            if total > MAX_SCHEMA_EXPANDED_NODES:
                break
        self.path.discard(id(node))
        self.sized[id(node)] = total
        return total


def _walk(node: Any, depth: int) -> Iterator[tuple[dict[str, Any], int]]:
    """Every schema object with its nesting depth (data keywords are not descended)."""
    if isinstance(node, dict):
        yield node, depth
        for key, value in node.items():
            if key not in DATA_KEYWORDS:
                yield from _walk_values(value, depth + 1)
    elif isinstance(node, list):
        yield from _walk_values(node, depth)


def _walk_values(value: Any, depth: int) -> Iterator[tuple[dict[str, Any], int]]:
    if isinstance(value, dict):
        yield from _walk(value, depth)
    elif isinstance(value, list):
        if depth > MAX_SCHEMA_DEPTH:
            yield {}, depth
            return
        for item in value:
            yield from _walk_values(item, depth + 1)


_COMPILED: SameObjects[dict[str, Any], ArgumentsSchema] = SameObjects(256)
