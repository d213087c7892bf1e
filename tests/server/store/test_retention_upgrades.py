"""Upgrades: a database made at every schema version either store has had (built from the scripts those
releases ran, ``legacy_schemas.py``, with rows in every table of that version) opens with nothing
lost, on SQLite and on PostgreSQL; its history can be compacted afterwards; a database newer than the
code is refused. That the upgraded schema is the new one is ``test_schema.py``'s."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from legacy_schemas import OldDatabase, newest

from stepwatch.server.store import StoreError
from stepwatch.server.store.migrations import SCHEMA_VERSION, plan, postgres_version
from stepwatch.server.views.history import downsampled

pytestmark = pytest.mark.both_stores

WINDOWS = 2000

# the first version of each backend's own numbering with these tables or columns
FEATURES = {
    "sqlite": {"health": 2, "policies": 3, "tokens": 4, "history": 7},
    "postgres": {"health": 1, "policies": 1, "tokens": 3, "history": 5},
}
SPANS = [
    {"state": "stalled", "from": 150.0, "since": 140.0, "to": 160.0, "message": "rank 1 has stood 60 s", "rank": 1},
    {"state": "not_learning", "from": 190.0, "since": 170.0, "to": None, "message": "loss flat for 400 steps"},
]
"""The verdicts of the old job, in its row's ``health_history`` (until 12) or ``health_spans`` (since)."""
WRITE_LOG = range(5, 8)
"""The SQLite versions with a write log (what the workers of the removed ``--workers`` read of each other)."""


def shared_version(db: OldDatabase) -> int:
    """The version the database is at, in the numbering both stores share."""
    return postgres_version(db.version()) if db.backend == "postgres" else db.version()


def loss(i: int) -> float:
    return 50.0 if i == 700 else (math.nan if i == 300 else 1.0 / (1 + i / 100))


def fill(db: OldDatabase, version: int) -> None:
    """Rows in every table of ``version``."""
    has = {k: version >= v for k, v in FEATURES[db.backend].items()}
    db.executemany(
        "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, step, total_steps, "
        "params, gpus, gpu_hour_cost) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [("nlp", "old", 1, "h", "running", 100.0, 200.0, WINDOWS, 2 * WINDOWS, '{"lr": 0.1}', 8.0, 2.5)],
    )
    nan = "NaN" if db.backend == "sqlite" else math.nan
    db.executemany(
        "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
        "VALUES (1, 'loss', ?, ?, ?, ?, ?, ?, 1, ?)",
        [
            (i + 1, 100.0 + i, v, v, v, v, 0) if math.isfinite(v) else (i + 1, 100.0 + i, nan, None, None, None, 1)
            for i, v in ((i, loss(i)) for i in range(WINDOWS))
        ],
    )
    db.executemany(
        "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) VALUES (1, 'r', 0, ?, ?, ?, ?)",
        [(i, 100.0 + 2 * i, 100.0 + 2 * i, 40 * i) for i in range(50)],
    )
    db.executemany(
        "INSERT INTO ranks (job_id, rank, run_id, last_sent_at, last_seen_at, step, step_time, host, pid) "
        "VALUES (1, ?, 'r', 198.0, 199.0, ?, 0.5, ?, ?)",
        [(0, WINDOWS, "node-0", 10), (1, WINDOWS - 1, "node-1", 11)],
    )
    db.executemany(
        "INSERT INTO commands (id, job_id, kind, reason, created_at) "
        "VALUES (?, 1, 'checkpoint', 'before a demo', 150.0)",
        [("cmd-1",)],
    )
    db.executemany(
        "INSERT INTO events (job_id, t, kind, message, data) VALUES (1, ?, ?, ?, '{}')",
        [(101.0, "registered", "registered"), (150.0, "command", "checkpoint requested")],
    )
    if has["health"]:
        db.executemany("UPDATE jobs SET health = ?, health_since = ? WHERE id = 1", [("not_learning", 190.0)])
    if has["history"]:
        db.executemany("UPDATE jobs SET health_history = ? WHERE id = 1", [(json.dumps(SPANS),)])
    if has["policies"]:
        db.executemany(
            "INSERT INTO namespace_policies (namespace, policy, updated_at) VALUES (?, ?, ?)",
            [("nlp", '{"on": {"stalled": ["notify"]}}', 5.0)],
        )
        db.executemany("UPDATE jobs SET policy = ?, gpu_type = ? WHERE id = 1", [('{"budget_usd": 100}', "a100")])
    if has["tokens"]:
        db.executemany(
            "INSERT INTO api_tokens (id, token_hash, name, role, namespaces, created_at, created_by) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [("tok-1", "hash-1", "ci", "editor", '["nlp"]', 3.0, "admin")],
        )
        db.executemany(
            "INSERT INTO audit (t, actor, action, namespace, name, reason) VALUES (?, ?, ?, ?, ?, ?)",
            [(3.0, "admin", "token_created", "nlp", "", "for CI")],
        )
    if db.backend == "sqlite" and version in WRITE_LOG:
        db.executemany("INSERT INTO write_log (origin, changes) VALUES (?, ?)", [("w0", '{"o": "w0", "j": [1]}')])


@pytest.fixture
def old(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> OldDatabase:
    if backend == "sqlite":
        return OldDatabase("sqlite", tmp_path / "old.db")
    schemas = request.getfixturevalue("postgres_schemas")
    if schemas.admin is None:
        pytest.skip(schemas.problem)
    return OldDatabase("postgres", tmp_path / "unused.db", str(schemas.url(schemas.fresh())))


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_database_of_every_earlier_version_is_upgraded_with_nothing_lost(old: OldDatabase, version: int) -> None:
    if version > newest(old.backend):
        pytest.skip(f"{old.backend} had no schema version {version} of its own")
    old.migrate_to(version)
    fill(old, version)
    has = {k: version >= v for k, v in FEATURES[old.backend].items()}
    store = old.open()
    try:
        assert shared_version(old) == SCHEMA_VERSION
        job = store.job("nlp", "old")
        assert job is not None and job.state == "running" and job.step == WINDOWS and job.total_steps == 2 * WINDOWS
        assert job.params == {"lr": 0.1} and job.gpus == 8.0 and job.gpu_hour_cost == 2.5
        assert job.health == ("not_learning" if has["health"] else "unknown")
        # 12 moved the spans out of the job's row, one a row of health_spans, in their order
        assert job.health_history == (SPANS if has["history"] else [])
        assert job.trainer_status is None  # no upstream status kept before the column existed
        columns = store.series_columns(job.id, "loss")
        assert (
            len(columns.steps) == WINDOWS
            and sum(columns.nonfinites) == 1
            and max(m for m in columns.maxs if m is not None) == 50.0
        )
        chart = downsampled(store.history_columns(job.id, "loss", 100), 100)  # folds the old windows first
        assert sum(p["windows"] for p in chart) == WINDOWS and max(p["max"] for p in chart) == 50.0
        assert sum(p["nonfinite"] for p in chart) == 1 and "NaN" in [str(p["last"]) for p in chart]
        assert store.metric_names(job.id) == ["loss"]
        assert [s.step for s in store.progress_samples(job.id)] == [40 * i for i in range(50)]
        assert [(r.rank, r.host) for r in store.ranks(job.id)] == [(0, "node-0"), (1, "node-1")]
        assert [c.id for c in store.pending_commands(job.id)] == ["cmd-1"]
        assert [e.kind for e in store.events(job_id=job.id)][:2] == ["registered", "command"]
        if has["policies"]:
            assert store.namespace_policies() == {"nlp": {"on": {"stalled": ["notify"]}}}
            assert job.policy == {"budget_usd": 100} and job.gpu_type == "a100"
        if has["tokens"]:
            assert [(t.id, t.role, t.namespaces) for t in store.api_tokens()] == [("tok-1", "editor", ("nlp",))]
            assert [a.action for a in store.audit_log()] == ["token_created"]
        # and the upgraded database goes on: new jobs, then retention over the old history
        assert store.register("nlp", "new", token_hash="h2", now=300.0).id != job.id
        done = store.compact(before=math.inf)
        assert done.windows >= WINDOWS - 2 * 16
        again = downsampled(store.history_columns(job.id, "loss", 100), 100)
        assert sum(p["windows"] for p in again) == WINDOWS and max(p["max"] for p in again) == 50.0
        assert sum(p["nonfinite"] for p in again) == 1
    finally:
        store.close()


def test_the_write_log_of_version_7_is_dropped_and_every_other_row_kept(old: OldDatabase) -> None:
    """8 drops the write log of the removed ``--workers`` (SQLite only): the one migration that is not an
    addition, so every other table is compared row for row across it (its version 7 was built with the
    scripts of that release, legacy_schemas.SQLITE)."""
    if old.backend != "sqlite":
        pytest.skip("PostgreSQL never had a write log")
    old.migrate_to(7)
    fill(old, 7)

    def tables() -> dict[str, list[dict[str, Any]]]:
        with sqlite3.connect(old.path) as conn:
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            out = {}
            for name in names:
                cursor = conn.execute(f"SELECT * FROM {name}")
                columns = [d[0] for d in cursor.description]
                out[name] = [dict(zip(columns, row, strict=True)) for row in cursor]
            return out

    before = tables()
    assert before["write_log"]
    old.open().close()
    after = tables()
    assert old.version() == SCHEMA_VERSION and "write_log" not in after  # (8, then what came after it)
    del before["write_log"]
    after.pop("sqlite_sequence", None), before.pop("sqlite_sequence", None)  # AUTOINCREMENT's counters
    assert {row.pop("metric_means") for row in after["jobs"]} == {"{}"}  # 9 added them, empty until a report
    # 12 moved the spans of the job's row to a table of their own, one a row, as they were written
    assert [json.loads(row.pop("health_history")) for row in before["jobs"]] == [SPANS]
    spans = after.pop("health_spans")
    assert [(s["job_id"], s["seq"]) for s in spans] == [(1, 0), (1, 1)]
    assert [json.loads(s["span"]) for s in spans] == SPANS
    assert after == before


def test_a_database_newer_than_the_code_is_refused_by_name(old: OldDatabase) -> None:
    old.migrate_to(newest(old.backend))
    if old.backend == "sqlite":
        with sqlite3.connect(old.path) as conn:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    else:
        old.executemany("UPDATE stepwatch_schema SET version = ?", [(SCHEMA_VERSION + 1,)])
    with pytest.raises(
        StoreError, match=rf"schema version {SCHEMA_VERSION + 1}, newer than this .*{SCHEMA_VERSION}: upgrade stepwatch"
    ):
        old.open()


def test_db_stats_reads_either_database(old: OldDatabase, capsys: pytest.CaptureFixture[str]) -> None:
    from stepwatch.cli import main  # (the CLI reads the database as an operator would)

    old.migrate_to(newest(old.backend))
    fill(old, newest(old.backend))
    where = ["--db", str(old.path)] if old.backend == "sqlite" else ["--database-url", old.url]
    assert main(["db", "stats", *where, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # read as it is (not upgraded): the newest old one is 8 (PostgreSQL's 5 is read as 8)
    assert (data["schema_version"], data["code_schema_version"]) == (8, SCHEMA_VERSION)
    tables = {t["name"]: t for t in data["tables"]}
    assert tables["points"]["rows"] == WINDOWS and tables["points"]["bytes"] > 0
    assert [(n["namespace"], n["jobs"], n["windows"]) for n in data["namespaces"]] == [("nlp", 1, WINDOWS)]
    assert main(["db", "compact", *where, "--all"]) == 0
    assert "compacted " in capsys.readouterr().out
    assert main(["db", "stats", *where]) == 0
    assert "nlp" in capsys.readouterr().out


def as_this_code_ran_it(old: OldDatabase, version: int) -> None:
    """The database at a shared ``version`` after 8 as this code made it: the newest old one (the shared 8),
    then each migration up to ``version``."""
    old.migrate_to(newest(old.backend))
    for done, statements in plan(old.backend, 8):
        if done > version:
            break
        for sql in statements:
            old.executemany(sql, [()])
    old.executemany(
        "UPDATE stepwatch_schema SET version = ?" if old.backend == "postgres" else f"PRAGMA user_version = {version}",
        [(version,)] if old.backend == "postgres" else [()],
    )


def test_a_database_of_version_9_keeps_every_window_in_step_order_without_its_index_by_step(
    old: OldDatabase,
) -> None:
    """Version 10 drops ``points_by_metric`` (windows are indexed in arrival order only; step-order reads
    sort what they read): a file this code wrote at 9 keeps every window, late ones still read in step order."""
    as_this_code_ran_it(old, 9)
    fill(old, 8)
    late = [(30, 103.0, 3.0), (10, 101.0, 1.0), (20, 102.0, 2.0), (20, 104.0, 2.5), (10, 101.0, 1.5)]
    old.executemany(
        "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
        "VALUES (1, 'acc', ?, ?, ?, ?, ?, ?, 1, 0)",
        [(step, t, v, v, v, v) for step, t, v in late],
    )
    assert "points_by_metric" in str(old.describe())
    store = old.open()
    try:
        assert shared_version(old) == SCHEMA_VERSION
        assert "points_by_metric" not in str(old.describe())
        assert [(p.step, p.t, p.last) for p in store.series(1, "acc")] == [
            (10, 101.0, 1.0),
            (10, 101.0, 1.5),  # the same step and time: in arrival order
            (20, 102.0, 2.0),
            (20, 104.0, 2.5),
            (30, 103.0, 3.0),
        ]
        columns = store.series_columns(1, "loss")
        assert columns.steps == list(range(1, WINDOWS + 1)) and sum(columns.nonfinites) == 1
        assert store.metric_names(1) == ["acc", "loss"]
    finally:
        store.close()


def test_a_database_of_version_10_keeps_every_report_and_indexes_rank_0_alone_by_arrival(old: OldDatabase) -> None:
    """Version 11 drops ``reports_progress`` (every rank's reports by arrival: a heartbeat paid an entry) for
    ``reports_rank0_progress`` (rank 0's alone): a database this code wrote at 10 keeps every report, reads
    the same progress samples, and retention by age still finds the old reports of every rank."""
    as_this_code_ran_it(old, 10)
    fill(old, 8)  # rank 0: 50 reports, 2 s apart from 100 s
    old.executemany(
        "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) VALUES (1, 'r', ?, ?, ?, ?, ?)",
        [(rank, i, 100.0 + 2 * i + rank / 10, 100.0 + 2 * i, 40 * i) for rank in (1, 2, 3) for i in range(50)],
    )
    assert "reports_progress" in str(old.describe()) and "reports_rank0_progress" not in str(old.describe())
    store = old.open()
    try:
        assert shared_version(old) == SCHEMA_VERSION
        described = str(old.describe())
        assert "reports_progress" not in described and "reports_rank0_progress" in described
        assert [(s.t, s.step) for s in store.progress_samples(1)] == [(100.0 + 2 * i, 40 * i) for i in range(50)]
        assert [s.step for s in store.progress_samples(1, since=180.0)] == [40 * i for i in range(40, 50)]
        done = store.compact(before=150.0)  # the reports of each rank received before 150 s: 25 of 50
        assert done.reports == 4 * 25
        left = old_rows(
            old, "SELECT rank, COUNT(*), MIN(received_at) >= 150.0 FROM reports GROUP BY rank ORDER BY rank"
        )
        assert left == [(rank, 25, True) for rank in range(4)]
    finally:
        store.close()


def old_rows(old: OldDatabase, sql: str) -> list[tuple[Any, ...]]:
    """The rows of a query, read outside the store."""
    if old.backend == "sqlite":
        with sqlite3.connect(old.path) as conn:
            return [tuple(r) for r in conn.execute(sql)]
    import psycopg

    with psycopg.connect(old.url) as conn:
        return [tuple(r) for r in conn.execute(sql)]
