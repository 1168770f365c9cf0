"""The PostgreSQL database going away (stopped, restarting, failed over, cut off): what asyncpg
raises then, how often the store probes for it to be back, and `guarded`, which turns those
errors into errors.StoreUnavailable (docs/durability.md#store-unavailable)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import asyncpg  # type: ignore[import-untyped]

PROBE_EVERY = 0.5  # seconds between attempts to reach a database that went away
PROBE_TIMEOUT = 5.0  # seconds a probe may take to connect and answer
# What a database that went away (stopped, restarting, unreachable, its connection cut) makes
# asyncpg raise: weather, not a fault of the store's. InterfaceError: a connection the pool
# closed under its user (it does that when the server ends the connection).
WEATHER: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, cannot connect now (starting, stopping)
    asyncpg.InterfaceError,
    # A connection the server ended while it was idle (a fast shutdown tells every session so)
    # is left in a state its next statement trips on: "another operation is in progress".
    asyncpg.exceptions.InternalClientError,
)


_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Guarding(Protocol):
    def guard(self) -> contextlib.AbstractContextManager[None]: ...


_Method = Callable[Concatenate[Any, _P], Coroutine[Any, Any, _T]]


def guarded(method: _Method[_P, _T]) -> _Method[_P, _T]:
    """The method's statements run under `guard()`: a database that went away raises
    StoreUnavailable, never asyncpg's error (which callers would get as INTERNAL)."""

    @functools.wraps(method)
    async def run(self: _Guarding, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with self.guard():
            return await method(self, *args, **kwargs)

    return run
