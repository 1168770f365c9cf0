"""What a store told its callbacks (ports.Store.on_health, on_unwritten), in order: the
store tests of the store going away and coming back (PostgreSQL, SQLite's full disk)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentruntime_server.domain.ports import Store


@dataclass
class Heard:
    health: list[bool] = field(default_factory=list)  # each on_health call
    told: list[str] = field(default_factory=list)  # the runtimes each on_unwritten call named


def listen(store: Store) -> Heard:
    heard = Heard()
    store.on_health(heard.health.append)
    store.on_unwritten(heard.told.extend)
    return heard
