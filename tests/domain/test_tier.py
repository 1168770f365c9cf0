"""The fast tier is fast because it starts nothing: collecting it (the root conftest, the
harness) imports no gRPC, no HTTP client and no part of the server's edge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_fast_tier_imports_no_grpc_no_http_and_no_server_edge() -> None:
    helpers = sorted(path.stem for path in (ROOT / "tests" / "domain").glob("*.py") if not path.stem.startswith("test_"))
    probe = (
        "import importlib, sys, tests.conftest\n"
        f"for name in {helpers!r}: importlib.import_module('tests.domain.' + name)\n"
        "heavy = ('grpc', 'aiohttp', 'httpx', 'agentruntime_server.app', 'agentruntime_server.api', 'agentruntime.v1')\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in heavy or name in heavy))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout
