"""The cyclic garbage collector, tuned for a long-running server.

CPython's defaults (a young collection every 700 net allocations of container objects)
suit short scripts. A server holds every live runtime's handles and transcripts, and each
turn makes and drops thousands of short-lived frames, futures and dicts: with the defaults,
objects that would die a moment later are traced and promoted, and the older generations
are traced again and again. Measured under the bench workload (C = 20, no model latency,
alternating runs; docs/performance.md): 13-19 % of the server's CPU was `gc_collect_main`
and its visitors, and these thresholds take 12-14 % off the CPU per model turn (209 against
242 µs with 1,200 roots' handles in memory). Cycles are still collected, in larger batches."""

from __future__ import annotations

import gc

# Young collections after 50,000 net allocations; the middle and old generations after 20
# collections of the one below (CPython also waits until an old collection would trace 25 %
# more objects than the last one did).
THRESHOLDS = (50_000, 20, 20)


def tune_for_serving() -> None:
    """Call once the server is built: what start-up made (modules, the gRPC server, the
    settings) is collected once and then left out of every later collection."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
