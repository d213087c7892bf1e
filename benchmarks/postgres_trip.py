"""A report's trip on PostgreSQL without HTTP: server CPU and database CPU per report, with 1, 2 and 3 replicas.

Each replica is a process that builds what ``stepwatch server`` builds around a PostgreSQL store (the
store, the live broadcaster, the replica bridge, the ingest service) and drives the ingest service
itself: ``--concurrency`` reporters per replica, each looking its job up as the report route does and
awaiting ``ingest_report`` with a report body as the report core sends it (``server_ingest.report_dict``,
5 metric windows), back to back. Each replica has jobs of its own (as section 6 of ``server_ingest.py``
splits them), so what a replica spends on the others' reports (their notifications of changed jobs and
their live updates, relayed) is counted in its CPU per report.

Per replica count: reports/s, the replicas' CPU per report (all their threads; HTTP excluded, so below
what ``server_ingest.py`` shows: compare the rows of one run), the CPU of the database's backends
connected to the throwaway database per report (from /proc: PostgreSQL runs on this machine), and the
statements and commits per report (statements: those the replicas' connections execute, counted in
each process; commits: ``pg_stat_database``'s). ``--src PATH``, repeated, measures each of several
``src/`` folders in turn, in the same run (A/B: the code before, exported with ``git archive``).

    .venv/bin/python benchmarks/postgres_trip.py --database-url postgresql://root@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from server_ingest import PostgresDatabase, start_store_child  # noqa: E402


def child(args: dict[str, Any]) -> dict[str, Any]:
    """One replica: serve its jobs' reports back to back between ``start_at`` and ``end_at``."""
    import asyncio

    import psycopg

    counted = {"statements": 0}
    execute = psycopg.Connection.execute

    def counting(self: Any, *a: Any, **k: Any) -> Any:
        counted["statements"] += 1
        return execute(self, *a, **k)

    psycopg.Connection.execute = counting  # type: ignore[method-assign]

    profiles: dict[str, list[Any]] = {}
    if args.get("profile"):
        _profile_threads(profiles)

    return asyncio.run(_replica(args, counted, profiles))


async def _replica(  # noqa: PLR0915 - one replica's life in order, read top to bottom
    args: dict[str, Any], counted: dict[str, int], profiles: dict[str, list[Any]]
) -> dict[str, Any]:
    """The replica's event loop: its store, broadcaster, bridge and reporters (see :func:`child`)."""
    import asyncio
    import random

    from server_ingest import report_dict

    from stepwatch.protocol import Report
    from stepwatch.server.ingest.service import ingest_report
    from stepwatch.server.live.broadcaster import Broadcaster
    from stepwatch.server.live.replicas import bridge_for
    from stepwatch.server.services import Services, blocking
    from stepwatch.server.store.postgres import PostgresStore

    store = PostgresStore(args["url"])
    live = Broadcaster()
    svc = Services(store, live)
    bridge = bridge_for(store, live)
    assert bridge is not None
    if args.get("relay", True):
        await bridge.start()
    watching = _watching(live) if args.get("subscriber") else None
    jobs = [
        store.register(args["namespace"], name, token_hash="x" * 64, now=time.time(), total_steps=10**7)
        for name in args["names"]
    ]
    done = {"reports": 0}
    rng = random.Random(args["seed"])

    async def reporter(k: int) -> None:
        mine = jobs[k :: args["concurrency"]]
        seq = 0
        while time.time() < args["end_at"]:
            for job in mine:
                found = store.cached_job(job.namespace, job.name) or await blocking(store.job, job.namespace, job.name)
                assert found is not None
                await ingest_report(svc, found, Report.from_dict(report_dict("run", seq, rng, os.getpid())))
                if args["measure_from"] <= time.time() < args["end_at"]:
                    done["reports"] += 1
            seq += 1

    await asyncio.sleep(max(0.0, args["start_at"] - time.time()))
    tasks = [asyncio.create_task(reporter(k)) for k in range(args["concurrency"])]
    await asyncio.sleep(max(0.0, args["measure_from"] - time.time()))
    heard = _count_heard(store)
    cpu0, statements0, threads0 = time.process_time(), counted["statements"], _thread_cpu()
    heard0, wakeups0 = heard["n"], getattr(store._listener, "wakeups", 0)
    if profiles:
        profiles["event loop"][0].enable()
    await asyncio.sleep(max(0.0, args["end_at"] - time.time()))
    cpu, relaying = time.process_time() - cpu0, getattr(bridge, "relaying", True)  # (a tree before: always)
    threads = {k: v - threads0.get(k, 0.0) for k, v in _thread_cpu().items()}
    threads["notifications heard (per 1,000 reports)"] = heard["n"] - heard0
    threads["listener wake-ups (per 1,000 reports)"] = getattr(store._listener, "wakeups", 0) - wakeups0
    if profiles:
        _dump_profiles(profiles, args["profile"])
    statements = counted["statements"] - statements0
    await asyncio.gather(*tasks)
    await asyncio.sleep(args["linger_s"])  # the others still write: go on hearing them, as a server does
    if watching is not None:
        watching.cancel()
    await bridge.aclose()
    store.close()
    return {
        "reports": done["reports"],
        "cpu_s": cpu,
        "statements": statements,
        "relayed_in": bridge.received,
        "relayed_out": bridge.sent,
        "ignored": getattr(bridge, "ignored", 0),  # (a tree before: none)
        "relaying": bool(args.get("relay", True) and relaying),
        "threads": threads,
    }


def _watching(live: Any) -> Any:
    """One live stream open on this replica, read as fast as it comes, in a task."""
    import asyncio

    async def watch() -> None:
        async for _ in live.stream():
            pass

    return asyncio.create_task(watch())


def _count_heard(store: Any) -> dict[str, int]:
    """Counts the notifications a store's listening thread hands over (``["n"]``)."""
    heard = {"n": 0}
    dispatch = store._listener._dispatch

    def counting(notify: Any) -> None:
        heard["n"] += 1
        dispatch(notify)

    store._listener._dispatch = counting
    return heard


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads by kind (their names without numbers), from /proc: the event
    loop, ``AnyIO`` (the store's blocking calls: the writer), ``asyncio`` (the bridge's sends),
    ``stepwatch-listen`` (notifications heard)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    kinds: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "other")
        if name == "MainThread":
            kind = "event loop"
        else:
            kind = "-".join(p for p in name.split(" ")[0].split("-") if not any(c.isdigit() for c in p))
            kind = kind.rstrip("_0123456789") or "other"
        kinds[kind] = kinds.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return kinds


def _profile_threads(profiles: dict[str, list[Any]]) -> None:
    """Profile every thread started from now on (cProfile on its own CPU time), by kind; the event loop's
    profiler is ``profiles["event loop"][0]``, enabled by the caller."""
    import cProfile
    import threading

    def profiled(*_: Any) -> None:  # the first event of each thread: a profiler of its own
        sys.setprofile(None)  # (this thread's hook only: threads started later still get one)
        profiler = cProfile.Profile(time.thread_time)
        name = threading.current_thread().name.split(" ")[0].rstrip("_0123456789") or "thread"
        profiles.setdefault(name, []).append(profiler)
        profiler.enable()

    threading.setprofile(profiled)
    profiles["event loop"] = [cProfile.Profile(time.thread_time)]


def _dump_profiles(profiles: dict[str, list[Any]], folder: str) -> None:
    """Stop the profilers; one pstats file a kind of thread into ``folder``."""
    import pstats

    for group in profiles.values():
        for profiler in group:
            profiler.disable()
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, group in profiles.items():
        stats = pstats.Stats(group[0])
        for profiler in group[1:]:
            stats.add(profiler)
        stats.dump_stats(f"{folder}/{os.getpid()}-{name.replace(' ', '_')}.prof")


def measure(url: str, replicas: int, cfg: argparse.Namespace, src: Path) -> dict[str, Any]:
    """One target: ``replicas`` processes on a fresh throwaway database."""
    database = PostgresDatabase(url)
    try:
        now = time.time()
        start_at = now + 4.0
        measure_from = start_at + cfg.warmup
        end_at = measure_from + cfg.duration
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{HERE.parent}"}
        procs = []
        for i in range(replicas):
            args = {
                "url": database.url,
                "namespace": "trip",
                "names": [f"r{i}-job-{j}" for j in range(cfg.jobs // replicas)],
                "concurrency": cfg.concurrency,
                "seed": i,
                "start_at": start_at,
                "measure_from": measure_from,
                "end_at": end_at,
                "linger_s": 1.0,
                "profile": cfg.profile,
                "relay": not cfg.no_relay,
                "subscriber": cfg.subscriber and i == 0,
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE), "--child", json.dumps(args)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
            time.sleep(0.5)  # one after the other: the first makes the schema
        time.sleep(max(0.0, measure_from - time.time()))
        db0, commits0 = database.cpu_s(), _commits(database)
        time.sleep(max(0.0, end_at - time.time()))
        db1, commits1 = database.cpu_s(), _commits(database)
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=cfg.duration + 120)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        database.drop()
    reports = sum(r["reports"] for r in results)
    threads: dict[str, float] = {}
    for r in results:
        for kind, cpu_s in r["threads"].items():
            threads[kind] = threads.get(kind, 0.0) + cpu_s
    return {
        "threads_ms_per_report": {k: 1000 * v / max(reports, 1) for k, v in sorted(threads.items())},
        "replicas": replicas,
        "reports_per_s": reports / cfg.duration,
        "cpu_ms_per_report": 1000 * sum(r["cpu_s"] for r in results) / max(reports, 1),
        "db_cpu_ms_per_report": 1000 * (db1 - db0) / max(reports, 1),
        "statements_per_report": sum(r["statements"] for r in results) / max(reports, 1),
        "commits_per_report": (commits1 - commits0) / max(reports, 1),
        "relayed_in": sum(r["relayed_in"] for r in results),
        "relayed_out": sum(r["relayed_out"] for r in results),
        "ignored": sum(r.get("ignored", 0) for r in results),
        "relaying": sum(r["relaying"] for r in results),
    }


def store_child(args: dict[str, Any]) -> None:
    """The store alone (``--store B``): batches of ``B`` reports of distinct jobs through ``ingest_reports``,
    as the group commit hands them over; the CPU of the calling thread per report."""
    import random

    from server_ingest import report_dict

    from stepwatch.protocol import Report
    from stepwatch.server.store import PendingReport
    from stepwatch.server.store.postgres import PostgresStore

    store = PostgresStore(args["url"])
    try:
        jobs = [
            store.register("trip", f"s-{j}", token_hash="x" * 64, now=time.time(), total_steps=10**7)
            for j in range(args["batch"])
        ]
        rng = random.Random(1)
        batches = [
            [
                PendingReport(job, Report.from_dict(report_dict("run", seq, rng, os.getpid())), time.time())
                for job in jobs
            ]
            for seq in range(args["batches"] + args["warmup_batches"])
        ]
        for batch in batches[: args["warmup_batches"]]:
            store.ingest_reports(batch)
        print("ready", flush=True)
        sys.stdin.readline()  # the parent reads the database's CPU now
        cpu0 = time.thread_time()
        for batch in batches[args["warmup_batches"] :]:
            store.ingest_reports(batch)
        cpu = time.thread_time() - cpu0
        print(json.dumps({"reports": args["batches"] * args["batch"], "cpu_s": cpu}), flush=True)
        sys.stdin.readline()  # the parent reads the database's CPU again, before the store's connections go
    finally:
        store.close()


def measure_store(url: str, cfg: argparse.Namespace, src: Path) -> dict[str, Any]:
    """``--store B``: one store, no server, on a fresh throwaway database."""
    database = PostgresDatabase(url)
    try:
        args = {"url": database.url, "batch": cfg.store, "batches": cfg.batches, "warmup_batches": 20}
        proc = start_store_child(HERE, src, args)
        assert proc.stdout is not None and proc.stdin is not None
        db0 = database.cpu_s()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        db1 = database.cpu_s()
        proc.stdin.write("end\n")
        proc.stdin.flush()
        proc.communicate(timeout=60)
    finally:
        database.drop()
    return {
        "cpu_ms_per_report": 1000 * result["cpu_s"] / result["reports"],
        "db_cpu_ms_per_report": 1000 * (db1 - db0) / result["reports"],
    }


def _commits(database: PostgresDatabase) -> int:
    row = database._admin.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database.name,)
    ).fetchone()
    return int(row[0]) if row else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://root@127.0.0.1/test")
    parser.add_argument("--replicas", default="1,2,3", help="replica counts to measure, in turn")
    parser.add_argument("--jobs", type=int, default=60, help="jobs in all, split across the replicas")
    parser.add_argument("--concurrency", type=int, default=20, help="reporters per replica")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--src",
        action="append",
        default=[],
        help="a src/ folder to measure (repeat: each in turn; default: this tree's)",
    )
    parser.add_argument(
        "--no-relay",
        action="store_true",
        help="no replica bridge (live updates stay in their replica: not a valid setting, only to see what "
        "relaying costs)",
    )
    parser.add_argument(
        "--subscriber",
        action="store_true",
        help="one live stream open on the first replica (the others relay to it), read as fast as it comes",
    )
    parser.add_argument("--threads", action="store_true", help="also the CPU per report of each kind of thread")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="profile every thread of each replica (cProfile on thread CPU time); one pstats file a thread "
        "kind and replica into DIR",
    )
    parser.add_argument(
        "--store",
        type=int,
        metavar="B",
        help="the store alone instead: batches of B reports of distinct jobs through ingest_reports, no server "
        "(the writing thread's CPU and the database's per report)",
    )
    parser.add_argument("--batches", type=int, default=200, help="--store: batches measured")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--store-child", help=argparse.SUPPRESS)
    cfg = parser.parse_args()
    if cfg.child:
        print(json.dumps(child(json.loads(cfg.child))))
        return
    if cfg.store_child:
        store_child(json.loads(cfg.store_child))
        return
    sources = [Path(s).resolve() for s in cfg.src] or [HERE.parent.parent / "src"]
    if cfg.store:
        print(f"{'code':<28} {'batch':>6} {'writer CPU ms/rep':>18} {'db CPU ms/rep':>14}")
        for _ in range(cfg.rounds):
            for src in sources:
                row = measure_store(cfg.database_url, cfg, src)
                label = f"{src.parent.name}/{src.name}"[-28:]
                cpu, db = row["cpu_ms_per_report"], row["db_cpu_ms_per_report"]
                print(f"{label:<28} {cfg.store:>6} {cpu:>18.3f} {db:>14.3f}", flush=True)
        return
    header = f"{'code':<28} {'replicas':>8} {'reports/s':>10} {'CPU ms/rep':>11} {'db CPU ms/rep':>14} "
    print(header + f"{'statements/rep':>15} {'commits/rep':>12}")
    for _ in range(cfg.rounds):
        for src in sources:
            for n in (int(x) for x in cfg.replicas.split(",")):
                row = measure(cfg.database_url, n, cfg, src)
                label = f"{src.parent.name}/{src.name}"[-28:]
                print(
                    f"{label:<28} {n:>8} {row['reports_per_s']:>10,.0f} {row['cpu_ms_per_report']:>11.3f} "
                    f"{row['db_cpu_ms_per_report']:>14.3f} {row['statements_per_report']:>15.2f} "
                    f"{row['commits_per_report']:>12.3f}",
                    flush=True,
                )
                if cfg.threads:
                    shares = ", ".join(f"{k} {v:.3f}" for k, v in row["threads_ms_per_report"].items())
                    print(f"    threads, CPU ms/rep: {shares}", flush=True)
                    relayed = f"sent {row['relayed_out']}, received {row['relayed_in']}, "
                    relayed += f"dropped undecoded {row['ignored']}; "
                    relayed += f"replicas relaying at the end: {row['relaying']} of {n}"
                    print(f"    live updates relayed: {relayed}", flush=True)


if __name__ == "__main__":
    main()
