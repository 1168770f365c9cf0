"""Errors the domain raises for a caller's mistake. The api layer maps each to a gRPC code."""

from __future__ import annotations

from dataclasses import dataclass

from .vocabulary import Limit


def shown(value: str, limit: int = 64) -> str:
    """A caller's value as an error message quotes it: never more than a short prefix, so
    an error always fits in a reply's metadata and never echoes a whole hostile input."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


class DomainError(Exception):
    """Base: a request the runtime refuses, with a message a caller can act on."""


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class InvalidArgument(DomainError):
    """`reason`: one a caller branches on (ErrorInfo), beside the field violations, if any."""

    def __init__(self, violations: list[FieldViolation], reason: str = "") -> None:
        self.violations = violations
        self.reason = reason
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))


class RequestIdReused(InvalidArgument):
    """A request id already answered a call that said something else (issue #29)."""

    def __init__(self, request_id: str, rpc: str) -> None:
        super().__init__(
            [
                FieldViolation(
                    "request_id",
                    f"{shown(request_id)} was already sent with another {rpc} request (or with another call);"
                    " send a new id for a new request",
                )
            ],
            reason="REQUEST_ID_REUSED",
        )


class OutOfRange(InvalidArgument):
    """A position past what exists now (a fork's seq past the source's last event): it may
    exist later, unlike an invalid argument."""


class NotFound(DomainError):
    def __init__(self, kind: str, name: str, hint: str = "") -> None:
        self.kind = kind
        self.name = name[:128]
        message = f"{kind} {shown(name)} not found"
        super().__init__(f"{message}; {hint}" if hint else message)


class AlreadyExists(DomainError):
    pass


class RuntimeExists(AlreadyExists):
    def __init__(self, runtime_id: str) -> None:
        super().__init__(f"runtime {runtime_id!r} already exists; choose another id or leave it empty")


class RequestIdTaken(AlreadyExists):
    """The store holds an answer for this request id already (another process recorded it
    first): the call reads that answer instead."""


class FailedPrecondition(DomainError):
    def __init__(self, message: str, reason: str = "FAILED_PRECONDITION") -> None:
        self.reason = reason
        super().__init__(message)


class ResourceExhausted(DomainError):
    """A budget or a bounded resource (an inbox) is used up."""

    def __init__(self, message: str, reason: str, limit: Limit = Limit.NONE) -> None:
        self.reason = reason
        self.limit = limit
        super().__init__(message)


class Unauthenticated(DomainError):
    """No credentials, or credentials that are wrong, revoked or expired. `reason`, one of a
    fixed few words (what the failed-authentication metric and log line say): `missing`,
    `malformed`, `invalid`, `revoked`, `expired`, `tenant_changed`."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        self.reason = reason
        super().__init__(message)


class PermissionDenied(DomainError):
    """Credentials that do not allow this call."""


class Unavailable(DomainError):
    """The server did not act on this call and cannot now; the caller should retry, after
    `retry_after` seconds (RetryInfo). `reason` says why (ErrorInfo): the server is draining,
    the runtime is moving between replicas, the store cannot be written."""

    reason = "SERVER_DRAINING"
    retry_after = 1.0

    def __init__(self, message: str, reason: str | None = None, retry_after: float | None = None) -> None:
        if reason is not None:
            self.reason = reason
        if retry_after is not None:
            self.retry_after = retry_after
        super().__init__(message)


class Detached(Exception):
    """Raised inside a run when the process is shutting down: the run stops at a journal
    point without settling, and continues from the store at the next start."""


class OwnedElsewhere(DomainError):
    """Another replica executes this runtime now (it holds its lease): commands and waits
    go to it. `address`: where it serves (the edge forwards the call there)."""

    def __init__(self, runtime_id: str, address: str) -> None:
        self.address = address
        super().__init__(f"runtime {shown(runtime_id)} is run by another replica right now; retry")


class Fenced(Detached, Unavailable):
    """The store takes no more writes of a runtime from this process: another replica took
    the runtime over (this one was paused or cut off past its lease), or the runtime was
    deleted under it (DeleteRuntime or retention, elsewhere or while it was cut off). Its
    copy stops at once and the caller retries: where the runtime runs now, or to be told
    it is gone (NOT_FOUND).

    `gone`: what the store found in the runtime's place, so that the message says what
    happened: its row deleted (True), held by another replica (False), or not known (None)."""

    reason = "RUNTIME_MOVING"
    retry_after = 0.2

    def __init__(self, runtime_id: str, gone: bool | None = None) -> None:
        self.gone = gone
        name = shown(runtime_id)
        if gone:
            message = (
                f"runtime {name} was deleted (DeleteRuntime, or retention: AGENTRUNTIME_RETENTION)"
                " before this call's change was written; the change was not kept"
            )
        elif gone is False:
            message = f"runtime {name} moved to another replica; retry the call"
        else:
            message = (
                f"runtime {name} changed under this call (another replica took it over, it was deleted,"
                " or a write of it failed); retry the call"
            )
        super().__init__(message)


class NotJournaled(Detached, Unavailable):
    """The store did not take a write of this runtime (its row gone, an I/O error): the copy
    in memory, ahead of its journal now, stops at once and is read again from the store at
    the next call; the caller retries."""

    reason = "STORE_UNAVAILABLE"

    def __init__(self, runtime_id: str) -> None:
        super().__init__(f"runtime {shown(runtime_id)} could not be written: the change was not kept; retry the call")


class StoreUnavailable(Detached, Unavailable):
    """The store cannot be reached right now (its database stopped, restarts, or the network
    to it is cut): the server reconnects by itself, and its health says NOT_SERVING until it
    has. A runtime whose write was not taken stops in memory and goes on from its journal
    once the store is back; the caller retries (with the same request id: a change the
    database took just before the connection broke is then answered, not made twice). The
    cause is in the server log only."""

    reason = "STORE_UNAVAILABLE"
    retry_after = 1.0

    def __init__(self) -> None:
        super().__init__(
            "this server cannot reach its store right now (it reconnects by itself; see the server log);"
            " this call's change may not have been kept: retry the call"
        )


class StoreCannotWrite(StoreUnavailable):
    """The SQLite store cannot write (its disk is full, or it fails I/O for a while): the
    write was rolled back whole, the server probes by itself and takes writes again once one
    goes through, and its health says NOT_SERVING until then. Reads go on meanwhile. The
    cause is in the server log only."""

    reason = "STORE_FULL"
    retry_after = 5.0

    def __init__(self, full: bool = True) -> None:
        Unavailable.__init__(
            self,
            (
                "this server's store has no room left on its disk"
                if full
                else "this server's store cannot write right now (an I/O error)"
            )
            + " (it goes on by itself once it can write; see the server log); this call's change was not kept: retry the call",
            None if full else "STORE_UNAVAILABLE",
        )


class StoreBroken(Unavailable):
    """A commit of this process's SQLite store failed in a way no retry mends (a constraint
    its own write broke, a damaged file): it acknowledges nothing more until the server is
    restarted. (A full disk, or I/O that fails for a while, is StoreCannotWrite, and PostgreSQL
    going away StoreUnavailable: those mend by themselves.) The server's fault, not the
    caller's: another replica (or this one, restarted) takes the call. The cause is in the
    server log only: it may quote SQL or the database's address."""

    reason = "STORE_BROKEN"
    retry_after = 5.0

    def __init__(self) -> None:
        super().__init__(
            "this server can no longer write to its store (a write failed; see the server log)"
            " and must be restarted; retry the call at another replica, or once this one is back"
        )
