"""HTTP tools: POST the arguments JSON with an Idempotency-Key; a 2xx body is the output.

The calls go through a keep-alive client of their own (not the model providers'),
under the egress policy (`tools.egress`): a host name's refused addresses are dropped by
the client's resolver, an IP-literal host (in any form) is checked here, and a call that may
reach no allowed address fails before any connection is attempted. An endpoint that cannot be
reached and one that does not speak HTTP give one error result (the cause is logged), so that
a tool is no port scanner. But an attempt cut off once its request was written (the connection
lost, or no reply by the deadline) may have taken effect at the tool: it raises CallInDoubt,
and the turn loop applies the tool's `on_interrupted` policy; one that reached nothing raises
CallNotSent (its text is the error result, unless the call is in doubt already). Redirects are
not followed (a 3xx is an error result), a 2xx body over `max_text_bytes` is an error result
(at most that many bytes plus one are read), and an error body is cut to MAX_ERROR_BODY (500)
characters before the model sees it.
"""

from __future__ import annotations

import logging
import socket

from ..domain.ports import CallInDoubt, CallNotSent
from ..domain.suspension.answers import tool_answer_header
from ..domain.vocabulary import Answer, HttpExecutor, ToolResult, ToolSuspension
from ..http import BadReply, ConnectFailed, ConnectionLost, HttpClient, HttpError, ReplyTimeout, Response
from .egress import REFUSED, EgressDenied, EgressPolicy, PolicyResolver
from .pending import MAX_DATA_BYTES, NotAPendingRequest, suspension

ANSWER_HEADER = "Agentruntime-Answer"  # the host's answer, when a suspended call is made again

# Characters of a non-2xx body the model is shown (the rest is dropped unread).
MAX_ERROR_BODY = 500
# Characters of a 3xx's Location header named in its error result.
MAX_LOCATION = 200
# The result of a call whose endpoint could not be reached or did not answer HTTP: one text for
# nothing listening, a reset, a TLS failure and a listener speaking something else.
UNREACHABLE = "request failed: the endpoint could not be reached or did not answer as an HTTP server"
# Why an attempt whose connection was lost once the request was written is in doubt (the cause is logged).
LOST = "the connection was lost after the request was sent"

log = logging.getLogger(__name__)


class HttpTools:
    """One keep-alive client for every http tool, its resolver under the egress policy."""

    def __init__(self, policy: EgressPolicy, *, pool_size: int = 256, max_text_bytes: int = 256 * 1024) -> None:
        self.policy = policy
        self._max_text_bytes = max_text_bytes
        self._client = HttpClient(pool_size, resolver=PolicyResolver(policy))
        self._refusals: dict[str, str | None] = {}

    async def close(self) -> None:
        await self._client.close()

    def refusal(self, url: str) -> str | None:
        """Why a call to `url` may not be made before resolving it (an IP-literal host the
        policy refuses: CreateRuntime refused those, but a runtime stored under a looser policy
        may name one), or None. Host names are judged by the resolver. The answer for a URL
        never changes (no DNS is involved), so it is worked out once per URL."""
        if url not in self._refusals:
            if len(self._refusals) >= 4096:
                self._refusals.clear()
            self._refusals[url] = self.policy.url_refusal(url)
        return self._refusals[url]

    async def run(
        self, executor: HttpExecutor, arguments_json: str, idempotency_key: str, answer: Answer | None = None
    ) -> ToolResult | ToolSuspension:
        refused = self.refusal(executor.url)
        if refused is not None:
            return ToolResult(refused, is_error=True)
        headers = {"Content-Type": "application/json", **executor.headers, "Idempotency-Key": idempotency_key}
        if answer is not None:
            headers[ANSWER_HEADER] = tool_answer_header(answer)
        try:
            response = await self._client.post(
                executor.url, arguments_json.encode(), headers, timeout=executor.timeout, max_body=self._body_limit
            )
        except ReplyTimeout as exc:
            raise CallInDoubt(f"no reply within {executor.timeout:g}s of sending the request") from exc
        except TimeoutError as exc:
            raise CallNotSent(f"timed out after {executor.timeout:g}s") from exc
        except HttpError as exc:
            if isinstance(exc, ConnectFailed) and isinstance(exc.os_error, EgressDenied):
                raise CallNotSent(f"{REFUSED}{exc.os_error}") from exc
            if _unresolved(exc):
                raise CallNotSent(f"request failed: {type(exc).__name__}: {exc}") from exc
            log.info("http tool call %s failed: %s: %s", idempotency_key, type(exc).__name__, exc)
            if isinstance(exc, ConnectionLost) and exc.sent:
                raise CallInDoubt(LOST) from exc
            if isinstance(exc, BadReply):  # something answered, not as an HTTP server
                return ToolResult(UNREACHABLE, is_error=True)
            raise CallNotSent(UNREACHABLE) from exc
        except ValueError as exc:
            # The client refuses to build the request (a header it will not send): its words may
            # quote a header's value, a secret, so only the kind of refusal is told.
            return ToolResult(f"request failed: the request could not be built ({type(exc).__name__})", is_error=True)
        return self._result(response)

    def _body_limit(self, status: int) -> int:
        """The most of a reply's body any answer reads: a 2xx output (one byte past it tells it is
        over), a 202's Request, none of a 3xx, an error's excerpt (a character is at most 4 bytes
        in UTF-8: this many bytes hold MAX_ERROR_BODY of them)."""
        if status == 202:
            return MAX_DATA_BYTES * 2
        if 200 <= status < 300:
            return self._max_text_bytes
        return 0 if 300 <= status < 400 else 4 * MAX_ERROR_BODY

    def _result(self, response: Response) -> ToolResult | ToolSuspension:
        status, raw = response.status, response.body
        if status == 202:  # the tool needs the host first (tools/pending.py)
            try:
                return suspension(raw)
            except NotAPendingRequest as exc:
                return ToolResult(f"HTTP 202 without a valid pending Request: {exc}", is_error=True)
        if 300 <= status < 400:
            location = response.headers.get("location", "")
            named = f" (Location: {location[:MAX_LOCATION]})" if location else ""
            return ToolResult(f"HTTP {status}: redirects are not followed{named}", is_error=True)
        if 200 <= status < 300:
            limit = self._max_text_bytes
            if response.truncated:
                return ToolResult(_too_large(status, limit), is_error=True)
            return ToolResult(_decode(response, raw))
        return ToolResult(f"HTTP {status}: {_decode(response, raw)[:MAX_ERROR_BODY]}", is_error=True)


def _unresolved(error: HttpError) -> bool:
    """The host name did not resolve: that says nothing of a port, and names a typo."""
    return isinstance(error, ConnectFailed) and isinstance(error.os_error, socket.gaierror)


def _too_large(status: int, limit: int) -> str:
    return f"HTTP {status}: the output exceeds the limit of {limit} bytes (AGENTRUNTIME_MAX_TEXT_BYTES)"


def _decode(response: Response, raw: bytes) -> str:
    try:
        return raw.decode(response.charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return raw.decode("utf-8", errors="replace")
