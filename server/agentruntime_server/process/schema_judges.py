"""The server's schema judge (the domain's SchemaJudge port): checks whose cost has no small
bound run in worker processes (schema_worker.py), never on the event loop.

A schema and the value checked against it both come from outside (a tenant's definitions, a
model's answer, a third-party MCP server's content), and no validator bounds its own cost:
jsonschema compares `uniqueItems` pairwise and jsonschema-rs explores every branch of an `anyOf`
that recurses (2^20 paths for an answer nested 20 deep: 138 s). So a check gets a time budget
(AGENTRUNTIME_SCHEMA_CHECK_SECONDS), and a worker that spends it is killed and replaced; the
check is refused with the reason, as a check that failed. A tenant has one check at a time in
the workers: a tenant that sends costly checks waits for its own, and never holds every worker
while another tenant's check waits."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator

from ..domain.definitions.schemas import CheckNotDone
from .schema_worker import FAULT, HEADER, PROBLEM, READY, VALID, VERDICT

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 2
DEFAULT_SECONDS = 2.0
START_SECONDS = 30.0  # a worker's start: its imports, on a loaded machine
# What a worker is given of the server's environment: enough to find Python and this package,
# never a provider key or a token.
_ENVIRONMENT = ("PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LANG", "LC_ALL", "TMPDIR")


class _Worker:
    """One worker process, started when first needed and again after it was stopped."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.WriteTransport | None = None
        self.checking = False  # a check is with the worker (tests wait for it)

    async def judge(self, schema: bytes, instance: bytes, seconds: float) -> str | None:
        if self.process is None or self.process.poll() is not None:
            await self.start()
        assert self.reader is not None and self.writer is not None
        try:
            self.writer.write(HEADER.pack(len(schema), len(instance)) + schema + instance)
            self.checking = True
            async with asyncio.timeout(seconds):
                status, size = VERDICT.unpack(await self.reader.readexactly(VERDICT.size))
                text = (await self.reader.readexactly(size)).decode("utf-8", "surrogatepass")
        except TimeoutError:
            await self.stop()
            raise CheckNotDone(f"checking it took longer than the limit of {seconds:g} s") from None
        except (asyncio.IncompleteReadError, ConnectionError):
            await self.stop()
            raise CheckNotDone("the check stopped before it ended (it may need more memory than a check is given)") from None
        except BaseException:  # cancelled mid-check: its verdict must not be read as the next check's
            await self.stop()
            raise
        finally:
            self.checking = False
        if status == VALID:
            return None
        if status == PROBLEM:
            return text
        assert status == FAULT
        raise CheckNotDone(text)

    async def start(self) -> None:
        """A worker that has imported what it needs (that time is not a check's).

        Started with subprocess (vfork and exec), not the event loop's own: uvloop forks, and a
        fork of a process with gRPC's threads can crash in the child before it execs."""
        environment = {name: os.environ[name] for name in _ENVIRONMENT if name in os.environ}
        process = self.process = subprocess.Popen(  # noqa: ASYNC220 (returns once the child execs: about 1 ms)
            [sys.executable, "-m", "agentruntime_server.process.schema_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=environment,
        )
        assert process.stdin is not None and process.stdout is not None
        loop = asyncio.get_running_loop()
        reader = self.reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), process.stdout)
        self.writer, _ = await loop.connect_write_pipe(asyncio.Protocol, process.stdin)
        try:
            async with asyncio.timeout(START_SECONDS):
                ready = await reader.readexactly(len(READY))
        except (TimeoutError, asyncio.IncompleteReadError):
            ready = b""
        if ready != READY:
            await self.stop()
            raise CheckNotDone("no schema checker could be started")

    async def stop(self) -> None:
        process, self.process = self.process, None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.reader = None
        if process is not None:
            if process.poll() is None:
                process.kill()
            await asyncio.shield(asyncio.to_thread(process.wait))  # reaped: no zombie is left
            if process.stdout is not None:
                process.stdout.close()


class SchemaJudges:
    """Worker processes that judge values against schemas, each check within `seconds`."""

    def __init__(self, workers: int = DEFAULT_WORKERS, seconds: float = DEFAULT_SECONDS) -> None:
        self.seconds = seconds
        self._workers = [_Worker() for _ in range(workers)]
        self._idle: asyncio.Queue[_Worker] | None = None  # made on the loop, at the first check
        self._tenants: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.checks = collections.Counter[str]()  # verdicts by kind: valid, problem, not_done

    async def problem(self, tenant: str, schema: str, instance: str) -> str | None:
        async with self._tenant_turn(tenant):
            if self._idle is None:
                self._idle = asyncio.Queue()
                for worker in self._workers:
                    self._idle.put_nowait(worker)
            worker = await self._idle.get()
            try:
                verdict = await worker.judge(
                    schema.encode("utf-8", "surrogatepass"), instance.encode("utf-8", "surrogatepass"), self.seconds
                )
            except CheckNotDone as exc:
                self.checks["not_done"] += 1
                log.info("a schema check of tenant %r was not done: %s", tenant, exc)
                raise
            finally:
                self._idle.put_nowait(worker)
        self.checks["valid" if verdict is None else "problem"] += 1
        return verdict

    @contextlib.asynccontextmanager
    async def _tenant_turn(self, tenant: str) -> AsyncIterator[None]:
        """One check of a tenant's in the workers at a time (its others wait their turn)."""
        entry = self._tenants.get(tenant)
        if entry is None:
            entry = self._tenants[tenant] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0 and self._tenants.get(tenant) is entry:
                del self._tenants[tenant]

    async def close(self) -> None:
        for worker in self._workers:
            await worker.stop()
