"""What every RPC goes through at the edge, around its own work: decoding a request that may
not be a message of its type, the caller's identity for the call (a context variable), one
audit line per mutating call, and the mapping of a refusal to its canonical status."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message as ProtoMessage

from ..domain.definitions.validation import RUNTIME_ID
from ..domain.errors import DomainError, FieldViolation, InvalidArgument, Unavailable
from ..domain.limits import MAX_ID_CHARS
from ..domain.runtime.service import RuntimeService, runtime_key
from ..observability.logs import escaped
from .errors import code_name, to_grpc_status
from .forward import Relayed, forwarded_by
from .principals import DEFAULT, READ_METHODS, Principal

log = logging.getLogger("agentruntime_server.api.servicer")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Req, Context], Awaitable[Resp]]


class Served(Protocol):
    """What `edge` needs of the servicer it wraps the methods of."""

    service: RuntimeService
    forwarder: object | None
    kill_after_commit: frozenset[str]  # testing only: AGENTRUNTIME_TEST_KILL_AFTER_COMMIT

    async def authenticate(self, context: Context, method: str) -> Principal: ...

    async def serve(self, method: Handler[Req, Resp], request: Req, context: Context) -> Resp: ...


@dataclass(frozen=True)
class Undecodable:
    """What a request that is not a valid message of its type decodes to: the edge refuses it."""

    type_name: str


def decoder(message_type: type[ProtoMessage]) -> Callable[[bytes], ProtoMessage | Undecodable]:
    def decode(data: bytes) -> ProtoMessage | Undecodable:
        try:
            return message_type.FromString(data)
        except Exception:  # DecodeError, invalid UTF-8, nesting past protobuf's limit: the caller's bytes
            return Undecodable(message_type.DESCRIPTOR.full_name)

    return decode


def refuse_undecodable(request: object) -> None:
    if isinstance(request, Undecodable):
        raise InvalidArgument(
            [FieldViolation("request", f"is not a valid {request.type_name} message (malformed protobuf or invalid UTF-8)")]
        )


def decoded(request: Req | Undecodable) -> Req:
    refuse_undecodable(request)
    assert not isinstance(request, Undecodable)
    return request


# The caller of the RPC being served (set by edge, in the RPC's own task).
current_caller: contextvars.ContextVar[Principal] = contextvars.ContextVar("caller", default=DEFAULT)
UNKNOWN = Principal(tenant="-", name="-", scopes=frozenset())  # not authenticated (yet)
audit = logging.getLogger("agentruntime.audit")
# Replicas: a call one replica forwards to the owner is audited on both; the forwarder's line
# says where it went (forwarded_to=the owner's address), the owner's which replica sent it
# (forwarded_from=its replica id), so the two lines are told apart and paired.
route: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("route", default=None)


def metadata_of(context: Context) -> list[tuple[str, str | bytes]]:
    return [(str(key), value) for key, value in context.invocation_metadata() or ()]


def tenant() -> str:
    return current_caller.get().tenant


def plain(value: str) -> str:
    """A caller's value as one audit field: anything but id characters escaped (each escape
    reads back as one code point), so no value can forge a field or a line of its own."""
    return "".join(char if (char.isalnum() and char.isprintable()) or char in "_.:/-" else escaped(char) for char in value)


def audit_call(method: str, request: Any, code: str, response: Any = None) -> None:
    """One line per mutating RPC: who (tenant, token name; never the token), what, the outcome
    (a runtime the server named, CreateRuntime's without an id, by the name it was given)."""
    if method in READ_METHODS:
        return
    caller = current_caller.get()
    runtime_id = str(getattr(request, "runtime_id", "") or getattr(response, "runtime_id", ""))[:128]
    handle_id = str(getattr(request, "handle_id", "") or getattr(request, "parent_id", ""))[:256]
    hop = route.get()
    audit.info(
        "audit tenant=%s caller=%s rpc=%s runtime=%s handle=%s code=%s%s",
        caller.tenant,
        plain(caller.name) or "-",
        method,
        plain(runtime_id) or "-",
        plain(handle_id) or "-",
        code,
        f" {hop[0]}={plain(hop[1])}" if hop else "",
        extra={
            "tenant": caller.tenant,
            "caller": caller.name,
            "rpc": method,
            "runtime_id": runtime_id,
            "handle_id": handle_id,
            "code": code,
            **({hop[0]: hop[1]} if hop else {}),
        },
    )


def edge(method: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Authenticates, then maps a refused request to its canonical status; nothing else
    escapes as INTERNAL quietly."""

    @functools.wraps(method)
    async def wrapper(self: Served, request: Req, context: Context) -> Resp:
        name = method.__name__
        current_caller.set(UNKNOWN)  # an audit line of a refused stranger names no tenant
        sender = forwarded_by(metadata_of(context)) if self.forwarder is not None else None
        route.set(("forwarded_from", sender) if sender is not None else None)
        try:
            current_caller.set(await self.authenticate(context, name))
            refuse_undecodable(request)
            try:
                response: Resp = await self.serve(method, request, context)
            except DomainError:
                # A refusal may tell of another call's write (a handle closed, running): like
                # any answer, it leaves only once what was written so far is durable.
                await self.service.acknowledge()
                raise
            await self.service.acknowledge(written(name, request))
            if name in self.kill_after_commit and not route.get():
                # A fault a test arms: the call's effect is committed and its answer never leaves.
                os.kill(os.getpid(), signal.SIGKILL)
            audit_call(name, request, "OK", response)
            return response
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is None or current.cancelling():
                raise  # this call was cancelled: its deadline passed, its client left, or the server stops
            # Something it awaited ended cancelled, not the call: grpc would drop a call that
            # raises this, and leave its client hanging until its deadline. It is answered.
            if self.service.draining:
                refusal = Unavailable("the server is shutting down; retry against its replacement")
                await context.abort_with_status(to_grpc_status(refusal))  # type: ignore[arg-type]
            log.error("%s: something it awaited was cancelled", name, exc_info=True)
            await context.abort(grpc.StatusCode.INTERNAL, f"{name} failed inside the server; see the server log")
            raise
        except Relayed as relayed:  # the owner replica's answer to a forwarded call
            audit_call(name, request, relayed.code.name)
            await context.abort(relayed.code, relayed.details, relayed.trailing)
            raise  # unreachable: abort raises
        except DomainError as error:
            status = to_grpc_status(error)
            refused_caller = getattr(error, "principal", None)
            if isinstance(refused_caller, Principal):
                current_caller.set(refused_caller)
            audit_call(name, request, code_name(error))
            await context.abort_with_status(status)  # type: ignore[arg-type]
            raise  # unreachable: abort raises
        except Exception:
            # Our bug, not the caller's: log it whole, answer INTERNAL without internals.
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed inside the server; see the server log")
            raise

    return wrapper


def written(method: str, request: Any) -> str | None:
    """The store key of the runtime a mutating call wrote to (its writes must have been
    accepted before the reply leaves), if any."""
    runtime_id = getattr(request, "runtime_id", "")
    if method in READ_METHODS or not runtime_id or not RUNTIME_ID.fullmatch(runtime_id):
        return None
    return runtime_key(tenant(), runtime_id)


def moving_between_replicas(runtime_id: str) -> Unavailable:
    return Unavailable(f"runtime {runtime_id[:64]!r} is moving between replicas; retry the call", "RUNTIME_MOVING")


def require(**fields: str) -> None:
    missing = [FieldViolation(name, "is required") for name, value in fields.items() if not value]
    too_long = [
        FieldViolation(name, f"is longer than {MAX_ID_CHARS} characters: no such id exists")
        for name, value in fields.items()
        if len(value) > MAX_ID_CHARS
    ]
    if missing or too_long:
        raise InvalidArgument(missing + too_long)
