"""Store URLs as logs may show them."""

from __future__ import annotations

import urllib.parse


def redacted(url: str) -> str:
    """The URL without its password, in the user part or the query (for logs).

    The user part is cut at the URL's last '@', not where a URL parser ends the authority:
    a password with an unencoded '#', '/' or '?' makes the parser end it early, and the rest
    of the password would be shown as the path or the fragment."""
    scheme, separator, rest = url.partition("://")
    if separator and "@" in rest:
        userinfo, _, location = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        url = f"{scheme}://{user}{':***' if colon else ''}@{location}"
    try:
        parts = urllib.parse.urlsplit(url)
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return f"{scheme}://***"
    secret = [name.lower() in ("password", "passfile") for name, _ in pairs]
    if not any(secret):
        return url
    query = "&".join(
        f"{urllib.parse.quote(name)}={'***' if hidden else urllib.parse.quote(value)}"
        for (name, value), hidden in zip(pairs, secret, strict=True)
    )
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{url.partition('?')[0]}?{query}{fragment}"  # not urlunsplit: it drops an empty host's '//'
