"""The layout is the architecture (docs/architecture.md), held by a test: no module of the server
over 500 lines; no import cycle between its modules, type-only and function-level imports
included; the domain imports no gRPC, no HTTP client and no SQL driver; and a room of the domain
imports only the rooms below it."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "agentruntime_server"
MAX_LINES = 500
# The domain's layers, top to bottom: a room may import those after it, never one before it.
# The modules at the domain's top level are one layer (they import each other), above billing.
GROUND = {"vocabulary", "errors", "limits", "clock", "fifo_gate", "ownership"}
LAYERS = [
    {"runtime"},
    {"runs"},
    {"suspension"},
    {"definitions"},
    {"tenancy"},
    {"ports"},
    {"watching"},
    {"journal"},
    GROUND,
    {"billing"},
]
FORBIDDEN_IN_DOMAIN = {"grpc", "httpx", "aiohttp", "asyncpg", "psycopg", "sqlite3", "google", "agentruntime"}


@functools.cache
def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every module of the package (or outside it) `module` imports, wherever the import is."""
    yield from _imports(module, path)


@functools.cache
def _imports(module: str, path: Path) -> tuple[str, ...]:
    known = modules()
    return tuple(_read_imports(module, path, known))


def _read_imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target


def test_no_module_of_the_server_is_over_500_lines() -> None:
    long = {module: len(path.read_text().splitlines()) for module, path in modules().items()}
    assert not {module: lines for module, lines in long.items() if lines > MAX_LINES}


def test_no_import_cycle_between_the_servers_modules() -> None:
    known = modules()
    graph = {
        module: {target for target in imports(module, path, known) if target in known and target != module}
        for module, path in known.items()
    }
    for module, targets in graph.items():  # a package's __init__ is not a cycle with what it re-exports from its own modules
        if known[module].name == "__init__.py":
            graph[module] = {target for target in targets if not target.startswith(module + ".")}
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_domain_imports_no_edge_library() -> None:
    known = modules()
    wrong = [
        f"{module} imports {target}"
        for module, path in known.items()
        if module.startswith("agentruntime_server.domain")
        for target in imports(module, path, known)
        if target.split(".")[0] in FORBIDDEN_IN_DOMAIN
        or (target.startswith("agentruntime_server.") and not target.startswith("agentruntime_server.domain"))
    ]
    assert not wrong


def test_a_room_of_the_domain_imports_only_the_rooms_below_it() -> None:
    known = modules()
    order = {room: index for index, layer in enumerate(LAYERS) for room in layer}

    def room(module: str) -> str:
        return module.split(".")[2] if module.count(".") >= 2 else ""

    wrong = []
    for module, path in known.items():
        if not module.startswith("agentruntime_server.domain."):
            continue
        here = room(module)
        for target in imports(module, path, known):
            there = room(target)
            if not target.startswith("agentruntime_server.domain.") or order[there] == order[here]:
                continue
            if order[there] < order[here]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found
