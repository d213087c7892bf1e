"""An upstream status's next seq on PostgreSQL is read along the key of ``reports``, backwards, whatever the
table's statistics: ``MAX(seq)`` was served by the partial index of rank 0's reports by time on a table not
analysed yet (it has ``job_id`` first and costs the same), reading every rank-0 report of the job. Real
PostgreSQL (see ``conftest.py``), each test in its own schema."""

from __future__ import annotations

from typing import Any

import pytest

from stepwatch.protocol import TrainerStatus

pytest.importorskip("psycopg")

from stepwatch.server.store.postgres_ingest import STATUS_SEQ_SQL


@pytest.fixture
def backend() -> str:
    return "postgres"


def _status(n: int) -> TrainerStatus:
    return TrainerStatus.from_body(
        {
            "trainerStatus": {
                "progressPercentage": n,
                "metrics": [{"name": "current_step", "value": str(10 * n)}, {"name": "loss", "value": "0.5"}],
                "lastUpdatedTime": f"2026-01-01T00:00:{n:02d}Z",
            }
        }
    )


def test_the_next_seq_of_a_status_is_read_along_the_key_not_rank_0s_index(database: Any, store: Any) -> None:
    """The plan of the store's own read on a fresh table (no statistics), as it ran here before the change
    (``MAX(seq)``: "Index Scan using reports_rank0_progress"), and the seqs it numbers statuses with."""
    job = store.register("ns", "upstream", token_hash="h", now=1.0)
    database.execute(  # rank 0's native reports: what the partial index holds
        "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) "
        "SELECT ?, 'run-1', 0, g, g, g, g FROM generate_series(1, 300) AS g",
        (job.id,),
    )
    for n in range(3):
        job = store.ingest_status(job, _status(n), 20.0 + n).job
    import psycopg

    with psycopg.connect(database.url) as conn:
        plan = " | ".join(str(r[0]) for r in conn.execute("EXPLAIN " + STATUS_SEQ_SQL, (job.id,)))
    assert "Index Only Scan Backward using reports_pkey" in plan, plan
    assert "reports_rank0_progress" not in plan and "Seq Scan" not in plan, plan
    rows = database.execute(
        "SELECT seq, step FROM reports WHERE job_id = ? AND run_id = 'kubeflow' ORDER BY seq", (job.id,)
    )
    assert rows == [(0, 0), (1, 10), (2, 20)]
