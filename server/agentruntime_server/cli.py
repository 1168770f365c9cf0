"""`agentruntime serve`: the console script. Its other commands (run, ls, ...) are the client's CLI."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from agentruntime.cli import COMMANDS, command_first
from agentruntime.cli import main as client_main
from pydantic import ValidationError

from .app import start
from .console.serve import add_arguments as add_console_arguments
from .console.serve import main as console_main
from .observability.logs import configure_logging
from .process.collector import tune_for_serving
from .process.event_loop import loop_factory
from .settings import Settings, StartupError


def main(argv: list[str] | None = None) -> None:
    arguments = command_first(sys.argv[1:] if argv is None else argv)
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
    serve.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (env AGENTRUNTIME_TLS_CERT)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert (env AGENTRUNTIME_TLS_KEY)")
    serve.add_argument(
        "--tls-client-ca", help="PEM CA: require client certificates it signed, mTLS (env AGENTRUNTIME_TLS_CLIENT_CA)"
    )
    serve.add_argument("--auth", choices=["none", "tokens", "jwt"], help="env AGENTRUNTIME_AUTH")
    serve.add_argument("--auth-tokens-file", help="JSON list of hashed bearer tokens (env AGENTRUNTIME_AUTH_TOKENS_FILE)")
    serve.add_argument("--auth-jwks", help="JWKS URL or file for --auth jwt (env AGENTRUNTIME_AUTH_JWKS)")
    serve.add_argument("--auth-issuer", help="env AGENTRUNTIME_AUTH_ISSUER")
    serve.add_argument("--auth-audience", help="env AGENTRUNTIME_AUTH_AUDIENCE")
    serve.add_argument("--auth-tenant-claim", help="env AGENTRUNTIME_AUTH_TENANT_CLAIM (default: tenant)")
    serve.add_argument(
        "--allow-insecure",
        action="store_const",
        const=True,
        help="serve a non-loopback address in plaintext with --auth none (env AGENTRUNTIME_ALLOW_INSECURE)",
    )
    console = commands.add_parser("console", help="serve the web console for a runtime (the console extra)")
    add_console_arguments(console)
    for name, summary in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)  # handled above, listed in --help
    args = parser.parse_args(argv)
    if args.command == "console":
        sys.exit(console_main(args))
    overrides: dict[str, Any] = {key: value for key, value in vars(args).items() if key != "command" and value is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        for problem in error.errors():
            where = f"AGENTRUNTIME_{str(problem['loc'][0]).upper()}: " if problem["loc"] else ""
            print(f"error: {where}{problem['msg']}", file=sys.stderr)
        sys.exit(2)
    configure_logging(settings)
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            runner.run(_serve(settings))
    except StartupError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


async def _serve(settings: Settings) -> None:
    running = await start(settings)
    tune_for_serving()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop(settings.shutdown_grace)


if __name__ == "__main__":
    main()
