"""make flake-hunt: the Python suite several times in a row, then the e2e folder more times,
stopping at nothing, and which tests failed in which run.

    scripts/flake_hunt.py --suite tests --suite-runs 5 --e2e tests/e2e --e2e-runs 10

Each run is `pytest -q` with a JUnit XML report of its own; the runs' logs and reports stay
in build/flake-hunt/ (a run that left no report, the run stopped by a test still hung after
its timeout, is listed with the end of its log). Exits 1 when any test failed in any run."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    kind: str  # "suite" or "e2e"
    number: int
    paths: list[str]
    seconds: float = 0.0
    exit_code: int = 0
    tests: int = 0
    failed: list[str] = field(default_factory=list)
    report_missing: bool = False
    log: Path = Path()

    @property
    def label(self) -> str:
        return f"{self.kind} run {self.number}"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def node_id(case: ElementTree.Element) -> str:
    """The pytest node id of a JUnit test case (xunit1 reports carry its file)."""
    file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    if not file.endswith(".py"):
        return f"{classname}::{name}"
    module = file.removesuffix(".py").replace("/", ".")
    classes = classname.removeprefix(module).strip(".")
    return "::".join([file, *filter(None, classes.split(".")), name])


def read_report(report: Path) -> tuple[int, list[str]]:
    """How many tests the report holds, and the ids of those that failed or errored."""
    cases = ElementTree.parse(report).getroot().iter("testcase")
    tests, failed = 0, []
    for case in cases:
        tests += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(node_id(case))
    return tests, list(dict.fromkeys(failed))  # a failed test whose teardown errored too: once


def run_once(run: Run, out: Path, pytest_args: list[str]) -> None:
    stem = f"{run.kind}-{run.number}"
    report, run.log = out / f"{stem}.xml", out / f"{stem}.log"
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-o", "junit_family=xunit1"]
    command += [f"--junitxml={report}", *pytest_args, *run.paths]
    print(f"== {run.label}: {' '.join(run.paths)}", flush=True)
    started = time.monotonic()
    with run.log.open("wb") as log:
        run.exit_code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    run.seconds = time.monotonic() - started
    if report.exists():
        run.tests, run.failed = read_report(report)
    else:
        run.report_missing = True
    state = "no report (stopped?)" if run.report_missing else f"{run.tests} tests, {len(run.failed)} failed"
    print(f"   {state}, exit {run.exit_code}, {run.seconds:.0f} s; log {shown(run.log)}", flush=True)
    for test in run.failed:
        print(f"   FAILED {test}", flush=True)


def summary(runs: list[Run]) -> int:
    failures: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        for test in run.failed:
            failures[test].append(run)
    totals = {kind: sum(1 for run in runs if run.kind == kind) for kind in ("suite", "e2e")}
    print(f"\nflake hunt: {totals['suite']} suite run(s), {totals['e2e']} e2e run(s)")
    for test, failed_in in sorted(failures.items()):
        by_kind = defaultdict(list)
        for run in failed_in:
            by_kind[run.kind].append(str(run.number))
        where = "; ".join(
            f"{kind} runs {', '.join(numbers)} ({len(numbers)} of {totals[kind]})" for kind, numbers in by_kind.items()
        )
        print(f"  {test}: failed in {where}")
    stopped = [run for run in runs if run.report_missing or (run.exit_code not in (0, 1) and not run.failed)]
    for run in stopped:
        tail = run.log.read_text(errors="replace").splitlines()[-15:]
        print(f"  {run.label} ended with exit {run.exit_code} and no failed test reported; its log ends:")
        print("\n".join(f"    {line}" for line in tail))
    if not failures and not stopped:
        print(f"  no test failed in {len(runs)} run(s)")
        return 0
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", nargs="*", default=["tests"], help="what the suite runs are (pytest paths)")
    parser.add_argument("--suite-runs", type=int, default=5)
    parser.add_argument("--e2e", nargs="*", default=["tests/e2e"], help="what the e2e runs are (pytest paths)")
    parser.add_argument("--e2e-runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "flake-hunt")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in [*args.out.glob("*.xml"), *args.out.glob("*.log")]:
        stale.unlink()
    runs = [Run("suite", n, args.suite) for n in range(1, args.suite_runs + 1)]
    runs += [Run("e2e", n, args.e2e) for n in range(1, args.e2e_runs + 1)]
    for run in runs:
        run_once(run, args.out, args.pytest_args)
    return summary(runs)


if __name__ == "__main__":
    sys.exit(main())
