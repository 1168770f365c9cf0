"""The test process forks with the collector off in the child (tests/support/forking.py), so
a child uvloop starts runs no collection, and no gRPC finalizer, before its exec."""

from __future__ import annotations

import gc
import os


def test_a_forked_child_starts_with_the_collector_off_and_the_parent_keeps_it_on() -> None:
    assert gc.isenabled()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only what cannot collect, then out
        os.write(write, b"off" if not gc.isenabled() else b"on")
        os._exit(0)
    os.close(write)
    try:
        said = os.read(read, 3)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert said == b"off"
    assert gc.isenabled()
