"""A PostgreSQL batch whose jobs this store wrote last sends its report statements with the lock of their rows,
in one round trip, admitted by the jobs as it wrote them; the rows as locked then decide, and where they
would have admitted other reports (another replica added metric names up to the limit, or removed the
job) the batch is written again report by report, with the same results as a store that never guessed.
Real PostgreSQL (see ``conftest.py``), each test in its own schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.protocol import Report
from stepwatch.server.store import IngestResult, MetricLimitError, PendingReport, StoreError

psycopg = pytest.importorskip("psycopg")

MakeReport = Callable[..., dict[str, Any]]


@pytest.fixture
def backend() -> str:
    return "postgres"


def _trace(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the store's connections do, in order: ``batch`` (a report statement sent), ``read`` (an answer
    waited for)."""
    seen: list[str] = []
    execute, fetchall = psycopg.Connection.execute, psycopg.Cursor.fetchall

    def tracing_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "WITH ORDINALITY AS w" in str(query):
            seen.append("batch")
        return execute(self, query, *args, **kwargs)

    def tracing_fetchall(self: Any) -> Any:
        seen.append("read")
        return fetchall(self)

    monkeypatch.setattr(psycopg.Connection, "execute", tracing_execute)
    monkeypatch.setattr(psycopg.Cursor, "fetchall", tracing_fetchall)
    return seen


def test_a_batch_of_jobs_it_wrote_sends_its_reports_before_the_first_answer(
    database: Any, make_report: MakeReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First batch of a job (not written by this store yet): the lock's answer is read, then the reports
    sent. The next ones: the reports go before any answer is read (fails when they wait for the lock)."""
    store = database.open()
    job = store.register("ns", "early", token_hash="h", now=1.0)
    seen = _trace(monkeypatch)
    for seq in (1, 2, 3):
        body = make_report(seq, 10 * seq, {"loss": 1.0 / seq})
        (result,) = store.ingest_reports([PendingReport(job, Report.from_dict(body), 1.0 + seq)])
        assert isinstance(result, IngestResult) and not result.duplicate, result
        assert (seen.index("batch") > 0) == (seq == 1), (seq, seen)
        seen.clear()
    stored = database.open().job_by_id(job.id)
    assert stored is not None and stored.step == 30 and stored.last_metrics == {"loss": 1 / 3}


def _limited(database: Any, limit: int) -> Any:
    store = database.open()
    store.max_metric_names = limit
    return store


@pytest.mark.parametrize("guess", ["kept", "forgotten"])
def test_a_job_changed_by_another_replica_decides_by_its_row_as_locked(
    database: Any, make_report: MakeReport, guess: str
) -> None:
    """Limit 2 names. This store wrote the job with ``loss``; another replica adds ``acc``; this store's next
    batch brings ``lr`` (admitted by the job as this store wrote it, refused by the row) and ``loss``
    (admitted by both). ``kept``: the store guesses from its memory; ``forgotten``: its memory emptied, the
    long way. Both give the same results, rows and job."""
    a, b = _limited(database, 2), _limited(database, 2)
    job = a.register("ns", f"limit-{guess}", token_hash="h", now=1.0)
    first = Report.from_dict(make_report(1, 10, {"loss": 1.0}))
    (result,) = a.ingest_reports([PendingReport(job, first, 2.0)])
    assert isinstance(result, IngestResult)
    job = result.job
    (other,) = b.ingest_reports(
        [PendingReport(job, Report.from_dict(make_report(1, 10, {"acc": 0.5}, rank=1, world_size=2)), 2.5)]
    )
    assert isinstance(other, IngestResult)
    if guess == "forgotten":
        a._written_rows.clear()
    refused = PendingReport(job, Report.from_dict(make_report(2, 20, {"lr": 0.1})), 3.0)
    kept = PendingReport(job, Report.from_dict(make_report(3, 30, {"loss": 0.5})), 3.1)
    results = a.ingest_reports([refused, kept])
    assert isinstance(results[0], MetricLimitError), results
    assert isinstance(results[1], IngestResult) and not results[1].duplicate, results
    assert database.execute("SELECT metric, step FROM points WHERE job_id = ? ORDER BY rowid", (job.id,)) == [
        ("loss", 10),
        ("acc", 10),
        ("loss", 30),
    ]
    stored = database.open().job_by_id(job.id)
    assert stored is not None and stored.step == 30 and sorted(stored.last_metrics) == ["acc", "loss"]


def test_a_job_removed_meanwhile_fails_its_reports_alone(database: Any, make_report: MakeReport) -> None:
    """The store wrote two jobs; one is deleted behind its back; a batch of both: the other's report is
    written, the removed one's is an error of its own (as the long way gives)."""
    store = database.open()
    gone = store.register("ns", "gone", token_hash="h", now=1.0)
    stays = store.register("ns", "stays", token_hash="h", now=1.0)
    for job in (gone, stays):
        store.ingest_reports([PendingReport(job, Report.from_dict(make_report(1, 10, {"loss": 1.0})), 2.0)])
    assert gone.id in store._written_rows and stays.id in store._written_rows
    database.execute("DELETE FROM points WHERE job_id = ?", (gone.id,))
    database.execute("DELETE FROM reports WHERE job_id = ?", (gone.id,))
    database.execute("DELETE FROM ranks WHERE job_id = ?", (gone.id,))
    database.execute("DELETE FROM events WHERE job_id = ?", (gone.id,))
    database.execute("DELETE FROM jobs WHERE id = ?", (gone.id,))
    batch = [PendingReport(job, Report.from_dict(make_report(2, 20, {"loss": 0.5})), 3.0) for job in (gone, stays)]
    results = store.ingest_reports(batch)
    assert isinstance(results[0], StoreError) and isinstance(results[1], IngestResult), results
    stored = store.job_by_id(stays.id)
    assert stored is not None and stored.step == 20
