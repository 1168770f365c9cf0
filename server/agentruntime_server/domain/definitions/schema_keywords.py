"""The JSON Schema keywords jsonschema implements in more than linear time, implemented again
in linear time: the pattern keywords on RE2 (patterns.py), `uniqueItems` and `enum` on hashing.

jsonschema compares `uniqueItems` pairwise when the items do not sort (4,000 items of mixed
types: 5.3 s) and `enum` value by value (an enum of 9,000 numbers: 7 ms an item). Both are
judged here by a hashable key per value that is equal exactly when jsonschema's `equal` says
the values are: 1 and 1.0 are one number, True is not 1, key order does not count
(tests/properties/test_tool_schemas.py holds the two to it)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import jsonschema

from .patterns import search

# Enums smaller than this are compared one by one: a set of keys costs more to build.
_SMALL_ENUM = 16
_ENUM_KEYS_KEPT = 1024


def value_key(value: Any) -> Any:
    """A hashable key, equal for two JSON values exactly when jsonschema finds them equal."""
    if value is True or value is False:
        return ("b", value)
    if value is None:
        return ("z",)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, int | float):
        return ("n", value)  # 1 == 1.0 and hash(1) == hash(1.0): one key
    if isinstance(value, dict):
        return ("o", frozenset((key, value_key(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return ("a", tuple(value_key(item) for item in value))
    return ("?", id(value))  # not JSON: equal only to itself


class _EnumKeys:
    """The keys of the enums seen lately, by the enum list's identity (the list is held, so
    its id is not reused while it is kept)."""

    def __init__(self) -> None:
        self._kept: collections.OrderedDict[int, tuple[list[Any], frozenset[Any]]] = collections.OrderedDict()

    def of(self, enums: list[Any]) -> frozenset[Any]:
        kept = self._kept.get(id(enums))
        if kept is not None and kept[0] is enums:
            self._kept.move_to_end(id(enums))
            return kept[1]
        keys = frozenset(value_key(each) for each in enums)
        self._kept[id(enums)] = (enums, keys)
        if len(self._kept) > _ENUM_KEYS_KEPT:
            self._kept.popitem(last=False)
        return keys


_ENUMS = _EnumKeys()


def cut(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def enum(validator: Any, enums: Any, instance: Any, schema: object) -> Iterator[jsonschema.ValidationError]:
    if isinstance(enums, list) and len(enums) >= _SMALL_ENUM:
        found = value_key(instance) in _ENUMS.of(enums)
    else:
        found = any(jsonschema._utils.equal(each, instance) for each in enums)
    if not found:
        yield jsonschema.ValidationError(f"{cut(instance)} is not one of {cut(enums, 200)}")


def unique_items(validator: Any, unique: Any, instance: Any, schema: object) -> Iterator[jsonschema.ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = value_key(item)
        if key in seen:
            yield jsonschema.ValidationError(f"{cut(instance)} has non-unique elements")
            return
        seen.add(key)


def pattern(validator: Any, pattern: str, instance: Any, schema: object) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield jsonschema.ValidationError(f"{cut(instance)} does not match {pattern!r}")


def pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: object
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    assert isinstance(instance, dict)
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def additional_properties(
    validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    assert isinstance(instance, dict)
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance if key not in properties and not any(search(p, key) for p in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names = ", ".join(repr(extra) for extra in sorted(extras)[:10])
        yield jsonschema.ValidationError(f"additional properties are not allowed ({names} unexpected)")


KEYWORDS = {
    "pattern": pattern,
    "patternProperties": pattern_properties,
    "additionalProperties": additional_properties,
    "uniqueItems": unique_items,
    "enum": enum,
}
