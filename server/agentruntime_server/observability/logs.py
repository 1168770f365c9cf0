"""Logging: human text by default, one JSON object a line with AGENTRUNTIME_LOG_FORMAT=json.

JSON lines carry `runtime_id` and `handle_id` when the line is logged on behalf of a run
or an RPC: a context variable is set by an event observer (in the task that emits the
event, so a run's task inherits it) and by the gRPC interceptor (from the request), and
a logging.Filter copies it onto each record. The domain imports none of this."""

from __future__ import annotations

import contextvars
import datetime
import logging
from typing import TYPE_CHECKING, Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from ..domain.vocabulary import HandleState
from ..domain.watching.event_log import Event, EventKind

if TYPE_CHECKING:
    from ..settings import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

# (runtime_id, handle_id) of the run or RPC the current task works for.
log_context: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("agentruntime_log_context", default=None)

# The events emitted by the task that works for the handle: a run's own task (turns, tool
# calls), or the task that starts it (RUNNING is emitted before the run's task is created,
# so the task inherits it).
_CONTEXT_KINDS = frozenset({EventKind.TURN_STARTED, EventKind.TOOL_CALL_STARTED, EventKind.TOOL_CALL_ENDED})
_STATE_CHANGED = EventKind.STATE_CHANGED
_RUNNING = HandleState.RUNNING


def observe(runtime_id: str, event: Event) -> None:
    """An events.Observer: the emitting task now logs for (runtime, handle)."""
    kind = event.kind
    if kind in _CONTEXT_KINDS or (kind is _STATE_CHANGED and event.state is _RUNNING):
        log_context.set((runtime_id, event.handle_id))


class ContextFilter(logging.Filter):
    """Adds runtime_id and handle_id (when known, and not given by the caller) to a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = log_context.get()
        if context is not None:
            if not hasattr(record, "runtime_id"):
                record.runtime_id = context[0]
            if context[1] and not hasattr(record, "handle_id"):
                record.handle_id = context[1]
        return True


def escaped(char: str) -> str:
    """One code point as an escape that reads back as exactly that code point: \\xNN, \\uNNNN
    or \\UNNNNNNNN by its size (a bare \\x2028 would read as \\x20 and "28")."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    """`text` with every code point that does not print (controls, format characters such as
    U+202E, line and paragraph separators, unassigned ones; `keep` aside) escaped."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char in keep else escaped(char) for char in text)


class _TextFormatter(logging.Formatter):
    """Every code point that does not print is escaped in a text line (tab aside): a provider's
    error body, quoted in a message, must not start a forged line of its own, reorder what a
    reader sees or drive the terminal it is read on. JSON lines escape the controls already."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record), keep="\t")  # a traceback, added after, keeps its lines


class _JsonFormatter(JsonFormatter):
    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        log_data["time"] = datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="microseconds")
        super().add_fields(log_data, record, message_dict)


def json_formatter() -> logging.Formatter:
    """{"time": ISO 8601 UTC, "level", "logger", "message", then runtime_id, handle_id, exc_info, extras}."""
    return _JsonFormatter(["levelname", "name", "message"], rename_fields={"levelname": "level", "name": "logger"})


def make_handler(log_format: str, stream: TextIO | None = None) -> logging.Handler:
    """A stream handler (stderr by default) writing `text` or `json` lines."""
    handler = logging.StreamHandler(stream)
    if log_format == "json":
        handler.setFormatter(json_formatter())
        handler.addFilter(ContextFilter())
    else:
        handler.setFormatter(_TextFormatter(TEXT_FORMAT))
    return handler


def configure_logging(settings: Settings, stream: TextIO | None = None) -> None:
    """The process's logging, from AGENTRUNTIME_LOG_LEVEL and AGENTRUNTIME_LOG_FORMAT."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(make_handler(settings.log_format, stream))
    root.setLevel(settings.log_level.upper())
