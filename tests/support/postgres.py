"""The PostgreSQL server of the test session (conftest's `postgres` fixture): its URL, once started."""

from __future__ import annotations

POSTGRES: dict[str, str] = {}
