"""`agentruntime serve`: the console script. Its other commands (run, ls, ...) are the client's CLI."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from agentruntime.cli import COMMANDS
from agentruntime.cli import main as client_main

from .app import start
from .observability.logs import configure_logging
from .settings import Settings


def main(argv: list[str] | None = None) -> None:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments and arguments[0] in COMMANDS:
        sys.exit(client_main(arguments))
    parser = argparse.ArgumentParser(prog="agentruntime", description="A durable, legible LLM agent runtime over gRPC.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the AgentRuntime gRPC service")
    serve.add_argument("--listen", help="host:port (env AGENTRUNTIME_LISTEN)")
    serve.add_argument("--llm-style", choices=["scripted", "openai", "anthropic"], help="env AGENTRUNTIME_LLM_STYLE")
    serve.add_argument("--llm-base-url", help="env AGENTRUNTIME_LLM_BASE_URL")
    serve.add_argument("--llm-model", help="env AGENTRUNTIME_LLM_MODEL")
    serve.add_argument("--store", help="sqlite:///path.db or memory:// (env AGENTRUNTIME_STORE)")
    serve.add_argument("--log-level", help="env AGENTRUNTIME_LOG_LEVEL")
    for name, summary in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)  # handled above, listed in --help
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {key: value for key, value in vars(args).items() if key != "command" and value is not None}
    settings = Settings(**overrides)
    configure_logging(settings)
    asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> None:
    running = await start(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop(settings.shutdown_grace)


if __name__ == "__main__":
    main()
