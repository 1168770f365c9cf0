"""`agentruntime serve`: the console script."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from .app import start
from .settings import Settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="agentruntime", description="A durable, legible LLM agent runtime over gRPC.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the AgentRuntime gRPC service")
    serve.add_argument("--listen", help="host:port (env AGENTRUNTIME_LISTEN)")
    serve.add_argument("--llm-style", choices=["scripted", "openai"], help="env AGENTRUNTIME_LLM_STYLE")
    serve.add_argument("--llm-base-url", help="env AGENTRUNTIME_LLM_BASE_URL")
    serve.add_argument("--llm-model", help="env AGENTRUNTIME_LLM_MODEL")
    serve.add_argument("--store", help="sqlite:///path.db or memory:// (env AGENTRUNTIME_STORE)")
    serve.add_argument("--log-level", help="env AGENTRUNTIME_LOG_LEVEL")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {key: value for key, value in vars(args).items() if key != "command" and value is not None}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
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
