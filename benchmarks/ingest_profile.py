"""Where a report's CPU goes on the server: the whole trip, every thread, on SQLite or PostgreSQL.

The app runs in this process (its ASGI callable driven directly, no sockets: the HTTP stack's own
cost is the bare endpoint's, measured apart by ``server_ingest.py --sections 6``), with the report
core's bodies as ``server_ingest.py`` builds them (5 metric windows, rank 0). Every thread is profiled
(``cProfile`` on the event loop, ``threading.setprofile`` for the store's worker threads), and the
cumulative time is grouped by the stage of the trip it belongs to (:data:`STAGES`: per stage, and per
function counted).

    .venv/bin/python benchmarks/ingest_profile.py --reports 6000 [--database-url postgresql://...]
    .venv/bin/python benchmarks/ingest_profile.py --reports 6000 --top 40     # the raw profile too

``--heartbeats`` measures the other ranks' reports instead: each job has 8 ranks, and after rank 0's first
reports, ranks 1-7 heartbeat in turn (step and step time, no windows), as seven reports in eight of a fleet are.

``--store B`` times the SQLite store's writer alone (no app): the same bodies, read once by
``Report.from_dict``, written ``B`` reports a transaction through ``ingest_reports``, as the group
commit hands them over (``B = 1``: a fleet's pace, each report its own transaction); the writing
thread's CPU per report.

    .venv/bin/python benchmarks/ingest_profile.py --store 1 --reports 4000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import heartbeat
from server_ingest import report_dict

from stepwatch.server import ServerSettings, create_app

REQUEST = "api/guard.py:__call__"
"""The outermost function of a request: the guard, which hands a report to its direct route (``api/direct.py``)."""

STAGES = {
    "route + auth": (REQUEST,),
    "body read": ("api/request.py:receive_body",),
    "body parse + validate": ("api/request.py:decode_json", "protocol/_report.py:from_dict"),
    "writer (store)": (
        "store/sqlite_ingest.py:ingest_reports",
        "store/sqlite_ingest.py:ingest_reports_nowait",
        "store/postgres_ingest.py:ingest_reports",
    ),
    "estimates (ETA)": ("ingest/service.py:_estimate_for",),
    "health": ("ingest/health_monitor.py:assess",),
    "policies": ("ingest/service.py:review",),
    "publishing": ("live/publish.py:publish_job", "live/publish.py:publish_points", "live/publish.py:publish_events"),
    "response encoding": ("api/direct.py:send_json", "protocol/_report.py:to_dict"),
}
"""Each stage's outermost functions (``path/file.py:function``), as the report's trip now runs. "route + auth"
is the rest of the request: the guard and the direct route (``routes/ingest.py``'s ``report``), finding the
job and checking its token (``writer_of``), the ingest service's own glue: the request's cumulative time less
the other stages that run inside it. The writer runs apart (its own task, or the store's worker thread)."""


class Asgi:
    """Calls an ASGI app in-process: one HTTP request, its status and body."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def request(self, method: str, path: str, body: bytes = b"", token: str | None = None) -> tuple[int, bytes]:
        headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(body)).encode()))
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 80),
        }
        sent = False
        status = 0
        out: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                out.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(out)


async def _lifespan(app: Any) -> tuple[asyncio.Queue[Any], asyncio.Task[None]]:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    await outbox.get()
    return inbox, task


async def run(opts: argparse.Namespace, db: Path) -> dict[str, Any]:  # noqa: PLR0915 - one measured run, read top to bottom
    settings = ServerSettings(db=str(db), database_url=opts.database_url, health_sweep_s=3600.0)
    app = create_app(settings)
    inbox, life = await _lifespan(app)
    client = Asgi(app)
    jobs = []
    tag = f"{random.randrange(16**6):06x}"  # a database used before keeps its jobs
    for i in range(opts.jobs):
        status, body = await client.request(
            "POST", "/api/v1/namespaces/default/jobs", json.dumps({"name": f"prof-{tag}-{i}"}).encode()
        )
        assert status == 201, body
        jobs.append((f"prof-{tag}-{i}", json.loads(body)["token"]))
    rng = random.Random(0)
    per_job = opts.reports // opts.jobs
    warm = min(5, per_job // 4)
    bodies = [
        [json.dumps(report_body(opts, i, seq, warm, rng)).encode() for seq in range(per_job)] for i in range(opts.jobs)
    ]

    async def reporter(i: int, seqs: range) -> None:
        name, token = jobs[i]
        path = f"/api/v1/namespaces/default/jobs/{name}/reports"
        if opts.interval:  # paced: each job's reports that far apart, the jobs spread over the interval
            await asyncio.sleep(opts.interval * i / opts.jobs)
        for seq in seqs:
            status, answer = await client.request("POST", path, bodies[i][seq], token)
            assert status == 200, answer
            if opts.interval:
                await asyncio.sleep(opts.interval)

    await asyncio.gather(*(reporter(i, range(warm)) for i in range(opts.jobs)))
    profiles: list[cProfile.Profile] = []

    def thread_profiler(frame: Any, event: str, arg: Any) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        sys.setprofile(None)
        profile.enable()

    main = cProfile.Profile()
    profiles.append(main)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    process0 = time.process_time()
    if opts.profile:
        threading.setprofile(thread_profiler)
        main.enable()
    await asyncio.gather(*(reporter(i, range(warm, per_job)) for i in range(opts.jobs)))
    main.disable()
    threading.setprofile(None)
    process = time.process_time() - process0
    wall = time.perf_counter() - wall0
    n = opts.jobs * (per_job - warm)
    await inbox.put({"type": "lifespan.shutdown"})
    await life
    result: dict[str, Any] = {
        "reports": n,
        "wall_s": wall,
        "process_cpu_ms_per_report": 1000 * process / n,
        "loop_thread_cpu_ms_per_report": 1000 * (time.thread_time() - cpu0) / n,
    }
    if opts.profile:
        stats = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            try:
                p.disable()
                stats.add(p)
            except (TypeError, ValueError):
                pass
        result.update(stages(stats, n))
        if opts.dump:
            stats.dump_stats(opts.dump)
        if opts.top:
            stats.sort_stats("cumulative").print_stats(opts.top)
            stats.sort_stats("tottime").print_stats(opts.top)
    return result


def report_body(opts: argparse.Namespace, job: int, seq: int, warm: int, rng: random.Random) -> dict[str, Any]:
    """Report ``seq`` of job ``job``: rank 0's (5 windows); with ``--heartbeats``, the job has 8 ranks and its
    measured reports are the heartbeats of ranks 1-7 in turn (a fleet's seven reports in eight), each after
    the warm-up's rank-0 reports."""
    report = report_dict(f"run-{job}", seq, rng, 1000 + job)
    if not opts.heartbeats:
        return report
    report["identity"]["world_size"] = RANKS_PER_JOB
    return report if seq < warm else heartbeat(report, 1 + seq % (RANKS_PER_JOB - 1), RANKS_PER_JOB)


RANKS_PER_JOB = 8
"""A job's ranks with ``--heartbeats`` (``fleet.py``'s default)."""


def store_only(opts: argparse.Namespace, db: Path) -> dict[str, Any]:
    """The SQLite store's ``ingest_reports`` alone, ``opts.store`` reports a transaction (thread CPU)."""
    from stepwatch.protocol import Report
    from stepwatch.server.store import SQLiteStore
    from stepwatch.server.store.base import PendingReport

    store = SQLiteStore(db)
    try:
        jobs = [store.register("default", f"prof-{i}", token_hash="h", now=1.0) for i in range(opts.jobs)]
        rng = random.Random(0)
        per_job = opts.reports // opts.jobs
        reports = [
            [Report.from_dict(report_dict(f"run-{i}", seq, rng, 1000 + i)) for seq in range(per_job)]
            for i in range(opts.jobs)
        ]
        order = [(i, seq) for seq in range(per_job) for i in range(opts.jobs)]  # the jobs in turn
        latest = {job.id: job for job in jobs}

        def write(items: list[tuple[int, int]]) -> None:
            batch = [PendingReport(latest[jobs[i].id], reports[i][seq], 2.0 + seq) for i, seq in items]
            for result in store.ingest_reports(batch):
                assert not isinstance(result, Exception), result
                latest[result.job.id] = result.job

        warm = opts.jobs * min(5, per_job // 4)
        b = opts.store
        for k in range(0, warm, b):
            write(order[k : min(k + b, warm)])
        cpu0 = time.thread_time()
        for k in range(warm, len(order), b):
            write(order[k : k + b])
        n, cpu = len(order) - warm, time.thread_time() - cpu0
        return {"reports": n, "batch": b, "store_thread_cpu_us_per_report": round(1e6 * cpu / n, 1)}
    finally:
        store.close()


def stages(stats: pstats.Stats, n: int) -> dict[str, Any]:
    """Cumulative ms per report of each stage (its outermost functions; one called by another of its own
    stage is not counted again) and of every function counted."""
    table = stats.stats  # type: ignore[attr-defined]
    owner = {mark: stage for stage, marks in STAGES.items() for mark in marks}

    def mark_of(key: tuple[str, int, str]) -> str | None:
        file, _line, fn = key
        for mark in owner:
            path, name = mark.split(":")
            if fn == name and file.endswith("/" + path):
                return mark
        return None

    per_stage = dict.fromkeys(STAGES, 0.0)
    functions: dict[str, float] = {}
    for key, (_cc, _nc, _tt, ct, callers) in table.items():
        mark = mark_of(key)
        if mark is None or any(owner.get(mark_of(c) or "") == owner[mark] for c in callers):
            continue
        per_stage[owner[mark]] += ct
        functions[f"{key[0].split('stepwatch/')[-1]}:{key[1]}({key[2]})"] = round(1000 * ct / n, 4)
    inside = ("writer (store)", "route + auth")
    per_stage["route + auth"] -= sum(ms for stage, ms in per_stage.items() if stage not in inside)
    return {
        "stages_ms_per_report": {stage: round(1000 * ct / n, 4) for stage, ct in per_stage.items()},
        "functions_ms_per_report": dict(sorted(functions.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=4000)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--database-url")
    parser.add_argument(
        "--interval", type=float, default=0.0, help="seconds between a job's reports (default: back to back)"
    )
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument(
        "--heartbeats", action="store_true", help="measure heartbeats (ranks 1-7 of 8), not rank 0's reports"
    )
    parser.add_argument("--store", type=int, metavar="B", help="the SQLite store alone, B reports a transaction")
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--dump", metavar="PATH", help="write the merged profile there (pstats), to read its callers")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "prof.db"
        result = store_only(opts, db) if opts.store else asyncio.run(run(opts, db))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
