"""A SQLite store's new runtimes, written by the group commit: a runtime's row, its first steps
and its request id's answer go in the transaction that writes every runtime's steps of the
tick, each creation under a savepoint of its own, so that one that cannot be written (its id
or its request id taken meanwhile by another process on the file) fails alone."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass, field

from ...domain.errors import RequestIdTaken, RuntimeExists
from ...domain.ports import Origin, TenantReply
from ...domain.tenancy.quotas import QuotaExceeded, runtimes_quota_reached
from ..payloads import GroupRow

APPEND = "INSERT INTO journal (runtime_id, seq, at, first_event, last_event, step, last_seq) VALUES (?, ?, ?, ?, ?, ?, ?)"
_COUNT = "SELECT COUNT(*) FROM runtimes WHERE tenant = ?"
_INSERT = "INSERT INTO runtimes (id, agents, created_at, tenant, updated_at, bytes) VALUES (?, ?, ?, ?, ?, ?)"
_ORIGIN = (
    "UPDATE runtimes SET forked_from = ?, fork_seq = ?, handles = ?, running_handles = ?, suspended_handles = ?,"
    " tokens = ?, cost_micros = ?, cost_currency = ?, cost_priced = ?, running = ? WHERE id = ?"
)


@dataclass(eq=False)
class Creation:
    """A runtime to create, waiting for the commit that writes it (`written`)."""

    runtime_id: str
    tenant: str
    definitions: bytes
    at: float
    groups: list[GroupRow]
    reply: TenantReply | None
    quota: int = 0  # the tenant's runtimes at most (0: no quota), counted in the commit's transaction
    origin: Origin | None = None  # a fork's or a replay's
    written: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def bytes(self) -> int:
        return len(self.definitions) + sum(len(group[5]) for group in self.groups)


def write(db: sqlite3.Connection, creations: list[Creation]) -> dict[Creation, Exception]:
    """The creations written in `db`'s transaction; those that could not be (the id or the
    request id in the file already, the tenant's quota of runtimes reached), with why, left out
    whole."""
    refused: dict[Creation, Exception] = {}
    for creation in creations:
        db.execute("SAVEPOINT creation")
        try:
            _write(db, creation)
        except (RuntimeExists, RequestIdTaken, QuotaExceeded) as exc:
            db.execute("ROLLBACK TO creation")
            refused[creation] = exc
        db.execute("RELEASE creation")
    return refused


def _write(db: sqlite3.Connection, creation: Creation) -> None:
    try:
        db.execute(
            _INSERT,
            (creation.runtime_id, creation.definitions, creation.at, creation.tenant, creation.at, creation.bytes),
        )
    except sqlite3.IntegrityError:
        raise RuntimeExists(creation.runtime_id) from None
    # Counted with the insert, in the transaction every process on the file takes in turn: stores
    # creating at once each count the others' runtimes written before.
    if creation.quota and db.execute(_COUNT, (creation.tenant,)).fetchone()[0] > creation.quota:
        raise runtimes_quota_reached(creation.tenant, creation.quota)
    # Journal rows under the id belong to no runtime (its row was just inserted): its row was
    # deleted without them (by hand, or by another process on the file while this one
    # appended). The new runtime must not inherit their seqs and handles.
    db.execute("DELETE FROM journal WHERE runtime_id = ?", (creation.runtime_id,))
    db.executemany(APPEND, creation.groups)
    origin = creation.origin
    if origin is not None:
        db.execute(_ORIGIN, (origin.forked_from, origin.fork_seq, *origin.counts, origin.running, creation.runtime_id))
    keep(db, creation.reply)


def keep(db: sqlite3.Connection, reply: TenantReply | None) -> None:
    """A CreateRuntime's or DeleteRuntime's answer, in the transaction of its effect."""
    if reply is None:
        return
    try:
        db.execute(
            "INSERT INTO replies (tenant, scope, request_id, rpc, digest, runtime_id, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (reply.tenant, reply.scope, reply.request_id, reply.rpc, reply.digest, reply.runtime_id, reply.at),
        )
    except sqlite3.IntegrityError:  # (the transaction rolls back: nothing created or deleted)
        raise RequestIdTaken(f"request id {reply.request_id!r} was answered already") from None
