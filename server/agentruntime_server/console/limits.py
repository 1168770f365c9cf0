"""What the console holds at most, and how often a client may fail to sign in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # Signed-in sessions. Past a group's cap its own oldest session goes, never another's; past
    # the console's, a sign-in is refused (503) rather than someone else signed out.
    sessions: int = 10_000
    sessions_per_credential: int = 500  # sessions of one token (a team sharing one, --token)
    sessions_per_client: int = 20  # of one token from one client address (one person's browsers)
    session_idle: float = 12 * 3600.0  # seconds a session lives without a request
    # Sign-in: after this many failures from a client address within the window, its attempts
    # are refused (429, Retry-After) until the oldest of them leaves the window.
    signin_failures: int = 10
    signin_window: float = 600.0
    # Live pages: a session's newest streams, and the console's in all.
    live_streams_per_session: int = 8
    live_streams: int = 1000
