"""HTTP tools: POST the arguments JSON with an Idempotency-Key; a 2xx body is the output."""

from __future__ import annotations

import aiohttp

from ..domain.model import HttpExecutor, ToolResult
from ..http_session import HttpSession

MAX_ERROR_BODY = 2000


class HttpTools:
    def __init__(self, session: HttpSession) -> None:
        self._session = session

    async def run(self, executor: HttpExecutor, arguments_json: str, idempotency_key: str) -> ToolResult:
        headers = {"Content-Type": "application/json", **executor.headers, "Idempotency-Key": idempotency_key}
        try:
            async with self._session.get().post(
                executor.url,
                data=arguments_json.encode(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=executor.timeout),
            ) as response:
                body = await response.text(errors="replace")
                if 200 <= response.status < 300:
                    return ToolResult(body)
                return ToolResult(f"HTTP {response.status}: {body[:MAX_ERROR_BODY]}", is_error=True)
        except TimeoutError:
            return ToolResult(f"timed out after {executor.timeout:g}s", is_error=True)
        except aiohttp.ClientError as exc:
            return ToolResult(f"request failed: {type(exc).__name__}: {exc}", is_error=True)
