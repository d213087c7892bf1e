"""``stepwatch db stats|compact|backup|restore`` on real SQLite files (and the printed pg_dump command)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")

from stepwatch.cli import main
from stepwatch.server.store import SQLiteStore, StoreError
from stepwatch.server.store.migrations import SCHEMA_VERSION
from stepwatch.server.views.history import downsampled


def make_db(path: Path, jobs: int = 2, windows: int = 3000) -> list[int]:
    """Jobs with a ``loss`` series (a spike and a NaN in it), folded into roll-ups; their ids."""
    store = SQLiteStore(path)
    ids = []
    try:
        for j in range(jobs):
            job = store.register(f"team-{j % 2}", f"job-{j}", token_hash="h", now=0.0)
            ids.append(job.id)
            rows = []
            for i in range(windows):
                v = 50.0 if i == windows // 5 else (math.nan if i == windows // 3 else 1.0 / (1 + i))
                cells = (v, v, v, v, 0) if math.isfinite(v) else ("NaN", None, None, None, 1)
                rows.append((job.id, "loss", i + 1, 100.0 + i, *cells))
            with sqlite3.connect(path) as conn:
                conn.executemany(
                    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
                    rows,
                )
        store.rebuild_rollups()
    finally:
        store.close()
    return ids


def chart(path: Path, job_id: int) -> list[dict[str, Any]]:
    store = SQLiteStore(path)
    try:
        return downsampled(store.history_columns(job_id, "loss", 100), 100)
    finally:
        store.close()


def test_stats_shows_tables_namespaces_and_the_schema_version(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "s.db"
    make_db(db)
    assert main(["db", "stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"schema version: {SCHEMA_VERSION}" in out
    assert "points" in out and "rollups" in out and "team-0" in out and "team-1" in out
    assert main(["db", "stats", "--database-url", f"sqlite:///{db}", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    tables = {t["name"]: t for t in data["tables"]}
    assert tables["points"]["rows"] == 6000 and tables["points"]["bytes"] > 0
    assert tables["rollups"]["rows"] > 0 and data["schema_version"] == SCHEMA_VERSION
    assert {n["namespace"]: n["windows"] for n in data["namespaces"]} == {"team-0": 3000, "team-1": 3000}
    assert main(["db", "stats", "--db", str(tmp_path / "missing.db")]) == 1
    assert "no database at" in capsys.readouterr().err


def test_compact_runs_retention_now_and_keeps_the_charts(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "c.db"
    ids = make_db(db)
    before = [chart(db, j) for j in ids]
    assert main(["db", "compact", "--db", str(db)]) == 2
    assert "give --days, --quota or --all" in capsys.readouterr().err
    assert main(["db", "compact", "--db", str(db), "--days", "30"]) == 0  # the windows are from 1970
    out = capsys.readouterr().out
    assert out.startswith("compacted ") and "2 series" in out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM points").fetchone()[0] <= 2 * 16
    assert [chart(db, j) for j in ids] == before


def test_compact_by_quota_names_the_namespaces_over_it(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "q.db"
    make_db(db)
    assert main(["db", "compact", "--db", str(db), "--quota", '{"team-0": 100}']) == 0
    assert "over quota: team-0" in capsys.readouterr().out
    assert main(["db", "compact", "--db", str(db), "--quota", "-3"]) == 2


def test_backup_is_a_consistent_copy_and_restore_refuses_to_overwrite(tmp_path: Path, capsys: Any) -> None:
    db, copy, fresh = tmp_path / "live.db", tmp_path / "backup.db", tmp_path / "fresh.db"
    ids = make_db(db)
    shown = chart(db, ids[0])
    live = SQLiteStore(db)  # a server has it open
    try:
        assert main(["db", "backup", str(copy), "--db", str(db)]) == 0
        assert "backed up" in capsys.readouterr().out
        assert main(["db", "backup", str(copy), "--db", str(db)]) == 1
        assert "--force" in capsys.readouterr().err
    finally:
        live.close()
    assert main(["db", "restore", str(copy), "--db", str(fresh)]) == 0
    assert chart(fresh, ids[0]) == shown
    assert main(["db", "restore", str(copy), "--db", str(db)]) == 1  # not empty
    assert "not empty: give --force" in capsys.readouterr().err
    assert main(["db", "restore", str(copy), "--db", str(db), "--force"]) == 0
    assert chart(db, ids[0]) == shown
    assert main(["db", "restore", str(tmp_path / "nothing.db"), "--db", str(tmp_path / "x.db")]) == 1


def test_a_database_newer_than_the_code_is_refused(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "new.db"
    make_db(db, jobs=1, windows=10)
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this stepwatch"):
        SQLiteStore(db)
    assert main(["db", "restore", str(db), "--db", str(tmp_path / "r.db")]) == 1
    assert "newer than this stepwatch" in capsys.readouterr().err
    assert main(["db", "stats", "--db", str(db)]) == 0
    assert f"(this stepwatch: {SCHEMA_VERSION})" in capsys.readouterr().out


def test_postgresql_backup_prints_the_pg_dump_command(capsys: Any) -> None:
    url = "postgresql://sw@db.example/stepwatch?options=-csearch_path%3Dteam"
    assert main(["db", "backup", "out.dump", "--database-url", url]) == 0
    out = capsys.readouterr().out
    assert "pg_dump --format=custom --schema=team --file=out.dump 'postgresql://sw@db.example/stepwatch'" in out
    assert "pg_restore" in out
    assert main(["db", "restore", "out.dump", "--database-url", url]) == 2
