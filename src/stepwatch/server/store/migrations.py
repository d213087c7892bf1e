"""The schema's versions, one number for both stores, and how a database at any of them is upgraded.

:data:`MIGRATIONS` is the one ordered list. What a version adds is read from the schema's
declaration (:mod:`.schema`: every table, column and index names its ``since``); a migration holds
only what the declaration cannot say, per database and only where the SQL really differs (SQLite's
write log dropped). So each migration is declared once, and :func:`plan` gives a database at any version the
statements it lacks, one transaction per version. A database without tables is created as the
declaration stands now. Migrations only add, except the drop of a table that never held user data
and of indexes (10, 11), and a column whose values a migration moved first (12); no upgrade loses data.

SQLite keeps the version in ``PRAGMA user_version``, PostgreSQL in the table ``stepwatch_schema``.
The numbers are SQLite's: before the two stores shared them, PostgreSQL counted its own (1 to 5),
mapped onto the shared ones by :data:`POSTGRES_BEFORE`. Tables and indexes are created ``IF NOT
EXISTS``: an old PostgreSQL version may hold some of a later shared version already (the spill
table of its version 2 is the shared version 5's), and it is given only what it lacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .schema import INDEXES, TABLES, column_sql, create_statements, table_sql

__all__ = ["MIGRATIONS", "POSTGRES_BEFORE", "SCHEMA_VERSION", "Migration", "plan", "postgres_version"]


@dataclass(frozen=True)
class Migration:
    """One schema version: what it is for, and the statements of one database only that it runs after
    the tables, columns and indexes the declaration adds at this version."""

    version: int
    summary: str
    only: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, their reports, ranks, windows, commands and events"),
    Migration(2, "health; roll-ups of long series; jobs by update time"),
    Migration(3, "policies of jobs and namespaces; the kind of GPU; the GPUs each rank sees"),
    Migration(4, "access: API tokens by the hash of their secret, and the audit log"),
    Migration(
        5,
        "what the processes of one database tell each other: PostgreSQL's spill of large live updates, "
        "its index of jobs by health; SQLite's write log (dropped by 8: not declared, never created now)",
    ),
    Migration(6, "the last upstream Kubeflow trainerStatus as it was posted"),
    Migration(7, "every verdict a job had, with its span (store/health_history.py)"),
    Migration(
        8,
        "one process serves a SQLite file: its write log had no reader left (it held no user data)",
        only={"sqlite": ("DROP TABLE IF EXISTS write_log",)},
    ),
    Migration(9, "the mean of every metric's latest window, beside its last value (a list's steadier loss)"),
    Migration(
        10,
        "windows indexed once, in arrival order: the index of points by step dropped (step-order reads sort "
        "what they read; an index holds no data)",
        only=dict.fromkeys(("sqlite", "postgres"), ("DROP INDEX IF EXISTS points_by_metric",)),
    ),
    Migration(
        11,
        "rank 0's reports indexed by arrival time, the others' not: a heartbeat writes no index entry (the "
        "index of every rank's reports dropped; retention reads a job's reports by their key)",
        only=dict.fromkeys(("sqlite", "postgres"), ("DROP INDEX IF EXISTS reports_progress",)),
    ),
    Migration(
        12,
        "a job's verdicts one span a row (health_spans), moved out of the job's row, which SQLite rewrote whole "
        "with them at every report; the column that held them dropped once they are moved",
        only={
            "sqlite": (
                "INSERT INTO health_spans (job_id, seq, span) SELECT jobs.id, spans.key, spans.value "
                "FROM jobs, json_each(jobs.health_history) AS spans WHERE spans.type = 'object'",
            ),
            "postgres": (
                "INSERT INTO health_spans (job_id, seq, span) SELECT jobs.id, spans.n - 1, spans.value::text "
                "FROM jobs, json_array_elements(jobs.health_history::json) WITH ORDINALITY AS spans (value, n) "
                "WHERE json_typeof(spans.value) = 'object'",
            ),
        },
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1].version
"""The version this code writes and reads."""

POSTGRES_BEFORE: Mapping[int, int] = {1: 3, 2: 3, 3: 4, 4: 6, 5: 8}
"""PostgreSQL's own versions before the shared numbering, and the shared version each one holds all of.

Its version 1 was SQLite's 3 with PostgreSQL's types; 2 added the spill table and the index by health
(the shared 5's), 3 the tokens and audit (4), 4 the upstream status (6), 5 the health history (7; and 8
changes nothing in PostgreSQL). A database the shared numbering wrote holds at least 8 there, so a
number up to 5 is always the old one.
"""


def postgres_version(stored: int) -> int:
    """The shared version of what a PostgreSQL database's ``stepwatch_schema`` says."""
    return POSTGRES_BEFORE.get(stored, stored)


def _statements(migration: Migration, dialect: str) -> list[str]:
    """What ``migration`` runs in ``dialect``'s database, coming from the version before it."""
    version = migration.version
    out: list[str] = []
    for table in TABLES:
        if not table.has(dialect):
            continue
        if table.since == version:
            out.append(table_sql(table, dialect, version))
        elif table.since < version:
            for column in (*table.columns, *table.retired):
                if column.since == version and (sql := column_sql(column, dialect)) is not None:
                    out.append(f"ALTER TABLE {table.name} ADD COLUMN {sql}")
    out.extend(index.sql() for index in INDEXES if index.since == version and index.has(dialect))
    out.extend(migration.only.get(dialect, ()))
    # a column is dropped last: what the version's own statements moved out of it is elsewhere by then
    out.extend(
        f"ALTER TABLE {table.name} DROP COLUMN {column.name}"
        for table in TABLES
        if table.has(dialect)
        for column in table.retired
        if column.until == version
    )
    return out


def plan(dialect: str, version: int) -> list[tuple[int, list[str]]]:
    """What a database of ``dialect`` at ``version`` runs to be current: (the version it then is, the
    statements), one transaction each. Version 0 (no tables) is created as the declaration stands."""
    if version == 0:
        return [(SCHEMA_VERSION, list(create_statements(dialect)))]
    return [(m.version, _statements(m, dialect)) for m in MIGRATIONS if m.version > version]
