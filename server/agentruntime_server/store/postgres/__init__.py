"""The PostgreSQL store (`postgresql://...`; store.py says how it works), a module a layer:
the connections and the database's weather (connection.py, weather.py), what this process
owns (ownership.py), the group commit (commits.py, batch.py, statements.py), the journals
(journal.py), the runtimes' rows (runtimes.py), the tenants' replies and ledgers
(tenants.py); its schema's migrations (migrations.py), and the leases of replicas sharing
its database (leases.py). Importing it imports asyncpg: app.py does so only for a
PostgreSQL store."""

from .leases import PostgresLeases
from .store import PostgresStore

__all__ = ["PostgresLeases", "PostgresStore"]
