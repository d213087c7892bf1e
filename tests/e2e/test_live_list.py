"""The job list read live, as a person reads it (issue 30): several real jobs report to a real server while
headless Chromium at 1440 and at 800 px reads the list every 300 ms for 12 s, and counts what a person would
see go wrong:

- a progress bar whose width differs from the percentage printed beside it by more than 3 points (a row
  element reused for another job showed that job's bar, or slid from it);
- the rows changing order while nobody sorts (the default order tied, or followed a key that every report
  changes);
- a cell or a chip cut (its content wider than its box), the "not learning" chip included.

All three counts must be 0. On the list before issue 30 (rows reused by position, sorted by the time of the
last update, bars animated) the same reading found dozens of each at both widths.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from typing import Any

import pytest
from test_dashboard import wait_js
from test_layout import CLIPPED_CELLS

from stepwatch.protocol import Identity, MetricWindow, Progress, Report

pytestmark = pytest.mark.slow

BLOWS_UP = "fraud-detect-b"  # its loss goes to -9.5e34, then NaN (the widest loss a cell must hold)
READ_EVERY_MS = 300
READ_FOR_MS = 12_000

# name, total steps, steps per report (a range), the step it hangs at (None: it keeps going), the step it is
# stopped at (None: it runs on)
JOBS = (
    ("fraud-detect-a", 4000, (10, 30), None, None),
    ("fraud-detect-b", 4000, (10, 30), None, None),
    ("fraud-hangs", 2000, (5, 15), 199, None),
    ("tiny-cnn", 900, (3, 9), None, None),
    ("bert-sweep-3", 1000, (30, 50), None, 684),  # ends at 68.4 % while the list is read
    ("llama-lora", 10_000, (20, 60), None, None),
)

# every reading: the rows in the order shown, and for each the bar's drawn width against its printed percent
READ = """
() => [...document.querySelectorAll('table.jobs tbody tr[data-key]')].map((tr) => {
  const bar = tr.querySelector('.c-progress .bar');
  const fill = bar.querySelector('.fill');
  const track = bar.getBoundingClientRect().width;
  const text = tr.querySelector('.c-progress .pct').textContent;
  return {key: tr.dataset.key, drawn: track ? 100 * fill.getBoundingClientRect().width / track : null,
          printed: parseFloat(text), text};
})
"""

# the widest chips a list cell must hold, measured in the list's own cells: each health label is put in a
# row's health badges (the wide screen's health column, the one under the state on a narrow screen), each
# job state in its state badge, and measured
WIDEST_CHIPS = """
() => {
  const cut = [];
  const health = ['not learning', 'straggling', 'diverging', 'unknown', 'stalled', 'healthy'];
  const states = ['pending', 'running', 'finished', 'failed', 'stopped'];
  for (const badge of document.querySelectorAll('tr[data-key] td.c-health .badge, tr[data-key] td.c-state .badge')) {
    if (badge.offsetParent === null || getComputedStyle(badge).display === 'none') continue;
    const td = badge.closest('td');
    const before = badge.textContent;
    const labels = td.classList.contains('c-health') || badge.classList.contains('sub') ? health : states;
    for (const label of labels) {
      badge.textContent = label;
      const a = badge.getBoundingClientRect();
      const b = td.getBoundingClientRect();
      if (badge.scrollWidth > badge.clientWidth || a.right > b.right + 0.5 || td.scrollWidth > td.clientWidth)
        cut.push(`${td.className}: '${label}' ${a.right.toFixed(1)} > ${b.right.toFixed(1)}`);
    }
    badge.textContent = before;
  }
  return cut;
}
"""


class Feed:
    """The jobs' report loops, in a thread: each job reports every 0.25-0.5 s, as the report core would."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.rng = random.Random(30)
        self.steps = {name: 0 for name, *_ in JOBS}
        for name, total, *_ in JOBS:
            fleet.register(name, "team-x", total_steps=total, gpus=1, gpu_hour_cost=2.0)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            ended: set[str] = set()
            while not self.stop.is_set():
                for name, total, (lo, hi), hang, stop_at in JOBS:
                    if name in ended:
                        continue
                    step = self.steps[name]
                    if hang is not None and step >= hang:
                        step = hang  # it hangs: no progress, no report (a stalled job)
                        continue
                    step = min(total, step + self.rng.randint(lo, hi))
                    if hang is not None:
                        step = min(step, hang)
                    if stop_at is not None and step >= stop_at:
                        step = stop_at
                    self.steps[name] = step
                    loss = [2.0 / (1 + step / 100) + self.rng.gauss(0, 0.05) for _ in range(4)]
                    if name == BLOWS_UP and step > total // 40:  # as the demo's diverging run: 1e34, then NaN
                        loss = [-9.479744285347731e34] * 4 if step < total // 8 else [-9.479744285347731e34, math.nan]
                    state = "stopped" if stop_at is not None and step >= stop_at else "running"
                    self._report(name, step, total, loss, state)
                    if state != "running":
                        ended.add(name)
                self.stop.wait(self.rng.uniform(0.25, 0.5))
        except BaseException as exc:  # the test reports it
            self.errors.append(exc)

    def _report(self, name: str, step: int, total: int, loss: list[float], state: str) -> None:
        # the report core's report, with epochs (16 of them, as the demo's runs: "2.95 / 16" in the list)
        key = ("team-x", name)
        seq = self.fleet.seqs[key] = self.fleet.seqs.get(key, 0) + 1
        report = Report(
            run_id=f"run-{name}",
            seq=seq,
            sent_at=time.time(),
            identity=Identity(rank=0, world_size=1, host="node-1", pid=4242),
            progress=Progress(step=step, total_steps=total, epoch=16.0 * step / total, total_epochs=16.0),
            metrics=(loss_window(loss, step),),
            state=state,  # type: ignore[arg-type]
        )
        response = self.fleet.http.post(
            f"/api/v1/namespaces/team-x/jobs/{name}/reports",
            json=report.to_dict(),
            headers={"Authorization": f"Bearer {self.fleet.tokens[key]}"},
        )
        assert response.status_code == 200, response.text

    def __enter__(self) -> Feed:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def loss_window(values: list[float], step: int) -> MetricWindow:
    """A report's window of ``loss`` values (NaN counted apart, as the report core counts it)."""
    finite = [v for v in values if math.isfinite(v)]
    return MetricWindow(
        name="loss",
        last=values[-1],
        min=min(finite) if finite else None,
        max=max(finite) if finite else None,
        mean=sum(finite) / len(finite) if finite else None,
        count=len(values),
        nonfinite=len(values) - len(finite),
        first_step=step,
        last_step=step,
    )


def reorders(readings: list[list[dict[str, Any]]]) -> list[str]:
    """Each time two consecutive readings show the rows they share in a different order."""
    moved = []
    for i, (a, b) in enumerate(itertools.pairwise(readings)):
        keys_b = {r["key"] for r in b}
        keys_a = {r["key"] for r in a}
        order_a = [r["key"] for r in a if r["key"] in keys_b]
        order_b = [r["key"] for r in b if r["key"] in keys_a]
        if order_a != order_b:
            moved.append(f"reading {i + 1}: {order_a} -> {order_b}")
    return moved


def mismatched_bars(readings: list[list[dict[str, Any]]]) -> list[str]:
    """Each bar, in each reading, drawn more than 3 points away from the percentage printed beside it."""
    bad = []
    for i, reading in enumerate(readings):
        for row in reading:
            printed = row["printed"]
            if row["drawn"] is None or printed is None or math.isnan(printed):  # no bar, or no percentage ("—")
                continue
            if abs(row["drawn"] - printed) > 3:
                bad.append(f"reading {i}: {row['key']} bar at {row['drawn']:.1f}% beside {row['text']!r}")
    return bad


def read_live(page: Any, url: str) -> tuple[list[list[dict[str, Any]]], list[str]]:
    """Open the list and read it every 300 ms for 12 s (a :class:`Feed` running): the readings, and every cut
    cell or chip seen. ``benchmarks/dashboard_live.py`` takes the same reading of an earlier revision."""
    page.goto(url + "/")
    wait_js(page, f"return document.querySelectorAll('tr[data-key]').length === {len(JOBS)};")
    readings: list[list[dict[str, Any]]] = []
    clipped: list[str] = []
    deadline = time.monotonic() + READ_FOR_MS / 1000
    while time.monotonic() < deadline:
        tick = time.monotonic()
        readings.append(page.evaluate(READ))
        clipped += page.evaluate(CLIPPED_CELLS)
        page.wait_for_timeout(max(0.0, READ_EVERY_MS - 1000 * (time.monotonic() - tick)))
    clipped += page.evaluate(WIDEST_CHIPS)
    return readings, clipped


@pytest.mark.parametrize("width", (1440, 800))
def test_the_live_list_keeps_bars_order_and_chips_true(page: Any, fleet: Any, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    with Feed(fleet) as feed:
        time.sleep(1.0)  # every job has reported
        readings, clipped = read_live(page, fleet.url)
        progressed = dict(feed.steps)
    assert not feed.errors, feed.errors
    # the reading saw a live list: jobs moved on (the bars changed), one hung, one ended
    assert len(readings) >= 15, len(readings)  # about 35 (fewer on a busy machine)
    first = {r["key"]: r["printed"] for r in readings[0]}
    last = {r["key"]: r["printed"] for r in readings[-1]}
    assert sum(last[k] > first[k] for k in first) >= 3, (first, last)
    assert progressed["fraud-hangs"] == 199 and progressed["bert-sweep-3"] == 684
    assert "68.4%" in page.locator("tr[data-key='team-x/bert-sweep-3']").inner_text()

    bars, moved = mismatched_bars(readings), reorders(readings)
    counts = {"mismatched bars": len(bars), "unasked reorders": len(moved), "clipped cells": len(clipped)}
    print(f"{width} px, {len(readings)} readings: {counts}")  # the figures, for the table (pytest -s)
    assert counts == dict.fromkeys(counts, 0), (counts, bars[:5], moved[:5], clipped[:5])
