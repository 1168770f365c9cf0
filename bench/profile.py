"""Where the server's CPU goes under the bench workload: py-spy samples the server process
while bench/workload.py drives it, and this prints the samples grouped by component.

    make profile                      # C=20, no model latency, 15 s of samples
    .venv/bin/python bench/profile.py --latency 0.02 --raw /tmp/server.txt
    .venv/bin/python bench/profile.py --per-root --defaults    # a runtime per root, default logs and metrics

Below the components, the samples are summed by part of a model turn (the parts of
docs/performance.md#by-part) and scaled to the CPU per turn measured in the same run.

Each sample is counted once, for the frame it was taken in (self time): the server's own
modules by package, the HTTP client (http/ and httptools), the event loop
(asyncio, selectors, and C work run from a loop callback: a task step, a gRPC completion;
on uvloop, the loop's own C work is counted under asyncio's Runner.run, the frame it runs
below), gRPC's poller thread, and everything else by top-level module. `--raw` keeps
py-spy's collapsed stacks (one line per stack and its count) for a flame graph tool.
`--native` samples C frames too: the cyclic garbage collector, which runs inside whatever
Python frame allocated, then shows as a component of its own (13-19 % of the CPU before
it was tuned: process/collector.py), as do system calls and SQLite; idle threads show as waiting
in epoll.

py-spy counts a thread blocked in C code as busy, so the poller thread's share of samples
is not its share of CPU; the CPU each thread used while sampling, read from
/proc/<pid>/task, is printed below the samples, and is the figure to quote.
py-spy attaches with ptrace: it needs root or CAP_SYS_PTRACE. Measured, never asserted."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from workload import service_run

_FILE = re.compile(r"\((?P<file>[^()]+):\d+\)$")
_HTTP_CLIENT = ("httptools",)
_EVENT_LOOP = ("asyncio", "selectors.py")


_LIBRARY = re.compile(r"\((?P<library>[^()/]+\.so[^()]*)\)$")
_NATIVE = {"libc": "C library (system calls: write, sendmsg, pwrite...)", "libsqlite3": "SQLite", "cygrpc": "gRPC core"}


def component(frames: list[str]) -> str:
    """The component a sample's innermost frame belongs to."""
    if not frames:
        return "no Python frame (C code: gRPC core, SQLite, the interpreter)"
    leaf = frames[-1]
    # With --native: C frames too. The collector runs inside whatever frame allocated, so
    # it is found anywhere in the stack; a thread waiting in epoll is idle, not working.
    if any(frame.startswith("gc_collect") for frame in frames):
        return "cyclic garbage collector (native)"
    if leaf.startswith(("epoll_wait ", "epoll_pwait ")):
        return "waiting in epoll: idle (native)"
    library = _LIBRARY.search(leaf)
    if library:
        name = library.group("library").split(".")[0]
        return f"{_NATIVE.get(name, name)} (native)"
    if leaf.startswith("Thread.run ") and len(frames) <= 3:
        return "gRPC poller thread (a C target under threading)"
    if leaf.startswith("Handle._run "):
        return "event loop: C work in a callback (task steps, gRPC completions)"
    match = _FILE.search(leaf)
    path = re.sub(r"^.*site-packages/", "", match.group("file")) if match else leaf
    if path.endswith((".c", ".h", ".pyx", ".pxd", ".pxi")):  # --native: C code with its source known
        return f"{path.split('/')[0]} (native)"
    if path.startswith("agentruntime_server/http/"):
        return "HTTP client (http/, httptools)"
    if path.startswith("agentruntime_server/"):
        parts = path.split("/")
        return f"server: {parts[1] if len(parts) > 2 else parts[1].removesuffix('.py')}"
    top = path.split("/")[0]
    if top in _HTTP_CLIENT:
        return "HTTP client (http/, httptools)"
    if top in _EVENT_LOOP:
        return "event loop (asyncio, selectors)"
    return f"other: {top.removesuffix('.py')}"


# What a model turn pays for, as the issue of record names it (#43): a sample within a CreateRuntime
# call is that call's, wherever it runs; any other belongs to the first of _PARTS its stack meets,
# from the innermost frame out.
_CREATE_RUNTIME = ("CreateRuntime (definitions checked, tools compiled, the runtime written)", re.compile(r"\.CreateRuntime "))
_PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("logs and metrics", re.compile(r"\(logging/|\(prometheus_client/|agentruntime_server/observability/(metrics|logs)")),
    ("HTTP client (http/, httptools)", re.compile(r"agentruntime_server/http/|\(httptools/")),
    ("provider: request body, reply parsing (providers/)", re.compile(r"agentruntime_server/providers/")),
    ("journal: encoding, appending, committing (store/)", re.compile(r"agentruntime_server/store/")),
    ("journal: steps recorded and applied (domain/journal/)", re.compile(r"agentruntime_server/domain/journal/")),
    ("tool calls (tools/, the tool phase)", re.compile(r"agentruntime_server/tools/|domain/runs/tool_phase")),
    ("gRPC handling (api/, interceptors, grpc.aio)", re.compile(r"agentruntime_server/(api|observability)/|\(grpc/")),
    ("turn loop's bookkeeping (domain/: budgets, quotas, usage, events, runs)", re.compile(r"agentruntime_server/domain/")),
    ("the server's process (process/: collector, checker processes)", re.compile(r"agentruntime_server/process/")),
)


def part(frames: list[str]) -> str:
    """The part of a model turn's cost a sample is counted in (_PARTS), else where it ran."""
    name, pattern = _CREATE_RUNTIME
    if any(pattern.search(frame) for frame in frames):
        return name
    for frame in reversed(frames):
        if frame.startswith("Runner.run "):
            break  # the frames below it start the server, they do not run a turn
        for name, pattern in _PARTS:
            if pattern.search(frame):
                return name
    if frames and frames[-1].startswith("Runner.run "):
        return "event loop: uvloop's C work (sockets, task steps, gRPC completions)"
    return component(frames)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread of `pid`, by thread id."""
    seconds: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        seconds[tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def print_thread_split(pid: int, before: dict[str, float], after: dict[str, float]) -> None:
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    total = sum(used.values())
    if total <= 0:
        return
    main = used.get(str(pid), 0.0)
    print(
        f"CPU by thread while sampling (/proc): the event loop's thread {main / total:.1%}, "
        f"the {len(used) - 1} others {(total - main) / total:.1%}"
    )


def summarize(raw: Path, lines: int, cpu_per_turn: float | None = None) -> None:
    by_component: collections.Counter[str] = collections.Counter()
    by_part: collections.Counter[str] = collections.Counter()
    own_lines: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [frame for frame in stack.split(";") if frame]
        by_component[component(frames)] += samples
        by_part[part(frames)] += samples
        if frames and "agentruntime_server/" in frames[-1]:
            own_lines[re.sub(r"\(.*agentruntime_server/", "(", frames[-1])] += samples
    if not total:
        print("py-spy recorded no samples")
        return
    print(f"{total:,} samples of the server process")
    for name, samples in by_component.most_common():
        print(f"  {samples / total:6.1%}  {name}")
    scale = f", µs of a model turn's {cpu_per_turn:.0f} µs" if cpu_per_turn else ""
    print(f"by part of a model turn (share of samples{scale}):")
    for name, samples in by_part.most_common():
        share = samples / total
        print(f"  {share:6.1%}  {share * cpu_per_turn:5.0f} µs  {name}" if cpu_per_turn else f"  {share:6.1%}  {name}")
    print(f"the server's own lines, top {lines} (self time):")
    for name, samples in own_lines.most_common(lines):
        print(f"  {samples / total:6.1%}  {name}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.0, help="model latency, seconds")
    parser.add_argument("--seconds", type=int, default=15, help="how long py-spy samples")
    parser.add_argument("--rate", type=int, default=200, help="samples a second")
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--lines", type=int, default=15)
    parser.add_argument(
        "--per-root", action="store_true", help="a runtime per root (CreateRuntime each root), as ../shared/bench-floor measures"
    )
    parser.add_argument("--defaults", action="store_true", help="the server's default logs (INFO) and metrics (on)")
    parser.add_argument(
        "--native",
        action="store_true",
        help="sample C frames too (the process is paused at each sample): shows the garbage collector, "
        "system calls and SQLite, which Python frames alone attribute to whatever frame ran them",
    )
    args = parser.parse_args()
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed (it is in the server's dev extra: make install)")
    with tempfile.TemporaryDirectory() as folder:
        raw = args.raw or Path(folder) / "stacks.txt"
        recorders: list[subprocess.Popen[bytes]] = []
        split: list[tuple[int, dict[str, float], dict[str, float]]] = []

        def measure_threads(pid: int) -> None:
            before = thread_cpu(pid)
            time.sleep(args.seconds)
            split.append((pid, before, thread_cpu(pid)))

        def record(pid: int) -> None:
            threading.Thread(target=measure_threads, args=(pid,), daemon=True).start()
            # --nonblocking: the server is never paused, so it runs as it does unprofiled.
            command = [spy, "record", "-p", str(pid), "-d", str(args.seconds), "-r", str(args.rate)]
            # --native unwinds C frames too, which needs the process paused at each sample.
            command += ["-f", "raw", "-o", str(raw), "--native" if args.native else "--nonblocking"]
            recorders.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

        # A warm-up batch and a measured one, each long enough (about 1,800 turns a second
        # at 18 a root) that the workload outlasts the sampling; all in one runtime, 5 handles
        # a root, past the default limit of handles a runtime may have.
        roots = args.seconds * 100
        os.environ["AGENTRUNTIME_MAX_HANDLES"] = str(2 * roots * 5 + 100)
        figures = await service_run(
            args.concurrency, args.latency, roots, 1, on_server=record, per_root=args.per_root, quiet=not args.defaults
        )
        for recorder in recorders:
            _, errors = recorder.communicate()
            if recorder.returncode != 0:
                raise SystemExit(f"py-spy failed: {errors.decode(errors='replace').strip()}")
        print(
            f"C={args.concurrency}, model latency {args.latency * 1000:.0f} ms: {figures['turns_per_s']:,.0f} turns/s, "
            f"{figures['cpu_us_per_turn']:.0f} µs of server CPU per turn (under the profiler)"
        )
        summarize(raw, args.lines, figures["cpu_us_per_turn"])
        for pid, before, after in split:
            print_thread_split(pid, before, after)


if __name__ == "__main__":
    asyncio.run(main())
