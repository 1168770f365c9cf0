"""Asking a provider for an answer in a JSON Schema (an agent's `output_schema`,
docs/typed-results.md): OpenAI-compatible `response_format` (`strict` where the schema fits
strict mode), Anthropic's `output_config.format`. The runtime validates the answer itself
either way (domain/runs/typed_answers.py)."""

from __future__ import annotations

from typing import Any

# What OpenAI's strict mode does not take (its structured-outputs guide, "supported schemas").
_NOT_IN_STRICT = frozenset(
    {
        "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
        "patternProperties", "unevaluatedProperties", "unevaluatedItems", "propertyNames", "minProperties",
        "maxProperties", "contains", "minContains", "maxContains", "prefixItems", "additionalItems", "uniqueItems",
    }
)  # fmt: skip
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf",)


def fits_strict(schema: dict[str, Any]) -> bool:
    """Whether OpenAI's strict mode takes the schema as it is: an object at the top; every
    object closed (`additionalProperties: false`) with every property required; none of the
    keywords strict mode refuses. Otherwise the schema is sent with `strict: false`."""
    if schema.get("type") != "object":
        return False
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            return False  # a boolean schema
        if _NOT_IN_STRICT & node.keys():
            return False
        if node.get("type") == "object" or "properties" in node:
            properties = node.get("properties") or {}
            if node.get("additionalProperties") is not False or set(node.get("required") or ()) != set(properties):
                return False
        for key in _SUBSCHEMA_MAPS:
            stack.extend((node.get(key) or {}).values())
        for key in _SUBSCHEMA_LISTS:
            stack.extend(node.get(key) or ())
        items = node.get("items")
        if items is not None:
            stack.append(items)
    return True


def openai_response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": fits_strict(schema)}}


def anthropic_output_config(schema: dict[str, Any]) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "schema": schema}}
