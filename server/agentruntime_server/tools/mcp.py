"""MCP servers as tool sources, through the official `mcp` SDK (streamable HTTP transport).

Listing (at CreateRuntime) and each call open a session of their own: `initialize`, then
`tools/list` (every page, bounded) or `tools/call` with the idempotency key in the
request's `_meta` (`idempotency_key`). The http tools' egress policy applies: every address
the server's host name resolves to must be allowed, judged at each connection on the very
addresses it then connects to (`mcp_network`). A server that cannot be reached, times out
or fails gives an McpError at listing (the CreateRuntime is refused, naming the server) and
an error result at a call (the run goes on). Until a server has answered `initialize`, every
failure but the policy's refusal reads the same (UNREACHABLE; the cause is logged): a closed
port and a listener speaking something else must not be told apart, or MCP is a port
scanner. Every reply is read under a byte budget for the session, the connection dropped
past it (`mcp_limits`): a listing larger than LISTING_BYTES refuses the CreateRuntime, a
result larger than MAX_TEXT_BYTES is an error result. Messages never hold a header value:
headers are secrets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..domain.errors import shown
from ..domain.ports import McpError, McpTool, StructuredContent
from ..domain.vocabulary import McpExecutor, McpServerSpec, ToolResult
from .egress import EgressPolicy

if TYPE_CHECKING:  # the SDK is imported when an MCP server is first used, not at every start (~0.3 s)
    from mcp import ClientSession

    from .mcp_limits import ReplyBudget

log = logging.getLogger(__name__)
# The SDK's HTTP client logs every request at INFO; the service's log says what matters.
logging.getLogger("httpx2").setLevel(logging.WARNING)

MAX_PAGES = 20
MAX_TOOLS = 1000
UNREACHABLE = "it could not be reached or did not answer as an MCP server"


class _Progress:
    """How far a session got: past `initialize`, the server has shown it speaks MCP."""

    answered = False


class McpTools:
    """The domain's McpClient."""

    def __init__(self, policy: EgressPolicy, max_text_bytes: int = 256 << 10) -> None:
        self.policy = policy
        self.max_text_bytes = max_text_bytes
        self._ssl: ssl.SSLContext | None = None

    @contextlib.asynccontextmanager
    async def _session(
        self, url: str, headers: dict[str, str], timeout: float, budget: ReplyBudget, progress: _Progress
    ) -> AsyncIterator[ClientSession]:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        from .mcp_limits import BoundedTransport
        from .mcp_network import policy_transport, ssl_context

        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise McpError("the url must be an absolute http(s) URL")
        refusal = self.policy.url_refusal(url)  # a runtime stored under a looser policy may name one
        if refusal is not None:
            raise McpError(refusal)
        # The SDK's client over a transport that judges each address it connects to, and never
        # a proxy from the environment (redirects stay off; the SDK follows them only within
        # the server's origin).
        # Every response is read under the session's budget (mcp_limits), an SSE event included.
        if self._ssl is None:
            self._ssl = await asyncio.to_thread(ssl_context)
        transport = BoundedTransport(policy_transport(self.policy, self._ssl), budget)
        client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout), transport=transport, trust_env=False)
        async with (
            client,
            streamable_http_client(url, http_client=client, max_sse_event_size=budget.limit) as (read, write),
            ClientSession(read, write, read_timeout_seconds=timeout) as session,
        ):
            await session.initialize()
            progress.answered = True
            yield session

    async def list_tools(self, server: McpServerSpec) -> list[McpTool]:
        from mcp.types import PaginatedRequestParams

        from .mcp_limits import LISTING_BYTES, ReplyBudget, bounded

        tools: list[McpTool] = []
        budget = ReplyBudget(LISTING_BYTES, f"its listing is larger than the limit of {LISTING_BYTES:,} bytes")
        progress = _Progress()
        try:
            with bounded(budget):
                async with (
                    asyncio.timeout(server.timeout),
                    self._session(server.url, server.headers, server.timeout, budget, progress) as session,
                ):
                    cursor: str | None = None
                    for _ in range(MAX_PAGES):
                        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                        for tool in page.tools:
                            schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
                            output = dict(tool.output_schema) if isinstance(tool.output_schema, dict) else None
                            description = str(tool.description or "")
                            tools.append(McpTool(str(tool.name), description, dict(schema or {"type": "object"}), output))
                        if len(tools) > MAX_TOOLS:
                            raise McpError(f"it lists more than {MAX_TOOLS} tools; name the ones to use in allowed_tools")
                        cursor = page.next_cursor
                        if not cursor:
                            break
        except Exception as error:  # the SDK's and the network's: unreachable, refused, malformed, timed out
            cause = _innermost(error)
            raise (_ours(cause, progress) or McpError(_failure(server.name, cause, progress))) from None
        return tools

    async def call(self, executor: McpExecutor, arguments: dict[str, Any], key: str) -> ToolResult | StructuredContent:
        from mcp import types

        from .mcp_limits import ReplyBudget, bounded, call_bytes

        budget = ReplyBudget(call_bytes(self.max_text_bytes), self._too_large)
        progress = _Progress()
        try:
            with bounded(budget):
                async with (
                    asyncio.timeout(executor.timeout),
                    self._session(executor.url, executor.headers, executor.timeout, budget, progress) as session,
                ):
                    meta: types.RequestParamsMeta = {"idempotency_key": key}  # type: ignore[typeddict-unknown-key]  # an open map
                    params = types.CallToolRequestParams(name=executor.tool, arguments=arguments, _meta=meta)
                    # Not session.call_tool: it lists the server's tools again in the call's session to
                    # check structured content against an output schema (the listing's bytes, and the
                    # server's regular expressions run by `re` on the event loop), for content the
                    # runtime does not keep.
                    result = await session.send_request(types.CallToolRequest(params=params), types.CallToolResult)
        except Exception as error:
            cause = _innermost(error)
            ours = _ours(cause, progress)
            if ours is not None:
                return ToolResult(f"MCP server {executor.server!r}: {ours}", is_error=True)
            failure = _failure(executor.server, cause, progress)
            return ToolResult(f"MCP server {executor.server!r} failed: {failure}", is_error=True)
        text = self._text(result)
        structured = getattr(result, "structured_content", None)
        checked = executor.output_schema is not None and structured is not None and not getattr(result, "is_error", False)
        if checked:
            # Its structured content, checked against the output schema it listed (by the domain,
            # off the event loop when that costs: domain/definitions/schema_checks.py), is what the model
            # reads (docs/typed-results.md#mcp-tools).
            text = json.dumps(structured, ensure_ascii=False)
        if len(text.encode(errors="surrogatepass")) > self.max_text_bytes:
            return ToolResult(f"MCP server {executor.server!r}: {self._too_large}", is_error=True)
        if checked:
            return StructuredContent(executor.server, structured, text)
        return ToolResult(text, is_error=bool(getattr(result, "is_error", False)))

    @property
    def _too_large(self) -> str:
        return f"its result is larger than the limit of {self.max_text_bytes:,} bytes (AGENTRUNTIME_MAX_TEXT_BYTES)"

    def _text(self, result: Any) -> str:
        parts = []
        for content in getattr(result, "content", None) or ():
            text = getattr(content, "text", None)
            parts.append(text if isinstance(text, str) else f"[{getattr(content, 'type', 'content')}]")
        if not parts and getattr(result, "structured_content", None) is not None:
            parts.append(json.dumps(result.structured_content))
        return "\n".join(parts)


# Raised while the HTTP client builds a request (a header it will not send): their words may
# quote a header's value, which is a secret, so only their kind is told.
_REQUEST_BUILD_ERRORS = frozenset({"LocalProtocolError"})


def _innermost(error: BaseException) -> BaseException:
    """The error inside the groups anyio wraps errors in (an McpError of ours among them:
    the egress policy's refusal comes from inside the SDK's task group)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _ours(error: BaseException, progress: _Progress) -> McpError | None:
    """Our own refusal, to be told as it is: the policy's, a bad URL's, and once the server has
    spoken MCP, a reply of its that broke a bound. Before that, a reply too long or in an
    encoding not asked for tells only that something listens: it reads as UNREACHABLE."""
    from .mcp_limits import BadReply  # loaded with the session that failed

    if not isinstance(error, McpError):
        return None
    if isinstance(error, BadReply) and not progress.answered:
        return None
    return error


def _failure(server: str, error: BaseException, progress: _Progress) -> str:
    """What a caller is told of a failure that is not ours: the cause, once the server has
    spoken MCP; UNREACHABLE before (the cause goes to the log, for the operator)."""
    if progress.answered:
        return _describe(error)
    log.info("MCP server %r could not be reached or did not answer as one: %s", server, _describe(error))
    return UNREACHABLE


def _describe(error: BaseException) -> str:
    """The innermost cause, shortly."""
    error = _innermost(error)
    if isinstance(error, TimeoutError):
        return "it did not answer in time"
    if isinstance(error, UnicodeError) or type(error).__name__ in _REQUEST_BUILD_ERRORS:
        return f"{type(error).__name__}: the request could not be built"
    return f"{type(error).__name__}: {shown(str(error), 200)}"
