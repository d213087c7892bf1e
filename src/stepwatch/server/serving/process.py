"""Settings of the serving Python process that keep ingest latency flat under load.

CPython's cyclic garbage collector, with its defaults (700, 10, 10), ran a full collection every 2-4 s
under ``benchmarks/server_ingest.py``'s load (about 1,000 reports/s on 2 cores) and stopped
everything, the event loop and the store's writer thread, for 22-30 ms each time; a third or more of
what it walked were the modules, classes and functions loaded at start, which never die. Those are
moved out of its sight (``gc.freeze()``), and the youngest generation is collected after 10,000 net
allocations instead of 700, so a full collection comes about once a minute and walks only what the
server made since it started. Measured in the same benchmark: full collections 79 -> 1 a run, the
event loop's lag p99 50 ms -> 3 ms and its worst 90 ms -> 10-23 ms, time in the collector 4.2 s ->
1.5 s. Nothing leaks for it: objects without reference cycles are freed at once as always, and
cycles are still collected, less often.
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "tune_for_serving"]

GC_THRESHOLDS = (10_000, 10, 10)
"""Net allocations before a collection of the youngest generation; collections of each generation
before one of the next (CPython's defaults: 700, 10, 10)."""


def tune_for_serving() -> None:
    """Apply the collector's settings to this process; call once, with the app built, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
