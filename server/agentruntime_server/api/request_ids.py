"""A mutating request's request id, checked, with the digest of what the rest of the request
says (domain/runtime/request_ids.py: the same id with another request is refused)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ..domain.errors import FieldViolation, InvalidArgument
from ..domain.runtime.request_ids import RequestKey

REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def request_key(request: Any, waits: bool = False) -> RequestKey | None:
    """None when the request carries no request id (no promise: today's behaviour). `waits`:
    the request's `timeout` (how long this attempt waits) is no part of what it asks for."""
    request_id: str = request.request_id
    if not request_id:
        return None
    if not REQUEST_ID.fullmatch(request_id):
        raise InvalidArgument(
            [FieldViolation("request_id", "must be 1 to 64 characters of letters, digits, '_' and '-' (a UUID, say)")]
        )
    # The request as its fields say it, the id aside (deterministic: map fields in key order).
    # Cleared in place and put back, rather than copied: a CreateRuntime may be megabytes.
    request.request_id = ""
    timeout = None
    if waits and request.HasField("timeout"):
        timeout = type(request.timeout)()
        timeout.CopyFrom(request.timeout)
        request.ClearField("timeout")
    try:
        said = request.SerializeToString(deterministic=True)
    finally:
        request.request_id = request_id
        if timeout is not None:
            request.timeout.CopyFrom(timeout)
    return RequestKey(request_id, hashlib.blake2b(said, digest_size=16).hexdigest())
