"""The collector off across a fork of the test process.

Every test runs on uvloop, which starts a child process by fork, then exec. Between the two
the child runs Python: the interpreter's after-fork hooks (threading's among them). A
collection there may finalize a gRPC object of the parent's, whose finalizer joins a thread
the child does not have, or touches its completion queue: the child hangs for ever before its
exec, or dies of SIGSEGV (both seen: a replica of tests/e2e/test_replicas.py that never
started, one of test_failover_invisible.py that "exited -11 after 0.0 s"). With the collector
off from just before each fork until the fork returns in the parent, the child never collects
before it execs, and the parent collects as before."""

from __future__ import annotations

import gc
import os
import threading

_was_enabled = threading.local()


def _before() -> None:
    _was_enabled.value = gc.isenabled()
    gc.disable()


def _after_in_parent() -> None:
    if getattr(_was_enabled, "value", True):
        gc.enable()


def keep_the_collector_out_of_forks() -> None:
    """Once per process (the registration cannot be undone)."""
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent)
