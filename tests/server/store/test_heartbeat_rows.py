"""A heartbeat leaves its job's row as it is while the row heard a report less than
``job_updates.HEARTBEAT_LAG_S`` ago (issue 31: seven reports in eight of a fleet are heartbeats), on
SQLite and on PostgreSQL; anything that changes the job writes, as before, and the row's times lag the
newest report by less than the bound."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.protocol import Report
from stepwatch.server.store import PendingReport, Store
from stepwatch.server.store.base import Job
from stepwatch.server.store.job_updates import HEARTBEAT_LAG_S, report_updates

MakeReport = Callable[..., dict[str, Any]]
pytestmark = pytest.mark.both_stores


def _row(database: Any, job_id: int) -> tuple[Any, ...]:
    """The job's two times as stored, and on PostgreSQL the row's version (a new one at every ``UPDATE``)."""
    version = "xmin::text" if database.backend == "postgres" else "0"
    [row] = database.execute(f"SELECT updated_at, last_report_at, {version} FROM jobs WHERE id = ?", (job_id,))
    return tuple(row)


def _running(store: Store, report: Callable[..., Report], at: float) -> Job:
    job = store.register("ns", "fleet", token_hash="h", now=1.0)
    return store.ingest_report(job, report(1, 5, {"loss": 0.5}, world_size=8, total_steps=100), at).job


def test_a_heartbeat_within_the_bound_leaves_the_row_and_one_after_it_writes(
    store: Store, report: Callable[..., Report], database: Any
) -> None:
    job = _running(store, report, 20.0)
    written = _row(database, job.id)
    assert written[:2] == (20.0, 20.0)
    seq = 1
    for rank, at in ((1, 20.1), (2, 20.5), (7, 20.0 + HEARTBEAT_LAG_S - 0.01)):
        seq += 1
        result = store.ingest_report(job, report(seq, 5, rank=rank, world_size=8), at)
        assert not result.duplicate
        # the row, and the job the store answers with and keeps, hold the times of the report at 20.0
        assert _row(database, job.id) == written  # not rewritten (on PostgreSQL: the same row version)
        assert (result.job.updated_at, result.job.last_report_at) == (20.0, 20.0)
        assert result.job == job and store.job_by_id(job.id) == job
        job = result.job
    # the bound reached: the heartbeat writes both times
    beat = store.ingest_report(job, report(seq + 1, 5, rank=3, world_size=8), 20.0 + HEARTBEAT_LAG_S)
    assert _row(database, job.id)[:2] == (20.0 + HEARTBEAT_LAG_S,) * 2
    assert beat.job.last_report_at == 20.0 + HEARTBEAT_LAG_S == store.job_by_id(job.id).last_report_at  # type: ignore[union-attr]
    # the ranks' rows are written all the same
    seen = dict(database.execute("SELECT rank, last_seen_at FROM ranks WHERE job_id = ?", (job.id,)))
    assert seen == {0: 20.0, 1: 20.1, 2: 20.5, 7: 20.0 + HEARTBEAT_LAG_S - 0.01, 3: 20.0 + HEARTBEAT_LAG_S}


def test_the_rows_times_lag_a_fleets_heartbeats_by_less_than_the_bound(
    store: Store, report: Callable[..., Report], database: Any
) -> None:
    rng = random.Random(31)
    job = _running(store, report, 100.0)
    seqs = dict.fromkeys(range(8), 1)
    at, writes = 100.0, 0
    for _ in range(120):
        at += rng.choice((0.0, 0.05, 0.1, 0.25, 0.4, 0.7, 1.3))
        rank = rng.randrange(1, 8)
        seqs[rank] += 1
        before = _row(database, job.id)
        job = store.ingest_report(job, report(seqs[rank], 5, rank=rank, world_size=8, sent_at=at), at).job
        stored = _row(database, job.id)
        writes += stored != before
        assert stored[0] == stored[1] == job.last_report_at == job.updated_at
        assert at - HEARTBEAT_LAG_S < job.last_report_at <= at  # type: ignore[operator]
        assert (stored == before) == (at - before[1] < HEARTBEAT_LAG_S)
    assert 0 < writes < 120


def test_what_changes_the_job_writes_at_once(store: Store, report: Callable[..., Report], database: Any) -> None:
    job = _running(store, report, 20.0)
    command = store.add_command(job, "checkpoint", "asked", 20.05)
    job = store.job_by_id(job.id)  # type: ignore[assignment]
    at = 20.0
    changing = [
        {"rank": 1, "metrics": {"grad": 1.0}},  # a rank's metrics
        {"rank": 2, "params": {"lr": 0.1}},
        {"rank": 3, "acks": [command.id]},
        {"rank": 0, "metrics": None},  # rank 0's newest report: its progress
        {"rank": 4, "state": "failed", "reason": "oom"},  # a rank's final state: a report that may end its job
    ]
    for seq, kwargs in enumerate(changing, start=2):
        at += 0.1
        rank = kwargs.pop("rank")
        metrics = kwargs.pop("metrics", None)
        result = store.ingest_report(job, report(seq, 6, metrics, rank=rank, world_size=8, **kwargs), at)
        assert (result.job.updated_at, result.job.last_report_at) == (at, at), rank
        assert _row(database, job.id)[:2] == (at, at), rank
        job = result.job
    assert job.params == {"lr": 0.1} and "grad" in job.last_metrics and job.step == 6


def test_the_first_report_of_a_pending_job_starts_it(
    store: Store, report: Callable[..., Report], database: Any
) -> None:
    job = store.register("ns", "pending", token_hash="h", now=1.0)
    # a job whose row heard a report (an upstream status, say) but is still pending is started by the next
    pending = job.changed(last_report_at=9.9)
    updates, _ = report_updates(pending, PendingReport(pending, report(1, 5, rank=1, world_size=2), 10.0), True)
    assert updates == {"updated_at": 10.0, "last_report_at": 10.0}
    result = store.ingest_report(job, report(1, 5, rank=1, world_size=2), 10.0)
    assert (result.job.state, result.job.started_at, result.job.last_report_at) == ("running", 10.0, 10.0)


def test_a_late_report_of_rank_0_that_ends_its_job_writes(store: Store, report: Callable[..., Report]) -> None:
    job = _running(store, report, 20.0)
    job = store.ingest_report(job, report(3, 7), 20.2).job
    assert job.last_report_at == 20.2
    # sent before the newest one (history only), within the bound, but it ends the job
    late = store.ingest_report(job, report(2, 6, state="finished"), 20.4)
    assert (late.job.state, late.job.finished_at, late.job.last_report_at) == ("finished", 20.4, 20.4)


def test_a_clock_gone_back_writes(store: Store, report: Callable[..., Report], database: Any) -> None:
    job = _running(store, report, 20.0)
    beat = store.ingest_report(job, report(2, 5, rank=1, world_size=8), 19.5)
    assert beat.job.last_report_at == 19.5 == _row(database, job.id)[1]
