"""Which runtimes a PostgreSQL store's process may write, and from which seq: with replicas,
the epoch of each runtime its leases claimed (store/postgres/leases.py), and the runtimes
fenced since (another replica holds them, or they were deleted); and, with or without, the
runtimes whose copies are ahead of the store (unwritten)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable
from typing import Protocol

from .connection import PostgresConnection


class Leasing(Protocol):
    """What the store needs of the leases attached to it (store/postgres/leases.py): the replica
    whose writes it keeps, whom to tell of the writes it refused (`gone`: their runtime's row
    was deleted), and the runtime it creates for this replica meanwhile."""

    @property
    def replica_id(self) -> str: ...

    def refused(self, keys: Iterable[str], gone: Collection[str] = ()) -> None: ...

    def creating(self, runtime_id: str) -> contextlib.AbstractContextManager[None]: ...


class Ownership(PostgresConnection):
    """What this process owns and may write (the second layer of PostgresStore)."""

    def __init__(self, url: str, *, schema: str | None = None, pool_size: int = 10) -> None:
        super().__init__(url, schema=schema, pool_size=pool_size)
        # Runtimes whose rows a failed commit carried (or whose append was refused), until
        # loaded, claimed or created again: their copies are ahead of the store.
        self.unwritten: set[str] = set()
        self._next_seq: dict[str, int] = {}  # per runtime: the seq its next entry must have
        # Replicas: the leases, and the epoch of every runtime this process owns.
        self.leasing: Leasing | None = None
        self.epochs: dict[str, int] = {}
        # The runtimes whose writes were refused since (until claimed, loaded or created
        # again), each with whether its row was gone (else another replica held it).
        self.fenced: dict[str, bool] = {}

    def claimed(self, runtime_id: str, epoch: int) -> None:
        """This process owns the runtime from this epoch on: its writes are no longer refused,
        and its next seq is read again (another replica may have written since)."""
        self.epochs[runtime_id] = epoch
        self.fenced.pop(runtime_id, None)
        self._next_seq.pop(runtime_id, None)
        self.unwritten.discard(runtime_id)

    def released(self, runtime_id: str | None = None) -> None:
        """This process no longer owns the runtime (None: any runtime, as it stops)."""
        if runtime_id is None:
            self.epochs.clear()
            self._next_seq.clear()
        else:
            self.epochs.pop(runtime_id, None)
            self._next_seq.pop(runtime_id, None)

    def lost(self, runtime_id: str, deleted: bool) -> None:
        """Another replica holds the runtime now, or (`deleted`) its row is gone: every later
        write of it is refused (Fenced)."""
        self.epochs.pop(runtime_id, None)
        self.fenced[runtime_id] = deleted
        self._next_seq.pop(runtime_id, None)
