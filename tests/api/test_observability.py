"""Observability over a real server: Prometheus /metrics scraped over HTTP, JSON log lines
with runtime/handle ids, and OpenTelemetry spans (through an in-memory exporter). Under
hostile or long-lived use: a gauge comes back down when retention deletes what it counted,
span attributes and log context a stranger cannot inflate, and text log lines an upstream
body cannot split or colour."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import RunningServer
from agentruntime_server.domain.limits import MAX_ID_CHARS
from agentruntime_server.observability import tracing_endpoint
from agentruntime_server.observability.logs import configure_logging, make_handler
from agentruntime_server.settings import Settings
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from tests.support.build import agent, create, http_tool, run
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.poll import eventually, until
from tests.support.servers import Served, serve
from tests.support.tool_server import ToolServer

KEY = "sk-test-secret-never-shown"
AGENT_RUNTIME = "agentruntime.v1.AgentRuntime"


@dataclass
class Observed:
    server: RunningServer
    stub: pb_grpc.AgentRuntimeAsyncStub
    spans: InMemorySpanExporter

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of /metrics, scraped over HTTP: (name, labels) -> value."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.server.metrics_port}/metrics") as response,
        ):
            assert response.status == 200
            text = await response.text()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def value(self, name: str, **labels: str) -> float:
        return (await self.metrics()).get((name, frozenset(labels.items())), 0.0)


def settings(model: ScriptedModelServer, **overrides: Any) -> dict[str, Any]:
    """Metrics on, on a free port (never the default 9464), unless overridden."""
    return {
        "llm_style": "openai",
        "llm_base_url": model.base_url,
        "llm_api_key": KEY,
        "llm_backoff_base": 0.01,
        "metrics_listen": "127.0.0.1:0",
        "log_format": "json",
        **overrides,
    }


@pytest.fixture
async def observed(model: ScriptedModelServer) -> AsyncIterator[Observed]:
    exporter = InMemorySpanExporter()
    async with serve(span_exporter=exporter, **settings(model)) as served:
        running = served.running
        assert running.metrics_port > 0
        yield Observed(running, served.stub, exporter)


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """What the server logs while the test runs, as the JSON handler writes it."""
    stream = io.StringIO()
    handler = make_handler("json", stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def grpc_labels(method: str, code: str, kind: str = "unary") -> dict[str, str]:
    return {"grpc_service": AGENT_RUNTIME, "grpc_method": method, "grpc_type": kind, "grpc_code": code}


def delegate_once(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("task", {"agent": "worker", "prompt": "ping it"})], tokens=100)
    return Reply(text="coordinated", tokens=100)


def ping_once(body: dict[str, Any]) -> Reply:
    if tool_results(body) == 0:
        return Reply(calls=[("ping", {})], tokens=40)
    return Reply(text="pinged", tokens=40)


async def delegated_run(observed: Observed, model: ScriptedModelServer, tools: ToolServer) -> tuple[str, str, pb.TaskResult]:
    """coordinator -task-> worker -ping (http)-> ; 4 model turns, 2 tool calls."""
    model.script("coordinator", delegate_once)
    model.script("worker", ping_once)
    worker = agent("worker", tools=[http_tool("ping", tools.url("ping"))])
    runtime_id = await create(observed.stub, agent("coordinator", team=["worker"]), worker)
    handle_id, result = await run(observed.stub, runtime_id, "coordinator", "map the repo")
    assert result.status == pb.STATUS_DONE
    return runtime_id, handle_id, result


# ---- metrics -------------------------------------------------------------------------------


async def test_metrics_count_rpcs_turns_tokens_tool_calls_and_model_calls(
    observed: Observed, model: ScriptedModelServer, tools: ToolServer
) -> None:
    _, _, result = await delegated_run(observed, model, tools)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await observed.stub.Spawn(pb.SpawnRequest(runtime_id="no-such-runtime", agent="coordinator"))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND

    metrics = await observed.metrics()

    def value(name: str, **labels: str) -> float:
        return metrics.get((name, frozenset(labels.items())), 0.0)

    assert value("grpc_server_handled_total", **grpc_labels("Wait", "OK")) == 1
    assert value("grpc_server_handling_seconds_count", **grpc_labels("Wait", "OK")) == 1
    assert value("grpc_server_handled_total", **grpc_labels("Spawn", "OK")) == 1
    assert value("grpc_server_handled_total", **grpc_labels("Spawn", "NOT_FOUND")) == 1  # not UNKNOWN
    assert value("grpc_server_handled_total", **grpc_labels("Spawn", "UNKNOWN")) == 0
    started = {"grpc_service": AGENT_RUNTIME, "grpc_method": "Spawn", "grpc_type": "unary"}
    assert value("grpc_server_started_total", **started) == 2

    assert value("agentruntime_turns_total") == 4 == sum(model.calls.values())
    assert value("agentruntime_tokens_total") == result.total_tokens == 280
    assert value("agentruntime_tool_calls_total", outcome="ok") == 2 == result.tool_calls + 1  # task + the worker's ping
    assert value("agentruntime_tool_calls_total", outcome="error") == 0
    assert value("agentruntime_results_total", status="STATUS_DONE", limit="LIMIT_UNSPECIFIED") == 2
    model_calls = value("agentruntime_model_call_seconds_count", provider="openai", outcome="ok")
    assert model_calls == sum(model.calls.values()) == 4
    assert value("agentruntime_model_call_seconds_sum", provider="openai", outcome="ok") > 0
    assert value("agentruntime_pending_handles") == 0
    assert value("process_cpu_seconds_total") > 0
    assert KEY not in repr(metrics)


async def test_a_retry_is_counted_and_logged_as_json_with_ids(
    observed: Observed, model: ScriptedModelServer, json_logs: io.StringIO
) -> None:
    replies = iter([Reply(status=503, raw='{"error": "busy"}', headers={"Retry-After": "0"})])
    model.script("shaky", lambda body: next(replies, Reply(text="recovered", tokens=9)))
    runtime_id = await create(observed.stub, agent("shaky"))
    handle_id, result = await run(observed.stub, runtime_id, "shaky", "go")
    assert (result.status, result.text) == (pb.STATUS_DONE, "recovered")
    assert model.calls["shaky"] == 2

    assert await observed.value("agentruntime_model_call_retries_total", provider="openai", reason="server_error") == 1
    assert await observed.value("agentruntime_model_call_seconds_count", provider="openai", outcome="server_error") == 1
    assert await observed.value("agentruntime_model_call_seconds_count", provider="openai", outcome="ok") == 1
    assert await observed.value("agentruntime_turns_total") == 1
    assert await observed.value("agentruntime_tokens_total") == 9

    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    [retry] = [line for line in lines if "retrying" in line["message"]]
    assert retry["level"] == "WARNING" and retry["logger"] == "agentruntime.providers"
    assert (retry["runtime_id"], retry["handle_id"]) == (runtime_id, handle_id)
    assert "503" in retry["message"] and retry["time"].endswith("+00:00")
    assert KEY not in json_logs.getvalue()


async def test_pending_handles_go_up_at_a_suspension_and_down_at_resume(observed: Observed, model: ScriptedModelServer) -> None:
    def relay_then_answer(body: dict[str, Any]) -> Reply:
        return Reply(calls=[("deploy", {"version": "v2"})]) if tool_results(body) == 0 else Reply(text="shipped")

    model.script("release", relay_then_answer)
    deploy = pb.ToolDef(name="deploy", description="the host deploys", relay=pb.RelayTool())
    runtime_id = await create(observed.stub, agent("release", tools=[deploy]))
    assert await observed.value("agentruntime_pending_handles") == 0

    _, pending = await run(observed.stub, runtime_id, "release", "ship v2")
    assert pending.status == pb.STATUS_PENDING
    assert await observed.value("agentruntime_pending_handles") == 1
    assert await observed.value("agentruntime_results_total", status="STATUS_PENDING", limit="LIMIT_UNSPECIFIED") == 1

    [call] = pending.pending.calls
    answer = pb.Answer(id=pending.pending.id, ok=True, outputs=[pb.ToolOutput(call_id=call.id, output="deployed")])
    resumed = (await observed.stub.Resume(pb.ResumeRequest(runtime_id=runtime_id, answer=answer))).result
    assert resumed.status == pb.STATUS_DONE
    assert await observed.value("agentruntime_pending_handles") == 0
    assert await observed.value("grpc_server_handled_total", **grpc_labels("Resume", "OK")) == 1
    assert await observed.value("agentruntime_tool_calls_total", outcome="ok") == 1  # the relay output, recorded


async def test_watch_streams_through_the_interceptor(observed: Observed, model: ScriptedModelServer) -> None:
    model.script("solo", lambda body: Reply(text="done", tokens=5))
    runtime_id = await create(observed.stub, agent("solo"))
    await run(observed.stub, runtime_id, "solo", "go")
    call = observed.stub.Watch(pb.WatchRequest(runtime_id=runtime_id))
    payloads = []
    async for response in call:
        payloads.append(response.event.WhichOneof("payload"))
        if payloads[-1] == "result":
            call.cancel()  # the watcher goes away: the stream ends CANCELLED on the server
            break
    assert payloads[:1] == ["spawned"] and "turn_ended" in payloads
    cancelled = grpc_labels("Watch", "CANCELLED", kind="server_stream")
    await eventually(lambda: observed.value("grpc_server_handled_total", **cancelled), "the cancelled Watch counted", timeout=5)
    assert await observed.value("grpc_server_handled_total", **cancelled) == 1
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in observed.stub.Watch(pb.WatchRequest(runtime_id="nope")):
            pass
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    refused_watch = grpc_labels("Watch", "NOT_FOUND", kind="server_stream")
    assert await observed.value("grpc_server_handled_total", **refused_watch) == 1


# ---- spans -----------------------------------------------------------------------------------


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_spans_for_rpcs_turns_model_calls_and_tool_calls(
    observed: Observed, model: ScriptedModelServer, tools: ToolServer
) -> None:
    runtime_id, handle_id, _ = await delegated_run(observed, model, tools)
    with pytest.raises(grpc.aio.AioRpcError):
        await observed.stub.Spawn(pb.SpawnRequest(runtime_id=runtime_id, agent="nobody"))
    spans = observed.spans.get_finished_spans()

    [wake] = by_name(spans, f"{AGENT_RUNTIME}/Wake")
    assert wake.kind is SpanKind.SERVER
    assert wake.attributes is not None
    assert wake.attributes["rpc.method"] == "Wake" and wake.attributes["rpc.grpc.status_code"] == 0
    assert wake.attributes["agentruntime.handle_id"] == handle_id
    refused = by_name(spans, f"{AGENT_RUNTIME}/Spawn")[-1]
    assert refused.attributes is not None and refused.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert refused.status.status_code is StatusCode.UNSET  # the caller's mistake, not the server's fault

    turns = by_name(spans, "agentruntime.turn")
    model_calls = by_name(spans, "agentruntime.model_call")
    tool_calls = by_name(spans, "agentruntime.tool_call")
    assert len(turns) == 4 and len(model_calls) == 4 and len(tool_calls) == 2
    assert {span.context.trace_id for span in turns + model_calls + tool_calls} == {wake.context.trace_id}

    def turn(handle: str, number: int) -> ReadableSpan:
        [found] = [
            s
            for s in turns
            if s.attributes and s.attributes["agentruntime.handle_id"] == handle and s.attributes["agentruntime.turn"] == number
        ]
        return found

    first, second = turn(handle_id, 1), turn(handle_id, 2)
    assert parent_id(first) == parent_id(second) == wake.context.span_id  # the run hangs under the Wake that started it
    assert first.attributes is not None and first.attributes["agentruntime.tokens"] == 100
    assert second.attributes is not None and second.attributes["agentruntime.total_tokens"] == 280
    [task] = [s for s in tool_calls if s.attributes and s.attributes["gen_ai.tool.name"] == "task"]
    [ping] = [s for s in tool_calls if s.attributes and s.attributes["gen_ai.tool.name"] == "ping"]
    assert parent_id(task) == wake.context.span_id
    worker_id = f"{handle_id}/worker.1"
    # The child's run hangs under the task call that started it, and so do its tool calls.
    assert parent_id(turn(worker_id, 1)) == parent_id(turn(worker_id, 2)) == parent_id(ping) == task.context.span_id
    assert ping.attributes is not None and ping.attributes["agentruntime.handle_id"] == worker_id
    assert first.start_time is not None and task.start_time is not None and second.start_time is not None
    assert first.start_time <= task.start_time <= second.start_time

    turn_ids = {span.context.span_id: span for span in turns}
    for call in model_calls:
        assert call.kind is SpanKind.CLIENT
        assert call.attributes is not None and call.attributes["agentruntime.provider"] == "openai"
        assert call.attributes["agentruntime.outcome"] == "ok"
        parent = turn_ids[parent_id(call) or 0]  # every model call hangs under its turn
        assert parent.start_time is not None and call.start_time is not None and call.end_time is not None
        assert parent.start_time <= call.start_time and parent.end_time is not None and call.end_time <= parent.end_time

    text = json.dumps([dict(span.attributes or {}) for span in spans])
    assert KEY not in text and "map the repo" not in text and "ping it" not in text


async def test_a_caller_trace_is_continued(observed: Observed) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    metadata = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
    await observed.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="traced", agents=[agent("solo")]), metadata=metadata)
    [span] = by_name(observed.spans.get_finished_spans(), f"{AGENT_RUNTIME}/CreateRuntime")
    assert span.context.trace_id == int(trace_id, 16)
    assert parent_id(span) == 0x00F067AA0BA902B7


# ---- settings --------------------------------------------------------------------------------


async def test_off_means_off(model: ScriptedModelServer) -> None:
    async with serve(**settings(model, metrics_listen="off", log_format="text")) as served:
        running = served.running
        assert running.metrics_port == 0
        observability = running.observability
        assert observability.metrics is None and observability.tracing is None
        assert observability.observers == () and observability.interceptors() == []
        assert observability.model_monitor is None


async def test_a_busy_metrics_port_does_not_stop_the_service(model: ScriptedModelServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with serve(**settings(model, metrics_listen=f"127.0.0.1:{port}")) as served:
            running = served.running
            assert running.metrics_port == 0
            created = await served.stub.CreateRuntime(pb.CreateRuntimeRequest(agents=[agent("a")]))
            assert created.runtime_id


def test_tracing_is_on_only_with_an_endpoint() -> None:
    assert tracing_endpoint(Settings(), environ={}) is None
    assert tracing_endpoint(Settings(otel_endpoint="http://collector:4317"), environ={}) == "http://collector:4317"
    assert tracing_endpoint(Settings(), environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}) == ""
    assert tracing_endpoint(Settings(), environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}) == ""


def test_log_format_text_by_default_json_on_request() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        stream = io.StringIO()
        configure_logging(Settings(), stream)
        logging.getLogger("agentruntime.test").info("plain %s", "words")
        configure_logging(Settings(log_format="json", log_level="debug"), stream)
        logging.getLogger("agentruntime.test").debug("structured %s", "words", extra={"runtime_id": "rt-1"})
        text, structured = stream.getvalue().splitlines()
        assert text.endswith("INFO agentruntime.test plain words")
        line = json.loads(structured)
        assert (line["level"], line["logger"], line["message"], line["runtime_id"]) == (
            "DEBUG",
            "agentruntime.test",
            "structured words",
            "rt-1",
        )
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])


# ---- under hostile or long-lived use ----------------------------------------------------------------


@pytest.fixture
async def observed_with_retention(model: ScriptedModelServer) -> AsyncIterator[Observed]:
    exporter = InMemorySpanExporter()
    async with serve(span_exporter=exporter, **settings(model, suspended_retention=1.0)) as served:
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

    await eventually(deleted, "retention to delete the idle suspended runtime")
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
    async with serve(**settings(model, suspended_retention=1.0, runtime_cache=1, store=store)) as served:
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

        await eventually(deleted, "retention to delete the idle suspended runtime")
        assert await deleted(), "retention kept the idle suspended runtime"
        assert await observed.value("agentruntime_pending_handles") == 0


async def test_a_strangers_huge_runtime_id_is_clipped_in_the_rpc_span(model: ScriptedModelServer) -> None:
    exporter = InMemorySpanExporter()
    async with serve(span_exporter=exporter, **settings(model)) as served:
        huge = "x" * (1 << 20)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Wait(pb.WaitRequest(runtime_id=huge, handle_id=huge))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        def waits() -> list[Any]:
            return [s for s in exporter.get_finished_spans() if s.name.endswith("/Wait")]

        await until(lambda: bool(waits()), "the Wait's span to end (it may end after its answer left)")
        [span] = waits()
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
