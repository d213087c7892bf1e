"""Rank 0's reports alone are indexed by arrival time (schema version 11; issue 31: seven reports in eight
of a fleet are heartbeats): a heartbeat writes its report's row and no index entry, and every read of
``reports`` keeps an index that serves it, on SQLite and on PostgreSQL, as each database's own plan
(``EXPLAIN``) says. A partial index serves a query only when the query's ``WHERE`` implies the index's:
the reads below are the stores' own statements."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.protocol import Report
from stepwatch.server.store import Store

MakeReport = Callable[..., dict[str, Any]]
pytestmark = pytest.mark.both_stores

PROGRESS = (
    "SELECT received_at, step FROM reports WHERE job_id = ? AND rank = 0 AND step IS NOT NULL "
    "AND newest = TRUE AND received_at >= ? ORDER BY received_at"
)
"""``sql_history.progress_samples``'s read."""
RETENTION = (
    "DELETE FROM reports WHERE job_id = ? AND (run_id, rank, seq) IN (SELECT run_id, rank, seq FROM reports "
    "WHERE job_id = ? AND received_at < ? LIMIT ?)"
)
"""``retention.compact_reports``' delete."""
KUBEFLOW_SEQ = "SELECT COALESCE(MAX(seq), -1) + 1 FROM reports WHERE job_id = ? AND run_id = 'kubeflow' AND rank = 0"
"""The next seq of an upstream status (both ingests)."""


def _fleet(store: Store, report: Callable[..., Report], ranks: int = 4, beats: int = 6) -> int:
    """A job whose rank 0 reports metrics and whose other ranks heartbeat, every 2 s; its id."""
    job = store.register("ns", "fleet", token_hash="h", now=1.0)
    for seq in range(1, beats + 1):
        for rank in range(ranks):
            metrics = {"loss": 1.0 / seq} if rank == 0 else None
            body = report(seq, 10 * seq, metrics, rank=rank, world_size=ranks)
            job = store.ingest_report(job, body, 10.0 + 2 * seq + rank / 10).job
    return job.id


def _plan(database: Any, sql: str, args: tuple[Any, ...]) -> str:
    """The database's plan for ``sql``, one line; PostgreSQL's with sequential scans priced out (its few
    test rows would be read whole otherwise): which index serves the query, if any does."""
    if database.backend == "sqlite":
        return " | ".join(str(r[3]) for r in database.execute("EXPLAIN QUERY PLAN " + sql, args))
    import psycopg

    with psycopg.connect(database.url) as conn:
        conn.execute("SET LOCAL enable_seqscan = off")
        return " | ".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql.replace("?", "%s"), args))


def _indexes(database: Any) -> dict[str, str]:
    """The indexes of ``reports`` other than its key, by name: each one's ``WHERE`` ("" for a whole one)."""
    if database.backend == "sqlite":
        rows = database.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'reports'")
        return {name: " ".join(sql.split()).partition(" WHERE ")[2] for name, sql in rows if sql}
    rows = database.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'reports'"
    )
    return {name: d.partition(" WHERE ")[2] for name, d in rows if name != "reports_pkey"}


def test_no_index_of_reports_holds_a_heartbeat(database: Any, store: Store, report: Callable[..., Report]) -> None:
    """Every index of ``reports`` but its key is partial on rank 0: a heartbeat (rank != 0) writes no entry.
    On SQLite the entries are counted in the file's pages (``dbstat``): one per rank-0 report."""
    job_id = _fleet(store, report)
    assert database.execute("SELECT rank, COUNT(*) FROM reports GROUP BY rank ORDER BY rank") == [
        (rank, 6) for rank in range(4)
    ]
    indexes = _indexes(database)
    assert indexes == {"reports_rank0_progress": "rank = 0" if database.backend == "sqlite" else "(rank = 0)"}
    if database.backend == "sqlite":
        [(entries,)] = database.execute("SELECT SUM(ncell) FROM dbstat WHERE name = 'reports_rank0_progress'")
        assert entries == 6
    assert [s.step for s in store.progress_samples(job_id)] == [10 * seq for seq in range(1, 7)]


def test_every_read_of_reports_has_an_index_that_serves_it(
    database: Any, store: Store, report: Callable[..., Report]
) -> None:
    """Rank 0's progress by the partial index; retention and an upstream status's next seq by the key's
    prefix (job_id; job_id, run_id, rank): none reads the whole table, or another job's rows."""
    job_id = _fleet(store, report)
    progress = _plan(database, PROGRESS, (job_id, 0.0))
    retention = _plan(database, RETENTION, (job_id, job_id, 15.0, 100))
    kubeflow = _plan(database, KUBEFLOW_SEQ, (job_id,))
    if database.backend == "sqlite":
        assert "USING INDEX reports_rank0_progress (job_id=? AND received_at>?)" in progress
        assert "USING PRIMARY KEY (job_id=?)" in retention and "SCAN reports" not in retention
        assert "USING PRIMARY KEY (job_id=? AND run_id=? AND rank=?)" in kubeflow
    else:
        assert "using reports_rank0_progress" in progress and "Seq Scan" not in progress
        assert "reports_pkey" in retention and "Seq Scan" not in retention
        # the key's prefix, or (its few rows unanalysed, the costs equal) rank 0's index by job_id
        assert "Index Cond: (" in kubeflow and "job_id = " in kubeflow and "Seq Scan" not in kubeflow
    assert database.execute(PROGRESS, (job_id, 15.0)) == [(10.0 + 2 * seq, 10 * seq) for seq in range(3, 7)]
