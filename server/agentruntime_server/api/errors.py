"""Domain errors -> canonical gRPC status codes with google.rpc details."""

from __future__ import annotations

import datetime

from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ..domain import errors as e
from ..domain.tenancy.quotas import QuotaExceeded

DOMAIN = "agentruntime.dev"
# An error never carries more than this of a caller's input: it must fit in a reply's
# trailing metadata (a default client accepts 8 KiB, the details base64-encoded there)
# whatever the caller sent.
MAX_MESSAGE = 600
MAX_VIOLATIONS = 10
MAX_DETAIL = 200


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def to_status(error: e.DomainError) -> status_pb2.Status:
    details: list[object] = []
    if isinstance(error, e.InvalidArgument):
        code = code_pb2.OUT_OF_RANGE if isinstance(error, e.OutOfRange) else code_pb2.INVALID_ARGUMENT
        if error.reason:
            details.append(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN))
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=_cut(v.field, MAX_DETAIL), description=_cut(v.description, MAX_DETAIL)
                    )
                    for v in error.violations[:MAX_VIOLATIONS]
                ]
            )
        )
    elif isinstance(error, e.NotFound):
        code = code_pb2.NOT_FOUND
        details.append(error_details_pb2.ResourceInfo(resource_type=error.kind, resource_name=_cut(error.name, MAX_DETAIL)))
    elif isinstance(error, e.AlreadyExists):
        code = code_pb2.ALREADY_EXISTS
    elif isinstance(error, e.FailedPrecondition):
        code = code_pb2.FAILED_PRECONDITION
        details.append(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN))
    elif isinstance(error, e.Unavailable):
        # Refused without acting: why, and when to try again (a client retries on RetryInfo).
        code = code_pb2.UNAVAILABLE
        details.append(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN))
        delay = duration_pb2.Duration()
        delay.FromTimedelta(datetime.timedelta(seconds=error.retry_after))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    elif isinstance(error, e.Unauthenticated):
        code = code_pb2.UNAUTHENTICATED
    elif isinstance(error, e.PermissionDenied):
        code = code_pb2.PERMISSION_DENIED
    elif isinstance(error, QuotaExceeded):
        code = code_pb2.RESOURCE_EXHAUSTED
        details.append(
            error_details_pb2.QuotaFailure(
                violations=[error_details_pb2.QuotaFailure.Violation(subject=error.subject, description=str(error))]
            )
        )
        details.append(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata={"quota": error.quota}))
    elif isinstance(error, e.ResourceExhausted):
        code = code_pb2.RESOURCE_EXHAUSTED
        metadata = {"limit": error.limit.wire_name} if error.limit.value else {}
        details.append(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=metadata))
    else:
        code = code_pb2.FAILED_PRECONDITION
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)  # type: ignore[arg-type]
        packed.append(holder)
    message = str(error)
    if isinstance(error, e.InvalidArgument) and len(error.violations) > MAX_VIOLATIONS:
        message = "; ".join(f"{v.field}: {v.description}" for v in error.violations[:MAX_VIOLATIONS])
        message += f"; and {len(error.violations) - MAX_VIOLATIONS} more problems"
    return status_pb2.Status(code=code, message=_cut(message, MAX_MESSAGE), details=packed)


def code_name(error: e.DomainError) -> str:
    """The canonical code's name an error maps to (for the audit log)."""
    number = to_status(error).code
    return str(code_pb2.Code.Name(number))


def to_grpc_status(error: e.DomainError) -> object:
    return rpc_status.to_status(to_status(error))
