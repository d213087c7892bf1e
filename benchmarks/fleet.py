"""A fleet on one server: N simulated ranks, each reporting every 2 s (the report core's default) with
the report core's bodies, against a real ``stepwatch server``; report latency, the delay to the live
stream, and the server's CPU per report, projected to the cores a 10,000-GPU cluster needs.

    .venv/bin/python benchmarks/fleet.py --ranks 400 --ranks-per-job 8 --seconds 30
    .venv/bin/python benchmarks/fleet.py --ranks 400 --database-url postgresql://root@127.0.0.1/test

Jobs have ``--ranks-per-job`` ranks (one GPU each): rank 0 sends the 5 metric windows of
``server_ingest.report_dict`` (what ``Report.to_dict`` writes for the report core's window), the other
ranks heartbeats (step, step time, no metrics), as the report core sends them. Each rank starts at a
random point of its first interval, so the fleet's reports spread over time as real ranks' do. One
process drives every rank (asyncio, one kept-alive connection each: ~0.1 ms of CPU a request, measured
as the load generator's CPU) and one reader of ``GET /api/v1/events``: the delay to the live stream is
the arrival of a ``points`` update minus the moment its report was sent.

The projection: a 10,000-GPU cluster's ranks send 5,000 reports/s. Cores = 5,000 x the measured server
CPU per report (every process and thread of the server; PostgreSQL's backends apart), doubled so that
the server runs at half its capacity (where p99 latency stays low); the mix of rank-0 reports and
heartbeats is this run's (1 in ``--ranks-per-job``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_ingest import PostgresDatabase, RawClient, Server, pct, register_jobs, report_dict

CLUSTER_GPUS = 10_000
INTERVAL_S = 2.0


def heartbeat(body: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """A rank's heartbeat: rank 0's body without metrics, its own identity and step time."""
    out = {k: v for k, v in body.items() if k not in ("metrics", "params")}
    out["metrics"] = []
    out["identity"] = {**body["identity"], "rank": rank, "local_rank": rank % 8, "world_size": world}
    return out


class Fleet:
    """Every simulated rank, and the live-stream reader."""

    def __init__(self, base: str, jobs: list[tuple[str, str]], ranks_per_job: int, seconds: float) -> None:
        self.base = base
        self.jobs = jobs
        self.world = ranks_per_job
        self.seconds = seconds
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.sent_at: dict[tuple[str, int], float] = {}
        self.live_delays: list[float] = []
        self.measuring = False
        self.answered = 0
        """Reports answered in the whole run, warm-up included (the server's CPU is over all of it)."""

    async def rank(self, job: int, rank: int, end: float) -> None:
        name, token = self.jobs[job]
        host, port = self.base.removeprefix("http://").split(":")
        client = RawClient(host, int(port))
        headers = f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n".encode()
        path = f"/api/v1/namespaces/default/jobs/{name}/reports"
        rng = random.Random(f"{job}/{rank}")
        await asyncio.sleep(rng.random() * INTERVAL_S)
        seq = 0
        try:
            while time.monotonic() < end:
                tick = time.monotonic()
                body = report_dict(f"fleet-{job}", seq, rng, 1000 + rank)
                if rank:
                    body = heartbeat(body, rank, self.world)
                else:
                    body["identity"]["world_size"] = self.world
                    self.sent_at[(name, body["progress"]["step"])] = time.time()
                status = await client.request("POST", path, headers, json.dumps(body).encode())
                self.answered += 1
                if self.measuring:
                    self.latencies.append(time.monotonic() - tick)
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                seq += 1
                await asyncio.sleep(max(0.0, tick + INTERVAL_S - time.monotonic()))
        finally:
            await client.close()

    async def read_live(self, end: float) -> None:
        host, port = self.base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /api/v1/events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode())
        kind = ""
        try:
            while time.monotonic() < end:
                try:
                    line = await asyncio.wait_for(reader.readline(), timeout=1.0)
                except asyncio.TimeoutError:
                    continue
                if line.startswith(b"event:"):
                    kind = line[6:].strip().decode()
                elif line.startswith(b"data:") and kind == "points":
                    data = json.loads(line[5:])
                    step = data["points"]["loss"]["step"]
                    sent = self.sent_at.pop((data["name"], step), None)
                    if sent is not None and self.measuring:
                        self.live_delays.append(time.time() - sent)
        finally:
            writer.close()

    async def run(self, warmup: float) -> None:
        end = time.monotonic() + warmup + self.seconds
        tasks = [asyncio.create_task(self.read_live(end + 1.0))]
        await asyncio.sleep(0.2)
        tasks += [asyncio.create_task(self.rank(j, r, end)) for j in range(len(self.jobs)) for r in range(self.world)]
        await asyncio.sleep(warmup)
        self.measuring = True
        await asyncio.sleep(self.seconds)
        self.measuring = False
        await asyncio.gather(*tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=400)
    parser.add_argument("--ranks-per-job", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--database-url", help="PostgreSQL server: a throwaway database is made there")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--src", help="serve the stepwatch of this src/ (another checkout's: the code before)")
    opts = parser.parse_args()
    n_jobs = max(1, opts.ranks // opts.ranks_per_job)
    with tempfile.TemporaryDirectory() as tmp:
        pg = PostgresDatabase(opts.database_url) if opts.database_url else None
        try:
            url = pg.url if pg is not None else None
            with Server(
                Path(tmp) / "fleet.db",
                Path(tmp) / "server.log",
                database_url=url,
                src=Path(opts.src) if opts.src else None,
            ) as server:
                jobs = register_jobs(server.base, [f"fleet-{i:04d}" for i in range(n_jobs)])
                fleet = Fleet(server.base, jobs, opts.ranks_per_job, opts.seconds)
                cpu0 = server.cpu_s()
                db0 = server.db_cpu_s() if pg is None else pg.cpu_s()
                client0 = time.process_time()
                wall0 = time.monotonic()
                asyncio.run(fleet.run(opts.warmup))
                wall = time.monotonic() - wall0
                server_cpu = server.cpu_s() - cpu0
                db_cpu = (server.db_cpu_s() if pg is None else pg.cpu_s()) - db0
                client_cpu = time.process_time() - client0
        finally:
            if pg is not None:
                pg.drop()
    total = sum(fleet.statuses.values())
    per_s = total / opts.seconds
    reports_all = fleet.answered  # the CPU is over the whole run, warm-up included
    cpu_ms = 1000 * server_cpu / max(reports_all, 1)
    db_ms = 1000 * db_cpu / max(reports_all, 1)
    needed = CLUSTER_GPUS / INTERVAL_S * (cpu_ms + db_ms) / 1000
    out = {
        "store": "postgres" if opts.database_url else "sqlite",
        "ranks": n_jobs * opts.ranks_per_job,
        "jobs": n_jobs,
        "reports_per_s": round(per_s, 1),
        "statuses": fleet.statuses,
        "latency_ms": {
            "p50": round(1000 * pct(fleet.latencies, 0.5), 2),
            "p99": round(1000 * pct(fleet.latencies, 0.99), 2),
        },
        "live_delay_ms": {
            "n": len(fleet.live_delays),
            "p50": round(1000 * pct(fleet.live_delays, 0.5), 2),
            "p99": round(1000 * pct(fleet.live_delays, 0.99), 2),
        },
        "server_cpu_ms_per_report": round(cpu_ms, 3),
        "db_cpu_ms_per_report": round(db_ms, 3),
        "load_generator_cpu_ms_per_report": round(1000 * client_cpu / max(reports_all, 1), 3),
        "server_cores_used": round(server_cpu / wall, 3),
        "projection": {
            "gpus": CLUSTER_GPUS,
            "reports_per_s": CLUSTER_GPUS / INTERVAL_S,
            "cores_at_full_load": round(needed, 2),
            "cores_at_half_load": round(2 * needed, 2),
        },
    }
    print(json.dumps(out, indent=1))
    if opts.json:
        Path(opts.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
