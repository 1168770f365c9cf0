"""What a google.protobuf.Value can carry to every client: JSON whose numbers are finite
doubles (an integer past a double's range cannot be one), whose text is valid Unicode (no lone
surrogate, which json reads from a `\\ud800` escape), nested MAX_VALUE_DEPTH levels at most (a
client's protobuf parser stops at 100 messages of nesting, and an object level takes three).

A value the contract cannot carry is refused where it enters (a typed answer, a tool's pending
Request), never recorded: once journaled, every read of it would fail."""

from __future__ import annotations

import math
from typing import Any

import re2

from ..limits import MAX_VALUE_DEPTH

# Text that holds none of these needs no walk: a number json reads as infinite or as an integer
# no double holds (three exponent digits, 309 digits in a row), NaN and the infinities, an
# escaped surrogate (a lone one is not Unicode; a pair is walked too, and passes).
_HINT = re2.compile(r"NaN|Infinity|[eE]\+?\d{3}|\d{309}|\\[uU][dD][89a-fA-F]")


def problem(value: Any, text: str | None = None) -> str | None:
    """What in `value` (parsed from the JSON `text`, when given) no Value can carry, with
    where it is (`$.a[3]`), or None. Linear in the value's size; with `text`, only a value whose
    text hints at something wrong is walked for more than its depth."""
    if text is not None and _HINT.search(text) is None:
        try:
            text.encode()  # a raw lone surrogate in the text itself
        except UnicodeEncodeError:
            pass
        else:
            if text.count("[") + text.count("{") <= MAX_VALUE_DEPTH or _depth_within(value):
                return None
    if _carried(value):  # the common case, without a path for every item
        return None
    return _first_wrong(value)


def _depth_within(value: Any) -> bool:
    """The value nests MAX_VALUE_DEPTH levels at most (only its containers are visited)."""
    if type(value) is not dict and type(value) is not list:
        return True
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_VALUE_DEPTH:
            return False
        inner = item.values() if type(item) is dict else item
        stack.extend((each, depth + 1) for each in inner if type(each) is dict or type(each) is list)
    return True


def _carried(value: Any) -> bool:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict or kind is list:
            if depth >= MAX_VALUE_DEPTH:
                return False
            if kind is dict:
                if not all(type(key) is str and _unicode(key) for key in item):
                    return False
                inner = item.values()
            else:
                inner = item
            for each in inner:
                kind = type(each)
                if kind is dict or kind is list:
                    stack.append((each, depth + 1))
                elif not _scalar_carried(each, kind):
                    return False
        elif not _scalar_carried(item, kind):
            return False
    return True


def _scalar_carried(item: Any, kind: type) -> bool:
    if kind is str:
        return _unicode(item)
    if kind is int:
        if item.bit_length() < 1024:
            return True
        try:
            float(item)
            return True
        except OverflowError:
            return False
    if kind is float:
        return math.isfinite(item)
    return item is None or kind is bool


def _first_wrong(value: Any) -> str | None:
    """The first place no Value can carry, named."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "$")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict):
            if depth >= MAX_VALUE_DEPTH:
                return f"{where} nests deeper than {MAX_VALUE_DEPTH} levels"
            for key, inner in item.items():
                if not isinstance(key, str) or not _unicode(key):
                    return f"{where} has a key that is not valid Unicode text"
                stack.append((inner, depth + 1, f"{where}.{key}" if key.isidentifier() else f"{where}[{key!r}]"))
        elif isinstance(item, list):
            if depth >= MAX_VALUE_DEPTH:
                return f"{where} nests deeper than {MAX_VALUE_DEPTH} levels"
            stack.extend((inner, depth + 1, f"{where}[{index}]") for index, inner in enumerate(item))
        elif isinstance(item, str):
            if not _unicode(item):
                return f"{where} is text that is not valid Unicode (a lone surrogate)"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            try:
                float(item)
            except OverflowError:
                return f"{where} is an integer past a double's range (about {int(item.bit_length() * 0.30103) + 1} digits)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{where} is {item!r}, not a finite number"
        else:
            return f"{where} is not a JSON value ({type(item).__name__})"
    return None


def _unicode(text: str) -> bool:
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False
