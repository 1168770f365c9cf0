"""What a model turn costs the database, for a capacity model toward many machines (issue 43).

The bench workload of replicas.py (a runtime per root; a coordinator and 4 workers, 18 model
turns and 12 http tool calls a root; C roots in flight) against two replicas on one embedded
PostgreSQL, with pg_stat_statements loaded (shared_preload_libraries, then a restart). Each
replica connects as a role of its own, so that the database's views tell the replicas apart.
Replicas keep a small runtime cache (--runtime-cache, 20): every root created evicts an idle
runtime and releases its lease, as at any rate that fills the default cache of 1,000.

Measured over the batches after a warm-up batch, per model turn:
- the statements the replicas executed, by kind (pg_stat_statements: calls, rows, WAL bytes,
  full-page images, execution time), and the transactions committed (pg_stat_database);
- the rows inserted, updated (HOT or not) and deleted, and the index scans, by table
  (pg_stat_user_tables), and the growth of each table and index (pg_total_relation_size,
  pg_relation_size);
- WAL bytes (pg_wal_lsn_diff of pg_current_wal_lsn before and after);
- the database's CPU: utime + stime of the postmaster and every process under it, from /proc
  (those that exited are in the postmaster's cutime + cstime), less this bench's own backend;
- the replicas' CPU, and the connections each replica holds (pg_stat_activity, sampled).
And an idle phase between the warm-up and the batches (--settle seconds, nothing running,
the cached runtimes held): the lease traffic per replica and second (store/postgres/leases.py:
a renewal every third of a lease).
Three runs, each on a fresh database: model latency 0 and 20 ms, then 0 ms with the tenant's
quotas on (QUOTAS: the ones that read or write rows shared by a tenant's runtimes).

Everything shares the machine's cores (replicas, PostgreSQL, the model server, this client).
Figures are measured, never asserted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from replicas import Cluster, cluster
from workload import TURNS_PER_ROOT

from tests.support.postgres import StoppablePostgres, embedded_server, fresh_database

ROLES = ("capacity_r0", "capacity_r1")  # one a replica
TABLES = ("runtimes", "journal", "tenant_tokens", "replicas", "replies")
LEASE_DURATION = 10.0  # the default (settings.lease_duration): a renewal every 3.3 s
# The tenant's quotas that read or write rows shared by its runtimes, set far above what the
# run reaches: the runtimes' count at each create (under the tenant's lock), the bytes its
# runtimes take (read at most once a second), its tokens by minute (upserted by each commit).
QUOTAS = {
    "AGENTRUNTIME_QUOTA_RUNTIMES": str(10**9),
    "AGENTRUNTIME_QUOTA_STORE_BYTES": str(10**15),
    "AGENTRUNTIME_QUOTA_TOKENS_PER_DAY": str(10**15),
}
RUNS = (  # a title, the model's latency, with QUOTAS
    ("model latency 0 ms", 0.0, False),
    ("model latency 20 ms", 0.02, False),
    ("model latency 0 ms, the tenant's quotas on", 0.0, True),
)

# Statements by the start of their text (whitespace folded, pg_stat_statements' $n as $): a
# name, and the tables they touch.
KINDS: tuple[tuple[str, str], ...] = (
    ("WITH mine AS", "group commit: journal insert, runtimes update, tenant_tokens upsert"),
    ("WITH created AS", "create runtime: runtimes insert, journal insert"),
    ("SELECT MAX(seq) FROM journal", "next seq of a runtime (journal)"),
    ("SELECT $ FROM runtimes WHERE id", "runtime exists (runtimes)"),
    ("SELECT agents FROM runtimes", "load: definitions (runtimes)"),
    ("SELECT seq, at, first_event", "load or page: journal rows"),
    ("INSERT INTO replicas", "lease: renewal (replicas upsert)"),
    ("DELETE FROM replicas WHERE expires_at", "lease: prune dead replicas"),
    ("SELECT id, epoch FROM runtimes WHERE owner", "lease: runtimes owned (runtimes)"),
    ("SELECT r.id FROM runtimes r WHERE r.running", "lease: orphans (runtimes, replicas)"),
    ("UPDATE runtimes r SET owner", "lease: claim (runtimes)"),
    ("SELECT r.owner, p.address", "lease: holder (runtimes, replicas)"),
    ("UPDATE runtimes SET owner", "lease: release (runtimes)"),
    ("SELECT COALESCE(SUM(bytes)", "tenant's bytes (runtimes)"),
    ("SELECT minute, tokens, micros", "tenant's tokens (tenant_tokens)"),
    ("SELECT pg_advisory_unlock_all", "pool: reset on release (4 statements, 1 round trip)"),
    ("CLOSE ALL", "pool: reset on release (4 statements, 1 round trip)"),
    ("UNLISTEN", "pool: reset on release (4 statements, 1 round trip)"),
    ("RESET ALL", "pool: reset on release (4 statements, 1 round trip)"),
    ("BEGIN", "BEGIN"),
    ("COMMIT", "COMMIT"),
    ("ROLLBACK", "ROLLBACK"),
)

_STATEMENTS = """
SELECT r.rolname, s.queryid, s.query, s.calls, s.rows, s.wal_bytes, s.wal_fpi, s.total_exec_time
FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND r.rolname = ANY($1::text[])
"""
_TABLES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, COALESCE(idx_scan, 0), seq_scan,
    autovacuum_count + autoanalyze_count, pg_total_relation_size(relid) FROM pg_stat_user_tables
"""
TABLE_FIGURES = 8  # the figures of a _TABLES row after its name
_INDEXES = "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
_CONNECTIONS = """
SELECT usename, COUNT(*), COUNT(*) FILTER (WHERE state = 'active') FROM pg_stat_activity
WHERE datname = current_database() AND usename = ANY($1::text[]) GROUP BY usename
"""
_BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND usename = ANY($1::text[])"


def kind(query: str) -> str:
    text = re.sub(r"\$\d+", "$", " ".join(query.split()))
    for prefix, name in KINDS:
        if text.startswith(prefix):
            return name
    return text[:60]


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster and every process it started, the exited ones included."""
    fields = _stat(postmaster)
    ticks = sum(int(fields[n]) for n in (11, 12, 13, 14))
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile: reaped into the postmaster's cutime
            fields = _stat(int(name))
            if int(fields[1]) == postmaster:
                ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds of a process (0 once gone)."""
    try:
        fields = _stat(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Figures = tuple[str, int, int, int, int, float]  # a statement's text, calls, rows, WAL bytes, full-page images, ms


@dataclass
class Snapshot:
    """The database's counters at one moment."""

    at: float
    lsn: str
    statements: dict[tuple[str, int], Figures]  # by (role, queryid)
    tables: dict[str, tuple[int, ...]]  # ins, upd, HOT upd, del, idx scans, seq scans, autovacuum and analyze runs, bytes
    indexes: dict[str, int]  # bytes
    database_bytes: int
    rows: dict[str, int]  # runtimes and journal rows, counted
    transactions: int  # committed, less the monitor's own
    cpu: float  # the database's CPU seconds, less the monitor's backend
    backends: dict[int, float]  # the replicas' backends: CPU seconds by pid
    replicas_cpu: float


@dataclass
class Monitor:
    """This bench's own connection to the database (its backend's CPU and transactions are left out)."""

    connection: Any
    postmaster: int
    statements: bool  # pg_stat_statements is there
    backend: int = 0
    queries: int = 0  # the monitor's own (each a transaction)
    samples: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # role -> (connections, active)

    async def fetch(self, query: str, *arguments: Any) -> list[Any]:
        self.queries += 1
        return list(await self.connection.fetch(query, *arguments))

    async def value(self, query: str, *arguments: Any) -> Any:
        self.queries += 1
        return await self.connection.fetchval(query, *arguments)

    async def snapshot(self, replicas: Cluster) -> Snapshot:
        statements: dict[tuple[str, int], Figures] = {}
        if self.statements:
            for role, queryid, query, calls, rows, wal, fpi, ms in await self.fetch(_STATEMENTS, list(ROLES)):
                statements[(role, queryid)] = (query, calls, rows, int(wal), fpi, ms)
        tables = {row[0]: tuple(int(v) for v in row[1:]) for row in await self.fetch(_TABLES)}
        indexes = {name: size for name, size in await self.fetch(_INDEXES)}
        database_bytes = await self.value("SELECT pg_database_size(current_database())")
        rows = {table: await self.value(f"SELECT COUNT(*) FROM {table}") for table in ("runtimes", "journal")}
        backends = {pid: process_cpu(pid) for (pid,) in await self.fetch(_BACKENDS, list(ROLES))}
        lsn = await self.value("SELECT pg_current_wal_lsn()::text")
        transactions = await self.value("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        cpu = postgres_cpu(self.postmaster) - process_cpu(self.backend)
        return Snapshot(
            time.monotonic(),
            lsn,
            statements,
            tables,
            indexes,
            database_bytes,
            rows,
            transactions - self.queries,
            cpu,
            backends,
            replicas.cpu(),
        )

    async def wal_bytes(self, before: Snapshot, after: Snapshot) -> int:
        return int(await self.value("SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)", after.lsn, before.lsn))

    @contextlib.asynccontextmanager
    async def sampling(self, every: float = 0.05) -> AsyncIterator[None]:
        """Samples each replica's connections while the block runs (on this connection: no
        other statement of the monitor's meanwhile)."""
        self.samples = {role: [] for role in ROLES}
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                seen = {row[0]: (row[1], row[2]) for row in await self.fetch(_CONNECTIONS, list(ROLES))}
                for role in ROLES:
                    self.samples[role].append(seen.get(role, (0, 0)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), every)

        task = asyncio.create_task(sample())
        try:
            yield
        finally:
            stop.set()
            await task  # not cancelled: a statement cut off would leave the connection busy

    async def runtimes(self) -> tuple[int, int]:
        """Runtimes in the table, and those a replica holds."""
        (total, held), *_ = await self.fetch("SELECT COUNT(*), COUNT(owner) FROM runtimes")
        return int(total), int(held)

    async def journal(self) -> tuple[int, float]:
        """Journal rows, and their steps' mean size in bytes."""
        (rows, mean), *_ = await self.fetch("SELECT COUNT(*), COALESCE(AVG(octet_length(step)), 0) FROM journal")
        return int(rows), float(mean)


@dataclass
class Phase:
    """What the database did between two snapshots."""

    before: Snapshot
    after: Snapshot
    wal_bytes: int
    counted: Snapshot | None = None  # the tables' counters of the phase, read later (see measure)

    @property
    def seconds(self) -> float:
        return self.after.at - self.before.at

    @property
    def cpu(self) -> float:
        return self.after.cpu - self.before.cpu

    @property
    def backends_cpu(self) -> float:
        """The replicas' backends' (a backend that ended between the snapshots is not in it)."""
        return sum(cpu - self.before.backends.get(pid, 0.0) for pid, cpu in self.after.backends.items())

    @property
    def replicas_cpu(self) -> float:
        return self.after.replicas_cpu - self.before.replicas_cpu

    def statements(self) -> dict[str, dict[str, float]]:
        """By kind: calls, rows, WAL bytes, full-page images, execution ms."""
        kinds: dict[str, dict[str, float]] = {}
        for key, (query, calls, rows, wal, fpi, ms) in self.after.statements.items():
            _, calls0, rows0, wal0, fpi0, ms0 = self.before.statements.get(key, (query, 0, 0, 0, 0, 0.0))
            if calls == calls0:
                continue
            figures = kinds.setdefault(kind(query), {"calls": 0, "rows": 0, "wal": 0, "fpi": 0, "ms": 0.0})
            for name, now, then in (("calls", calls, calls0), ("rows", rows, rows0), ("wal", wal, wal0), ("fpi", fpi, fpi0)):
                figures[name] += now - then
            figures["ms"] += ms - ms0
        return kinds

    def statements_by_role(self) -> dict[str, int]:
        counts = dict.fromkeys(ROLES, 0)
        for (role, queryid), figures in self.after.statements.items():
            before = self.before.statements.get((role, queryid))
            counts[role] += figures[1] - (before[1] if before is not None else 0)
        return counts

    def table(self, name: str) -> tuple[int, ...]:
        nothing = (0,) * TABLE_FIGURES
        end = self.counted or self.after
        after, before = end.tables.get(name, nothing), self.before.tables.get(name, nothing)
        return tuple(a - b for a, b in zip(after, before, strict=True))


async def measure(
    monitor: Monitor, replicas: Cluster, roots: int, batches: int, concurrency: int, settle: float
) -> tuple[Phase, Phase, float]:
    """A warm-up batch; `settle` seconds idle (the idle phase); the batches: their phase, with
    the tables' counters read `settle` seconds after its end; the idle phase; turns/s (median).

    A backend reports its tables' counters within a second of going idle, or 10 s later when
    another held the lock it needs (PGSTAT_IDLE_INTERVAL): read earlier, a phase's counters
    would miss part of its rows and hold some of the phase before's."""
    await replicas.batch(roots, concurrency)  # warm-up: connections open, statements prepared
    start = await monitor.snapshot(replicas)
    await asyncio.sleep(settle)
    before = await monitor.snapshot(replicas)
    idle_phase = Phase(start, before, await monitor.wal_bytes(start, before))
    rates = []
    async with monitor.sampling():
        for _ in range(batches):
            rate, _cpu = await replicas.batch(roots, concurrency)
            rates.append(rate)
    after = await monitor.snapshot(replicas)
    await asyncio.sleep(settle)
    counted = await monitor.snapshot(replicas)
    phase = Phase(before, after, await monitor.wal_bytes(before, after), counted)
    return phase, idle_phase, sorted(rates)[len(rates) // 2]


def role_url(url: str, role: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=f"{role}:@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")).geturl()


@contextlib.contextmanager
def postgres() -> Iterator[StoppablePostgres]:
    with embedded_server("agentruntime-bench-capacity-") as server:
        yield StoppablePostgres(server)


async def with_statements(server: StoppablePostgres) -> bool:
    """pg_stat_statements loaded (the server restarted with it); False if it cannot be."""
    admin = await asyncpg.connect(server.url)
    try:
        await admin.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        for role in ROLES:
            await admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
    finally:
        await admin.close()
    try:
        await server.restart()
    except AssertionError as error:  # the library cannot be loaded: the server starts without it
        print(f"pg_stat_statements: the server did not restart with it ({error}); counters only", file=sys.stderr)
        settings = Path(server.server.pgdata) / "postgresql.auto.conf"
        settings.write_text("".join(line for line in settings.read_text().splitlines(True) if "pg_stat_statements" not in line))
        await server.start()
        return False
    return True


def _line(label: str, text: str) -> None:
    print(f"{label:<46}{text}")


def report(
    title: str,
    phase: Phase,
    rate: float,
    roots: int,
    idle_phase: Phase,
    monitor: Monitor,
    held: tuple[int, int],
    journal: tuple[int, float],
) -> None:
    turns = roots * TURNS_PER_ROOT
    print(f"\n== two replicas, one PostgreSQL, C=20, {title}: {turns:,} model turns ({roots} roots)")
    statements = phase.statements()
    calls = sum(figures["calls"] for figures in statements.values())
    _line("model turns/s (median of the batches)", f"{rate:,.0f}")
    _line("replicas' CPU per turn", f"{phase.replicas_cpu / turns * 1e6:,.0f} µs")
    _line(
        "database's CPU per turn",
        f"{phase.cpu / turns * 1e6:,.0f} µs (the replicas' backends {phase.backends_cpu / turns * 1e6:,.0f} µs,"
        f" the rest: WAL writer, checkpointer, autovacuum, postmaster)",
    )
    if monitor.statements:
        split = ", ".join(f"{n / turns:.2f}" for n in phase.statements_by_role().values())
        _line("statements per turn (pg_stat_statements)", f"{calls / turns:.2f} (by replica: {split})")
    _line("transactions committed per turn", f"{(phase.after.transactions - phase.before.transactions) / turns:.2f}")
    _line("WAL per turn", f"{phase.wal_bytes / turns:,.0f} bytes")
    _line("database size growth per turn", f"{(phase.after.database_bytes - phase.before.database_bytes) / turns:,.0f} bytes")
    rows, mean = journal
    counted = {table: phase.after.rows[table] - phase.before.rows[table] for table in ("runtimes", "journal")}
    _line(
        "rows inserted (counted)",
        f"journal {counted['journal'] / turns:.2f} a turn (steps of {mean:,.0f} bytes on average over its {rows:,} rows),"
        f" runtimes {counted['runtimes'] / roots:.2f} a root",
    )
    for role in ROLES:
        samples = monitor.samples.get(role) or [(0, 0)]
        mean_active = sum(active for _, active in samples) / len(samples)
        _line(
            f"connections of replica {role[-1]}",
            f"{max(n for n, _ in samples)} open at most, {max(a for _, a in samples)} active at most,"
            f" {mean_active:.2f} active on average ({len(samples)} samples)",
        )
    if monitor.statements:
        print(
            f"\n{'statement (by kind)':<68} {'calls/turn':>10} {'rows/call':>9} {'WAL B/turn':>10} {'FPI/turn':>8} {'µs/call':>7}"
        )
        for name, figures in sorted(statements.items(), key=lambda item: -item[1]["calls"]):
            print(
                f"{name[:68]:<68} {figures['calls'] / turns:>10.3f} {figures['rows'] / figures['calls']:>9.1f}"
                f" {figures['wal'] / turns:>10,.0f} {figures['fpi'] / turns:>8.3f}"
                f" {figures['ms'] * 1000 / figures['calls']:>7.0f}"
            )
        wal_counted = sum(figures["wal"] for figures in statements.values())
        print(f"{'(their WAL, of all WAL)':<68} {'':>10} {'':>9} {wal_counted / max(phase.wal_bytes, 1):>10.0%}")
    print(
        f"\n{'table':<14} {'ins/turn':>9} {'upd/turn':>9} {'HOT':>5} {'del/turn':>9} {'idx scans/turn':>14}"
        f" {'seq scans':>9} {'autovacuum':>10} {'bytes/turn':>10}"
    )
    for name in TABLES:
        ins, upd, hot, gone, idx, seq, vacuums, size = phase.table(name)
        print(
            f"{name:<14} {ins / turns:>9.3f} {upd / turns:>9.3f} {hot / max(upd, 1):>5.0%} {gone / turns:>9.3f}"
            f" {idx / turns:>14.2f} {seq:>9} {vacuums:>10} {size / turns:>10,.0f}"
        )
    print(f"\n{'index':<28} {'bytes/turn':>10} {'size after':>12}")
    for name in sorted(phase.after.indexes):
        grown = phase.after.indexes[name] - phase.before.indexes.get(name, 0)
        print(f"{name:<28} {grown / turns:>10,.1f} {phase.after.indexes[name]:>12,}")
    leases(phase, idle_phase, roots, held)


def leases(phase: Phase, idle_phase: Phase, roots: int, held: tuple[int, int]) -> None:
    """What the run spent on leases, per runtime created, and what holding them costs per second."""
    used = {name: figures for name, figures in phase.statements().items() if name.startswith("lease:")}
    if used:
        total = sum(figures["calls"] for figures in used.values())
        print(
            f"\nleases during the run: {total / roots:.2f} statements per runtime created ({total:.0f} in {phase.seconds:.1f} s)"
        )
        for name, figures in sorted(used.items()):
            print(
                f"  {name:<50} {figures['calls'] / roots:>6.3f} a runtime, {figures['rows'] / figures['calls']:>6.1f} rows a call"
            )
    replicas, seconds = len(ROLES), idle_phase.seconds
    statements = idle_phase.statements()
    renewals = statements.get("lease: renewal (replicas upsert)", {}).get("calls", 0)
    print(
        f"idle for {seconds:.1f} s ({held[1]} of the table's {held[0]} runtimes held), per replica and second:"
        f" {renewals / replicas / seconds:.2f} renewals, {sum(f['calls'] for f in statements.values()) / replicas / seconds:.2f}"
        f" statements, {idle_phase.wal_bytes / replicas / seconds:,.0f} WAL bytes; CPU: the replica's"
        f" {idle_phase.replicas_cpu / replicas / seconds * 1e6:,.0f} µs, its backends'"
        f" {idle_phase.backends_cpu / replicas / seconds * 1e6:,.0f} µs, the database's in all"
        f" {idle_phase.cpu / replicas / seconds * 1e6:,.0f} µs"
    )
    for name, figures in sorted(statements.items()):
        print(
            f"  {name[:60]:<60} {figures['calls'] / replicas / seconds:>6.2f}/s a replica,"
            f" {figures['rows'] / figures['calls']:>6.1f} rows a call, {figures['ms'] * 1000 / figures['calls']:>6.0f} µs a call"
        )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--roots", type=int, default=60, help="roots per batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--runtime-cache", type=int, default=20, help="each replica's runtime cache (AGENTRUNTIME_RUNTIME_CACHE)")
    parser.add_argument(
        "--settle", type=float, default=11.0, help="seconds idle after the warm-up (the idle phase) and after the batches"
    )
    args = parser.parse_args()
    with postgres() as server:
        statements = await with_statements(server)
        for name, latency, quotas in RUNS:
            url = await fresh_database(server.url, f"capacity_{len(name)}_{int(latency * 1000)}")
            connection = await asyncpg.connect(url)
            try:
                if statements:
                    await connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                monitor = Monitor(connection, server.server.get_pid(), statements)
                monitor.backend = await connection.fetchval("SELECT pg_backend_pid()")
                stores = [role_url(url, role) for role in ROLES]
                settings = {
                    "AGENTRUNTIME_RUNTIME_CACHE": str(args.runtime_cache),
                    "AGENTRUNTIME_LEASE_DURATION": str(LEASE_DURATION),
                    **(QUOTAS if quotas else {}),
                }
                async with cluster(stores, latency, **settings) as replicas:
                    phase, idle_phase, rate = await measure(monitor, replicas, args.roots, args.batches, 20, args.settle)
                    held = await monitor.runtimes()
                    journal = await monitor.journal()
                report(name, phase, rate, args.roots * args.batches, idle_phase, monitor, held, journal)
            finally:
                await connection.close()


if __name__ == "__main__":
    asyncio.run(main())
