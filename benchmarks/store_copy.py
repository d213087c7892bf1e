"""How long ``stepwatch db copy`` takes: a SQLite database of 1,000 jobs and N points (default
1,000,000; ``--points 10000000`` for the issue's size) copied into a fresh PostgreSQL database and into
another SQLite file, verification included, with the rows per second of each.

    .venv/bin/python benchmarks/store_copy.py --points 1000000 --database-url postgresql://root@127.0.0.1/test

``--postgres-only`` leaves out the copy into SQLite (the issue's path is the laptop's SQLite to PostgreSQL).

The source is built as ``server_ingest.py`` builds its bulk database (jobs and one report each through
the store, the points by ``executemany``, the roll-ups rebuilt). A throwaway PostgreSQL database is made
on the server of ``--database-url`` and dropped after.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_ingest import bulk_jobs, bulk_points

from stepwatch.server.store import SQLiteStore
from stepwatch.server.store.copy import copy_database, open_database


def _copy(source: str, target: str) -> dict[str, Any]:
    src, dst = open_database(source), open_database(target)
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        report = copy_database(src, dst)
    finally:
        src.close()
        dst.close()
    wall = time.perf_counter() - t0
    return {
        "rows": report.rows,
        "seconds": round(wall, 1),
        "verify_s": round(report.verify_seconds, 1),
        "rows_per_s": round(report.rows / wall),
        "copier_cpu_s": round(time.process_time() - cpu0, 1),
        "verified": report.verified,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--database-url", default="postgresql://root@127.0.0.1/test")
    parser.add_argument("--postgres-only", action="store_true", help="copy into PostgreSQL only, not into SQLite")
    opts = parser.parse_args()
    import psycopg

    name = f"stepwatch_copy_{int(time.time())}"
    with psycopg.connect(opts.database_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    pg_url = opts.database_url.rsplit("/", 1)[0] + f"/{name}"
    out: dict[str, Any] = {"jobs": opts.jobs, "points": opts.points}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "source.db"
            t0 = time.perf_counter()
            _, job_ids = bulk_jobs(db, opts.jobs, print)
            bulk_points(db, job_ids, max(opts.points // opts.jobs, 10), opts.points, print)
            store = SQLiteStore(db)
            store.rebuild_rollups()
            store.close()
            out["build_s"] = round(time.perf_counter() - t0, 1)
            out["source_mb"] = round(db.stat().st_size / 2**20)
            print(f"built {db} ({out['source_mb']} MB) in {out['build_s']} s")
            out["sqlite_to_postgres"] = _copy(f"sqlite:///{db}", pg_url)
            print("SQLite -> PostgreSQL:", out["sqlite_to_postgres"])
            if not opts.postgres_only:
                out["sqlite_to_sqlite"] = _copy(f"sqlite:///{db}", f"sqlite:///{Path(tmp) / 'target.db'}")
                print("SQLite -> SQLite:", out["sqlite_to_sqlite"])
    finally:
        with psycopg.connect(opts.database_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name}")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
