"""What reads time without the Clock port (domain/clock.py): a walk of a module's syntax tree
that names each line reading the machine's clocks or arming the event loop's timers. The
domain must have none (test_clock.py): a read of real time there is a rule the fast tier could
not move by hand, and a test of it would have to wait."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# Calls that read a clock, or arm a timer, on whatever object they are made on (time.time(),
# loop.time(), loop.call_later(...)), unless that object is a clock (self.services.clock.time()).
CLOCK_READS = frozenset({"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns", "process_time"})
TIMERS = frozenset({"call_later", "call_at"})
# asyncio's own deadlines: each arms a timer on the running loop.
ASYNCIO_DEADLINES = frozenset({"wait_for", "timeout", "timeout_at"})
WALL_DATES = frozenset({"now", "utcnow", "today"})  # datetime.now(), date.today()


@dataclass(frozen=True)
class TimeRead:
    path: str
    line: int
    what: str
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}: {self.code}"


def _name(node: ast.expr) -> str:
    """The last name of an expression: `clock` for self.services.clock, `time` for time."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_clock(node: ast.expr) -> bool:
    return _name(node).lower().endswith("clock")


def _zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def _what(node: ast.AST) -> str | None:
    """Why the node reads time outside the clock, or None."""
    if isinstance(node, ast.Import):
        if any(alias.name == "time" for alias in node.names):
            return "imports the time module"
        return None
    if isinstance(node, ast.ImportFrom):
        if node.module == "time":
            return "imports from the time module"
        if node.module == "asyncio" and any(alias.name in {"sleep", *ASYNCIO_DEADLINES} for alias in node.names):
            return "imports asyncio's sleep or deadlines by name"
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    method, receiver = node.func.attr, node.func.value
    if _is_clock(receiver):
        return None
    if method in CLOCK_READS:
        return f"{_name(receiver) or 'an object'}.{method}() reads a clock"
    if method in TIMERS:
        return f"{method} arms a timer of the event loop"
    if method == "sleep" and not (len(node.args) == 1 and _zero(node.args[0])):
        return "sleeps for a delay (only sleep(0), a yield, reads no time)"
    if _name(receiver) == "asyncio" and method in ASYNCIO_DEADLINES:
        return f"asyncio.{method} arms a deadline on the event loop"
    if _name(receiver) == "asyncio" and method == "wait":
        timeout = next((keyword.value for keyword in node.keywords if keyword.arg == "timeout"), None)
        if len(node.args) > 1 or (timeout is not None and not (isinstance(timeout, ast.Constant) and timeout.value is None)):
            return "asyncio.wait with a timeout arms a timer of the event loop"
    if method in WALL_DATES and _name(receiver) in {"datetime", "date"}:
        return f"{_name(receiver)}.{method}() reads the wall clock"
    return None


def time_reads(source: str, path: str = "<source>") -> list[TimeRead]:
    """Every line of the source that reads time or arms a timer other than through a clock."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, path)):
        what = _what(node)
        if what is not None:
            line = getattr(node, "lineno", 0)
            found.append(TimeRead(path, line, what, lines[line - 1].strip() if 0 < line <= len(lines) else ""))
    return sorted(found, key=lambda read: (read.path, read.line))


def time_reads_under(root: Path, allowed: Path) -> list[TimeRead]:
    """Those of every module under `root` but `allowed` (the clock port itself)."""
    found = []
    for module in sorted(root.rglob("*.py")):
        if module == allowed:
            continue
        found.extend(time_reads(module.read_text(encoding="utf-8"), str(module.relative_to(root.parent))))
    return found
