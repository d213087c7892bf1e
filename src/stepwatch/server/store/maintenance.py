"""Database maintenance for ``stepwatch db``: sizes and counts, online backup and restore.

Sizes come from the database itself: SQLite's ``dbstat`` (bytes of the pages each table and its
indexes use) and PostgreSQL's ``pg_total_relation_size``. Bytes per namespace are an estimate: each
table's bytes shared out by the namespace's share of its rows.

Backups of SQLite use its online backup API (a consistent copy while the server writes, page by
page). PostgreSQL is backed up with its own tool, ``pg_dump`` (a consistent snapshot of the schema):
:func:`pg_dump_commands` gives the commands to run.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .base import StoreError
from .migrations import SCHEMA_VERSION, postgres_version

__all__ = [
    "DatabaseStats",
    "NamespaceStats",
    "TableStats",
    "backup_sqlite",
    "pg_dump_commands",
    "postgres_stats",
    "restore_sqlite",
    "sqlite_stats",
]

_BY_NAMESPACE = {
    "points": "SELECT jobs.namespace, COUNT(*) FROM points JOIN jobs ON jobs.id = points.job_id GROUP BY 1",
    "rollups": "SELECT jobs.namespace, COUNT(*) FROM rollups JOIN jobs ON jobs.id = rollups.job_id GROUP BY 1",
    "reports": "SELECT jobs.namespace, COUNT(*) FROM reports JOIN jobs ON jobs.id = reports.job_id GROUP BY 1",
    "jobs": "SELECT namespace, COUNT(*) FROM jobs GROUP BY 1",
}


@dataclass
class TableStats:
    """One table: rows, and bytes with its indexes."""

    name: str
    rows: int
    bytes: int


@dataclass
class NamespaceStats:
    """One namespace: jobs, raw windows, roll-up rows, progress reports, estimated bytes."""

    namespace: str
    jobs: int = 0
    windows: int = 0
    rollups: int = 0
    reports: int = 0
    bytes: int = 0


@dataclass
class DatabaseStats:
    """What ``stepwatch db stats`` shows."""

    backend: str
    where: str
    schema_version: int
    code_schema_version: int
    bytes: int
    tables: list[TableStats] = field(default_factory=list)
    namespaces: list[NamespaceStats] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "backend": self.backend,
            "where": self.where,
            "schema_version": self.schema_version,
            "code_schema_version": self.code_schema_version,
            "bytes": self.bytes,
            "tables": [vars(t) for t in self.tables],
            "namespaces": [vars(n) for n in self.namespaces],
        }


def _namespaces(query: Callable[[str], list[tuple[Any, ...]]], tables: list[TableStats]) -> list[NamespaceStats]:
    found: dict[str, NamespaceStats] = {}
    sizes = {t.name: t for t in tables}
    for table, sql in _BY_NAMESPACE.items():
        if table not in sizes:
            continue
        total = sizes[table].rows or 1
        for namespace, n in query(sql):
            ns = found.setdefault(namespace, NamespaceStats(namespace))
            setattr(ns, {"points": "windows", "jobs": "jobs", "rollups": "rollups", "reports": "reports"}[table], n)
            ns.bytes += sizes[table].bytes * n // total
    return sorted(found.values(), key=lambda n: n.namespace)


def sqlite_stats(path: str) -> DatabaseStats:
    """Counts and sizes of a SQLite database (read-only: a server may be writing it)."""
    if not Path(path).exists():
        raise StoreError(f"no database at {path}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"))
        sizes: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            table = owner.get(name, name)
            sizes[table] = sizes.get(table, 0) + int(size)
        tables = [
            TableStats(n, conn.execute(f'SELECT COUNT(*) FROM "{n}"').fetchone()[0], sizes.get(n, 0))
            for n in names
            if not n.startswith("sqlite_")
        ]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        return DatabaseStats(
            "sqlite",
            path,
            int(version),
            SCHEMA_VERSION,
            int(page_size * pages),
            tables,
            _namespaces(lambda sql: conn.execute(sql).fetchall(), tables),
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the database {path}: {exc}") from None
    finally:
        conn.close()


def postgres_stats(url: str, where: str) -> DatabaseStats:
    """Counts and sizes of stepwatch's tables in a PostgreSQL schema."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            row = conn.execute("SELECT version FROM stepwatch_schema").fetchone()
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
                )
            ]
            tables = [
                TableStats(
                    n,
                    conn.execute(f'SELECT COUNT(*) FROM "{n}"').fetchone()[0],  # type: ignore[index]
                    conn.execute("SELECT pg_total_relation_size(%s::regclass)", (n,)).fetchone()[0],  # type: ignore[index]
                )
                for n in names
            ]
            namespaces = _namespaces(lambda sql: conn.execute(sql).fetchall(), tables)
    except psycopg.Error as exc:
        raise StoreError(f"cannot read the database {where}: {str(exc).splitlines()[0]}") from None
    return DatabaseStats(
        "postgresql",
        where,
        postgres_version(int(row[0])) if row else 0,
        SCHEMA_VERSION,
        sum(t.bytes for t in tables),
        tables,
        namespaces,
    )


Progress = Callable[[int, int], None]
"""Called with (pages left, pages in all) while a copy goes on."""


def backup_sqlite(source: str, target: str, progress: Progress | None = None, *, force: bool = False) -> int:
    """A consistent copy of a live SQLite database (its online backup API); bytes written."""
    if not Path(source).exists():
        raise StoreError(f"no database at {source}")
    if Path(target).exists() and not force:
        raise StoreError(f"{target} exists: give --force to overwrite it")
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=10.0)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst, pages=4096, progress=lambda _status, left, total: progress and progress(left, total))
    except sqlite3.Error as exc:
        raise StoreError(f"cannot back up {source}: {exc}") from None
    finally:
        dst.close()
        src.close()
    return Path(target).stat().st_size


def restore_sqlite(backup: str, target: str, progress: Progress | None = None, *, force: bool = False) -> int:
    """Copy a backup into ``target``; refused where ``target`` holds a database, unless ``force``.

    The backup's schema version is checked (newer than this code: refused); the restored database is
    brought to this code's version when the store next opens it. Returns its schema version.
    """
    if not Path(backup).exists():
        raise StoreError(f"no backup at {backup}")
    src = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
    try:
        try:
            (version,) = src.execute("PRAGMA user_version").fetchone()
            has_jobs = src.execute("SELECT 1 FROM sqlite_master WHERE name = 'jobs'").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{backup} is not a SQLite database: {exc}") from None
        if not has_jobs or version < 1:
            raise StoreError(f"{backup} is not a stepwatch database")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{backup} has schema version {version}, newer than this stepwatch's {SCHEMA_VERSION}: "
                "upgrade stepwatch"
            )
        if Path(target).exists() and Path(target).stat().st_size > 0 and not force:
            dst = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
            try:
                tables = dst.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
            except sqlite3.Error:
                tables = 1
            finally:
                dst.close()
            if tables:
                raise StoreError(f"{target} is not empty: give --force to overwrite it")
        dst = sqlite3.connect(target)
        try:
            src.backup(dst, pages=4096, progress=lambda _status, left, total: progress and progress(left, total))
        except sqlite3.Error as exc:
            raise StoreError(f"cannot restore into {target}: {exc}") from None
        finally:
            dst.close()
        return int(version)
    finally:
        src.close()


def pg_dump_commands(url: str, file: str) -> tuple[str, str]:
    """The ``pg_dump`` command that backs up the schema a URL names, and the ``pg_restore`` one."""
    options = parse_qs(urlsplit(url).query).get("options", [""])[0]
    schema = ""
    for part in options.split():
        if part.startswith("-csearch_path="):
            schema = part.removeprefix("-csearch_path=")
    only = f" --schema={schema}" if schema else ""
    base = url.split("?", 1)[0]
    return (
        f"pg_dump --format=custom{only} --file={file} '{base}'",
        f"pg_restore --exit-on-error --single-transaction --dbname='{base}' {file}",
    )
