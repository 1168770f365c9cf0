"""The SQLite store (`sqlite:///path`, the default; store.py says how it works), a module a
layer: the file and its disk (disk.py), the connection and its health (connection.py), the
group commit (commits.py), the journals (journal.py), the runtimes' rows (runtimes.py), the
tenants' replies and ledgers (tenants.py); its schema's migrations (migrations.py) and the
import of a store release 0.1.0 wrote (legacy.py, migration 3's)."""

from .disk import disk_full
from .store import SqliteStore

__all__ = ["SqliteStore", "disk_full"]
