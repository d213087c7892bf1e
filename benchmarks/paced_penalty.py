"""What the same Python work costs this machine when it comes spread out rather than back to back.

A server at a fleet's pace wakes for each report and sleeps between them; back to back it never sleeps. On a
shared virtual machine the first costs more CPU for the same work (caches and the core's state are cold at each
wake-up). This measures that penalty alone, with no stepwatch code: one unit of pure Python work (decoding,
sorting and encoding a small JSON document, about a report's size in work) done back to back, then with a sleep
of ``GAP`` between units, rounds alternated; the thread's CPU per unit, and the ratio to back to back.

    .venv/bin/python benchmarks/paced_penalty.py                # gaps 0.5 ms and 5 ms (about 200 reports/s)
    .venv/bin/python benchmarks/paced_penalty.py --gaps 0.002 --units 2000 --rounds 3

Read it beside ``fleet.py`` and ``ingest_profile.py --interval``: where the server's CPU per report at a fleet's
pace is a few times its figure back to back, this says how much of that the machine adds to any work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

_DOCUMENT = json.dumps({"windows": list(range(50)), "identity": {"rank": 3, "host": "node-" + "x" * 40}, "step": 1.5})


def unit() -> None:
    """One unit of work: ~50-100 us of pure Python on a 2020s core."""
    for _ in range(3):
        doc = json.loads(_DOCUMENT)
        doc["sorted"] = sorted(doc["windows"], reverse=True)
        json.dumps(doc)


def cpu_per_unit(gap: float, units: int) -> float:
    """Thread CPU µs per unit, ``gap`` seconds of sleep between units (``0``: back to back)."""
    start = time.thread_time()
    for _ in range(units):
        unit()
        if gap:
            time.sleep(gap)
    return 1e6 * (time.thread_time() - start) / units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gaps", default="0.0005,0.005", help="sleeps between units, seconds, comma-separated")
    parser.add_argument("--units", type=int, default=2000, help="units a measure")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    gaps = [0.0] + [float(g) for g in opts.gaps.split(",") if g]
    cpu: dict[float, list[float]] = {g: [] for g in gaps}
    for _ in range(opts.rounds):
        for gap in gaps:  # alternated: the machine's load moves between rounds
            cpu[gap].append(cpu_per_unit(gap, opts.units))
    base = statistics.median(cpu[0.0])
    print(f"{'between units':>16}  {'CPU us/unit, median':>20}  {'range':>16}  {'x back to back':>14}")
    for gap in gaps:
        label = "back to back" if gap == 0 else f"{gap * 1000:g} ms"
        figures = cpu[gap]
        low, high = min(figures), max(figures)
        ratio = statistics.median(figures) / base
        print(f"{label:>16}  {statistics.median(figures):>20.1f}  {f'{low:.0f}-{high:.0f}':>16}  {ratio:>14.2f}")


if __name__ == "__main__":
    main()
