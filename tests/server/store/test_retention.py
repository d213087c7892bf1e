"""Retention: raw windows compacted into roll-ups by age and by namespace quota, with nothing a chart
shows lost (spikes, NaN, infinities, the last value), on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.protocol import Report
from stepwatch.server.settings import ServerSettings
from stepwatch.server.store import PendingReport, Store, retention
from stepwatch.server.store.retention_task import compact_now
from stepwatch.server.store.rollups import FANOUT, compacted_floor
from stepwatch.server.views.history import downsampled
from stepwatch.testing import wait_for

pytestmark = pytest.mark.both_stores


def values(n: int, seed: int = 5) -> list[float]:
    """A noisy decaying loss with a spike, a NaN and an infinity early on (where compaction reaches),
    in different level-2 rows (256 windows): within one row, two non-finite ``last`` are one mark."""
    rng = random.Random(seed)
    out = [1.0 / (1 + i / 500) + rng.gauss(0, 0.01) for i in range(n)]
    out[n // 5], out[n // 7], out[n // 3] = 50.0, math.nan, -math.inf
    return out


def fill(store: Store, report: Callable[..., Report], namespace: str, name: str, n: int, t0: float = 10.0) -> int:
    """A job with ``n`` reports of ``loss``, the i-th received at ``t0 + i``; its id."""
    job = store.register(namespace, name, token_hash="h", now=t0 - 1)
    batch = [PendingReport(job, report(i + 1, i + 1, {"loss": v}), t0 + i) for i, v in enumerate(values(n))]
    for start in range(0, n, 500):
        store.ingest_reports(batch[start : start + 500])
    return job.id


def chart(store: Store, job_id: int, max_points: int) -> tuple[Any, ...]:
    """What a chart of the series shows: windows and values covered, extremes, non-finite marks, the end."""
    points = downsampled(store.history_columns(job_id, "loss", max_points), max_points)
    return (
        sum(p["windows"] for p in points),
        sum(p["count"] for p in points),
        max(p["max"] for p in points if p["max"] is not None),
        min(p["min"] for p in points if p["min"] is not None),
        sum(p["nonfinite"] for p in points),
        sorted(str(p["last"]) for p in points if isinstance(p["last"], str)),
        points[-1]["step"],
        points[-1]["last"],
    )


def raw(database: Any, job_id: int) -> int:
    [(n,)] = database.execute("SELECT COUNT(*) FROM points WHERE job_id = ?", (job_id,))
    return int(n)


def test_compaction_by_age_keeps_what_charts_show(
    store: Store, database: Any, report: Callable[..., Report], monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 6000
    job_id = fill(store, report, "ns", "old", n)
    before = {m: chart(store, job_id, m) for m in (50, 300, 2000)}
    assert before[300][2] == 50.0 and before[300][4] == 2  # the spike, the NaN and -inf are there to keep
    assert compacted_floor(_conn(database), job_id, "loss") == 0

    early = store.compact(before=10.5)  # the job is older, none of its roll-ups: no window to compact
    assert early.windows == early.rollups == 0
    done = store.compact(before=10.0 + 4000)  # windows received in the first 4,000 s
    assert done.windows >= 4000 - 2 * FANOUT and done.series == 1 and not done.more
    assert raw(database, job_id) <= n - 4000 + 2 * FANOUT
    assert done.reports >= 3990  # progress reports of that time go too
    for m, shown in before.items():
        assert chart(store, job_id, m) == shown, m

    done = store.compact(before=math.inf)  # everything folded; a short series keeps its level-1 rows
    assert done.windows > 0 and done.rollups == 0
    for m, shown in before.items():
        assert chart(store, job_id, m) == shown, m
    monkeypatch.setattr(retention, "LONG_SERIES", 2)  # as a long series: level-1 rows under level 2 go too
    done = store.compact(before=math.inf)
    assert done.rollups > 0
    assert raw(database, job_id) <= FANOUT  # only what ingest has not folded yet (and the newest window)
    for m, shown in before.items():
        assert chart(store, job_id, m) == shown, m
    assert store.compact(before=math.inf).deleted == 0  # nothing left: a pass is idempotent
    assert store.metric_names(job_id) == ["loss"]  # the newest window stays raw: the metric stays listed


def test_ingest_after_compaction_and_rebuild_keep_the_whole_history(
    store: Store, database: Any, report: Callable[..., Report]
) -> None:
    job_id = fill(store, report, "ns", "resumed", 3000)
    store.compact(before=math.inf)
    job = store.job_by_id(job_id)
    assert job is not None
    more = [PendingReport(job, report(3001 + i, 3001 + i, {"loss": 0.25}), 5000.0 + i) for i in range(700)]
    store.ingest_reports(more)
    shown = chart(store, job_id, 200)
    assert shown[0] == 3700 and shown[2] == 50.0 and shown[4] == 2 and shown[6] == 3700
    store.rebuild_rollups()  # a compacted series' roll-ups are its only copy: kept
    assert chart(store, job_id, 200) == shown


def test_a_namespace_over_its_quota_has_its_oldest_windows_compacted(
    store: Store, database: Any, report: Callable[..., Report]
) -> None:
    first = fill(store, report, "team-a", "first", 2000, t0=10.0)
    second = fill(store, report, "team-a", "second", 2000, t0=5000.0)
    other = fill(store, report, "team-b", "other", 2000)
    shown = {j: chart(store, j, 100) for j in (first, second, other)}
    done = store.compact(before=None, quotas={"team-a": 2500})
    assert done.namespaces_over_quota == ["team-a"]
    assert raw(database, first) < 2000 and raw(database, second) == 2000  # the oldest job first
    assert raw(database, first) + raw(database, second) <= 2500 + FANOUT
    assert raw(database, other) == 2000  # another namespace is left alone
    assert {j: chart(store, j, 100) for j in shown} == shown
    done = store.compact(before=None, quotas={"*": 1000})  # "*": every namespace
    assert sorted(done.namespaces_over_quota) == ["team-a", "team-b"]
    assert {j: chart(store, j, 100) for j in shown} == shown


def test_passes_are_bounded_and_run_until_done(store: Store, database: Any, report: Callable[..., Report]) -> None:
    job_id = fill(store, report, "ns", "big", 3000)
    shown = chart(store, job_id, 100)
    one = store.compact(before=math.inf, budget=500)
    assert one.more and one.deleted <= 500
    total = asyncio.run(compact_now(store, asyncio.to_thread, now=1e9, retention_days=1.0, quotas=None, pause_s=0))
    assert not total.more and total.windows + one.windows >= 3000 - 2 * FANOUT
    assert chart(store, job_id, 100) == shown


def test_retention_settings_are_parsed_and_refused_by_name() -> None:
    s = ServerSettings.resolve(
        {}, {"STEPWATCH_RETENTION_DAYS": "30", "STEPWATCH_QUOTA_POINTS": '{"nlp": 1000, "*": 50}'}
    )
    assert s.retention_days == 30.0 and s.quota_points == {"nlp": 1000, "*": 50}
    assert ServerSettings.resolve({}, {"STEPWATCH_QUOTA_POINTS": "2000000"}).quota_points == {"*": 2_000_000}
    assert ServerSettings.resolve({}, {}).retention_days is None  # default: keep every window
    for name, bad in (("STEPWATCH_RETENTION_DAYS", "0"), ("STEPWATCH_QUOTA_POINTS", '{"a": -1}')):
        with pytest.raises(ValueError, match=name):
            ServerSettings.resolve({}, {name: bad})


class _conn:
    """The test database as a ``?`` connection for the retention helpers."""

    def __init__(self, database: Any) -> None:
        self.database = database

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        rows = self.database.execute(sql, parameters)

        class Cursor(list[Any]):
            def fetchone(self) -> Any:
                return self[0] if self else None

            def fetchall(self) -> list[Any]:
                return list(self)

        return Cursor(rows)


def test_the_server_applies_retention_in_the_background(
    store: Store, database: Any, report: Callable[..., Report]
) -> None:
    from starlette.testclient import TestClient

    from stepwatch.server.app import create_app

    job_id = fill(store, report, "ns", "aged", 2000)
    shown = chart(store, job_id, 100)
    settings = ServerSettings(retention_days=1.0, retention_sweep_s=0.05)
    with TestClient(create_app(settings, store=store, clock=lambda: 1e9)):
        wait_for(lambda: raw(database, job_id) <= FANOUT, 20, "retention to compact the points")
    assert raw(database, job_id) <= FANOUT
    assert chart(store, job_id, 100) == shown
