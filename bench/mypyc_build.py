"""Compile the server's hot path with mypyc, in place, for a measurement (issue 43).

    .venv/bin/python bench/mypyc_build.py          compile MODULES; the .so files land next to the sources
    .venv/bin/python bench/mypyc_build.py --clean  remove them again (the tree runs as plain Python)

Not part of the product's build: `make install` does not run it, and the .so files must not be
committed. The editable install finds the compiled modules first (an extension module wins over
the .py of the same name), and they all share one library, agentruntime_server/_hot__mypyc*.so
(the group is named inside the package, so the editable finder reaches it too). The figures and
what was left out, and why, are in docs/performance.md."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "server"
PACKAGE = SERVER / "agentruntime_server"
GROUP = "agentruntime_server._hot"

# The hot path as the profile shows it (docs/performance.md, "A model turn's CPU, by part").
MODULES = (
    "domain/journal/entry.py",
    "domain/journal/handle.py",
    "domain/journal/replay.py",
    "domain/journal/tree.py",
    "domain/runs/budgets.py",
    "domain/runs/driver.py",
    "domain/runs/tool_phase.py",
    "domain/runs/turn_loop.py",
    "http/connection.py",
    "http/client.py",
    "providers/base.py",
    "providers/openai.py",
    "providers/anthropic.py",  # not on the bench's path, but it subclasses base.py's HttpProvider
)

# On the hot path, but mypyc refuses them as they are.
LEFT_OUT = {
    "store/payloads.py": "PayloadTooNew subclasses RuntimeError: 'Inheriting from most builtin types is unimplemented' "
    "(would need @mypy_extensions.mypyc_attr(native_class=False))",
    "domain/watching/event_log.py": "'async generators are unimplemented'",
}

# Compiled, but broken at run time.
BROKEN = {
    "domain/journal/record.py": "Journal's dataclass fields declared field(default=..., init=False) are never set "
    "(AttributeError: attribute 'closed' of 'Journal' undefined; would need them set in __post_init__)",
    "store/sqlite/commits.py": "compiles, but SqliteStore(Journal, Runtimes, Tenants) then fails: 'interpreted classes "
    "cannot inherit from compiled'; compiling the whole chain fails: 'Multiple inheritance is not supported (except "
    "for traits)'",
    "store/sqlite/journal.py": "the same: Journal(GroupCommit) is one of SqliteStore's bases",
    # mypyc replaces a compiled class's annotations by runtime classes, and every one it cannot name (a NamedTuple,
    # a union, another compiled class) by `type`: msgspec then refuses the journal's rows on replay.
    "domain/journal/steps.py": "msgspec.ValidationError: Expected `type`, got `dict` - at `$.message` (a step's "
    "`message: Message | None` read back)",
    "domain/billing/usage.py": "the same: Usage and Tokens (NamedTuples inside steps) read back as `type`",
    "domain/journal/events.py": "the same: an imported Event's state read back as `type` (EventsImported.kept)",
    # mypyc checks a value against its declared type at run time, so a stub that declares too narrow a type fails.
    "api/convert.py": "MessageToDict(a google.protobuf.Value) is a float, a list...; types-protobuf says dict: "
    "'TypeError: dict object expected; got float' (a structured tool output that is not an object)",
}


def compiled_files() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.so"))


def clean() -> None:
    for path in compiled_files():
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")


def build(opt_level: str) -> None:
    # Imported here: --clean needs neither, and setuptools' import patches distutils.
    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped]  # no stubs installed

    os.chdir(SERVER)  # module names are found from the sources' paths, and the .so files land there
    os.environ["MYPYPATH"] = str(ROOT / "clients" / "python")  # the repository's mypy_path is relative to ROOT
    sources = [str(Path("agentruntime_server") / module) for module in MODULES]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mypyc-") as scratch:
        extensions = mypycify(
            ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", f"{scratch}/cache", *sources],
            opt_level=opt_level,
            group_name=GROUP,
            target_dir=f"{scratch}/c",
        )
        translated = time.monotonic()
        setup(
            name="agentruntime-server-hot",
            ext_modules=extensions,
            script_args=[
                "--quiet",
                "build_ext",
                "--inplace",
                "--build-temp",
                f"{scratch}/temp",
                "--build-lib",
                f"{scratch}/lib",
            ],
        )
    finished = time.monotonic()
    for path in compiled_files():
        print(f"built {path.relative_to(ROOT)}")
    print(f"{len(MODULES)} modules: mypy and C generation {translated - started:.0f} s, C compiler {finished - translated:.0f} s")
    for module, why in (LEFT_OUT | BROKEN).items():
        print(f"left out {module}: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--opt-level", default="3", help="the C compiler's -O level (mypyc's default: 3)")
    args = parser.parse_args()
    if args.clean:
        clean()
    else:
        build(args.opt_level)


if __name__ == "__main__":
    main()
