"""Store URLs as logs may show them."""

from __future__ import annotations

import urllib.parse


def redacted(url: str) -> str:
    """The URL without its password, in the user part or the query (for logs)."""
    try:
        parts = urllib.parse.urlsplit(url)
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return f"{url.partition(':')[0]}://***"
    secret = [name.lower() in ("password", "passfile") for name, _ in pairs]
    if parts.password is None and not any(secret):
        return url
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{urllib.parse.quote(name)}={'***' if hidden else urllib.parse.quote(value)}"
        for (name, value), hidden in zip(pairs, secret, strict=True)
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
