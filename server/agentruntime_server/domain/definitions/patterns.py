"""Regular expressions a caller defines, run in linear time (RE2), so that no pattern and no
input can hold the event loop: `completion.must_match` and every JSON Schema `pattern`."""

from __future__ import annotations

import functools
from typing import Any

import re2

from ..limits import MAX_PATTERN_CHARS

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a caller's bad pattern is reported to the caller, not to stderr
_OPTIONS.max_mem = 8 << 20  # bounds the compiled program: a huge repetition fails to compile


class PatternError(ValueError):
    pass


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Any:
    """The compiled pattern; PatternError with a reason a caller can act on."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"is {len(pattern)} characters long; the limit is {MAX_PATTERN_CHARS}")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(
            f"not a valid RE2 regular expression ({reason}); backreferences and lookaround are not supported"
        ) from None


def search(pattern: str, text: str) -> bool:
    """True when `pattern` matches somewhere in `text` (patterns are checked before they get here)."""
    return compile_pattern(pattern).search(text) is not None
