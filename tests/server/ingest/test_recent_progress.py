"""When the server recomputes a job's ETA: often enough to be right, rarely enough to be cheap."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from stepwatch.protocol import Identity, Progress, Report
from stepwatch.server.ingest.recent_progress import (
    ESTIMATE_EVERY_S,
    HORIZON_S,
    YOUNG_S,
    YOUNG_SAMPLES,
    RecentProgress,
    estimate_due,
    estimate_for_report,
    estimate_from_samples,
)
from stepwatch.server.store import Job, ProgressSample, SQLiteStore

NOW = 10_000.0
OLD = dataclasses.replace(
    Job(id=1, namespace="ns", name="j", attempt=1, state="running", created_at=0.0, updated_at=NOW),
    started_at=NOW - 3600,
    step=500,
    total_steps=1000,
    eta_seconds=100.0,
    eta_rate=5.0,
    eta_at=NOW - 2,
)


@pytest.mark.parametrize(
    ("changes", "step", "due"),
    [
        ({}, 510, False),  # known, fresh: counted down by the views
        ({"eta_at": NOW - ESTIMATE_EVERY_S}, 510, True),  # stale
        ({"eta_at": None}, 510, True),  # never estimated
        ({"state": "pending"}, 510, True),  # first report
        ({"started_at": NOW - YOUNG_S / 2}, 510, True),  # young job: every report at the default pace...
        ({"started_at": NOW - YOUNG_S / 2, "eta_at": NOW - 1}, 510, True),  # ...and every one that moved
        ({"started_at": NOW - YOUNG_S / 2, "eta_at": NOW - 1}, 500, False),  # heartbeats of a burst do not
        ({"started_at": NOW - YOUNG_S / 2, "eta_at": NOW - 0.5}, 510, False),  # back to back: not every report
        ({"started_at": NOW - YOUNG_S / 2, "samples": YOUNG_SAMPLES}, 510, False),  # young, long history: not
        ({"eta_rate": None}, 510, True),  # incomplete and the step moved
        ({"eta_rate": None}, 500, False),  # incomplete but stalled: heartbeats do not pay for it
        ({"eta_seconds": None}, 510, True),  # total known, ETA not yet
        ({"eta_seconds": None, "total_steps": None}, 510, False),  # no total: no ETA to wait for
    ],
)
def test_estimate_due(changes: dict[str, object], step: int, due: bool) -> None:
    changes = dict(changes)
    samples = int(changes.pop("samples", 0))  # type: ignore[call-overload]
    assert estimate_due(dataclasses.replace(OLD, **changes), NOW, step, samples) is due


def test_recent_progress_keeps_a_horizon_spaced_samples_and_bounded_jobs() -> None:
    recent = RecentProgress(horizon_s=100.0, min_gap_s=2.0, max_jobs=2)
    recent.add(1, ProgressSample(0.0, 0))  # not kept yet: the first estimate loads the job
    assert 1 not in recent and recent.samples(1, 0.0) is None
    recent.load(1, [ProgressSample(t, int(t) * 10) for t in (0.0, 2.0, 4.0)])
    for tenth in range(41, 600):  # a reporter every 0.1 s for a minute
        recent.add(1, ProgressSample(tenth / 10, tenth))
    kept = recent.samples(1, 0.0)
    assert kept is not None and kept[-1] == (59.9, 599)  # the newest is always there
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(kept[:-1])]
    assert min(gaps) >= 2.0 - 0.1 - 1e-6 and len(kept) <= 60 / 1.9 + 2  # min_gap apart, less one report interval
    recent.add(1, ProgressSample(30.0, 5))  # out of order: ignored
    assert recent.samples(1, 0.0) == kept
    for t in range(60, 400, 2):
        recent.add(1, ProgressSample(float(t), t * 10))
    old = recent.samples(1, 0.0)
    assert old is not None and old[0][0] >= 398 - 100 - 2 * 64 - 2  # trimmed to the horizon, in chunks
    assert recent.samples(1, 300.0) == [s for s in old if s[0] >= 300.0]
    recent.load(2, [])
    recent.load(3, [])  # the third job evicts the least recently reported one
    assert 1 not in recent and 2 in recent and 3 in recent and len(recent) == 2
    recent.forget(3)
    assert 3 not in recent and recent.count(3) == 0


def test_the_estimate_from_memory_equals_the_estimate_from_the_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "eta.db")
    try:
        job = store.register("ns", "a", token_hash="h", now=0.0, total_steps=100_000)
        recent = RecentProgress()
        recent.load(job.id, [])
        step, now = 0, 0.0
        for seq in range(1, 1200):  # 40 minutes at one report every 2 s, an eval pause every 5 minutes
            now += 2.0
            step += 0 if seq % 150 < 10 else 20
            report = Report(
                run_id="r", seq=seq, sent_at=now, identity=Identity(), progress=Progress(step=step, total_steps=100_000)
            )
            result = store.ingest_report(job, report, now)
            assert result.sample is not None
            recent.add(job.id, result.sample)
        job = result.job
        from_store = estimate_for_report(store, job, step + 20, now + 2.0)
        kept = recent.samples(job.id, now + 2.0 - HORIZON_S)
        assert kept is not None
        assert estimate_from_samples(job, kept, step + 20, now + 2.0) == pytest.approx(from_store)
        assert from_store[0] is not None and from_store[1] is not None
    finally:
        store.close()


def test_recent_progress_keeps_when_each_step_was_first_reached() -> None:
    recent = RecentProgress(min_gap_s=2.0)
    recent.load(1, [])
    # a fast reporter (every 50 ms) whose step moves every 100 ms: heartbeats in between
    for k in range(7):
        t = k / 20
        recent.add(1, ProgressSample(t, 1000 + 100 * (k // 2)))
    kept = recent.samples(1, 0.0)
    assert kept is not None
    assert (0.0, 1000) in kept and (0.1, 1100) in kept  # the first arrivals the rate is measured from
    assert kept[-1] == (0.3, 1300)
    # the estimate from them: about 1,000 steps/s, not 100 steps in the last 50 ms
    job = dataclasses.replace(OLD, total_steps=10_000)
    eta, rate = estimate_from_samples(job, kept, 1300, 0.3)
    assert rate is not None and 500 < rate < 2_000 and eta is not None
