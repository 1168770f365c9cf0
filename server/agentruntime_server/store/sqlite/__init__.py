"""The SQLite store (`sqlite:///path`, the default), its migrations and the import of a store
release 0.1.0 wrote."""

from .store import SqliteStore, disk_full

__all__ = ["SqliteStore", "disk_full"]
