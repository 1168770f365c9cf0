"""Leases for replicas sharing one PostgreSQL database (the DBOS / Oban pattern: the
database is the coordinator; no consensus of our own, no broker).

- Every replica has a row in `replicas` with its advertised address and an expiry it
  pushes forward every third of the lease (`renew`). A replica is live while that row has
  not expired, by the database's clock (replicas' clocks never matter).
- A runtime's `owner` is the replica executing it, or NULL. `claim` takes a runtime whose
  owner is NULL, itself, or not live, and raises its `epoch` in the same statement.
- The store (PostgresStore, as it commits) accepts a journal write only from the owner at
  the epoch it claimed, under a row lock a claim waits for: a replica that was paused or cut
  off past its lease can never write again once another replica has claimed.
- A replica that has not renewed for a lease by its own clock (starved, paused) renews
  before any copy of it answers (`confirm`): it never answers from a copy another
  replica may have run on since.
- A graceful stop releases every lease at once (`release_all`), so a rolling restart waits
  for no expiry; a crash's leases lapse after the lease duration, and the live replicas take
  over the runtimes with running handles (`orphans`) through the same replay as a restart.
  A replica whose store broke (a commit failed) renews no more: its leases lapse the same way.
- A killed replica's row outlives it by PRUNE_AFTER, then every renewal deletes it. For every
  reader a missing row is an expired one (a claim, retention and the orphans look for a live
  row; a forward needs one), and fencing never reads the table: a commit is checked against the
  runtime's own owner and epoch. So a runtime whose owner's row is gone is claimed like a dead
  one's, and a replica paused past it that wakes up puts its row back with its next renewal and
  learns, by epoch, which runtimes it lost, as after any lapse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator

from ...domain.ownership import Claim
from .store import PostgresStore
from .weather import guarded

log = logging.getLogger(__name__)

_NOW = "extract(epoch FROM clock_timestamp())"
# Seconds a replica's row is kept past its expiry: any time would be safe (see above); an hour
# shows an operator the replicas that died lately, and keeps the table to the live replicas
# and an hour of restarts (a replica killed every 90 s: 40 rows, not one per start for ever).
PRUNE_AFTER = 3600.0
_LIVE_OWNER = f"EXISTS (SELECT 1 FROM replicas p WHERE p.id = r.owner AND p.expires_at > {_NOW})"
_CLAIM = (
    "UPDATE runtimes r SET owner = $2, epoch = r.epoch + 1"
    f" WHERE r.id = $1 AND (r.owner IS NULL OR r.owner = $2 OR NOT {_LIVE_OWNER}) RETURNING r.epoch"
)
_HOLDER = (
    f"SELECT r.owner, p.address, COALESCE(p.expires_at > {_NOW}, FALSE)"
    " FROM runtimes r LEFT JOIN replicas p ON p.id = r.owner WHERE r.id = $1"
)


class PostgresLeases:
    shared = True

    def __init__(self, store: PostgresStore, address: str, duration: float = 10.0) -> None:
        """`address`: where other replicas reach this one (host:port); `duration`: seconds a
        lease outlives the last renewal of its replica."""
        self.store = store
        self.address = address
        self.duration = duration
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._callbacks: list[Callable[[str], None]] = []
        self._renewed = float("-inf")  # monotonic time the last renewal was sent at
        self._claiming: set[str] = set()
        self._confirming: asyncio.Future[None] | None = None
        store.leasing = self

    def guard(self) -> contextlib.AbstractContextManager[None]:
        return self.store.guard()

    def fresh(self) -> bool:
        """This replica's leases cannot have lapsed yet (by its own clock, counted from when
        the last renewal was sent: a process paused past its lease finds out on waking)."""
        return time.monotonic() - self._renewed < self.duration

    def on_lost(self, callback: Callable[[str], None]) -> None:
        self._callbacks.append(callback)

    def refused(self, keys: Iterable[str], gone: Collection[str] = ()) -> None:
        """The store refused writes of these runtimes: their lease was lost (`gone`: those
        whose row was deleted, by retention or DeleteRuntime at another replica, while this
        one was cut off or paused)."""
        for key in keys:
            if key in gone:
                log.warning("runtime %s: it was deleted while this replica was cut off; this replica's copy stops", key)
            else:
                log.warning("runtime %s: another replica holds its lease now; this replica's copy stops", key)
            for callback in self._callbacks:
                callback(key)

    async def start(self) -> None:
        """Registers this replica (live from now on)."""
        self._renewed = await self._heartbeat()
        log.info("replica %s serving at %s (leases of %gs)", self.replica_id, self.address, self.duration)

    @guarded
    async def _heartbeat(self) -> float:
        """Pushes this replica's expiry on; the monotonic time it was sent at. Not while its store
        is away (it commits nothing then): its leases lapse if that lasts, and the other
        replicas take its runtimes over."""
        self.store.raise_if_away()
        pool = await self.store.pool()
        sent = time.monotonic()
        await pool.execute(
            f"INSERT INTO replicas (id, address, expires_at) VALUES ($1, $2, {_NOW} + $3)"
            f" ON CONFLICT (id) DO UPDATE SET expires_at = {_NOW} + $3, address = excluded.address",
            self.replica_id,
            self.address,
            self.duration,
        )
        return sent

    async def confirm(self) -> None:
        """Renews now if this replica's leases may have lapsed (it was starved or paused past
        a renewal), so that a copy answers only once it is known to be still this replica's.
        Callers at the same moment share one renewal."""
        if self.fresh():
            return
        if self._confirming is None or self._confirming.done():
            self._confirming = asyncio.ensure_future(self._renew_and_report())
        await asyncio.shield(self._confirming)

    async def _renew_and_report(self) -> None:
        for key in await self.renew():
            for callback in self._callbacks:
                callback(key)

    def holds(self, runtime_id: str) -> bool:
        """Held, and this replica's leases cannot have lapsed: a replica starved or paused past
        its lease must not answer from its copy (another may have run the runtime since)."""
        return runtime_id in self.store.epochs and self.fresh()

    @contextlib.contextmanager
    def creating(self, runtime_id: str) -> Iterator[None]:
        """A runtime this replica is creating (and so owns): a renewal that reads the new row
        before the store has recorded its epoch here must not give it up as one no longer held."""
        self._claiming.add(runtime_id)
        try:
            yield
        finally:
            self._claiming.discard(runtime_id)

    async def claim(self, runtime_id: str) -> Claim:
        self._claiming.add(runtime_id)
        try:
            return await self._claim(runtime_id)
        finally:
            self._claiming.discard(runtime_id)

    @guarded
    async def _claim(self, runtime_id: str) -> Claim:
        pool = await self.store.pool()
        for _ in range(3):  # the holder may release between the two statements
            epoch = await pool.fetchval(_CLAIM, runtime_id, self.replica_id)
            if epoch is not None:
                self.store.claimed(runtime_id, epoch)
                return Claim(owned=True)
            holder = await pool.fetchrow(_HOLDER, runtime_id)
            if holder is None:
                return Claim(owned=False, exists=False)
            owner, address, live = holder
            if live and owner != self.replica_id:
                return Claim(owned=False, address=address or "")
        return Claim(owned=False)

    @guarded
    async def release(self, runtime_id: str) -> None:
        epoch = self.store.epochs.get(runtime_id)
        if epoch is None:
            return
        await self.store.flush()  # the journal first: nothing of this epoch may land after
        if self.store.epochs.get(runtime_id) != epoch:
            return  # claimed again meanwhile
        self.store.released(runtime_id)
        pool = await self.store.pool()
        await pool.execute(
            "UPDATE runtimes SET owner = NULL WHERE id = $1 AND owner = $2 AND epoch = $3",
            runtime_id,
            self.replica_id,
            epoch,
        )

    @guarded
    async def release_all(self) -> None:
        await self.store.flush()
        self.store.released()
        pool = await self.store.pool()
        async with pool.acquire() as connection, connection.transaction():
            await connection.execute("UPDATE runtimes SET owner = NULL WHERE owner = $1", self.replica_id)
            await connection.execute("DELETE FROM replicas WHERE id = $1", self.replica_id)

    @guarded
    async def renew(self) -> list[str]:
        """Renews, then compares: a runtime held here that the database gives to another
        replica (or to another epoch) was lost; one the database gives to this replica that
        it no longer holds (its copy stopped: see PostgresStore.flush) is given up."""
        sent = await self._heartbeat()
        held = dict(self.store.epochs)
        pool = await self.store.pool()
        # Replicas killed (a graceful stop deletes its own row) long enough ago: PRUNE_AFTER.
        await pool.execute(f"DELETE FROM replicas WHERE expires_at < {_NOW} - $1", PRUNE_AFTER)
        rows = await pool.fetch("SELECT id, epoch FROM runtimes WHERE owner = $1", self.replica_id)
        owned = {key: epoch for key, epoch in rows}
        missing = sorted(key for key, epoch in held.items() if owned.get(key) != epoch)
        present: set[str] = set()
        if missing:  # rare: whether each was deleted or taken over, for the message its callers get
            present = {row[0] for row in await pool.fetch("SELECT id FROM runtimes WHERE id = ANY($1::text[])", missing)}
        lost = []
        for key, epoch in held.items():
            if owned.get(key) != epoch and self.store.epochs.get(key) == epoch:  # not claimed again meanwhile
                self.store.lost(key, key not in present)
                lost.append(key)
        # Fresh again only now: had the leases lapsed, what was lost is known before any copy answers.
        self._renewed = sent
        for key, epoch in owned.items():
            if key not in self.store.epochs and key not in self._claiming:
                await pool.execute(
                    "UPDATE runtimes SET owner = NULL WHERE id = $1 AND owner = $2 AND epoch = $3", key, self.replica_id, epoch
                )
        return lost

    @guarded
    async def orphans(self) -> list[str]:
        """Random order and a bound: replicas taking over together spread the work."""
        pool = await self.store.pool()
        rows = await pool.fetch(
            f"SELECT r.id FROM runtimes r WHERE r.running AND (r.owner IS NULL OR NOT {_LIVE_OWNER}) ORDER BY random() LIMIT 100"
        )
        return [row[0] for row in rows]
