"""``stepwatch db copy SOURCE TARGET``: a laptop's SQLite history into PostgreSQL (or another SQLite
file), every row, ids included, verified row for row; a non-empty target refused; an interrupted copy
resumed. The source is filled through the real API and store (reports with NaN, commands, a verdict,
a namespace policy, an API token), the copy runs through the CLI as a user runs it."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepwatch.cli import main
from stepwatch.server.store import JobFilter, SQLiteStore, Store
from stepwatch.server.store.access import ApiToken, AuditEntry
from stepwatch.server.store.copy import copy_database, open_database

MakeReport = Callable[..., dict[str, Any]]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'copy.db'}"
    schemas = request.getfixturevalue("postgres_schemas")
    if schemas.admin is None:
        pytest.skip(schemas.problem)
    return str(schemas.url(schemas.fresh()))


@pytest.fixture
def source(api: Any, store: Store, db_path: Path, make_report: MakeReport) -> str:
    """A history as a laptop holds it: three jobs, one ended, windows with NaN, a pending and an acked
    command, a verdict, a namespace policy and an API token."""
    for j, name in enumerate(("alpha", "beta", "gamma")):
        token = api.register(name, total_steps=100, gpus=1)
        for seq in range(12):
            loss = math.nan if (seq == 7 and j == 1) else 1.0 / (seq + 1)
            api.report_ok(name, token, make_report(seq, 5 * (seq + 1), {"loss": [loss, 0.5], "lr": 0.1}))
            api.clock.advance(2)
        job = store.job("default", name)
        assert job is not None
        store.add_command(job, "checkpoint", "before the weekend", api.clock(), actor="alice")
        if name == "gamma":
            api.report_ok(name, token, make_report(12, 100, {"loss": 0.01}, state="finished"))
    beta = store.job("default", "beta")
    assert beta is not None
    store.set_health(beta.id, "diverging", api.clock(), {"message": "loss is NaN at step 40"}, api.clock())
    store.set_namespace_policy("default", {"on": {"stalled": "notify"}}, api.clock(), actor="alice")
    token = ApiToken(id="tok-1", name="ci", role="reader", namespaces=("default",), created_at=api.clock())
    store.create_token(token, "h" * 64, AuditEntry(api.clock(), "alice", "token_created", reason="for CI"))
    return f"sqlite:///{db_path}"


def _open(url: str) -> Store:
    if url.startswith("sqlite:///"):
        return SQLiteStore(url.removeprefix("sqlite:///"))
    from stepwatch.server.store.postgres import PostgresStore

    return PostgresStore(url)


def _everything(url: str) -> str:
    """What a reader reads of a database, opened afresh (not what a store's cache holds): every job
    (its verdicts and policies), its history, events, commands, the namespace policies and tokens
    (``repr``: NaN compares equal to NaN there)."""
    store = _open(url)
    try:
        return _read_all(store)
    finally:
        store.close()


def _read_all(store: Store) -> str:
    jobs = sorted(store.jobs(JobFilter()), key=lambda j: j.id)
    parts: list[Any] = [jobs, store.api_tokens(), store.namespace_policies()]
    for job in jobs:
        parts += [
            store.pending_commands(job.id),
            store.events(job_id=job.id),
            store.history_columns(job.id, "loss", 1000),
        ]
    return repr(parts)


def test_a_copy_holds_every_row_and_reads_back_as_the_source(
    source: str, target: str, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "copy", source, target]) == 0
    out = capsys.readouterr().out
    assert "verified:" in out and "row for row" in out
    assert _everything(target) == _everything(source)
    copied = _open(target)
    try:
        # the copy is a working database: a new job gets a fresh id, after the copied ones
        new = copied.register("default", "delta", token_hash="x" * 64, now=2e9)
        assert new.id > max(j.id for j in store.jobs(JobFilter()))
    finally:
        copied.close()


def test_a_target_that_holds_jobs_is_refused(source: str, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "copy", source, target]) == 0
    capsys.readouterr()
    assert main(["db", "copy", source, target]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepwatch db copy: ") and "already holds 3 jobs" in err and "--resume" in err
    assert len(err.splitlines()) == 1
    # --resume on a finished copy of the same source finds nothing left to copy, and verifies it
    assert main(["db", "copy", source, target, "--resume"]) == 0
    assert "verified:" in capsys.readouterr().out


def test_a_target_holding_other_jobs_is_refused_even_to_resume(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = SQLiteStore(tmp_path / "other.db")
    other.register("default", "someone-else", token_hash="y" * 64, now=1.0)
    other.close()
    assert main(["db", "copy", source, f"sqlite:///{tmp_path / 'other.db'}", "--resume"]) == 1
    assert "cannot be merged" in capsys.readouterr().err


def test_an_interrupted_copy_goes_on_where_it_stopped(
    source: str, target: str, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    def stop_in_points(table: str, done: int, total: int) -> None:
        if table == "copying points" and done >= 20:
            raise KeyboardInterrupt  # the user's Ctrl-C, part-way through the biggest table

    src, dst = open_database(source), open_database(target)
    try:
        with pytest.raises(KeyboardInterrupt):
            copy_database(src, dst, progress=stop_in_points, chunk_rows=10)
    finally:
        src.close()
        dst.close()
    assert main(["db", "copy", source, target, "--resume"]) == 0
    out = capsys.readouterr().out
    points = next(line.split() for line in out.splitlines() if line.startswith("points"))
    assert int(points[1]) == int(points[3]) > int(points[2].replace(",", "")) > 0  # only the rest was copied now
    assert _everything(target) == _everything(source)


def test_a_copy_that_differs_is_reported(source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The verification can fail: a row changed in the target after the copy is found."""
    from stepwatch.server.store.copy import Database

    target = f"sqlite:///{tmp_path / 'copy.db'}"
    assert main(["db", "copy", source, target]) == 0
    db = Database(target)
    db.conn.execute("UPDATE points SET mean = mean + 1e-12 WHERE rowid = 5")
    db.close()
    src, dst = open_database(source), open_database(target)
    try:
        report = copy_database(src, dst, resume=True)
    finally:
        src.close()
        dst.close()
    assert not report.verified
    assert [t.name for t in report.tables if t.mismatches] == ["points"]


def test_a_source_that_is_not_there_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.db"
    assert main(["db", "copy", f"sqlite:///{missing}", f"sqlite:///{tmp_path / 'copy.db'}"]) == 1
    assert capsys.readouterr().err.strip() == f"stepwatch db copy: no database at {missing} " + (
        "(`stepwatch db stats` prints where the server keeps its own)"
    )
    assert not missing.exists()  # not created by looking for it
