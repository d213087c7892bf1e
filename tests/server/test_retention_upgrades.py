"""Upgrades: a database made at every schema version this code has had (built from the migration
scripts themselves, with rows in every table of that version) opens with nothing lost, on SQLite and
on PostgreSQL; its history can be compacted afterwards; a database newer than the code is refused."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stepwatch.server.store import SQLiteStore, Store, StoreError
from stepwatch.server.store import sqlite_schema as sqlite_versions
from stepwatch.server.views.history import downsampled

pytestmark = pytest.mark.both_stores

WINDOWS = 2000

# the first schema version of each backend with these tables or columns
FEATURES = {
    "sqlite": {"health": 2, "policies": 3, "tokens": 4},
    "postgres": {"health": 1, "policies": 1, "tokens": 3},
}
WRITE_LOG = range(5, 8)
"""The SQLite versions with a write log (what the workers of the removed ``--workers`` read of each other)."""


def _postgres_versions() -> Any:
    from stepwatch.server.store import postgres_schema

    return postgres_schema


def versions(backend: str) -> range:
    schema = sqlite_versions if backend == "sqlite" else _postgres_versions()
    return range(1, schema.SCHEMA_VERSION + 1)


class OldDatabase:
    """A database at one schema version, written with plain SQL as that version's server would have."""

    def __init__(self, backend: str, tmp_path: Path, postgres_schemas: Any) -> None:
        self.backend = backend
        if backend == "sqlite":
            self.path = tmp_path / "old.db"
            self.url = ""
        else:
            if postgres_schemas.admin is None:
                pytest.skip(postgres_schemas.problem)
            self.url = str(postgres_schemas.url(postgres_schemas.fresh()))

    def migrate_to(self, version: int) -> None:
        if self.backend == "sqlite":
            with sqlite3.connect(self.path) as conn:
                for v in range(1, version + 1):
                    conn.executescript(f"BEGIN; {sqlite_versions.MIGRATIONS[v]} PRAGMA user_version = {v}; COMMIT;")
            return
        import psycopg

        schema = _postgres_versions()
        with psycopg.connect(self.url) as conn:
            for v in range(1, version + 1):
                conn.execute(schema.MIGRATIONS[v])
            conn.execute("CREATE TABLE stepwatch_schema (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO stepwatch_schema (version) VALUES (%s)", (version,))

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if self.backend == "sqlite":
            with sqlite3.connect(self.path) as conn:
                conn.executemany(sql, rows)
            return
        import psycopg

        with psycopg.connect(self.url) as conn:
            conn.cursor().executemany(sql.replace("?", "%s"), rows)

    def version(self) -> int:
        if self.backend == "sqlite":
            with sqlite3.connect(self.path) as conn:
                return int(conn.execute("PRAGMA user_version").fetchone()[0])
        import psycopg

        with psycopg.connect(self.url) as conn:
            return int(conn.execute("SELECT version FROM stepwatch_schema").fetchone()[0])  # type: ignore[index]

    def open(self) -> Store:
        if self.backend == "sqlite":
            return SQLiteStore(self.path)
        from stepwatch.server.store.postgres import PostgresStore

        return PostgresStore(self.url)


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
    schemas = request.getfixturevalue("postgres_schemas") if backend == "postgres" else None
    return OldDatabase(backend, tmp_path, schemas)


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7])
def test_a_database_of_every_earlier_version_is_upgraded_with_nothing_lost(old: OldDatabase, version: int) -> None:
    if version not in versions(old.backend):
        pytest.skip(f"{old.backend} has no schema version {version}")
    old.migrate_to(version)
    fill(old, version)
    has = {k: version >= v for k, v in FEATURES[old.backend].items()}
    store = old.open()
    try:
        assert old.version() == versions(old.backend)[-1]
        job = store.job("nlp", "old")
        assert job is not None and job.state == "running" and job.step == WINDOWS and job.total_steps == 2 * WINDOWS
        assert job.params == {"lr": 0.1} and job.gpus == 8.0 and job.gpu_hour_cost == 2.5
        assert job.health == ("not_learning" if has["health"] else "unknown")
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
    addition, so every other table is compared row for row across it."""
    if old.backend != "sqlite":
        pytest.skip("PostgreSQL never had a write log")
    old.migrate_to(7)
    fill(old, 7)

    def tables() -> dict[str, list[tuple[Any, ...]]]:
        with sqlite3.connect(old.path) as conn:
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {name: conn.execute(f"SELECT * FROM {name}").fetchall() for name in names}

    before = tables()
    assert before["write_log"]
    old.open().close()
    after = tables()
    assert old.version() == 8 and "write_log" not in after
    del before["write_log"]
    after.pop("sqlite_sequence", None), before.pop("sqlite_sequence", None)  # AUTOINCREMENT's counters
    assert after == before


def test_a_database_newer_than_the_code_is_refused_by_name(old: OldDatabase) -> None:
    newest = versions(old.backend)[-1]
    old.migrate_to(newest)
    if old.backend == "sqlite":
        with sqlite3.connect(old.path) as conn:
            conn.execute(f"PRAGMA user_version = {newest + 1}")
    else:
        old.executemany("UPDATE stepwatch_schema SET version = ?", [(newest + 1,)])
    with pytest.raises(
        StoreError, match=rf"schema version {newest + 1}, newer than this .*{newest}: upgrade stepwatch"
    ):
        old.open()


def test_db_stats_reads_either_database(old: OldDatabase, capsys: pytest.CaptureFixture[str]) -> None:
    from stepwatch.cli import main  # (the CLI reads the database as an operator would)

    newest = versions(old.backend)[-1]
    old.migrate_to(newest)
    fill(old, newest)
    where = ["--db", str(old.path)] if old.backend == "sqlite" else ["--database-url", old.url]
    assert main(["db", "stats", *where, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema_version"] == data["code_schema_version"] == newest
    tables = {t["name"]: t for t in data["tables"]}
    assert tables["points"]["rows"] == WINDOWS and tables["points"]["bytes"] > 0
    assert [(n["namespace"], n["jobs"], n["windows"]) for n in data["namespaces"]] == [("nlp", 1, WINDOWS)]
    assert main(["db", "compact", *where, "--all"]) == 0
    assert "compacted " in capsys.readouterr().out
    assert main(["db", "stats", *where]) == 0
    assert "nlp" in capsys.readouterr().out
