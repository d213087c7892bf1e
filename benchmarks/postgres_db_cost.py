"""What PostgreSQL spends per report at a fleet's pace: its backends' CPU and the write-ahead log written.

One ``stepwatch server`` (one replica) on a throwaway PostgreSQL database, fed by ``fleet.py``'s fleet
(``--jobs`` jobs of ``--ranks-per-job`` ranks, each rank reporting every 2 s; rank 0 with the report core's 5
metric windows, the others heartbeats). Per report: the server's CPU, the CPU of the database's backends
(from /proc: PostgreSQL runs on this machine), the write-ahead log bytes that this database's transactions
wrote (``pg_walinspect``: the records touching its relations, and the commit records of their transactions;
the other databases of the server, other benchmarks', are left out), and the transactions committed (at a
fleet's pace the group commit's batches are small: per report, the database's CPU follows the commits). With
``--by-record`` the log's bytes by kind of record. ``--store B``: the store alone, no server or HTTP, batches
of ``B`` reports of the same fleet's stream in their order (the writing thread's CPU instead of the
server's): batch sizes fixed, so less noise between trees. ``--src PATH``, repeated, measures each ``src/``
folder in turn, rounds alternating (A/B: a ``git worktree`` of the code before).

    .venv/bin/python benchmarks/postgres_db_cost.py --src /tmp/wt/src --src src --rounds 3
    .venv/bin/python benchmarks/postgres_db_cost.py --src /tmp/wt/src --src src --rounds 3 --store 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from fleet import Fleet  # noqa: E402
from server_ingest import PostgresDatabase, Server, register_jobs, start_store_child  # noqa: E402


def wal_lsn(database: PostgresDatabase, start: bool = False) -> str:
    """Where the write-ahead log stands; ``start``: after a checkpoint, so that no timed checkpoint (every
    ``checkpoint_timeout``, 5 min by default) removes the segments of the measurement before they are read."""
    if start:
        database._admin.execute("CHECKPOINT")
    row = database._admin.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_of(database: PostgresDatabase, start: str, end: str) -> tuple[float, dict[str, tuple[int, int]]]:
    """The log bytes this database's transactions wrote between two positions, and by kind of record
    (count, bytes); NaN and none when the log's segments were removed before they could be read (a checkpoint
    that another client of the server forced: PostgreSQL keeps none beyond ``wal_keep_size``, 0 by default)."""
    import psycopg

    try:
        return _wal_of(database, start, end)
    except psycopg.errors.UndefinedFile as exc:
        print(f"    (the log could not be read: {str(exc).strip()})", file=sys.stderr)
        return math.nan, {}


def _wal_of(database: PostgresDatabase, start: str, end: str) -> tuple[float, dict[str, tuple[int, int]]]:
    admin = database._admin
    admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    oid_row = admin.execute("SELECT oid FROM pg_database WHERE datname = %s", (database.name,)).fetchone()
    assert oid_row is not None
    rows = admin.execute(
        """
        WITH r AS (SELECT * FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)),
             mine AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %s AND xid <> 0)
        SELECT resource_manager || '/' || record_type, count(*), sum(record_length + fpi_length)
        FROM r WHERE block_ref LIKE %s OR (resource_manager = 'Transaction' AND xid IN (SELECT xid FROM mine))
        GROUP BY 1 ORDER BY 3 DESC
        """,
        (start, end, f"%/{oid_row[0]}/%", f"%/{oid_row[0]}/%"),
    ).fetchall()
    kinds = {str(k): (int(n), int(b)) for k, n, b in rows}
    return sum(b for _, b in kinds.values()), kinds


def commits(database: PostgresDatabase) -> int:
    """Transactions committed in the database so far (``pg_stat_database``, as the statistics have them)."""
    database._admin.execute("SELECT pg_stat_clear_snapshot()")
    row = database._admin.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database.name,)
    ).fetchone()
    return int(row[0]) if row else 0


def one(src: Path, cfg: argparse.Namespace) -> dict[str, Any]:
    """One run of the fleet against the server of ``src`` on a fresh database."""
    database = PostgresDatabase(cfg.database_url)
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            Server(None, Path(tmp) / "server.log", database_url=database.url, src=src) as server,
        ):
            jobs = register_jobs(server.base, [f"fleet-{i:04d}" for i in range(cfg.jobs)])
            fleet = Fleet(server.base, jobs, cfg.ranks_per_job, cfg.seconds)

            async def run() -> dict[str, Any]:
                task = asyncio.create_task(fleet.run(cfg.warmup))
                await asyncio.sleep(cfg.warmup + 0.2)  # the fleet's warm-up: it measures from here
                lsn0, commits0 = wal_lsn(database, start=True), commits(database)
                answered0, cpu0, db0 = fleet.answered, server.cpu_s(), database.cpu_s()
                await asyncio.sleep(cfg.seconds - 0.4)
                answered, cpu, db = fleet.answered - answered0, server.cpu_s() - cpu0, database.cpu_s() - db0
                lsn1 = wal_lsn(database)
                await task
                await asyncio.sleep(0.6)  # the statistics are sent at most every 0.5 s
                n_commits = commits(database) - commits0
                return {"reports": answered, "cpu_s": cpu, "db_s": db, "lsn": (lsn0, lsn1), "commits": n_commits}

            got = asyncio.run(run())
            wal, kinds = wal_of(database, *got["lsn"])
    finally:
        database.drop()
    n = max(got["reports"], 1)
    return {
        "reports": got["reports"],
        "server_ms": 1000 * got["cpu_s"] / n,
        "db_ms": 1000 * got["db_s"] / n,
        "wal_bytes": wal / n,
        "commits": got["commits"] / n,
        "kinds": {k: (c / n, b / n) for k, (c, b) in kinds.items()},
    }


def store_child(args: dict[str, Any]) -> None:
    """``--store B``: the store alone, batches of ``B`` reports of the fleet's stream in the order they come
    (every rank once every 2 s, each at its own point of the interval; rank 0 with windows), as the group
    commit hands them over; the writing thread's CPU between the parent's two readings."""
    import random

    from fleet import heartbeat
    from server_ingest import report_dict

    from stepwatch.protocol import Report
    from stepwatch.server.store import PendingReport
    from stepwatch.server.store.postgres import PostgresStore

    store = PostgresStore(args["url"])
    try:
        world, n_jobs = args["ranks_per_job"], args["jobs"]
        jobs = [store.register("cost", f"job-{j}", token_hash="x" * 64, now=time.time()) for j in range(n_jobs)]
        rng = random.Random(1)
        offsets = sorted((rng.random() * 2.0, j, r) for j in range(n_jobs) for r in range(world))
        total = args["batches"] + args["warmup_batches"]
        stream: list[tuple[float, int, int, int]] = []
        seq = 0
        while len(stream) < total * args["batch"]:
            stream += [(2.0 * seq + t, j, r, seq) for t, j, r in offsets]
            seq += 1
        t0 = time.time() - stream[-1][0] - 10.0  # the stream ends 10 s ago: its reports' times are all past
        reports = []
        for t, j, r, k in stream[: total * args["batch"]]:
            body = report_dict("run", k, rng, 1000 + r)
            body["sent_at"] = t0 + t
            body = heartbeat(body, r, world) if r else {**body, "identity": {**body["identity"], "world_size": world}}
            reports.append((j, Report.from_dict(body), t0 + t))
        batches = [reports[i : i + args["batch"]] for i in range(0, len(reports), args["batch"])]

        def write(batch: list[tuple[int, Report, float]]) -> None:
            for result in store.ingest_reports([PendingReport(jobs[j], report, now) for j, report, now in batch]):
                assert not isinstance(result, Exception), result

        for batch in batches[: args["warmup_batches"]]:
            write(batch)
        print("ready", flush=True)
        sys.stdin.readline()  # the parent reads the database's CPU and the log's position now
        cpu0 = time.thread_time()
        for batch in batches[args["warmup_batches"] :]:
            write(batch)
        cpu = time.thread_time() - cpu0
        print(json.dumps({"reports": args["batches"] * args["batch"], "cpu_s": cpu}), flush=True)
        sys.stdin.readline()  # the parent reads them again, before the store's connections go
    finally:
        store.close()


def one_store(src: Path, cfg: argparse.Namespace) -> dict[str, Any]:
    """``--store B``: one store, no server, on a fresh throwaway database."""
    database = PostgresDatabase(cfg.database_url)
    try:
        args = {
            "url": database.url,
            "batch": cfg.store,
            "batches": cfg.batches,
            "warmup_batches": 200,
            "jobs": cfg.jobs,
            "ranks_per_job": cfg.ranks_per_job,
        }
        proc = start_store_child(HERE, src, args)
        assert proc.stdout is not None and proc.stdin is not None
        lsn0 = wal_lsn(database, start=True)
        db0 = database.cpu_s()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        db1, lsn1 = database.cpu_s(), wal_lsn(database)
        proc.stdin.write("end\n")
        proc.stdin.flush()
        proc.communicate(timeout=60)
        wal, kinds = wal_of(database, lsn0, lsn1)
    finally:
        database.drop()
    n = result["reports"]
    return {
        "reports": n,
        "server_ms": 1000 * result["cpu_s"] / n,
        "db_ms": 1000 * (db1 - db0) / n,
        "wal_bytes": wal / n,
        "commits": 1 / cfg.store,
        "kinds": {k: (c / n, b / n) for k, (c, b) in kinds.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://root@127.0.0.1/test")
    parser.add_argument("--src", action="append", help="src/ folders to measure in turn (default: this tree's)")
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--ranks-per-job", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--by-record", action="store_true", help="also the log's records and bytes by kind")
    parser.add_argument("--store", type=int, help="the store alone, in batches of this many reports (no server)")
    parser.add_argument("--batches", type=int, default=1000, help="--store: batches measured")
    parser.add_argument("--store-child", help=argparse.SUPPRESS)
    cfg = parser.parse_args()
    if cfg.store_child:
        store_child(json.loads(cfg.store_child))
        return
    srcs = [Path(s).resolve() for s in (cfg.src or [str(HERE.parent.parent / "src")])]
    table: dict[str, list[dict[str, Any]]] = {str(s): [] for s in srcs}
    for r in range(cfg.rounds):
        for src in srcs if r % 2 == 0 else list(reversed(srcs)):
            got = one_store(src, cfg) if cfg.store else one(src, cfg)
            table[str(src)].append(got)
            print(
                f"round {r + 1} {src}: {got['reports']} reports, server {got['server_ms']:.3f} ms, "
                f"db {got['db_ms']:.3f} ms, WAL {got['wal_bytes']:.0f} B, {got['commits']:.2f} commits a report",
                flush=True,
            )
            if cfg.by_record:
                for kind, (count, size) in sorted(got["kinds"].items(), key=lambda kv: -kv[1][1])[:14]:
                    print(f"    {kind:36s} {count:6.2f} records {size:8.1f} B a report")
    server = "writing thread" if cfg.store else "server"
    print(f"\n| src | rounds | {server} CPU ms/report | database CPU ms/report | WAL bytes/report | commits/report |")
    print("|---|---|---|---|---|---|")
    for name, runs in table.items():

        def span(key: str, fmt: str, runs: list[dict[str, Any]] = runs) -> str:
            values = [run[key] for run in runs]
            return f"{min(values):{fmt}}-{max(values):{fmt}}"

        spans = [span("server_ms", ".3f"), span("db_ms", ".3f"), span("wal_bytes", ".0f"), span("commits", ".2f")]
        print(f"| {name} | {len(runs)} | {' | '.join(spans)} |")


if __name__ == "__main__":
    main()
