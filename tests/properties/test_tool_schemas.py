"""Tool argument checks: a plain schema is decided by jsonschema-rs when it finds the
arguments valid, by jsonschema otherwise, and the two must never disagree on what is valid
(domain/definitions/schemas.py, ArgumentsSchema). No server: the verdicts are compared directly."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import pytest
from agentruntime_server.domain.definitions import carriable, schemas
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NAMES = ["a", "b", "c"]
TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
LITERALS = st.one_of(st.none(), st.booleans(), st.text(max_size=3))
NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.floats(-1e6, 1e6, allow_nan=False))
COUNTS = st.integers(0, 4)


def _keywords(subschema: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)),
            "minimum": NUMBERS,
            "maximum": NUMBERS,
            "exclusiveMinimum": NUMBERS,
            "exclusiveMaximum": NUMBERS,
            "minLength": COUNTS,
            "maxLength": COUNTS,
            "minItems": COUNTS,
            "maxItems": COUNTS,
            "minProperties": COUNTS,
            "maxProperties": COUNTS,
            "required": st.lists(st.sampled_from(NAMES), max_size=3, unique=True),
            "enum": st.lists(LITERALS, min_size=1, max_size=3),
            "const": LITERALS,
            "format": st.sampled_from(["date-time", "email", "uuid", "ipv4"]),
            "description": st.text(max_size=5),
            "properties": st.dictionaries(st.sampled_from(NAMES), subschema, max_size=3),
            "additionalProperties": subschema,
            "items": subschema,
            "prefixItems": st.lists(subschema, min_size=1, max_size=2),
            "anyOf": st.lists(subschema, min_size=1, max_size=2),
            "allOf": st.lists(subschema, min_size=1, max_size=2),
            "oneOf": st.lists(subschema, min_size=1, max_size=2),
            "not": subschema,
        },
    )


PLAIN_SCHEMAS = st.recursive(st.one_of(st.booleans(), _keywords(st.booleans())), _keywords, max_leaves=8)
VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=5),
        st.sampled_from(["2026-12-04T12:00:00Z", "a@b.example", "10.0.0.1", "\ud800"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)),
    max_leaves=10,
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=PLAIN_SCHEMAS, value=VALUES)
def test_the_fast_check_never_passes_what_jsonschema_refuses(schema: Any, value: Any) -> None:
    assert schemas.plain(schema)
    tool_schema = schema if isinstance(schema, dict) else {"not": {"not": schema}}  # a tool's schema is an object
    arguments, reference = schemas.ArgumentsSchema(tool_schema), schemas.compile_schema(tool_schema)
    assert (arguments.problem(value) is None) == reference.is_valid(value)


LOOKUP = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}, "unit": {"enum": ["c", "f"]}},
    "required": ["n"],
    "additionalProperties": False,
}


def test_a_plain_tool_schema_is_checked_fast_and_refusals_keep_jsonschemas_message() -> None:
    lookup = schemas.ArgumentsSchema(LOOKUP)
    assert lookup.fast
    assert lookup.problem({"n": 3, "unit": "c"}) is None
    assert lookup.problem({"n": -1}) == "-1 is less than the minimum of 0"
    assert lookup.problem({"n": 1, "x": 2}) == "additional properties are not allowed ('x' unexpected)"
    assert lookup.problem({}) == "'n' is a required property"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}},  # patterns run on RE2
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "integer"}}},
        {"type": "object", "properties": {"n": {"enum": [1, 2]}}},  # number equality: jsonschema's own
        {"type": "object", "properties": {"n": {"multipleOf": 0.1}}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
        {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    ],
)
def test_other_schemas_are_checked_by_jsonschema_alone(schema: dict[str, Any]) -> None:
    assert not schemas.plain(schema)
    assert not schemas.ArgumentsSchema(schema).fast


def test_values_the_fast_check_cannot_take_are_judged_by_jsonschema() -> None:
    numbers = schemas.ArgumentsSchema({"type": "object", "properties": {"x": {"type": "number"}, "s": {"type": "string"}}})
    assert numbers.fast
    assert numbers.problem({"x": math.nan}) is None  # json.loads reads NaN; jsonschema calls it a number
    assert numbers.problem({"s": "\ud800"}) is None  # a lone surrogate, which Rust strings cannot hold
    assert numbers.problem({"x": "1"}) == "'1' is not of type 'number'"


# ---- the schema itself: jsonschema-rs decides what its metaschema allows, jsonschema the rest ----

DIALECTS = [
    None,
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema#",
    "http://json-schema.org/draft-04/schema#",
]
KEYWORDS = [
    "type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
    "minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "required", "dependentRequired", "dependencies", "enum", "const", "format", "properties", "additionalProperties",
    "propertyNames", "items", "prefixItems", "additionalItems", "unevaluatedItems", "anyOf", "allOf", "oneOf", "not",
    "if", "then", "else", "dependentSchemas", "$defs", "definitions", "$ref", "$anchor", "$comment", "title",
    "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
]  # fmt: skip
# Values right for some keywords and wrong for others: the metaschema's verdicts are what is compared.
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-2, 2),
    st.sampled_from([*TYPES, "nope", "#", "#/$defs/a", "a"]),
    st.lists(st.one_of(st.sampled_from([*NAMES, *TYPES]), st.integers(0, 2)), max_size=3),
)


def _any_keywords(subschema: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    value = st.one_of(subschema, ANY_VALUE, st.dictionaries(st.sampled_from(NAMES), subschema, max_size=2))
    return st.dictionaries(st.sampled_from(KEYWORDS), value, max_size=4)


ANY_SCHEMAS = st.recursive(st.one_of(st.booleans(), _any_keywords(st.booleans())), _any_keywords, max_leaves=8)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=ANY_SCHEMAS, dialect=st.sampled_from(DIALECTS))
def test_what_the_fast_metaschema_check_allows_jsonschema_allows(schema: Any, dialect: str | None) -> None:
    document = schema if isinstance(schema, dict) else {"not": {"not": schema}}
    if dialect is not None:
        document = {**document, "$schema": dialect}
    if schemas.metaschema_allows(document):
        jsonschema.validators.validator_for(document, default=jsonschema.Draft202012Validator).check_schema(document)


def test_the_fast_metaschema_check_allows_and_refuses() -> None:
    assert schemas.metaschema_allows(LOOKUP)
    assert not schemas.metaschema_allows({"type": "object", "properties": {"n": {"type": "integr"}}})
    with pytest.raises(schemas.SchemaProblem, match=r"not a valid JSON Schema: .*'integr' is not valid under any"):
        schemas.check({"type": "object", "properties": {"n": {"type": "integr"}}})


def test_an_empty_enum_under_draft_4_is_refused_as_its_metaschema_says() -> None:
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "enum": []}
    assert not schemas.metaschema_allows(draft4)
    with pytest.raises(schemas.SchemaProblem, match="should be non-empty"):
        schemas.check(draft4)


def test_an_infinite_number_is_judged_by_jsonschema_not_let_through() -> None:
    bounded = schemas.ArgumentsSchema({"type": "object", "properties": {"n": {"type": "number", "maximum": 0}}})
    assert bounded.problem({"n": float("inf")}) is not None
    assert bounded.problem({"n": -1.5}) is None


# ---- uniqueItems and enum in linear time, with jsonschema's verdicts (schema_keywords.py) ----

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, 1.0, 2.5, -0.0]), st.text(max_size=2)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)),
    max_leaves=6,
)
ORIGINAL = jsonschema.Draft202012Validator  # jsonschema's own keywords: uniq() and equal() one by one


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(JSON_VALUES, max_size=6))
def test_unique_items_by_hashing_agrees_with_jsonschema(items: list[Any]) -> None:
    schema = {"type": "array", "uniqueItems": True}
    assert schemas.compile_schema(schema).is_valid(items) == ORIGINAL(schema).is_valid(items)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=st.lists(JSON_VALUES, min_size=16, max_size=20), value=JSON_VALUES)
def test_a_large_enum_by_hashing_agrees_with_jsonschema(members: list[Any], value: Any) -> None:
    schema = {"enum": members}
    for candidate in (value, members[len(members) // 2]):
        assert schemas.compile_schema(schema).is_valid(candidate) == ORIGINAL(schema).is_valid(candidate)


def test_the_red_teams_unique_items_and_enum_take_linear_time() -> None:
    # jsonschema: 5.3 s for the first (pairwise: the items do not sort), ~30 s for the second.
    unique = schemas.compile_schema({"type": "array", "uniqueItems": True})
    assert unique.is_valid([{}, *range(4000)]) and not unique.is_valid([{}, *range(4000), 3999.0])
    numbers = schemas.compile_schema({"type": "array", "items": {"enum": list(range(9000))}})
    assert numbers.is_valid(list(range(8999, 4999, -1))) and not numbers.is_valid([*range(4000), True])


# ---- what the event loop may judge itself (ArgumentsSchema.here) ----


def test_a_plain_schemas_small_check_is_judged_here_and_a_large_one_elsewhere() -> None:
    lookup = schemas.ArgumentsSchema(LOOKUP)
    assert lookup.here({"n": 3}, '{"n": 3}') is None
    assert lookup.here({"n": -1}, '{"n": -1}') == "-1 is less than the minimum of 0"
    big = {"n": 3, "pad": "x" * 200_000}
    assert isinstance(lookup.here(big, json.dumps(big)), schemas.Elsewhere)  # past FAST_UNITS
    wrong = {"n": -1, "pad": "x" * 2000}
    assert isinstance(lookup.here(wrong, json.dumps(wrong)), schemas.Elsewhere)  # valid cheaply, a message is not
    assert lookup.problem(wrong) == "additional properties are not allowed ('pad' unexpected)"


def test_a_schema_without_a_bound_on_its_cost_is_never_judged_here() -> None:
    for schema in (
        {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
        {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "integer"}}},
    ):
        assert isinstance(schemas.ArgumentsSchema(schema).here({}, "{}"), schemas.Elsewhere)


def test_a_number_json_reads_as_infinite_is_seen_in_the_text() -> None:
    bounded = schemas.ArgumentsSchema({"type": "object", "properties": {"n": {"type": "number", "maximum": 0}}})
    assert bounded.here({"n": -1.0}, '{"n": -1.0}') is None
    # jsonschema-rs takes an infinite number as within any bound: the text sends it to jsonschema.
    for text in ('{"n": 1e400}', '{"n": 1' + "0" * 400 + ".0}", '{"n": Infinity}'):
        assert bounded.here(json.loads(text), text) == "inf is greater than the maximum of 0"


# ---- what a google.protobuf.Value can carry (carriable.py) ----


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"n": 10**400}, "$.n is an integer past a double's range"),
        ({"n": [1, math.inf]}, "$.n[1] is inf, not a finite number"),
        ({"n": math.nan}, "$.n is nan, not a finite number"),
        ({"a b": "\ud800"}, "$['a b'] is text that is not valid Unicode"),
        ({"\udfff": 1}, "$ has a key that is not valid Unicode text"),
        (json.loads('{"a":' * 33 + "1" + "}" * 33), "nests deeper than 32 levels"),
        ([[[]]] * 2 + [json.loads("[" * 40 + "]" * 40)], "$[2]"),
    ],
)
def test_what_no_value_can_carry_is_named_with_where_it_is(value: Any, says: str) -> None:
    wrong = carriable.problem(value)
    assert wrong is not None and says in wrong
    assert carriable.problem(value, json.dumps(value)) == wrong  # the text's hints lead to the walk


def test_what_a_value_can_carry_passes_with_or_without_its_text() -> None:
    value = {"n": 2**60, "f": 1e308, "s": "\U0001f600 é", "deep": json.loads('{"a":' * 31 + "1" + "}" * 31)}
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert carriable.problem(value, text) is None
    assert carriable.problem(value) is None
