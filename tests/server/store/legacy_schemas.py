"""Old databases for the upgrade tests: the SQL of every schema version the two stores shipped before
they shared one declaration, kept as it was, and :class:`OldDatabase`, a database built with it.

``store/migrations.py`` maps these versions onto the shared numbering: SQLite's are the shared
numbers; PostgreSQL counted its own, 1 to 5. Frozen: never edit these scripts; a later schema change
is a new migration in ``store/migrations.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from stepwatch.server.store import SQLiteStore, Store

SQLITE: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        token_hash TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        last_report_at REAL,
        step INTEGER,
        total_steps INTEGER,
        epoch REAL,
        total_epochs REAL,
        samples INTEGER,
        steps_per_second REAL,
        samples_per_second REAL,
        reported_eta REAL,
        reported_progress REAL,
        reason TEXT NOT NULL DEFAULT '',
        exit_code INTEGER,
        source TEXT NOT NULL DEFAULT 'native',
        gpus REAL NOT NULL DEFAULT 0,
        gpu_hour_cost REAL NOT NULL DEFAULT 0,
        world_size INTEGER NOT NULL DEFAULT 1,
        params TEXT NOT NULL DEFAULT '{}',
        last_metrics TEXT NOT NULL DEFAULT '{}',
        nonfinite_total INTEGER NOT NULL DEFAULT 0,
        eta_seconds REAL,
        eta_rate REAL,
        eta_at REAL,
        UNIQUE (namespace, name, attempt)
    );
    CREATE INDEX jobs_by_state ON jobs (state);
    CREATE TABLE reports (
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        run_id TEXT NOT NULL,
        rank INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        received_at REAL NOT NULL,
        sent_at REAL NOT NULL,
        step INTEGER,
        newest INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (job_id, run_id, rank, seq)
    ) WITHOUT ROWID;
    CREATE INDEX reports_progress ON reports (job_id, rank, received_at);
    CREATE TABLE ranks (
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        rank INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        last_sent_at REAL NOT NULL,
        last_seen_at REAL NOT NULL,
        step INTEGER,
        step_time REAL,
        host TEXT NOT NULL DEFAULT '',
        pid INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, rank)
    ) WITHOUT ROWID;
    CREATE TABLE points (
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        metric TEXT NOT NULL,
        step INTEGER NOT NULL,
        t REAL NOT NULL,
        last REAL NOT NULL,
        min REAL,
        max REAL,
        mean REAL,
        count INTEGER NOT NULL,
        nonfinite INTEGER NOT NULL
    );
    CREATE INDEX points_by_metric ON points (job_id, metric, step, t);
    CREATE TABLE commands (
        id TEXT PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at REAL NOT NULL,
        acked_at REAL
    );
    CREATE INDEX commands_pending ON commands (job_id, acked_at);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        t REAL NOT NULL,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_by_job ON events (job_id, id);
    """,
    2: """
    CREATE INDEX points_by_arrival ON points (job_id, metric);
    CREATE INDEX jobs_by_updated ON jobs (updated_at);
    ALTER TABLE jobs ADD COLUMN health TEXT NOT NULL DEFAULT 'unknown';
    ALTER TABLE jobs ADD COLUMN health_since REAL;
    ALTER TABLE jobs ADD COLUMN health_evidence TEXT NOT NULL DEFAULT '{}';
    CREATE TABLE rollups (
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        metric TEXT NOT NULL,
        level INTEGER NOT NULL,
        last_rowid INTEGER NOT NULL,
        first_step INTEGER NOT NULL,
        step INTEGER NOT NULL,
        t REAL NOT NULL,
        last REAL,
        min REAL,
        max REAL,
        mean REAL,
        count INTEGER NOT NULL,
        nonfinite INTEGER NOT NULL,
        windows INTEGER NOT NULL,
        ordered INTEGER NOT NULL,
        PRIMARY KEY (job_id, metric, level, last_rowid)
    ) WITHOUT ROWID;
    """,
    3: """
    ALTER TABLE jobs ADD COLUMN policy TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE jobs ADD COLUMN policy_fired TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE jobs ADD COLUMN gpu_type TEXT NOT NULL DEFAULT '';
    ALTER TABLE ranks ADD COLUMN gpus TEXT NOT NULL DEFAULT '[]';
    CREATE TABLE namespace_policies (
        namespace TEXT PRIMARY KEY,
        policy TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # Access: API tokens by the hash of their secret, and the audit log (who did what, and why).
    4: """
    CREATE TABLE api_tokens (
        id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        namespaces TEXT NOT NULL,
        created_at REAL NOT NULL,
        created_by TEXT NOT NULL DEFAULT '',
        expires_at REAL,
        revoked_at REAL,
        revoked_by TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        t REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        namespace TEXT NOT NULL DEFAULT '',
        name TEXT NOT NULL DEFAULT '',
        reason TEXT NOT NULL DEFAULT '',
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_by_namespace ON audit (namespace, id);
    """,
    # The write log: which jobs each write transaction changed, read by the other processes writing the
    # same file (the workers of one server) to forget what they cached of them. Only recent rows are kept.
    5: """
    CREATE TABLE write_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        origin TEXT NOT NULL,
        changes TEXT NOT NULL
    );
    """,
    # The last upstream Kubeflow trainerStatus as it was posted (JSON; NULL when the job's last word was not
    # one): each accepted status replaces it whole, and every reader shows it as the client sent it.
    6: """
    ALTER TABLE jobs ADD COLUMN trainer_status TEXT;
    """,
    # Every verdict a job had, with its span (store/health_history.py): kept when it recovers or ends.
    7: """
    ALTER TABLE jobs ADD COLUMN health_history TEXT NOT NULL DEFAULT '[]';
    """,
    # One process serves a SQLite file now: the write log (5) had no reader left. It held no user data.
    8: """
    DROP TABLE IF EXISTS write_log;
    """,
}
"""SQLite's scripts by version (``PRAGMA user_version``); 8 is also the first shared version."""

POSTGRES: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        namespace TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL,
        attempt INTEGER NOT NULL,
        token_hash TEXT NOT NULL,
        state TEXT COLLATE "C" NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION,
        last_report_at DOUBLE PRECISION,
        step BIGINT,
        total_steps BIGINT,
        epoch DOUBLE PRECISION,
        total_epochs DOUBLE PRECISION,
        samples BIGINT,
        steps_per_second DOUBLE PRECISION,
        samples_per_second DOUBLE PRECISION,
        reported_eta DOUBLE PRECISION,
        reported_progress DOUBLE PRECISION,
        reason TEXT NOT NULL DEFAULT '',
        exit_code INTEGER,
        source TEXT NOT NULL DEFAULT 'native',
        gpus DOUBLE PRECISION NOT NULL DEFAULT 0,
        gpu_hour_cost DOUBLE PRECISION NOT NULL DEFAULT 0,
        world_size INTEGER NOT NULL DEFAULT 1,
        params TEXT NOT NULL DEFAULT '{}',
        last_metrics TEXT NOT NULL DEFAULT '{}',
        nonfinite_total BIGINT NOT NULL DEFAULT 0,
        eta_seconds DOUBLE PRECISION,
        eta_rate DOUBLE PRECISION,
        eta_at DOUBLE PRECISION,
        health TEXT COLLATE "C" NOT NULL DEFAULT 'unknown',
        health_since DOUBLE PRECISION,
        health_evidence TEXT NOT NULL DEFAULT '{}',
        policy TEXT NOT NULL DEFAULT '{}',
        policy_fired TEXT NOT NULL DEFAULT '{}',
        gpu_type TEXT NOT NULL DEFAULT '',
        UNIQUE (namespace, name, attempt)
    );
    CREATE INDEX jobs_by_state ON jobs (state);
    CREATE INDEX jobs_by_updated ON jobs (updated_at);
    CREATE TABLE reports (
        job_id BIGINT NOT NULL REFERENCES jobs (id),
        run_id TEXT NOT NULL,
        rank INTEGER NOT NULL,
        seq BIGINT NOT NULL,
        received_at DOUBLE PRECISION NOT NULL,
        sent_at DOUBLE PRECISION NOT NULL,
        step BIGINT,
        newest BOOLEAN NOT NULL DEFAULT TRUE,
        PRIMARY KEY (job_id, run_id, rank, seq)
    );
    CREATE INDEX reports_progress ON reports (job_id, rank, received_at);
    CREATE TABLE ranks (
        job_id BIGINT NOT NULL REFERENCES jobs (id),
        rank INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        last_sent_at DOUBLE PRECISION NOT NULL,
        last_seen_at DOUBLE PRECISION NOT NULL,
        step BIGINT,
        step_time DOUBLE PRECISION,
        host TEXT NOT NULL DEFAULT '',
        pid BIGINT NOT NULL DEFAULT 0,
        gpus TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (job_id, rank)
    );
    CREATE TABLE points (
        job_id BIGINT NOT NULL REFERENCES jobs (id),
        metric TEXT COLLATE "C" NOT NULL,
        rowid BIGINT GENERATED ALWAYS AS IDENTITY,
        step BIGINT NOT NULL,
        t DOUBLE PRECISION NOT NULL,
        last DOUBLE PRECISION NOT NULL,
        min DOUBLE PRECISION,
        max DOUBLE PRECISION,
        mean DOUBLE PRECISION,
        count BIGINT NOT NULL,
        nonfinite BIGINT NOT NULL,
        PRIMARY KEY (job_id, metric, rowid)
    );
    CREATE INDEX points_by_metric ON points (job_id, metric, step, t);
    CREATE TABLE rollups (
        job_id BIGINT NOT NULL REFERENCES jobs (id),
        metric TEXT COLLATE "C" NOT NULL,
        level INTEGER NOT NULL,
        last_rowid BIGINT NOT NULL,
        first_step BIGINT NOT NULL,
        step BIGINT NOT NULL,
        t DOUBLE PRECISION NOT NULL,
        last DOUBLE PRECISION,
        min DOUBLE PRECISION,
        max DOUBLE PRECISION,
        mean DOUBLE PRECISION,
        count BIGINT NOT NULL,
        nonfinite BIGINT NOT NULL,
        windows BIGINT NOT NULL,
        ordered BOOLEAN NOT NULL,
        PRIMARY KEY (job_id, metric, level, last_rowid)
    );
    CREATE TABLE commands (
        id TEXT PRIMARY KEY,
        job_id BIGINT NOT NULL REFERENCES jobs (id),
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        acked_at DOUBLE PRECISION
    );
    CREATE INDEX commands_pending ON commands (job_id, created_at) WHERE acked_at IS NULL;
    CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        job_id BIGINT NOT NULL REFERENCES jobs (id),
        t DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_by_job ON events (job_id, id);
    CREATE TABLE namespace_policies (
        namespace TEXT COLLATE "C" PRIMARY KEY,
        policy TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    """,
    # Replicas: live updates too large for a notification's payload (8,000 bytes) wait here for the
    # other replicas to read them; rows older than a few minutes are deleted by the sender.
    2: """
    CREATE TABLE live_spill (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        t DOUBLE PRECISION NOT NULL,
        payload TEXT NOT NULL
    );
    CREATE INDEX jobs_by_health ON jobs (health);
    """,
    # Access: API tokens by the hash of their secret, and the audit log (who did what, and why).
    3: """
    CREATE TABLE api_tokens (
        id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        namespaces TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        created_by TEXT NOT NULL DEFAULT '',
        expires_at DOUBLE PRECISION,
        revoked_at DOUBLE PRECISION,
        revoked_by TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE audit (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        t DOUBLE PRECISION NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        namespace TEXT COLLATE "C" NOT NULL DEFAULT '',
        name TEXT COLLATE "C" NOT NULL DEFAULT '',
        reason TEXT NOT NULL DEFAULT '',
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_by_namespace ON audit (namespace, id);
    """,
    # The last upstream Kubeflow trainerStatus as it was posted (JSON; NULL when the job's last word was not
    # one): each accepted status replaces it whole, and every reader shows it as the client sent it.
    4: """
    ALTER TABLE jobs ADD COLUMN trainer_status TEXT;
    """,
    # Every verdict a job had, with its span (store/health_history.py): kept when it recovers or ends.
    5: """
    ALTER TABLE jobs ADD COLUMN health_history TEXT NOT NULL DEFAULT '[]';
    """,
}
"""PostgreSQL's scripts by its own version (the table ``stepwatch_schema``)."""


def newest(backend: str) -> int:
    """The newest version a backend had of its own (SQLite 8, PostgreSQL 5)."""
    return max(SQLITE if backend == "sqlite" else POSTGRES)


class OldDatabase:
    """A database of one backend at one old version, built with the scripts above and written with plain
    SQL as that version's server would have (``?`` placeholders on both)."""

    def __init__(self, backend: str, path: Path, url: str = "") -> None:
        self.backend = backend
        self.path = path
        self.url = url

    def migrate_to(self, version: int) -> None:
        """Run the scripts up to ``version`` and record it, as that release did."""
        if self.backend == "sqlite":
            with sqlite3.connect(self.path) as conn:
                for v in range(1, version + 1):
                    conn.executescript(f"BEGIN; {SQLITE[v]} PRAGMA user_version = {v}; COMMIT;")
            return
        import psycopg

        with psycopg.connect(self.url) as conn:
            for v in range(1, version + 1):
                conn.execute(POSTGRES[v])
            conn.execute("CREATE TABLE stepwatch_schema (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO stepwatch_schema (version) VALUES (%s)", (version,))

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """One statement for many rows, in one transaction."""
        if self.backend == "sqlite":
            with sqlite3.connect(self.path) as conn:
                conn.executemany(sql, rows)
            return
        import psycopg

        with psycopg.connect(self.url) as conn:
            conn.cursor().executemany(sql.replace("?", "%s"), rows)

    def version(self) -> int:
        """The version the database says it is at (PostgreSQL's old numbers as they are)."""
        if self.backend == "sqlite":
            with sqlite3.connect(self.path) as conn:
                return int(conn.execute("PRAGMA user_version").fetchone()[0])
        import psycopg

        with psycopg.connect(self.url) as conn:
            return int(conn.execute("SELECT version FROM stepwatch_schema").fetchone()[0])  # type: ignore[index]

    def open(self) -> Store:
        """The store of this code on the database (which upgrades it)."""
        if self.backend == "sqlite":
            return SQLiteStore(self.path)
        from stepwatch.server.store.postgres import PostgresStore

        return PostgresStore(self.url)

    def describe(self) -> dict[str, Any]:
        """The schema as the database itself reports it: every table's columns in order (type, null,
        default, key), its keys, constraints and indexes; not the text it was created with."""
        if self.backend == "sqlite":
            return _describe_sqlite(self.path)
        return _describe_postgres(self.url)


def _describe_sqlite(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with sqlite3.connect(path) as conn:
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()
        for name, sql in tables:
            indexes = {}
            for _, index, unique, origin, partial in conn.execute(f"PRAGMA index_list({name})"):
                made = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index,)).fetchone()
                where = " ".join(made[0].split()).partition(" WHERE ")[2] if made and made[0] else ""
                columns = [r[2] for r in conn.execute(f"PRAGMA index_info({index})")]
                indexes[index if origin == "c" else f"({origin}) {columns}"] = (unique, origin, partial, columns, where)
            found[name] = {
                "columns": conn.execute(f"PRAGMA table_xinfo({name})").fetchall(),
                "foreign_keys": conn.execute(f"PRAGMA foreign_key_list({name})").fetchall(),
                "indexes": indexes,
                "without_rowid": " ".join(sql.split()).upper().endswith("WITHOUT ROWID"),
                "autoincrement": "AUTOINCREMENT" in sql.upper(),
            }
    return found


def _describe_postgres(url: str) -> dict[str, Any]:
    import psycopg

    found: dict[str, Any] = {}
    with psycopg.connect(url) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
        for row in conn.execute(
            "SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default, "
            "collation_name, is_identity, identity_generation FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        ):
            # a column's place, not PostgreSQL's position, which keeps the gap of a dropped column (12's)
            columns = found.setdefault(row[0], {"columns": [], "constraints": [], "indexes": []})["columns"]
            columns.append((len(columns) + 1, *row[2:]))
        for table, name, definition in conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2"
        ):
            found[table]["constraints"].append((name, definition))
        for table, name, definition in conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1, 2"
        ):
            found[table]["indexes"].append((name, definition.replace(f" {schema}.", " ")))
    return found
