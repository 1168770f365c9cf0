"""The `agentruntime` CLI (run, ls, inspect, transcript, resume, watch, runtimes, rm) as a subprocess against a real server.

Off a terminal `run` prints one line per event and reads the prompt and the answers from
standard input, so what a person sees in the live tree is checked here line by line; model
output cannot drive the terminal it is printed on."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agentruntime.cli import command_first
from agentruntime.v1 import agent_runtime_pb2 as pb
from agentruntime.v1 import agent_runtime_pb2_grpc as pb_grpc
from agentruntime_server.app import RunningServer
from google.protobuf import json_format

from tests.support.build import agent, create, duration, http_tool, run
from tests.support.model_server import Reply, ScriptedModelServer, tool_results
from tests.support.process import ServerProcess, free_port
from tests.support.servers import Served, serve
from tests.support.sse import Streamed
from tests.support.tool_server import ToolServer

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "examples" / "agents.json"
RELEASE = ROOT / "examples" / "release.json"


@pytest.fixture
async def scripted_served() -> AsyncIterator[Served]:
    """A server on the embedded scripted model (the `make run` default): the examples run offline."""
    async with serve() as served:
        yield served


@pytest.fixture
def scripted(scripted_served: Served) -> RunningServer:
    return scripted_served.running


@pytest.fixture
def stub(scripted_served: Served) -> pb_grpc.AgentRuntimeAsyncStub:
    return scripted_served.stub


def _env(server: RunningServer | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENTRUNTIME_")}
    if server is not None:
        env["AGENTRUNTIME_ADDR"] = f"127.0.0.1:{server.port}"
    return env


async def cli(
    server: RunningServer | None, *args: str, stdin: str = "", module: str = "agentruntime_server"
) -> tuple[int, str, str]:
    """Runs `python -m agentruntime_server ARGS` (the console script) without blocking the server's loop."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(server), cwd=ROOT,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def block(text: str, title: str) -> dict[str, str]:
    """The `key  value` lines under `--- title`."""
    lines = text.splitlines()
    start = lines.index(f"--- {title}") + 1
    rows: dict[str, str] = {}
    for line in lines[start:]:
        if line.startswith("--- "):
            break
        key, _, value = line.partition("  ")
        rows[key] = value.strip()
    return rows


def runtime_of(stdout: str) -> str:
    first = stdout.splitlines()[0]
    assert first.startswith("runtime "), stdout
    return first.split()[1]


async def test_run_shows_every_event_and_ends_done_with_the_tree_bill(
    scripted: RunningServer, stub: pb_grpc.AgentRuntimeAsyncStub
) -> None:
    prompt = "How does the Python GIL affect CPU-bound threads?"
    code, out, err = await cli(scripted, "run", str(AGENTS), "--prompt", prompt)
    assert (code, err) == (0, ""), out + err
    runtime_id = runtime_of(out)
    assert runtime_id.startswith("demo-")  # the file's id plus a suffix: the file can run again
    assert "#1 root/coordinator.1 spawned agent=coordinator parent=root" in out
    assert "root/coordinator.1/explore.1 spawned agent=explore" in out
    assert "root/coordinator.1/summarize.1 turn 1 ended" in out
    result = block(out, "result")
    assert result["status"] == "DONE"
    assert result["turns"] == "2"
    own, total = int(result["own tokens"]), int(result["total tokens"])
    listed = {view.handle_id: view for view in (await stub.List(pb.ListRequest(runtime_id=runtime_id))).handles}
    root = listed["root/coordinator.1"]
    assert (own, total) == (root.own_tokens, root.total_tokens)
    children = [view.total_tokens for handle_id, view in listed.items() if handle_id != root.handle_id]
    assert total == own + sum(children) > own

    again, second, _ = await cli(scripted, "run", str(AGENTS), "--prompt", prompt)
    assert again == 0 and runtime_of(second) != runtime_id


async def test_run_asks_for_the_relay_output_on_stdin_and_resumes_to_done(
    scripted: RunningServer, stub: pb_grpc.AgentRuntimeAsyncStub
) -> None:
    code, out, err = await cli(scripted, "run", str(RELEASE), "--prompt", "Ship v2.", stdin="deployed v2 at 12:00\n")
    assert (code, err) == (0, ""), out + err
    request = block(out, "the run waits for you")
    assert request["kind"] == "tool_call"
    assert request["path"] == "root/lead.1/release.1"
    assert request["call call_1_1"] == 'deploy {"version": "v2"}'
    assert 'output of deploy call_1_1 ({"version": "v2"}): deployed v2 at 12:00' in out
    result = block(out, "result")
    assert (result["status"], result["turns"], result["own tokens"], result["total tokens"]) == ("DONE", "2", "200", "220")
    assert result["text"] == "Release finished: v2 is live."
    # The answer was the deploy call's result, and the suspended turn was not bought again.
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_of(out), handle_id="root/lead.1/release.1"))
    assert [m.content for m in transcript.messages if m.role == "tool"] == ["deployed v2 at 12:00"]


async def test_a_run_left_pending_is_finished_by_resume(scripted: RunningServer) -> None:
    code, out, _ = await cli(scripted, "run", str(RELEASE), "--runtime-id", "rel", "--prompt", "Ship v2.")
    assert code == 1  # stdin ended before the answer: the run waits, and says how to answer
    assert runtime_of(out) == "rel"
    assert block(out, "result")["status"] == "PENDING"
    assert "agentruntime resume rel --id root/lead.1/release.1/call_1_1:tool_call" in out

    request_id = "root/lead.1/release.1/call_1_1:tool_call"
    code, out, err = await cli(scripted, "resume", "rel", "--id", request_id, "--output", "call_1_1=deployed")
    assert (code, err) == (0, ""), out + err
    result = block("--- result\n" + out, "result")
    assert (result["status"], result["own tokens"], result["total tokens"]) == ("DONE", "200", "220")


async def test_run_asks_for_approval_and_input(
    scripted: RunningServer, stub: pb_grpc.AgentRuntimeAsyncStub, tmp_path: Path
) -> None:
    ask = {"name": "ask", "arguments_json": json.dumps({"question": "Which table?"})}
    drop = {"name": "drop", "arguments_json": json.dumps({"table": "users"})}
    ops = {
        "name": "ops",
        "tools": [{"name": "drop", "relay": {}, "approval": {"required": True, "prompt": "Drop it?"}}],
        "script": {"replies": [{"tool_calls": [ask]}, {"tool_calls": [drop]}, {"text": "left it alone"}]},
    }
    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"runtime_id": "ops", "agents": [ops]}))
    code, out, err = await cli(scripted, "run", str(path), "--prompt", "clean up", stdin="users\nn too risky\n")
    assert (code, err) == (0, ""), out + err
    assert "your answer: users" in out
    assert "approve? [y/n, or 'n REASON']: n too risky" in out
    assert block(out, "result")["text"] == "left it alone"
    transcript = await stub.GetTranscript(pb.GetTranscriptRequest(runtime_id=runtime_of(out), handle_id="root/ops.1"))
    tool_messages = [m.content for m in transcript.messages if m.role == "tool"]
    assert json.loads(tool_messages[0]) == {"answer": "users"}
    assert "too risky" in tool_messages[1]


async def test_ls_inspect_and_transcript(scripted: RunningServer) -> None:
    code, out, _ = await cli(scripted, "run", str(AGENTS), "--runtime-id", "team", "--prompt", "Compare GIL and no-GIL builds.")
    assert code == 0

    code, out, err = await cli(scripted, "ls", "team")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == ["handle", "agent", "state", "turns", "own", "total", "cost", "tools", "last", "pending"]
    table = {row.split()[0]: row.split() for row in rows}
    assert list(table) == ["root/coordinator.1", "root/coordinator.1/explore.1", "root/coordinator.1/summarize.1"]
    assert table["root/coordinator.1"][1:4] == ["coordinator", "IDLE", "2"]
    assert table["root/coordinator.1"][6:] == ["unpriced", "2", "DONE", "-"]

    code, out, _ = await cli(scripted, "inspect", "team", "root/coordinator.1")
    view = block("--- handle\n" + out, "handle")
    assert code == 0 and view["state"] == "IDLE" and view["budget"] == "max_turns=10, max_tokens=20000"
    assert view["total tokens"] == table["root/coordinator.1"][5]

    code, out, _ = await cli(scripted, "transcript", "team", "root/coordinator.1")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "user: Compare GIL and no-GIL builds."
    assert lines[1] == "assistant (turn 1):"
    assert lines[2].startswith("  → task call_1_1 ") and '"agent": "explore"' in lines[2]
    assert lines[-1].startswith("assistant (turn 2): coordinator: explore on")

    code, out, _ = await cli(scripted, "transcript", "team", "root/coordinator.1", "--json")
    assert code == 0 and json.loads(out)["messages"][0]["role"] == "user"

    # The client alone (no server package) runs the same commands.
    code, out, _ = await cli(scripted, "ls", "team", module="agentruntime.cli")
    assert code == 0 and out.splitlines()[0].startswith("handle")


async def test_watch_prints_the_history_then_follows_until_interrupted(scripted: RunningServer) -> None:
    code, _, _ = await cli(scripted, "run", str(AGENTS), "--runtime-id", "watched", "--prompt", "hi")
    assert code == 0
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentruntime_server", "watch", "watched", "--after", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(scripted), cwd=ROOT,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    while not (lines and " result DONE" in lines[-1] and lines[-1].startswith("#") and "root/coordinator.1 " in lines[-1]):
        lines.append((await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode().rstrip("\n"))
    assert lines[0].startswith("#3 root/coordinator.1 turn 1 started")
    process.send_signal(signal.SIGTERM)  # as Ctrl-C (which a test run in the background may ignore)
    assert await asyncio.wait_for(process.wait(), timeout=30) == 0


async def test_errors_are_one_line_with_the_code_never_a_traceback(scripted: RunningServer, tmp_path: Path) -> None:
    code, out, err = await cli(scripted, "ls", "nope")
    assert (code, out) == (2, "")
    assert err.startswith("error: NOT_FOUND: runtime 'nope' not found")

    code, _, err = await cli(scripted, "resume", "nope-either", "--id", "x")
    assert code == 2 and err.startswith("error: NOT_FOUND:")

    await cli(scripted, "run", str(RELEASE), "--runtime-id", "rel", "--prompt", "Ship v2.")
    code, _, err = await cli(scripted, "resume", "rel", "--id", "nope")
    assert code == 2
    assert err.splitlines() == [
        "error: FAILED_PRECONDITION: no live request has id 'nope' in runtime 'rel';"
        " Wait on the root handle to see its pending request",
        "  reason: NO_SUCH_REQUEST",
    ]

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"agents": [{"name": "lead", "team": ["ghost"]}]}))
    code, _, err = await cli(scripted, "run", str(broken), "--prompt", "go")
    assert code == 2 and err.startswith("error: INVALID_ARGUMENT:")
    assert "  agents[0].team[0]: " in err  # the field violation, under the message

    code, _, err = await cli(scripted, "run", str(tmp_path / "missing.json"), "--prompt", "go")
    assert (code, err) == (2, f"error: cannot read {tmp_path / 'missing.json'}: No such file or directory\n")

    code, _, err = await cli(None, "ls", "rt", "--addr", f"127.0.0.1:{free_port()}", "--retry-window", "0.5")
    assert code == 2 and err.startswith("error: UNAVAILABLE: ")  # after half a second of retries
    assert "Traceback" not in err
    code, _, err = await cli(None, "ls", "rt", "--retry-window", "-1")
    assert code == 2 and "--retry-window: expected a number of seconds >= 0, got '-1'" in err


async def test_a_command_sent_while_the_server_is_away_gets_through_when_it_is_back(tmp_path: Path) -> None:
    """Every call is retried on UNAVAILABLE for --retry-window seconds (10 by default): a
    server restarting under a command is waited for, and `rm` removes the runtime once."""
    address = f"127.0.0.1:{free_port()}"
    store = f"sqlite:///{tmp_path / 'store.db'}"
    async with serve(listen=address, store=store) as served:
        await served.stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="kept", agents=[agent("a")]))
    listing = asyncio.ensure_future(cli(None, "runtimes", "--addr", address))
    removing = asyncio.ensure_future(cli(None, "rm", "kept", "--addr", address))
    await asyncio.sleep(1.0)  # away for a while: both commands are refused and retry
    async with serve(listen=address, store=store):
        code, out, err = await listing
        assert (code, err) == (0, ""), out + err
        assert out.split()[:7] == ["runtime", "created", "handles", "running", "suspended", "tokens", "cost"]
        code, out, err = await removing
        assert (code, out, err) == (0, "deleted runtime kept\n", "")


async def test_runtimes_lists_newest_first_and_rm_deletes(scripted: RunningServer, stub: pb_grpc.AgentRuntimeAsyncStub) -> None:
    for runtime_id in ("older", "newer"):
        code, _, err = await cli(scripted, "run", str(AGENTS), "--runtime-id", runtime_id, "--prompt", "hi")
        assert (code, err) == (0, "")
    slow = pb.AgentDef(name="slow", description="thinks", script=pb.Script(replies=[pb.ScriptedReply(text="done")]))
    slow.script.replies[0].delay.FromSeconds(30)
    await stub.CreateRuntime(pb.CreateRuntimeRequest(runtime_id="busy", agents=[slow]))
    handle = (await stub.Spawn(pb.SpawnRequest(runtime_id="busy", parent_id="root", agent="slow"))).handle_id
    await stub.Wake(pb.WakeRequest(runtime_id="busy", handle_id=handle, prompt="go"))

    code, out, err = await cli(scripted, "runtimes")
    assert (code, err) == (0, ""), out + err
    header, *rows = out.splitlines()
    assert header.split() == ["runtime", "created", "handles", "running", "suspended", "tokens", "cost"]
    table = {row.split()[0]: row.split() for row in rows}
    assert list(table) == ["busy", "newer", "older"]  # newest first
    spent = {r.runtime_id: r.total_tokens for r in (await stub.ListRuntimes(pb.ListRuntimesRequest())).runtimes}
    # [1:3]: the created date and time; no price table: nothing priced
    assert table["older"][3:] == table["newer"][3:] == ["3", "0", "0", str(spent["older"]), "unpriced"]
    assert spent["older"] == spent["newer"] > 0
    assert table["busy"][3:6] == ["1", "1", "0"]
    assert table["older"][1].count("-") == 2 and table["older"][2].endswith("Z")

    code, out, _ = await cli(scripted, "runtimes", "--json")
    assert code == 0 and [r["runtime_id"] for r in json.loads(out)["runtimes"]] == ["busy", "newer", "older"]

    code, out, err = await cli(scripted, "rm", "older")
    assert (code, out, err) == (0, "deleted runtime older\n", "")
    code, _, err = await cli(scripted, "ls", "older")
    assert code == 2 and err.startswith("error: NOT_FOUND:")

    code, out, err = await cli(scripted, "rm", "busy")  # a handle is running: refused without --force
    assert (code, out) == (2, "") and err.startswith("error: FAILED_PRECONDITION:"), err
    code, out, err = await cli(scripted, "rm", "busy", "--force")
    assert (code, out, err) == (0, "deleted runtime busy\n", "")

    code, out, _ = await cli(scripted, "runtimes")
    assert code == 0 and [row.split()[0] for row in out.splitlines()[1:]] == ["newer"]


async def test_cert_and_key_go_together(scripted: RunningServer, tmp_path: Path) -> None:
    code, out, err = await cli(scripted, "runtimes", "--cert", str(tmp_path / "client.pem"))
    assert (code, out, err) == (2, "", "error: --cert and --key go together (mTLS): give both, or neither\n")
    code, _, err = await cli(scripted, "runtimes", "--ca", str(tmp_path / "ca.pem"))
    assert (code, err) == (2, f"error: cannot read --ca {tmp_path / 'ca.pem'}: No such file or directory\n")


async def test_runtimes_over_mtls_with_a_token(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server_cert, client_cert = ca.issue_cert("localhost", "127.0.0.1"), ca.issue_cert("cli")
    files = {
        "ca.pem": ca.cert_pem.bytes(),
        "server.pem": server_cert.cert_chain_pems[0].bytes(),
        "server.key": server_cert.private_key_pem.bytes(),
        "client.pem": client_cert.cert_chain_pems[0].bytes(),
        "client.key": client_cert.private_key_pem.bytes(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    token = "cli-test-token"
    entry = {"tenant": "acme", "token_sha256": hashlib.sha256(token.encode()).hexdigest(), "scopes": ["read"], "name": "cli"}
    (tmp_path / "tokens.json").write_text(json.dumps([entry]))
    security: dict[str, Any] = {
        "tls_cert": str(tmp_path / "server.pem"),
        "tls_key": str(tmp_path / "server.key"),
        "tls_client_ca": str(tmp_path / "ca.pem"),
        "auth": "tokens",
        "auth_tokens_file": str(tmp_path / "tokens.json"),
    }
    async with serve(**security) as served:
        addr = ["--addr", f"localhost:{served.port}", "--ca", str(tmp_path / "ca.pem")]
        mtls = ["--cert", str(tmp_path / "client.pem"), "--key", str(tmp_path / "client.key")]
        code, out, err = await cli(None, "runtimes", *addr, *mtls, "--token", token)
        headers = ["runtime", "created", "handles", "running", "suspended", "tokens", "cost"]
        assert (code, out.split(), err) == (0, headers, "")

        code, _, err = await cli(None, "runtimes", *addr, *mtls)
        assert code == 2 and err.startswith("error: UNAUTHENTICATED:"), err
        code, _, err = await cli(None, "rm", "any", *addr, *mtls, "--token", token)  # a read token
        assert code == 2 and err.startswith("error: PERMISSION_DENIED:"), err
        code, _, err = await cli(None, "runtimes", *addr, "--token", token, "--retry-window", "0")  # no client certificate
        assert code == 2 and err.startswith("error: UNAVAILABLE:"), err


async def test_connection_options_may_come_before_the_command(scripted: RunningServer) -> None:
    code, _, err = await cli(scripted, "run", str(AGENTS), "--runtime-id", "early", "--prompt", "hi")
    assert (code, err) == (0, "")
    address = f"127.0.0.1:{scripted.port}"
    code, out, err = await cli(None, "--addr", address, "runtimes")  # no AGENTRUNTIME_ADDR: only the flag
    assert (code, err) == (0, ""), out + err
    assert "early" in out
    code, out, err = await cli(None, "--addr=" + address, "--tls", "--retry-window", "0", "runtimes")  # the handshake fails
    assert code == 2 and "UNAVAILABLE" in err
    assert command_first(["--addr", "h:1", "--tls", "ls", "rt"]) == ["ls", "--addr", "h:1", "--tls", "rt"]
    assert command_first(["--retry-window", "0", "ls", "rt"]) == ["ls", "--retry-window", "0", "rt"]
    assert command_first(["ls", "rt", "--addr", "h:1"]) == ["ls", "rt", "--addr", "h:1"]
    assert command_first(["--addr", "h:1"]) == ["--addr", "h:1"]  # no command: argparse says so


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_the_server_runs_on_the_event_loop_its_settings_name(
    loop: str, model: ScriptedModelServer, tools: ToolServer, tmp_path: Path
) -> None:
    """uvloop by default; AGENTRUNTIME_EVENT_LOOP=asyncio for the standard library's. Either way
    a model call and an http tool call go through, and the start-up line says which loop it is."""

    def script(body: dict[str, Any]) -> Reply:
        if not tool_results(body):
            return Reply(calls=[("ping", {})], tokens=3)
        return Reply(text=f"on {loop}: {body['messages'][-1]['content']}", tokens=4)

    model.script("looper", script)
    env = {} if loop == "uvloop" else {"AGENTRUNTIME_EVENT_LOOP": "asyncio"}
    server = ServerProcess(tmp_path / "store.db", model.base_url, tmp_path / "server.log", env)
    stub = await server.start()
    try:
        runtime_id = await create(stub, agent("looper", tools=[http_tool("ping", tools.url("ping"))]))
        _, result = await run(stub, runtime_id, "looper", "go")
        assert (result.status, result.text, result.total_tokens) == (pb.STATUS_DONE, f"on {loop}: ping ok #1", 7)
    finally:
        await server.stop(signal.SIGTERM)
    assert f"event loop: {loop})" in (tmp_path / "server.log").read_text()


HOSTILE = "done\x1b]0;owned\x07\x1b[2J\x9b31m"


async def test_the_cli_prints_no_terminal_control_from_model_text(tmp_path: Path) -> None:
    scripted = pb.AgentDef(name="echo", description="says it", script=pb.Script(replies=[pb.ScriptedReply(text=HOSTILE)]))
    agents = tmp_path / "agents.json"
    agents.write_text(json_format.MessageToJson(pb.CreateRuntimeRequest(runtime_id="hostile", agents=[scripted])))
    async with serve() as served:
        code, ran, _ = await cli(served.running, "run", str(agents), "--runtime-id", "hostile", "--prompt", "go")
        assert code == 0, ran
        _, shown, _ = await cli(served.running, "transcript", "hostile", "root/echo.1")
    for out in (ran, shown):
        assert "owned" in out  # the text is shown, its control characters escaped
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, out


STREAMED = "Streaming lets a person read an answer\nwhile the model is still writing it."


def streaming_file(tmp_path: Path, pause: float) -> Path:
    """A runtime file whose one agent's scripted reply streams in pieces of 8 characters."""
    reply = pb.ScriptedReply(text=STREAMED, tokens=19, stream_chunk_chars=8, stream_pause=duration(pause))
    writer = pb.AgentDef(name="writer", description="writes", script=pb.Script(replies=[reply]))
    path = tmp_path / "writer.json"
    path.write_text(json_format.MessageToJson(pb.CreateRuntimeRequest(runtime_id="writer", agents=[writer])))
    return path


async def test_run_prints_the_handles_text_as_it_streams(scripted: RunningServer, tmp_path: Path) -> None:
    code, out, err = await cli(scripted, "run", str(streaming_file(tmp_path, 0.01)), "--prompt", "write it")
    assert (code, err) == (0, ""), out + err
    lines = out.splitlines()
    started = next(i for i, line in enumerate(lines) if line.endswith("root/writer.1 turn 1 started"))
    # The pieces, printed as they came, make the reply's lines; the next event starts a line of its own.
    assert lines[started + 1 : started + 3] == STREAMED.splitlines()
    assert lines[started + 3].endswith("root/writer.1 turn 1 ended: 19 tokens (own 19, total 19)")
    # The result block as before, the whole text in it.
    assert block(out, "result")["status"] == "DONE"
    first, second = STREAMED.splitlines()
    assert out.endswith(f"text          {first}\n              {second}\n")


async def test_run_marks_a_turn_run_again_after_a_crash_and_prints_it_anew(process: ServerProcess, tmp_path: Path) -> None:
    await process.start()
    # Five seconds of pieces: the crash comes in the middle, and the turn run again still streams
    # when the CLI's Watch is back (its reconnects wait 1 s, then 2 s: on a loaded machine the
    # first can find the server still starting).
    path = streaming_file(tmp_path, 0.5)
    running = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentruntime.cli", "run", str(path), "--prompt", "write it",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
        env={**_env(None), "AGENTRUNTIME_ADDR": process.address},
    )  # fmt: skip
    assert running.stdout is not None
    seen = b""
    while b"Streaming lets" not in seen:
        seen += await asyncio.wait_for(running.stdout.read(4096), timeout=30)
    await process.stop(signal.SIGKILL)
    await process.restart()  # the turn begun before the crash runs again: a reset, then its pieces
    rest, err = await asyncio.wait_for(running.communicate(), timeout=60)
    out = (seen + rest).decode()
    assert (running.returncode, err.decode()) == (0, ""), out
    before, marker, after = out.partition("\n[running the turn again]\n")
    assert marker, out
    assert "Streaming lets" in before and STREAMED in after
    assert block(out, "result")["status"] == "DONE"


async def test_run_marks_a_provider_call_cut_mid_stream_and_prints_the_retry(model: ScriptedModelServer, tmp_path: Path) -> None:
    attempts: list[int] = []

    def script(body: dict[str, Any]) -> Reply:
        attempts.append(1)  # the first call is cut after its fifth event; the second is whole
        cut = 5 if len(attempts) == 1 else None
        return Reply(text=STREAMED, tokens=30, streamed=Streamed(chunk=8, pause=0.02, cut_after=cut))

    model.script("writer", script)
    path = tmp_path / "writer.json"
    writer = pb.AgentDef(name="writer", description="writes", model="writer")
    path.write_text(json_format.MessageToJson(pb.CreateRuntimeRequest(runtime_id="writer", agents=[writer])))
    async with serve(llm_style="openai", llm_base_url=model.base_url, llm_api_key="sk-test", llm_backoff_base=0.01) as served:
        code, out, err = await cli(served.running, "run", str(path), "--prompt", "write it")
    assert (code, err) == (0, ""), out + err
    before, marker, after = out.partition("\n[retrying]\n")
    assert marker and len(attempts) == 2, out
    # What came before the cut, the marker on a line of its own, then the whole reply from its start.
    assert "turn 1 started\nStreaming lets a person" in before and after.startswith(STREAMED + "\n#"), out


# ---- fork and replay -----------------------------------------------------------------------------


def definitions_file(tmp_path: Path, name: str, *agents: pb.AgentDef) -> Path:
    """A runtime file (`run`'s format) holding `agents`: what `--definitions` reads."""
    path = tmp_path / name
    path.write_text(json_format.MessageToJson(pb.CreateRuntimeRequest(agents=agents)))
    return path


def scripted_agent(name: str, *replies: pb.ScriptedReply) -> pb.AgentDef:
    return pb.AgentDef(name=name, description=f"the {name} agent", script=pb.Script(replies=replies))


class StandIn(pb_grpc.AgentRuntimeServicer):
    """ForkRuntime and ReplayRuntime answered as a test says, each request kept: what the CLI
    sends and how it shows the answers, whatever the server makes of them."""

    def __init__(self, replays: dict[str, pb.ReplayRuntimeResponse]) -> None:
        self.replays = replays
        self.forks: list[pb.ForkRuntimeRequest] = []
        self.replayed: list[pb.ReplayRuntimeRequest] = []

    async def ForkRuntime(self, request: pb.ForkRuntimeRequest, context: Any) -> pb.ForkRuntimeResponse:
        self.forks.append(request)
        held = ["root/a.1", "root/b.1"] if request.at_seq < 5 else []
        return pb.ForkRuntimeResponse(
            runtime_id=request.runtime_id or "rt-fork", fork_seq=request.at_seq + 1, held_handle_ids=held
        )

    async def ReplayRuntime(self, request: pb.ReplayRuntimeRequest, context: Any) -> pb.ReplayRuntimeResponse:
        self.replayed.append(request)
        return self.replays[request.source_runtime_id]


@pytest.fixture
async def stand_in() -> AsyncIterator[tuple[StandIn, str]]:
    def result(status: pb.Status.ValueType, turns: int, tokens: int, micros: int = 0) -> pb.TaskResult:
        cost = pb.Cost(micros=micros, currency="USD", priced=True) if micros else pb.Cost()
        return pb.TaskResult(status=status, turns=turns, total_tokens=tokens, total_cost=cost)

    same = pb.ReplayDiff(handle_id="root/a.1", recorded=result(pb.STATUS_DONE, 2, 30), replayed=result(pb.STATUS_DONE, 2, 30))
    text = pb.ReplayDiff(
        handle_id="root/a.2",
        recorded=result(pb.STATUS_DONE, 2, 30, 1500),
        replayed=result(pb.STATUS_DONE, 2, 32, 1700),
        changed=["total_tokens", "cost", "text"],
    )
    broke = pb.ReplayDiff(
        handle_id="root/a.1",
        recorded=result(pb.STATUS_DONE, 2, 30),
        replayed=result(pb.STATUS_ERROR, 1, 20),
        changed=["status", "turns", "total_tokens"],
    )
    replays = {
        "calm": pb.ReplayRuntimeResponse(runtime_id="calm-replay", diffs=[same, text], settled=True, changed_count=1),
        "broken": pb.ReplayRuntimeResponse(runtime_id="broken-replay", diffs=[broke], settled=True, changed_count=1),
    }
    servicer = StandIn(replays)  # type: ignore[abstract]
    server = grpc.aio.server()
    pb_grpc.add_AgentRuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_replay_prints_a_row_per_root_and_exits_1_only_when_a_status_changed(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    servicer, address = stand_in
    definitions = definitions_file(tmp_path, "new.json", scripted_agent("a", pb.ScriptedReply(text="better")))
    code, out, err = await cli(None, "replay", "calm", "--definitions", str(definitions), "--addr", address)
    assert (code, err) == (0, ""), out + err
    header, *rows = out.splitlines()
    assert header.split() == ["runtime", "handle", "status", "turns", "tokens", "cost", "changed"]
    assert rows[0].split() == ["calm", "root/a.1", "DONE", "2", "30", "unpriced", "-"]
    assert rows[1].split() == ["calm", "root/a.2", "DONE", "2", "30→32", "0.0015", "USD→0.0017", "USD", "total_tokens,cost,text"]
    assert rows[2] == "calm: replayed as calm-replay, 1 of 2 roots changed"
    [request] = servicer.replayed
    assert [agent.name for agent in request.agents] == ["a"] and request.agents[0].script.replies[0].text == "better"
    assert request.unrecorded_calls == pb.UNRECORDED_CALLS_RECORDED_ONLY and request.request_id

    # Two runtimes, one of whose roots ends otherwise: exit 1, for CI.
    args = ["replay", "calm", "broken", "--definitions", str(definitions), "--unrecorded", "live", "--addr", address]
    code, out, err = await cli(None, *args)
    assert (code, err) == (1, ""), out + err
    table = [line.split() for line in out.splitlines()]
    assert ["broken", "root/a.1", "DONE→ERROR", "2→1", "30→20", "unpriced", "status,turns,total_tokens"] in table
    assert out.splitlines()[-1] == "a status changed"
    assert [r.unrecorded_calls for r in servicer.replayed[1:]] == [pb.UNRECORDED_CALLS_LIVE] * 2

    code, out, _ = await cli(None, "replay", "broken", "--definitions", str(definitions), "--json", "--addr", address)
    assert code == 1 and json.loads(out)["diffs"][0]["changed"] == ["status", "turns", "total_tokens"]

    code, _, err = await cli(None, "replay", "calm", "--addr", address)  # the definitions are required
    assert code == 2 and "--definitions" in err
    code, _, err = await cli(
        None, "replay", "calm", "--definitions", str(definitions), "--unrecorded", "maybe", "--addr", address
    )
    assert code == 2 and "invalid choice: 'maybe'" in err
    code, _, err = await cli(None, "replay", "calm", "--definitions", str(tmp_path / "none.json"), "--addr", address)
    assert (code, err) == (2, f"error: cannot read {tmp_path / 'none.json'}: No such file or directory\n")


async def test_fork_prints_the_fork_its_cut_and_its_held_handles(stand_in: tuple[StandIn, str], tmp_path: Path) -> None:
    servicer, address = stand_in
    code, out, err = await cli(None, "fork", "src", "--at", "3", "--addr", address)
    assert (code, err) == (0, ""), out + err
    rows = block("--- fork\n" + out, "fork")
    assert (rows["runtime"], rows["forked from"], rows["fork seq"], rows["held"]) == ("rt-fork", "src", "4", "root/a.1")
    assert "root/b.1" in out.splitlines()[4]  # the second held handle, on a line of its own
    definitions = definitions_file(tmp_path, "new.json", scripted_agent("a", pb.ScriptedReply(text="other")))
    code, out, err = await cli(
        None, "fork", "src", "--at", "9", "--definitions", str(definitions), "--runtime-id", "mine", "--addr", address
    )
    assert (code, err) == (0, ""), out + err
    assert block("--- fork\n" + out, "fork")["held"] == "-"
    first, second = servicer.forks
    assert (first.source_runtime_id, first.at_seq, first.runtime_id, list(first.agents)) == ("src", 3, "", [])
    assert (second.at_seq, second.runtime_id, [a.name for a in second.agents]) == (9, "mine", ["a"])
    assert first.request_id and first.request_id != second.request_id

    code, out, _ = await cli(None, "fork", "src", "--at", "3", "--json", "--addr", address)
    assert code == 0 and json.loads(out) == {
        "runtime_id": "rt-fork",
        "fork_seq": "4",
        "held_handle_ids": ["root/a.1", "root/b.1"],
    }
    code, _, err = await cli(None, "fork", "src", "--addr", address)
    assert code == 2 and "--at" in err
    code, _, err = await cli(None, "fork", "src", "--at", "0", "--addr", address)
    assert (code, err) == (2, "error: --at is an event's seq: 1 or more\n")
    assert len(servicer.forks) == 3  # nothing sent for the refused arguments


async def test_fork_and_replay_against_the_server(
    scripted: RunningServer, stub: pb_grpc.AgentRuntimeAsyncStub, tmp_path: Path
) -> None:
    """A recorded run forked at its model call (held, then continued with other definitions) and
    replayed: with its own definitions nothing changes (exit 0); with a provider that fails, the
    status does (exit 1)."""
    recorded = definitions_file(tmp_path, "recorded.json", scripted_agent("a", pb.ScriptedReply(text="first", tokens=5)))
    code, out, err = await cli(scripted, "run", str(recorded), "--runtime-id", "rec", "--prompt", "go")
    assert (code, err) == (0, ""), out + err
    # #1 spawned, #2 RUNNING, #3 turn 1 started, #4 turn 1 ended, #5 result, #6 IDLE
    assert "#3 root/a.1 turn 1 started" in out

    other = definitions_file(tmp_path, "other.json", scripted_agent("a", pb.ScriptedReply(text="second", tokens=7)))
    code, out, err = await cli(scripted, "fork", "rec", "--at", "3", "--definitions", str(other), "--runtime-id", "rec-f")
    assert (code, err) == (0, ""), out + err
    rows = block("--- fork\n" + out, "fork")
    assert (rows["runtime"], rows["forked from"], rows["fork seq"], rows["held"]) == ("rec-f", "rec", "3", "root/a.1")
    code, out, _ = await cli(scripted, "ls", "rec-f")
    assert code == 0 and out.splitlines()[1].split()[:3] == ["root/a.1", "a", "HELD"]
    await stub.Wake(pb.WakeRequest(runtime_id="rec-f", handle_id="root/a.1"))
    waited = await stub.Wait(pb.WaitRequest(runtime_id="rec-f", handle_id="root/a.1"))
    assert (waited.result.status, waited.result.text, waited.result.total_tokens) == (pb.STATUS_DONE, "second", 7)
    code, out, _ = await cli(scripted, "runtimes", "--forks-of", "rec")
    assert code == 0 and [row.split()[0] for row in out.splitlines()[1:]] == ["rec-f"]

    code, out, err = await cli(scripted, "replay", "rec", "--definitions", str(recorded))
    assert (code, err) == (0, ""), out + err
    _, row, summary = out.splitlines()
    assert row.split() == ["rec", "root/a.1", "DONE", "1", "5", "unpriced", "-"]
    assert summary.startswith("rec: replayed as ") and summary.endswith(", 0 of 1 roots changed")

    failing = pb.ScriptedReply(text="", stop=pb.SCRIPTED_STOP_PROVIDER_UNAVAILABLE)
    broken = definitions_file(tmp_path, "broken.json", scripted_agent("a", failing))
    code, out, err = await cli(scripted, "replay", "rec", "--definitions", str(broken))
    assert (code, err) == (1, ""), out + err
    cells = out.splitlines()[1].split()
    assert cells[:3] == ["rec", "root/a.1", "DONE→ERROR"] and "status" in cells[-1].split(",")
