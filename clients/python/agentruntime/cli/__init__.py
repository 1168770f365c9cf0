"""`agentruntime run | ls | inspect | transcript | resume | watch | runtimes | rm | fork | replay`: operate a server
from a terminal.

The commands are listed here without importing them, so a host (the server's console
script) can offer them at no cost; `main` imports the implementation."""

from __future__ import annotations

import sys

COMMANDS = {
    "run": "create a runtime from an agents file, run an agent and show its live tree",
    "ls": "list a runtime's handles",
    "inspect": "show one handle",
    "transcript": "show a handle's transcript",
    "resume": "answer a pending request",
    "watch": "print a runtime's events as they happen",
    "runtimes": "list your runtimes, newest first",
    "rm": "delete a runtime and everything stored of it",
    "fork": "fork a runtime at one of its events: a new runtime holding its history up to there",
    "replay": "replay recorded runtimes with other definitions and show what changed (exit 1: a status changed)",
}


# The connection options that take a value (--tls takes none).
_VALUED = ("--addr", "--token", "--ca", "--cert", "--key", "--retry-window")


def command_first(argv: list[str]) -> list[str]:
    """The arguments with the command first: connection options may come before it
    (`agentruntime --addr host:port ls rt`) as well as after it."""
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        index += 2 if argv[index] in _VALUED else 1
    if 0 < index < len(argv) and argv[index] in COMMANDS:
        return [argv[index], *argv[:index], *argv[index + 1 :]]
    return argv


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns the exit code (0 ok, 1 a run that did not end DONE, 2 an error)."""
    try:
        from .main import run_cli
    except ModuleNotFoundError as error:
        if error.name != "rich":
            raise
        print("agentruntime: the terminal commands need the `cli` extra: pip install 'agentruntime-client[cli]'", file=sys.stderr)
        return 2
    return run_cli(argv)
