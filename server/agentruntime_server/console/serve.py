"""`agentruntime console`: its options and its process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_TARGET = "127.0.0.1:50051"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--listen",
        default=env("AGENTRUNTIME_CONSOLE_LISTEN", DEFAULT_LISTEN),
        help=f"host:port to serve the console on (env AGENTRUNTIME_CONSOLE_LISTEN; default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--allow-host",
        dest="allow_hosts",
        action="append",
        metavar="NAME[:PORT]",
        default=[name.strip() for name in env("AGENTRUNTIME_CONSOLE_ALLOWED_HOSTS", "").split(",") if name.strip()],
        help="a name people reach the console by, besides its listen address, localhost and IP addresses (a DNS name, "
        "a proxy's); a request for any other name is refused. Repeat it for more names "
        "(env AGENTRUNTIME_CONSOLE_ALLOWED_HOSTS, comma-separated)",
    )
    parser.add_argument(
        "--target",
        default=env("AGENTRUNTIME_ADDR", DEFAULT_TARGET),
        help=f"the runtime's host:port (env AGENTRUNTIME_ADDR; default {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--token",
        default=env("AGENTRUNTIME_TOKEN"),
        help="a bearer token for people who sign in without one (env AGENTRUNTIME_TOKEN; default: none)",
    )
    tls = env("AGENTRUNTIME_TLS", "").lower() in ("1", "true", "yes")
    parser.add_argument("--tls", action="store_true", default=tls, help="connect with TLS (env AGENTRUNTIME_TLS=1)")
    parser.add_argument("--ca", type=Path, default=_path(env("AGENTRUNTIME_CA_FILE")), help="PEM CA to verify the runtime with")
    parser.add_argument(
        "--cert", type=Path, default=_path(env("AGENTRUNTIME_CLIENT_CERT_FILE")), help="PEM client certificate (mTLS)"
    )
    parser.add_argument("--key", type=Path, default=_path(env("AGENTRUNTIME_CLIENT_KEY_FILE")), help="PEM key of --cert")
    parser.add_argument(
        "--secure-cookies",
        action="store_true",
        default=env("AGENTRUNTIME_CONSOLE_SECURE_COOKIES", "").lower() in ("1", "true", "yes"),
        help="mark the session cookie Secure: the console is reached over HTTPS (env AGENTRUNTIME_CONSOLE_SECURE_COOKIES=1)",
    )


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def main(args: argparse.Namespace) -> int:
    try:
        from aiohttp import web

        from .app import build
        from .hosts import Site
        from .target import Target
    except ImportError as error:
        print(f"error: the console needs its extra ({error.name}): pip install 'agentruntime-server[console]'", file=sys.stderr)
        return 2
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"error: --listen must be host:port, got {args.listen!r}", file=sys.stderr)
        return 2
    if (args.cert is None) != (args.key is None):
        print("error: --cert and --key go together (mTLS): give both or neither", file=sys.stderr)
        return 2
    for given in (args.ca, args.cert, args.key):
        if given is not None and not given.is_file():
            print(f"error: no such file: {given}", file=sys.stderr)
            return 2
    try:
        names = Site(listen=args.listen, allowed_hosts=tuple(args.allow_hosts))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    target = Target(
        args.target,
        tls=args.tls or bool(args.ca or args.cert),
        ca=args.ca,
        cert=args.cert,
        key=args.key,
        token=args.token,
        secure_cookies=args.secure_cookies,
    )

    async def serve() -> None:
        runner = web.AppRunner(build(target, names), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]"), int(port))
        await site.start()
        print(f"agentruntime console on http://{args.listen} for the runtime at {args.target}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio.run(serve())
    return 0
