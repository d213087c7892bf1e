"""Roll-ups of long series: a history read touches O(max_points) rows and shows what every window shows
(on SQLite and on PostgreSQL: both stores keep them with the same code)."""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import legacy_schemas
import pytest

from stepwatch.protocol import Report
from stepwatch.server.store import PendingReport, SQLiteStore, Store
from stepwatch.server.store.migrations import SCHEMA_VERSION
from stepwatch.server.store.rollups import FANOUT
from stepwatch.server.views.history import downsampled

pytestmark = pytest.mark.both_stores


def values(n: int, seed: int = 7) -> list[float]:
    """A noisy decaying loss with a spike, a NaN and an infinity somewhere in it."""
    rng = random.Random(seed)
    out = [1.0 / (1 + i / 500) + rng.gauss(0, 0.01) for i in range(n)]
    out[n // 3], out[n // 2], out[2 * n // 3] = 50.0, math.nan, math.inf
    return out


def insert_raw(database: Any, job_id: int, series: list[float], metric: str = "loss") -> None:
    """Windows written without the store (older data, another tool): no roll-ups for them."""
    database.executemany(
        "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
        [(job_id, metric, i + 1, 1000.0 + 2 * i, *_cells(v)) for i, v in enumerate(series)],
    )


def _cells(v: float) -> tuple[Any, ...]:
    if math.isfinite(v):
        return (v, v, v, v, 0)
    return ("NaN" if math.isnan(v) else v, None, None, None, 1)


def summary(points: list[dict[str, Any]]) -> tuple[Any, ...]:
    """What a chart relies on: windows and values covered, extremes, non-finite marks, the end."""
    return (
        sum(p["windows"] for p in points),
        sum(p["count"] for p in points),
        max(p["max"] for p in points if p["max"] is not None),
        min(p["min"] for p in points if p["min"] is not None),
        sum(p["nonfinite"] for p in points),
        sorted(str(p["last"]) for p in points if isinstance(p["last"], str)),
        points[-1]["step"],
    )


@pytest.mark.slow
def test_ingest_keeps_roll_ups_and_a_read_of_a_long_series_reads_few_rows(
    store: Store, database: Any, report: Callable[..., Report]
) -> None:
    job = store.register("ns", "long", token_hash="h", now=0.0)
    series = values(20_000)
    batch = [PendingReport(job, report(i + 1, i + 1, {"loss": v}), 10.0 + i) for i, v in enumerate(series)]
    for start in range(0, len(batch), 500):
        store.ingest_reports(batch[start : start + 500])
    [(folded,)] = database.execute("SELECT SUM(windows) FROM rollups WHERE job_id = ? AND level = 1", (job.id,))
    # folded at ingest: every window but those since the store's last fold (it folds every _FOLD_EVERY windows)
    assert len(series) - store._FOLD_EVERY <= folded <= len(series)  # type: ignore[attr-defined]
    columns = store.history_columns(job.id, "loss", max_points=100)
    assert columns.windows is not None and sum(columns.windows) == len(series)
    assert 50 <= len(columns.steps) <= 32 * 100  # roll-up rows and a short tail, not 20,000 windows
    fast = downsampled(columns, 100)
    exact = downsampled(store.series_columns(job.id, "loss"), 100)
    assert len(fast) <= 100 and [p["step"] for p in fast] == sorted(p["step"] for p in fast)
    assert summary(fast) == summary(exact)
    assert math.isnan(fast[-1]["mean"] or 0) is False
    # a short read asks for every window: they come back as they are
    full = downsampled(store.history_columns(job.id, "loss", max_points=20_000), 20_000)
    assert len(full) == 20_000 and full == downsampled(store.series_columns(job.id, "loss"), 20_000)


def test_windows_stored_by_other_means_are_folded_by_the_first_read(store: Store, database: Any) -> None:
    job = store.register("ns", "old", token_hash="h", now=0.0)
    series = values(50_000, seed=3)
    insert_raw(database, job.id, series)
    first = downsampled(store.history_columns(job.id, "loss", max_points=200), 200)
    [(rows,)] = database.execute("SELECT COUNT(*) FROM rollups WHERE job_id = ? AND level = 1", (job.id,))
    assert rows == len(series) // FANOUT
    again = downsampled(store.history_columns(job.id, "loss", max_points=200), 200)
    assert first == again
    assert summary(again) == summary(downsampled(store.series_columns(job.id, "loss"), 200))


def test_a_series_whose_steps_go_back_is_read_in_step_order(store: Any, database: Any) -> None:
    job = store.register("ns", "reset", token_hash="h", now=0.0)
    insert_raw(database, job.id, values(10_000))
    # the step counter restarted half-way
    database.execute("UPDATE points SET step = step - 5000 WHERE job_id = ? AND step > 5000", (job.id,))
    store.rebuild_rollups(job.id)
    read = downsampled(store.history_columns(job.id, "loss", max_points=100), 100)
    exact = downsampled(store.series_columns(job.id, "loss"), 100)
    assert read == exact  # the roll-ups (arrival order) could not serve it: every window was read


def test_level_two_serves_very_long_series(store: Any, database: Any) -> None:
    job = store.register("ns", "year", token_hash="h", now=0.0)
    n = FANOUT * FANOUT * 5 + 123  # 20,603 windows: 321 level-1 rows, five level-2 rows
    insert_raw(database, job.id, values(n, seed=11))
    assert store.rebuild_rollups() == n - n % FANOUT
    levels = dict(database.execute("SELECT level, COUNT(*) FROM rollups GROUP BY level"))
    assert levels == {1: n // FANOUT, 2: 5}
    columns = store.history_columns(job.id, "loss", max_points=10)  # level 2 has >= 10 // 2 rows
    assert columns.windows is not None and sum(columns.windows) == n
    assert len(columns.steps) == 5 + (n // FANOUT - 5 * FANOUT) + n % FANOUT  # 5 + 1 + 59 rows
    assert summary(downsampled(columns, 10)) == summary(downsampled(store.series_columns(job.id, "loss"), 10))


def test_an_older_database_is_upgraded_and_its_history_kept(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(f"BEGIN; {legacy_schemas.SQLITE[1]} PRAGMA user_version = 1; COMMIT;")
        conn.execute(
            "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at) "
            "VALUES ('ns', 'a', 1, 'h', 'running', 0, 0)"
        )
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
            "VALUES (1, 'loss', ?, ?, ?, ?, ?, ?, 1, ?)",
            [(i + 1, 1000.0 + 2 * i, *_cells(v)) for i, v in enumerate(values(40_000))],
        )
    store = SQLiteStore(path)
    try:
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        read = downsampled(store.history_columns(1, "loss", max_points=100), 100)
        assert summary(read) == summary(downsampled(store.series_columns(1, "loss"), 100))
        assert store.metric_names(1) == ["loss"]
    finally:
        store.close()


@pytest.mark.parametrize("metrics", [["loss"], ["a", "b/c", "eval_loss", "z"]])
def test_metric_names_skip_through_the_index(store: Store, database: Any, metrics: list[str]) -> None:
    job = store.register("ns", "m", token_hash="h", now=0.0)
    for name in metrics:
        insert_raw(database, job.id, [1.0, 2.0, 3.0], metric=name)
    other = store.register("ns", "n", token_hash="h", now=0.0)
    insert_raw(database, other.id, [1.0], metric="other")
    assert store.metric_names(job.id) == sorted(metrics)
    assert store.metric_names(12345) == []


def test_windows_out_of_step_order_are_put_in_place_by_opening_the_rows_in_the_way(store: Any, database: Any) -> None:
    job = store.register("ns", "late", token_hash="h", now=0.0)
    series = values(100_000, seed=5)
    database.execute(  # the job's first report was for step 57,000 (a resumed run)
        "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
        "VALUES (?, 'loss', 57000, 1.0, 123.0, 123.0, 123.0, 123.0, 1, 0)",
        (job.id,),
    )
    insert_raw(database, job.id, series)
    database.execute(  # and a late window, stored after everything else
        "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
        "VALUES (?, 'loss', 31234, 9e9, -5.0, -5.0, -5.0, -5.0, 1, 0)",
        (job.id,),
    )
    store.rebuild_rollups(job.id)
    columns = store.history_columns(job.id, "loss", max_points=100)
    assert columns.windows is not None and sum(columns.windows) == len(series) + 2
    assert len(columns.steps) < 3_200  # roll-ups, two of them opened: not 100,002 windows
    assert columns.steps == sorted(columns.steps)
    fast = downsampled(columns, 100)
    exact = downsampled(store.series_columns(job.id, "loss"), 100)
    assert summary(fast) == summary(exact)
    assert max(p["max"] for p in fast if p["max"] is not None) == 123.0 and min(p["min"] for p in fast) == -5.0
