"""A store URL as the logs show it: no piece of a password, however the URL is written."""

from __future__ import annotations

import pytest
from agentruntime_server.store.urls import redacted

SECRET = "s3cr3t"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://agent:{SECRET}@db:5432/runs", "postgresql://agent:***@db:5432/runs"),
        # unencoded characters that end a parser's authority early: the password's tail
        # would be read as the path, the query or the fragment
        (f"postgresql://agent:{SECRET[:3]}#{SECRET[3:]}@db/runs", "postgresql://agent:***@db/runs"),
        (f"postgresql://agent:{SECRET[:3]}/{SECRET[3:]}@db/runs", "postgresql://agent:***@db/runs"),
        (f"postgresql://agent:{SECRET[:3]}?{SECRET[3:]}@db/runs", "postgresql://agent:***@db/runs"),
        (f"postgresql://agent:{SECRET[:3]}@{SECRET[3:]}@db/runs", "postgresql://agent:***@db/runs"),
        (f"postgresql:///runs?host=/run/pg&password={SECRET}", "postgresql:///runs?host=/run/pg&password=***"),
        ("postgresql://agent@db/runs", "postgresql://agent@db/runs"),
        ("postgresql://db/runs?application_name=a", "postgresql://db/runs?application_name=a"),
        ("sqlite:///var/lib/agentruntime.db", "sqlite:///var/lib/agentruntime.db"),
    ],
)
def test_a_store_url_is_shown_without_any_piece_of_its_password(url: str, shown: str) -> None:
    assert redacted(url) == shown
    assert not any(piece in redacted(url) for piece in (SECRET, SECRET[:3], SECRET[3:]))
