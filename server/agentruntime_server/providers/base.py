"""What every HTTP model provider shares: the shared keep-alive client, a per-attempt
timeout, retries (tenacity: exponential backoff with full jitter, honouring Retry-After)
on provider faults only, one global gate on calls in flight, and errors that name the
provider and its HTTP status and never carry the key."""

from __future__ import annotations

import abc
import datetime
import email.utils
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from tenacity import RetryCallState, retry_if_exception_type, stop_after_attempt, wait_random_exponential
from tenacity.asyncio import AsyncRetrying

from ..domain.fifo_gate import FifoGate
from ..domain.ports import ModelReply, ModelRequest, ProviderError, ReplyBound, ReplyStream
from ..domain.vocabulary import AgentSpec, Failure, FailureReason
from ..http import HttpClient, HttpError, Response, encode_headers
from .streaming import StreamedReply

log = logging.getLogger("agentruntime.providers")
MAX_ERROR_BODY = 500
STREAM_FRAMING = 16  # a streamed body may be this many times max_reply_bytes
# The failures a later attempt may cure (retried here first, then `retryable` to the host; a 429
# that waiting cannot cure is not: insufficient_quota). docs/budgets.md advises by this.
RETRYABLE_REASONS = frozenset({FailureReason.PROVIDER_RATE_LIMITED, FailureReason.PROVIDER_UNAVAILABLE})
# An exchange's status, its body (empty when streamed) and, when streamed, what read it.
Posted = tuple[int, bytes, "StreamedReply | None"]
# How the APIs say a request does not fit the model's context window (Anthropic:
# "prompt is too long", "input length and `max_tokens` exceed context limit").
CONTEXT_PHRASES = ("prompt is too long", "context length", "exceed context limit")


@dataclass(frozen=True)
class CallPolicy:
    """Shared by every HTTP provider of one server."""

    # Held around the HTTP exchange only, never across a backoff. A FIFO gate, not asyncio's
    # Semaphore: on Python 3.11 every acquire of that one walks its waiters (2.7 % of the
    # server's CPU under the bench workload, 80 model calls at a gate of 64).
    gate: FifoGate
    max_reply_bytes: int = 1 << 20  # a larger reply body is not read: a provider fault
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0


class CallMonitor(Protocol):
    """Told about every attempt of a model call and every retry (metrics, traces). Its
    arguments are a provider name, seconds and a fixed vocabulary: never a key or a prompt.
    It is called on the event loop and must be quick and must not raise."""

    def on_attempt(self, provider: str, seconds: float, outcome: str) -> None:
        """One HTTP exchange ended: ok, rate_limited, server_error, timeout, unreachable, rejected, cancelled."""

    def on_retry(self, provider: str, reason: str) -> None:
        """A failed attempt is about to be retried; `reason` is its outcome."""


class ProviderFault(Exception):
    """A failure worth retrying: 429, 5xx, a timeout, a lost connection."""

    def __init__(self, message: str, failure: Failure, retry_after: float | None = None, reason: str = "server_error") -> None:
        super().__init__(message)
        self.message = message
        self.failure = failure
        self.retry_after = retry_after
        self.reason = reason  # a CallMonitor outcome


class HttpProvider(abc.ABC):
    """One named provider. Subclasses say what to send and how to read the reply."""

    kind = "reply"  # what a valid reply is called in error messages
    monitor: CallMonitor | None = None  # set by the app when metrics or tracing are on

    def __init__(
        self,
        name: str,
        http: HttpClient,
        *,
        url: str,
        headers: Mapping[str, str],
        api_key: str,
        default_model: str,
        timeout: float,
        policy: CallPolicy,
    ) -> None:
        self.name = name
        self._http = http
        self._url = url
        # Encoded once: a provider's headers never change (a key with a line break, which no
        # header can carry, is refused with the settings).
        self._headers = encode_headers({"Content-Type": "application/json", **headers})
        self._api_key = api_key
        self._default_model = default_model
        self._timeout = timeout
        self._policy = policy
        self._backoff = wait_random_exponential(multiplier=policy.backoff_base, max=policy.backoff_max)

    @abc.abstractmethod
    def body(self, request: ModelRequest, model: str) -> dict[str, Any]: ...

    @abc.abstractmethod
    def parse(self, payload: Any, model: str) -> ModelReply:
        """`model`: the model the request named (the reply names it, for the price table)."""

    def ask_to_stream(self, body: dict[str, Any]) -> None:
        """The request `body` asks for the reply as a stream."""
        body["stream"] = True

    @abc.abstractmethod
    def stream_reader(self, stream: ReplyStream) -> StreamedReply:
        """What reads one attempt's streamed reply, handing its pieces to `stream`."""

    def output_cap(self, agent: AgentSpec) -> int | None:
        """The output cap sent with each call of the agent (None: none is sent)."""
        return agent.max_output_tokens

    def reply_bound(self, agent: AgentSpec) -> ReplyBound:
        return ReplyBound(agent.model or self._default_model, self.output_cap(agent))

    async def complete(self, request: ModelRequest) -> ModelReply:
        model = request.agent.model or self._default_model
        body = self.body(request, model)
        if request.stream is not None:
            self.ask_to_stream(body)
        status, raw, read = await self._post(_encode(body), request.stream)
        try:
            return self.parse(_json(raw) if read is None else read.payload(), model)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            raise ProviderError(
                self._redact(
                    f"provider {self.name!r} answered HTTP {status} with a reply that is not a {self.kind} "
                    f"({type(exc).__name__}: {exc}): {self._excerpt(raw)}"
                ),
                self._failure(FailureReason.PROVIDER_BAD_REPLY, status, f"not a {self.kind}"),
            ) from exc

    def _failure(self, reason: FailureReason, status: int = 0, detail: str = "") -> Failure:
        retryable = reason in RETRYABLE_REASONS
        return Failure(reason, provider=self.name, http_status=status, retryable=retryable, detail=self._detail(detail))

    def _detail(self, text: str) -> str:
        """A provider's words, as a Failure carries them: short, key-free, valid UTF-8."""
        return self._redact(text)[:200].encode("utf-8", "replace").decode()

    def classify(self, status: int, raw: bytes) -> Failure:
        """An error answer in the failure vocabulary, from the status and the documented
        error object both APIs send: OpenAI `{"error": {"type", "code", "message"}}`,
        Anthropic `{"type": "error", "error": {"type", "message"}}`."""
        try:
            error = json.loads(raw).get("error") or {}
        except (ValueError, AttributeError, RecursionError):
            error = {}
        if not isinstance(error, dict):
            error = {}
        kind, code = str(error.get("type") or ""), str(error.get("code") or "")
        message = str(error.get("message") or "")
        detail = ": ".join(part for part in (code or kind, message) if part) or f"HTTP {status}"
        lowered = message.lower()
        if "context_length_exceeded" in (kind, code) or any(phrase in lowered for phrase in CONTEXT_PHRASES):
            return self._failure(FailureReason.CONTEXT_LENGTH_EXCEEDED, status, detail)
        if status in (401, 403) or kind in ("authentication_error", "permission_error") or code == "invalid_api_key":
            return self._failure(FailureReason.PROVIDER_AUTH, status, detail)
        if code == "insufficient_quota":  # a 429 that waiting cannot cure
            return Failure(FailureReason.PROVIDER_RATE_LIMITED, self.name, status, False, self._detail(detail))
        if status == 429 or kind == "rate_limit_error":
            return self._failure(FailureReason.PROVIDER_RATE_LIMITED, status, detail)
        if status >= 500 or kind in ("api_error", "overloaded_error", "server_error"):
            return self._failure(FailureReason.PROVIDER_UNAVAILABLE, status, detail)
        return self._failure(FailureReason.PROVIDER_BAD_REQUEST, status, detail)

    async def _post(self, data: bytes, stream: ReplyStream | None = None) -> Posted:
        """The reply's status and body, or (with `stream`: a streamed reply) the reader that
        read it. A fault is retried; what an attempt streamed is reset before the next."""
        # The first attempt runs bare: tenacity costs ~25 us a call, paid only after a fault.
        try:
            return await self._attempt(data, stream)
        except ProviderFault as fault:
            first: list[ProviderFault] = [fault]

        async def attempt() -> Posted:
            if first:
                raise first.pop()  # tenacity's attempt 1 is the one already made
            if stream is not None and stream.streamed:
                stream.restart("retry")
            return await self._attempt(data, stream)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._policy.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(ProviderFault),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            result: Posted = await retrying(attempt)
        except ProviderFault as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            raise ProviderError(
                f"{exc.message} (gave up after {attempts} attempt{'s' if attempts != 1 else ''})", exc.failure
            ) from exc
        return result

    async def _attempt(self, data: bytes, stream: ReplyStream | None) -> Posted:
        gate = self._policy.gate
        await gate.acquire()
        started = time.perf_counter()  # the exchange only: a wait for the gate is not the provider's
        outcome = "cancelled"
        limit = self._policy.max_reply_bytes
        read = None
        if stream is not None:
            read = self.stream_reader(stream)
            read.max_chars = limit
        try:
            # No redirect is followed (the client follows none): a key header (Anthropic's
            # x-api-key) would go along to whatever host the Location names.
            response = await self._post_once(data, limit, read)
            status, raw, headers = response.status, response.body, response.headers
            outcome = _outcome(status)
        except TimeoutError as exc:
            outcome = "timeout"
            raise ProviderFault(
                f"provider {self.name!r} did not answer within {self._timeout:g}s",
                self._failure(FailureReason.PROVIDER_UNAVAILABLE, 0, "timed out"),
                reason=outcome,
            ) from exc
        except ValueError:
            # The client will not send it (a base URL or a header it cannot put on the wire):
            # its words may quote a header's value, a key, so only the kind is told.
            outcome = "rejected"
            raise ProviderError(
                f"provider {self.name!r}: the request could not be built; check its base URL and key",
                self._failure(FailureReason.PROVIDER_BAD_REQUEST, 0, "the request could not be built"),
            ) from None
        except HttpError as exc:
            outcome = "unreachable"
            raise ProviderFault(
                self._redact(f"provider {self.name!r} unreachable: {type(exc).__name__}: {exc}"),
                self._failure(FailureReason.PROVIDER_UNAVAILABLE, 0, f"unreachable: {type(exc).__name__}"),
                reason=outcome,
            ) from exc
        finally:
            gate.release()
            if self.monitor is not None:
                self.monitor.on_attempt(self.name, time.perf_counter() - started, outcome)
        if response.truncated:
            if read is not None and 200 <= status < 300:
                limit *= STREAM_FRAMING
            raise ProviderError(
                f"provider {self.name!r} answered HTTP {status} with a body over {limit} bytes; not read",
                self._failure(FailureReason.PROVIDER_BAD_REPLY, status, f"a body over {limit} bytes"),
            )
        if 200 <= status < 300:
            if read is not None:
                read.close(flush=True)
                self._check_stream(read, status)
            return status, raw, read
        if 300 <= status < 400:
            raise ProviderError(
                f"provider {self.name!r} answered HTTP {status}, a redirect, which is not followed: check its base URL",
                self._failure(FailureReason.PROVIDER_BAD_REQUEST, status, "a redirect"),
            )
        message = f"provider {self.name!r} answered HTTP {status}: {self._excerpt(raw)}"
        failure = self.classify(status, raw)
        if failure.retryable:
            raise ProviderFault(message, failure, retry_after=retry_after(headers), reason=outcome)
        raise ProviderError(message, failure)  # our request's fault (or a quota): retrying cannot help

    async def _post_once(self, data: bytes, limit: int, read: StreamedReply | None) -> Response:
        if read is None:
            return await self._http.post(self._url, data, self._headers, timeout=self._timeout, max_body=limit)

        def streamed_limit(status: int) -> int:
            # An event of a token or two costs 100-200 bytes of framing: a stream's bytes may be
            # many times its reply's (whose text is held to `limit` by the reader).
            return limit * STREAM_FRAMING if 200 <= status < 300 else limit

        try:
            return await self._http.post(
                self._url, data, self._headers, timeout=self._timeout, max_body=streamed_limit, sink=read.feed
            )
        except BaseException:
            read.close(flush=False)  # a failed attempt: what it held is void
            raise

    def _check_stream(self, read: StreamedReply, status: int) -> None:
        """A streamed reply that ended in an error event, or before its end, is a failure as a
        whole reply's error would be (retried when the error is a fault); one that could not
        be read is a bad reply."""
        if read.error is not None:
            error = read.error if isinstance(read.error, dict) else {"message": str(read.error)}
            raw = _encode({"type": "error", "error": error})
            failure = self.classify(status, raw)
            message = f"provider {self.name!r} sent an error event mid-stream: {self._excerpt(raw)}"
            if failure.retryable:
                raise ProviderFault(message, failure, reason="server_error")
            raise ProviderError(message, failure)
        if read.problem is not None:
            raise ProviderError(
                self._redact(
                    f"provider {self.name!r} answered HTTP {status} with a stream that is not one of {self.kind} events "
                    f"({type(read.problem).__name__}: {read.problem})"
                ),
                self._failure(FailureReason.PROVIDER_BAD_REPLY, status, f"not a stream of {self.kind} events"),
            )
        if not read.complete:
            raise ProviderFault(
                f"provider {self.name!r} ended its stream before the reply was complete",
                self._failure(FailureReason.PROVIDER_UNAVAILABLE, status, "the stream ended early"),
                reason="unreachable",
            )

    def _wait(self, state: RetryCallState) -> float:
        fault = state.outcome.exception() if state.outcome is not None else None
        if isinstance(fault, ProviderFault) and fault.retry_after is not None:
            return min(fault.retry_after, self._policy.backoff_max)
        return float(self._backoff(state))

    def _log_retry(self, state: RetryCallState) -> None:
        fault = state.outcome.exception() if state.outcome is not None else None
        if self.monitor is not None:
            self.monitor.on_retry(self.name, fault.reason if isinstance(fault, ProviderFault) else "fault")
        log.warning(
            "model call failed (%s); attempt %d of %d, retrying in %.2fs",
            fault,
            state.attempt_number,
            self._policy.max_retries + 1,
            state.upcoming_sleep,
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text

    def _excerpt(self, raw: bytes) -> str:
        """The start of a body, key-free: redacted before it is cut (a key across the cut
        would otherwise leave its first characters in)."""
        window = raw[: MAX_ERROR_BODY + len(self._api_key.encode()) + 4]
        text = self._redact(window.decode("utf-8", "replace"))[:MAX_ERROR_BODY].strip()
        return text or "(empty body)"


def reply_string(value: Any, what: str) -> str:
    """A field of a reply that must be text; anything else makes the reply a bad one."""
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    return value


def reply_count(value: Any, what: str) -> int:
    """A token count of a reply's usage: a whole number (JSON's 12, or 12.0); null or absent is
    0. Anything else (a string, a boolean, 1.9) makes the reply a bad one: never read as a number."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"{what} is not a whole number")


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date."""
    millis = _seconds(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")  # the client's header names are lower-case
    if not value:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:  # "-0000": UTC, with no zone said
            when = when.replace(tzinfo=datetime.UTC)
        return max(when.timestamp() - time.time(), 0.0)
    except (TypeError, ValueError, OverflowError):
        return None


def _seconds(value: str | None) -> float | None:
    """A header's number of seconds (or milliseconds), if it is one: finite, not below 0. A NaN
    would make the backoff sleep for ever."""
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return max(number, 0.0) if math.isfinite(number) else None


# msgspec encodes a request body (the whole transcript, every turn) several times faster
# than json.dumps, and reads a reply five times faster than json.loads (0.7 against 3.7 µs);
# a reply msgspec refuses is read again with json, which tolerates what providers send (a
# lone surrogate escape, NaN) so that the runtime can judge it.
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _json(raw: bytes) -> Any:
    try:
        return _decode(raw)
    except msgspec.MsgspecError:
        return json.loads(raw)


def _outcome(status: int) -> str:
    if 200 <= status < 300:
        return "ok"
    if status == 429:
        return "rate_limited"
    return "server_error" if status >= 500 else "rejected"
