"""The PostgreSQL store (`postgresql://...`), its migrations, and the leases of replicas
sharing its database. Importing it imports asyncpg: app.py does so only for a PostgreSQL store."""

from .leases import PostgresLeases
from .store import PostgresStore

__all__ = ["PostgresLeases", "PostgresStore"]
