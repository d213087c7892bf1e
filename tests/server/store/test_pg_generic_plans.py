"""A batch's statements run their generic plan on PostgreSQL (``postgres_ingest.GENERIC_PLANS``): without it
the database made a custom plan of :data:`~stepwatch.server.store.postgres_ingest.BATCH_SQL` for every batch
(it prices the generic plan higher: it cannot tell how long the arrays are), which cost more of its CPU than
running the batch. Real PostgreSQL (see ``conftest.py``), each test in its own schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.protocol import Report
from stepwatch.server.store import PendingReport

pytest.importorskip("psycopg")


@pytest.fixture
def backend() -> str:
    return "postgres"


def test_a_batch_runs_its_generic_plan_and_the_connection_goes_back_as_it_was(
    store: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    """30 batches of 3 reports (a fleet's: rank 0 with a window, two heartbeats) on the store's one pooled
    connection: the batch statement, prepared by psycopg from its fifth use, is planned generically from
    then on (before: 0 generic and 30 custom plans), and the setting does not outlive the transaction."""
    jobs = [store.register("ns", f"job-{i}", token_hash="h", now=1.0) for i in range(3)]
    for seq in range(1, 31):
        batch = [
            PendingReport(
                job,
                Report.from_dict(
                    make_report(seq, 10 * seq, {"loss": 1.0 / seq} if rank == 0 else None, rank=rank, world_size=3)
                ),
                10.0 + seq,
            )
            for rank, job in enumerate(jobs)
        ]
        results = store.ingest_reports(batch)
        assert not any(isinstance(r, Exception) for r in results), results
    with store._pool.connection() as conn:  # min_size 1, used by one thread: the connection that wrote
        plans = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ("%WITH ORDINALITY AS w%",),
        ).fetchall()
        mode = conn.execute("SHOW plan_cache_mode").fetchone()
    assert plans, "the batch statement was not prepared on the pooled connection"
    generic, custom = plans[0]
    assert generic >= 25 and custom == 0, plans
    assert mode == ("auto",)
    job = store.job("ns", "job-0")
    assert job is not None and job.step == 300
