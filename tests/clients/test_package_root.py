"""The Python client's package root: `from agentruntime import Client, SyncClient, output_as` and
the error types, as the docs show them, while importing the generated stubs (which imports the
package root first) still loads none of the client. Each check runs in a fresh interpreter, so
that what an earlier test imported cannot hide a cycle or an eager import. The README's Python
program, run against a server by tests/e2e/test_readme_claims.py, imports from the root too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

EXPORTS = {
    "Client": "agentruntime.client",
    "AgentRuntimeError": "agentruntime.client",
    "PEM": "agentruntime.client",
    "ToolHandler": "agentruntime.client",
    "SyncClient": "agentruntime.sync",
    "output_as": "agentruntime.output",
    "output_json": "agentruntime.output",
    "OutputError": "agentruntime.output",
}
CLIENT_MODULES = ["agentruntime.client", "agentruntime.sync", "agentruntime.output", "msgspec"]
STUBS = "import agentruntime.v1.agent_runtime_pb2_grpc\nfrom agentruntime.v1 import agent_runtime_pb2 as pb\n"


def fresh(program: str) -> str:
    """What a program prints, run by a Python of its own; its failure fails the test with its stderr."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_package_root_exports_the_client_and_its_errors() -> None:
    names = ", ".join(EXPORTS)
    checks = "\n".join(f"assert {name} is importlib.import_module({home!r}).{name}, {name!r}" for name, home in EXPORTS.items())
    out = fresh(f"import importlib\nimport agentruntime\nfrom agentruntime import {names}\n{checks}\n")
    assert out == ""
    assert sorted(fresh("import agentruntime\nprint(*agentruntime.__all__)").split()) == sorted(EXPORTS)
    listed = fresh("import agentruntime\nprint(*dir(agentruntime))").split()
    assert set(EXPORTS) <= set(listed)
    errors = "from agentruntime import AgentRuntimeError, OutputError\n"
    errors += "print(issubclass(AgentRuntimeError, Exception), issubclass(OutputError, ValueError))"
    assert fresh(errors).split() == ["True", "True"]


def test_a_name_the_root_does_not_have_is_an_import_error() -> None:
    out = fresh(
        """
        import agentruntime
        try:
            from agentruntime import Cleint
        except ImportError as error:
            print(error)
        try:
            agentruntime.Cleint
        except AttributeError as error:
            print(error)
        """
    )
    assert "cannot import name 'Cleint' from 'agentruntime'" in out
    assert "module 'agentruntime' has no attribute 'Cleint'" in out


def test_importing_the_stubs_loads_none_of_the_client() -> None:
    """The server and the generated code import agentruntime.v1: the package root they pass
    through must stay cheap (the client costs grpc.aio's helpers and msgspec on top)."""
    out = fresh(STUBS + f"import sys\nprint(*[m for m in {CLIENT_MODULES!r} if m in sys.modules])\n")
    assert out.split() == []


@pytest.mark.parametrize(
    "program",
    [
        STUBS + "from agentruntime import Client, SyncClient, output_as\n",
        "from agentruntime import Client, SyncClient, output_as\n" + STUBS,
        "import agentruntime.client\nfrom agentruntime import Client\nassert Client is agentruntime.client.Client\n",
        "from agentruntime import output_as\nimport agentruntime.sync\n" + STUBS,
    ],
    ids=["stubs-first", "root-first", "module-first", "output-first"],
)
def test_the_root_and_the_stubs_import_in_any_order(program: str) -> None:
    fresh(program + "print(Client if 'Client' in dir() else output_as)\n")
