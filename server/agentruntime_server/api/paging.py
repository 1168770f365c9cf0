"""AIP-158 pages for List and GetTranscript: cut by count and by encoded size, so that no
reply can outgrow what a default client accepts."""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..domain.definitions.validation import RUNTIME_ID
from ..domain.errors import FieldViolation, InvalidArgument
from ..domain.runtime.service import split_key

DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 1000

Item = TypeVar("Item")


def _scope(*names: str) -> str:
    """Binds a token to the listing it came from, so it cannot be replayed on another."""
    return hashlib.sha256("\0".join(names).encode()).hexdigest()[:12]


def _token(offset: int, scope: str) -> str:
    return base64.urlsafe_b64encode(f"{offset}:{scope}".encode()).decode().rstrip("=")


def _offset(token: str, scope: str) -> int:
    if not token:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        offset_text, token_scope = raw.split(":", 1)
        offset = int(offset_text)
    except ValueError:
        offset, token_scope = -1, ""
    if offset < 0 or token_scope != scope:
        raise InvalidArgument(
            [FieldViolation("page_token", "is not a next_page_token of this listing; start again with an empty page_token")]
        )
    return offset


def cursor_token(position: tuple[float, str], scope: tuple[str, ...]) -> str:
    """A keyset page token: the (created_at, key) of the last item of a page."""
    return base64.urlsafe_b64encode(f"{position[0]!r}|{position[1]}|{_scope(*scope)}".encode()).decode().rstrip("=")


def _is_key(key: str) -> bool:
    """A runtime's key as the store has it: `id`, or `tenant:id` (a tenant's name is a slug too)."""
    tenant, runtime_id = split_key(key)
    return bool(RUNTIME_ID.fullmatch(runtime_id) and RUNTIME_ID.fullmatch(tenant))


def cursor(token: str, scope: tuple[str, ...]) -> tuple[float, str] | None:
    if not token:
        return None
    try:
        created, key, token_scope = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().split("|")
        position = (float(created), key)
    except ValueError:
        token_scope = ""
    # The scope is not a secret: what the token says is checked too (it goes into a query).
    if token_scope != _scope(*scope) or not math.isfinite(position[0]) or not _is_key(position[1]):
        raise InvalidArgument(
            [FieldViolation("page_token", "is not a next_page_token of this listing; start again with an empty page_token")]
        )
    return position


def page(
    items: Sequence[Item],
    *,
    page_size: int,
    page_token: str,
    scope: tuple[str, ...],
    size_of: Callable[[Item], int],
    byte_budget: int,
) -> tuple[Sequence[Item], str]:
    """The page of `items` the request asks for, and the token of the next one ('' at the end).

    A page holds at most `page_size` items and at most `byte_budget` encoded bytes, but
    always at least one item, so a listing always makes progress."""
    if page_size < 0:
        raise InvalidArgument([FieldViolation("page_size", "must be >= 0 (0: the server's default)")])
    key = _scope(*scope)
    start = _offset(page_token, key)
    limit = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    end = start
    used = 0
    while end < len(items) and end - start < limit:
        cost = size_of(items[end]) + 8  # the repeated field's tag and length
        if end > start and used + cost > byte_budget:
            break
        used += cost
        end += 1
    return items[start:end], _token(end, key) if end < len(items) else ""
