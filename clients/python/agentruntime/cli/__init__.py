"""`agentruntime run | ls | inspect | transcript | resume | watch | runtimes | rm`: operate a server from a terminal.

The commands are listed here without importing them, so a host (the server's console
script) can offer them at no cost; `main` imports the implementation."""

from __future__ import annotations

COMMANDS = {
    "run": "create a runtime from an agents file, run an agent and show its live tree",
    "ls": "list a runtime's handles",
    "inspect": "show one handle",
    "transcript": "show a handle's transcript",
    "resume": "answer a pending request",
    "watch": "print a runtime's events as they happen",
    "runtimes": "list your runtimes, newest first",
    "rm": "delete a runtime and everything stored of it",
}


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns the exit code (0 ok, 1 a run that did not end DONE, 2 an error)."""
    from .main import run_cli

    return run_cli(argv)
