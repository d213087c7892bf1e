"""The SQLite schema of the embedded store: its migrations, and the SQL of progress and sorting.

The schema carries its version in ``PRAGMA user_version``; each migration only adds (tables,
columns, indexes), so an upgrade never loses data. The one exception drops the write log of version 5,
which held no user data (only which jobs each write had changed, for other server processes to read).
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "PROGRESS_SQL", "SCHEMA_VERSION", "SORT_SQL"]

SCHEMA_VERSION = 8

MIGRATIONS: dict[int, str] = {
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

PROGRESS_SQL = (
    "(CASE WHEN reported_progress IS NOT NULL THEN reported_progress "
    "WHEN total_steps > 0 AND step IS NOT NULL THEN MIN(100.0, 100.0 * step / total_steps) "
    "WHEN total_epochs > 0 AND epoch IS NOT NULL THEN MIN(100.0, 100.0 * epoch / total_epochs) "
    "WHEN state = 'finished' THEN 100.0 END)"
)
SORT_SQL = {
    "name": "name",
    "namespace": "namespace",
    "state": "state",
    "progress": PROGRESS_SQL,
    "step": "step",
    "created": "created_at",
    "updated": "updated_at",
    "eta": "(CASE WHEN state IN ('finished', 'failed', 'stopped') THEN NULL ELSE eta_at + eta_seconds END)",
}
