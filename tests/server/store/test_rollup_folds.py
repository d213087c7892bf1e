"""Roll-up folds at ingest, as cheap as they can be and the same rows as ever: level-1 rows merged in one call
of the bucket arithmetic are those merged a group at a time, on random series with non-finite values, steps
that go back, and windows without a finite value (both stores fold with the same code)."""

from __future__ import annotations

import math
import random
from itertools import pairwise
from typing import Any

import pytest

from stepwatch.server.store import rollups
from stepwatch.server.store.rollups import FANOUT
from stepwatch.server.store.rows import load_float, store_float

pytestmark = pytest.mark.both_stores


def random_windows(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    """``step, t, last, min, max, mean, count, nonfinite`` rows as ``points`` stores them: a NaN ``last`` as
    the text 'NaN', a window of only non-finite values without min, max or mean, steps that sometimes go back."""
    rows: list[tuple[Any, ...]] = []
    step = rng.randint(0, 100)
    for i in range(n):
        step += rng.choice((1, 1, 1, 5, -3)) if rng.random() < 0.2 else 1
        count = rng.randint(1, 40)
        kind = rng.random()
        if kind < 0.05:  # only non-finite values
            rows.append((step, 100.0 + i, store_float(rng.choice((math.nan, math.inf, -math.inf))), None, None, None,
                         count, count))  # fmt: skip
            continue
        nonfinite = rng.randint(1, count - 1) if kind < 0.15 and count > 1 else 0
        low = rng.uniform(-5, 5) * (1e306 if kind > 0.97 else 1)  # some sums overflow
        high = low + abs(rng.gauss(0, 1))
        last = rng.choice((math.nan, math.inf, high)) if nonfinite else rng.uniform(low, high)
        rows.append((step, 100.0 + i, store_float(last), low, high, (low + high) / 2, count, nonfinite))
    return rows


def one_group_at_a_time(windows: list[tuple[Any, ...]], groups: int) -> list[tuple[Any, ...]]:
    """The level-1 rows as folds wrote them before: one bucket-arithmetic call a group."""
    return [rollups._merge(windows[g * FANOUT : (g + 1) * FANOUT], None, None) for g in range(groups)]


@pytest.mark.parametrize("seed", range(40))
def test_groups_merged_at_once_are_the_groups_merged_one_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    groups = rng.randint(1, 40)
    windows = random_windows(rng, groups * FANOUT)
    assert repr(rollups._merge_groups(windows, groups)) == repr(one_group_at_a_time(windows, groups))


def test_a_fold_writes_the_rows_a_fold_a_group_at_a_time_wrote(store: Any, database: Any) -> None:
    job = store.register("ns", "fold", token_hash="h", now=0.0)
    rng = random.Random(3)
    windows = random_windows(rng, 40 * FANOUT + 7)
    database.executemany(
        "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
        "VALUES (?, 'loss', ?, ?, ?, ?, ?, ?, ?, ?)",
        [(job.id, *w) for w in windows],
    )
    assert store.rebuild_rollups(job.id) == 40 * FANOUT
    rows = database.execute(
        "SELECT first_step, step, t, last, min, max, mean, count, nonfinite, windows, ordered FROM rollups "
        "WHERE job_id = ? AND level = 1 ORDER BY last_rowid",
        (job.id,),
    )
    expected = [
        (*merged, all(a[0] <= b[0] for a, b in pairwise(windows[g * FANOUT : (g + 1) * FANOUT])))
        for g, merged in enumerate(one_group_at_a_time(windows, 40))
    ]

    def cells(row: tuple[Any, ...]) -> tuple[Any, ...]:  # NaN as the text both databases give back alike
        last = rows_last(row[3])
        return (*row[:3], last, *row[4:10], bool(row[10]))

    assert [repr(cells(r)) for r in rows] == [repr(cells(e)) for e in expected]
    assert any(not r[10] for r in rows) and any(r[10] for r in rows)  # steps went back in some groups only


def rows_last(value: Any) -> str:
    """A stored ``last`` as text (SQLite keeps a NaN as 'NaN', PostgreSQL as its own NaN)."""
    return repr(load_float(value))
