"""Observability under hostile or long-lived use: a gauge that must come back down when
retention deletes what it counted, span attributes and log context a stranger cannot
inflate, and text log lines an upstream body cannot split or colour."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime_server.domain.limits import MAX_ID_CHARS
from agentruntime_server.observability.logs import make_handler
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.api.test_observability import Observed, settings
from tests.support.build import agent, create, run
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.servers import Served, serve


@pytest.fixture
async def observed_with_retention(model: ScriptedModelServer) -> AsyncIterator[Observed]:
    exporter = InMemorySpanExporter()
    async with serve(span_exporter=exporter, **settings(model, retention=1.0)) as served:
        yield Observed(served.running, served.stub, exporter)


async def test_a_suspended_runtime_deleted_by_retention_leaves_the_pending_gauge(
    observed_with_retention: Observed, model: ScriptedModelServer
) -> None:
    observed = observed_with_retention
    model.script("release", lambda body: Reply(calls=[("deploy", {})]) if tool_results(body) == 0 else Reply(text="ok"))
    deploy = pb.ToolDef(name="deploy", description="the host deploys", relay=pb.RelayTool())
    runtime_id = await create(observed.stub, agent("release", tools=[deploy]))
    _, pending = await run(observed.stub, runtime_id, "release", "ship it")
    assert pending.status == pb.STATUS_PENDING
    assert await observed.value("agentruntime_pending_handles") == 1

    async def deleted() -> bool:
        try:
            await observed.stub.List(pb.ListRequest(runtime_id=runtime_id))
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND
            return True
        return False

    for _ in range(200):
        if await deleted():
            break
        await asyncio.sleep(0.05)
    assert await deleted(), "retention kept the idle suspended runtime"
    # Nothing waits on a Request that no longer exists: a gauge that stays up would drift
    # upward for ever on a server with retention.
    assert await observed.value("agentruntime_pending_handles") == 0


async def test_an_evicted_suspended_runtime_deleted_by_retention_leaves_the_pending_gauge(
    tmp_path: Path, model: ScriptedModelServer
) -> None:
    """Retention deletes it from the store without loading it: the gauge is told all the same."""
    model.script("release", lambda body: Reply(calls=[("deploy", {})]) if tool_results(body) == 0 else Reply(text="ok"))
    deploy = pb.ToolDef(name="deploy", description="the host deploys", relay=pb.RelayTool())
    store = f"sqlite:///{tmp_path / 'store.db'}"
    async with serve(**settings(model, retention=1.0, runtime_cache=1, store=store)) as served:
        observed = Observed(served.running, served.stub, InMemorySpanExporter())
        runtime_id = await create(served.stub, agent("release", tools=[deploy]))
        _, pending = await run(served.stub, runtime_id, "release", "ship it")
        assert pending.status == pb.STATUS_PENDING
        await create(served.stub, agent("release"))  # the cache keeps one runtime: the suspended one leaves memory
        assert served.running.service.cached == 1
        assert await observed.value("agentruntime_pending_handles") == 1

        async def deleted() -> bool:
            listed = await served.stub.ListRuntimes(pb.ListRuntimesRequest())
            return runtime_id not in {row.runtime_id for row in listed.runtimes}

        for _ in range(200):
            if await deleted():
                break
            await asyncio.sleep(0.05)
        assert await deleted(), "retention kept the idle suspended runtime"
        assert await observed.value("agentruntime_pending_handles") == 0


async def test_a_strangers_huge_runtime_id_is_clipped_in_the_rpc_span(model: ScriptedModelServer) -> None:
    exporter = InMemorySpanExporter()
    async with serve(span_exporter=exporter, **settings(model)) as served:
        huge = "x" * (1 << 20)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Wait(pb.WaitRequest(runtime_id=huge, handle_id=huge))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        [span] = [s for s in exporter.get_finished_spans() if s.name.endswith("/Wait")]
        attributes = dict(span.attributes or {})
        # A batch of such spans would hold gigabytes, and pass the collector's message limit.
        assert len(str(attributes["agentruntime.runtime_id"])) <= MAX_ID_CHARS
        assert len(str(attributes["agentruntime.handle_id"])) <= MAX_ID_CHARS


async def test_a_strangers_huge_runtime_id_is_clipped_in_the_json_log_context(model: ScriptedModelServer) -> None:
    from agentruntime_server.observability.logs import log_context

    seen: list[tuple[str, str] | None] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(log_context.get())

    async with serve(**settings(model)) as served:
        recorder = Recorder()
        audit = logging.getLogger("agentruntime.audit")
        audit.addHandler(recorder)
        level = audit.level
        audit.setLevel(logging.INFO)
        try:
            huge = "y" * (1 << 20)
            with pytest.raises(grpc.aio.AioRpcError):
                await served.stub.Post(pb.PostRequest(runtime_id=huge, handle_id=huge, text="hi"))
        finally:
            audit.removeHandler(recorder)
            audit.setLevel(level)
    [context] = seen
    assert context is not None
    assert len(context[0]) <= MAX_ID_CHARS and len(context[1]) <= MAX_ID_CHARS


async def _retry_logged_as_text(served: Served, model: ScriptedModelServer, body: str) -> str:
    stream = io.StringIO()
    handler = make_handler("text", stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        replies = iter([Reply(status=503, raw=body, headers={"Retry-After": "0"})])
        model.script("shaky", lambda _: next(replies, Reply(text="recovered", tokens=9)))
        runtime_id = await create(served.stub, agent("shaky"))
        _, result = await run(served.stub, runtime_id, "shaky", "go")
        assert result.status == pb.STATUS_DONE
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return stream.getvalue()


async def test_a_text_log_line_cannot_be_split_or_coloured_by_a_provider_body(model: ScriptedModelServer) -> None:
    forged = "2026-01-01 00:00:00,000 ERROR agentruntime.audit audit tenant=admin rpc=DeleteRuntime code=OK"
    body = f'{{"error": "busy"}}\n{forged}\r\n\x1b[2J\x1b]0;owned\x07\u2028next'
    overrides: dict[str, Any] = {**settings(model), "log_format": "text"}
    async with serve(**overrides) as served:
        text = await _retry_logged_as_text(served, model, body)
    [retry] = [line for line in text.splitlines() if "retrying" in line]
    assert "busy" in retry and "owned" in retry  # the body is still shown, escaped, on its own line
    assert not any(line.startswith(forged) for line in text.splitlines())
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\u2028" not in text
