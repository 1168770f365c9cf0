"""What is worked out once per object that comes back as the same object: a host that creates
the same runtime again and again sends the same definitions, which the edge decodes once
(api/definitions_memo.py) and hands on as one tuple, so that checking them, compiling their
schemas and writing them down is done once, not once a runtime."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SameObjects(Generic[K, V]):
    """Values kept by the identity of their key, the most recently used `size` of them. Each
    key is held while its value is kept, so its id names no other object meanwhile; a key
    equal to a kept one but another object is another key (nothing is hashed or compared)."""

    __slots__ = ("_kept", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._kept: OrderedDict[int, tuple[K, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        kept = self._kept.get(id(key))
        if kept is None or kept[0] is not key:
            return None
        self._kept.move_to_end(id(key))
        return kept[1]

    def put(self, key: K, value: V) -> V:
        self._kept[id(key)] = (key, value)
        self._kept.move_to_end(id(key))
        if len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._kept)
