"""A running tool may answer "pending" instead of a result: HTTP 202 with a JSON object
describing the Request the host must answer (a login to complete, an approval elsewhere):

    {"kind": "authorization", "prompt": "Sign in to the CRM", "url": "https://...",
     "expires_at": "2026-12-01T10:00:00Z", "data": {...}}

Every key is optional but `kind` (a slug). The handle suspends on it; Resume calls the tool
again, with the same Idempotency-Key and the answer in the `Agentruntime-Answer` header."""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Any
from urllib.parse import urlsplit

from ..domain.definitions import carriable
from ..domain.vocabulary import ToolSuspension

KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_PROMPT = 4096
MAX_URL = 2048
MAX_DATA_BYTES = 64 * 1024
LATEST = 253_402_300_800.0  # 10000-01-01: the end of google.protobuf.Timestamp's range


class NotAPendingRequest(ValueError):
    pass


def suspension(raw: bytes) -> ToolSuspension:
    """The Request a 202 body describes; NotAPendingRequest says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise NotAPendingRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise NotAPendingRequest("the body is not a JSON object")
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except (UnicodeEncodeError, ValueError, RecursionError):
        raise NotAPendingRequest("the body holds text that is not valid Unicode") from None
    kind = body.get("kind")
    if not isinstance(kind, str) or not KIND.fullmatch(kind):
        raise NotAPendingRequest("'kind' must be a slug of 1-32 lower-case letters, digits and '_'")
    prompt = _text(body, "prompt", MAX_PROMPT)
    url = _text(body, "url", MAX_URL)
    if url and urlsplit(url).scheme not in ("http", "https"):
        raise NotAPendingRequest("'url' must be an http(s) URL")
    data = body.get("data") or {}
    try:
        size = len(json.dumps(data, allow_nan=False)) if isinstance(data, dict) else -1
    except ValueError:  # NaN or an infinity: no Struct can carry it
        size = -1
    if not 0 <= size <= MAX_DATA_BYTES:
        raise NotAPendingRequest(f"'data' must be a JSON object of at most {MAX_DATA_BYTES} bytes")
    wrong = carriable.problem(data)
    if wrong is not None:
        raise NotAPendingRequest(f"'data' must be JSON a Struct can carry: {wrong.replace('$', 'data', 1)}")
    return ToolSuspension(kind=kind, prompt=prompt, url=url, expires_at=_expiry(body.get("expires_at")), data=data)


def _text(body: dict[str, Any], key: str, limit: int) -> str:
    value = body.get(key) or ""
    if not isinstance(value, str) or len(value) > limit:
        raise NotAPendingRequest(f"{key!r} must be a string of at most {limit} characters")
    return value


def _expiry(value: Any) -> float | None:
    """RFC 3339 (with a zone) or seconds since the epoch; None: it never expires."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and 0 < value < LATEST:
            return float(value)
        raise NotAPendingRequest("'expires_at' must be a time between 1970 and 9999")
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            when = None
        if when is not None and when.tzinfo is not None and 0 < when.timestamp() < LATEST:
            return when.timestamp()
    raise NotAPendingRequest("'expires_at' must be an RFC 3339 time with a zone, or seconds since the epoch")
