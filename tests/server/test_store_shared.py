"""Several SQLite stores on one file (the workers of ``stepwatch server --workers N``): each forgets what
another wrote, through the write log, and tells its listeners which jobs that was."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepwatch.protocol import Report
from stepwatch.server.store import AuditEntry, JobFilter, PendingReport, SQLiteStore
from stepwatch.server.store import sqlite as sqlite_module
from stepwatch.server.store.access import ApiToken

MakeReport = Callable[..., dict[str, Any]]
Heard = list[frozenset[int] | None]


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[SQLiteStore, SQLiteStore, Heard]]:
    """Two shared stores on one file; what the second's listener heard."""
    a = SQLiteStore(tmp_path / "s.db", shared=True)
    b = SQLiteStore(tmp_path / "s.db", shared=True)
    heard: Heard = []
    b.follow_changes(heard.append)
    try:
        yield a, b, heard
    finally:
        a.close()
        b.close()


def _ingest(store: SQLiteStore, job_id: int, report: Report, now: float) -> None:
    job = store.job_by_id(job_id)
    assert job is not None
    (result,) = store.ingest_reports([PendingReport(job, report, now)])
    assert not isinstance(result, Exception), result


def test_a_shared_store_never_answers_from_memory_what_another_changed(
    two: tuple[SQLiteStore, SQLiteStore, Heard], make_report: MakeReport
) -> None:
    a, b, heard = two
    job = a.register("ns", "j", token_hash="h", now=1.0, total_steps=100)
    _ingest(a, job.id, Report.from_dict(make_report(1, 10, {"loss": 1.0})), 2.0)
    seen = b.job_by_id(job.id)
    assert seen is not None and seen.step == 10
    _ingest(b, job.id, Report.from_dict(make_report(2, 20, {"loss": 0.9})), 3.0)  # b writes it: b caches it
    _ingest(a, job.id, Report.from_dict(make_report(3, 30, {"loss": 0.8})), 4.0)
    assert heard and heard[-1] == frozenset({job.id})
    for read in (b.job_by_id(job.id), b.job("ns", "j"), b.cached_job("ns", "j"), *b.jobs(JobFilter())):
        assert read is None or read.step == 30  # never the 20 b wrote itself
    assert b.job_by_id(job.id).step == 30  # type: ignore[union-attr]
    again = a.register("ns", "k", token_hash="h2", now=5.0)
    assert b.job("ns", "k") == again


def test_a_new_attempt_by_another_store_is_the_latest_at_once(
    two: tuple[SQLiteStore, SQLiteStore, Heard], make_report: MakeReport
) -> None:
    a, b, _ = two
    first = b.register("ns", "j", token_hash="h", now=1.0)
    assert b.cached_job("ns", "j") == first
    a.set_state(first, "finished", 2.0)
    second = a.register("ns", "j", token_hash="h2", now=3.0)
    assert b.job("ns", "j") == second
    assert b.cached_job("ns", "j") in (None, second)


def test_only_the_other_stores_writes_are_news(tmp_path: Path, make_report: MakeReport) -> None:
    a = SQLiteStore(tmp_path / "s.db", shared=True)
    heard: Heard = []
    a.follow_changes(heard.append)
    try:
        job = a.register("ns", "j", token_hash="h", now=1.0)
        _ingest(a, job.id, Report.from_dict(make_report(1, 10, {"loss": 1.0})), 2.0)
        a.job_by_id(job.id)
        assert heard == []
    finally:
        a.close()


def test_an_unshared_store_catches_up_at_its_next_write(tmp_path: Path, make_report: MakeReport) -> None:
    """The file's only server (``shared=False``) reads the log only when the file changed under it."""
    server = SQLiteStore(tmp_path / "s.db")
    tool = SQLiteStore(tmp_path / "s.db")
    heard: Heard = []
    server.follow_changes(heard.append)
    try:
        job = server.register("ns", "j", token_hash="h", now=1.0)
        other = server.register("ns", "other", token_hash="h", now=1.0)
        tool.set_state(tool.job_by_id(job.id), "stopped", 2.0)  # type: ignore[arg-type]
        assert server.job_by_id(job.id).state == "pending"  # type: ignore[union-attr]  # not read yet
        server.set_state(other, "running", 3.0)
        assert heard == [frozenset({job.id})]
        assert server.job_by_id(job.id).state == "stopped"  # type: ignore[union-attr]
        with sqlite3.connect(tmp_path / "s.db") as raw:  # a writer that logs nothing: everything may be stale
            raw.execute("UPDATE jobs SET reason = 'by hand' WHERE id = ?", (other.id,))
        server.set_estimate(job.id, 10.0, 1.0, 4.0)
        assert heard[-1] is None
        assert server.job_by_id(other.id).reason == "by hand"  # type: ignore[union-attr]
    finally:
        server.close()
        tool.close()


def test_a_revocation_by_another_store_is_refused_at_once(two: tuple[SQLiteStore, SQLiteStore, Heard]) -> None:
    a, b, _ = two
    token = ApiToken(id="t1", name="ci", role="reader", namespaces=("*",), created_at=1.0)
    a.create_token(token, "hash1", AuditEntry(t=1.0, actor="admin", action="token_created"))
    assert b.api_token("hash1") is not None and b.cached_api_token("hash1") is not None
    a.revoke_token("t1", 2.0, AuditEntry(t=2.0, actor="admin", action="token_revoked"))
    assert b.cached_api_token("hash1") is None
    found = b.api_token("hash1")
    assert found is not None and found.revoked_at == 2.0


def test_a_store_that_fell_behind_the_log_forgets_everything(
    two: tuple[SQLiteStore, SQLiteStore, Heard], monkeypatch: pytest.MonkeyPatch, make_report: MakeReport
) -> None:
    a, b, heard = two
    monkeypatch.setattr(sqlite_module, "WRITE_LOG_KEEP", 10)
    job = a.register("ns", "j", token_hash="h", now=1.0)
    b.job_by_id(job.id)
    heard.clear()
    for i in range(1, 1100):  # the log is pruned at every thousandth row, to the last 10
        a.set_estimate(job.id, float(i), 1.0, float(i))
        if i == 5:
            b.job_by_id(job.id)
    assert heard[-1] == frozenset({job.id})
    with sqlite3.connect(a.path) as raw:
        assert raw.execute("SELECT count(*) FROM write_log").fetchone()[0] < 200
    b.job_by_id(job.id)
    assert heard[-1] is None


def test_a_worker_forgets_the_trackers_and_samples_of_a_job_another_wrote(tmp_path: Path) -> None:
    from stepwatch.server.live import Broadcaster
    from stepwatch.server.services import Services

    a = SQLiteStore(tmp_path / "s.db", shared=True)
    b = SQLiteStore(tmp_path / "s.db", shared=True)
    try:
        svc = Services(store=a, live=Broadcaster())
        mine = a.register("ns", "mine", token_hash="h", now=1.0)
        theirs = a.register("ns", "theirs", token_hash="h", now=1.0)
        for job in (mine, theirs):
            svc.health.start(job, None, "loss")
            svc.progress.load(job.id, [])
        b.set_estimate(theirs.id, 10.0, 1.0, 2.0)  # the other worker writes one of them
        a.job_by_id(mine.id)  # any read of a shared store catches up first
        assert theirs.id not in svc.health and theirs.id not in svc.progress  # rebuilt at its next report
        assert mine.id in svc.health and mine.id in svc.progress
    finally:
        a.close()
        b.close()
