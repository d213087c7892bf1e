"""Server performance of stepwatch: ingest, live delay, history, listing and memory, in one run.

The real server runs as ``python -m stepwatch server`` in a subprocess on a free loopback port, with
a fresh SQLite file in a temporary directory; nothing is read back from an earlier run::

    .venv/bin/python benchmarks/server_ingest.py --json benchmarks/results/server.json
    .venv/bin/python benchmarks/server_ingest.py --quick          # small sizes, a smoke run (< 60 s)

Sections (docs/server-performance.md says what each figure means):

1. ingest: 200 reporters (one registered job each) post native reports with 5 metric windows back
   to back over kept-alive connections for 20 s, from two load-generator subprocesses; reports/s
   accepted, latency p50/p99 and the CPU split between server, load generator and the rest of the
   machine (from /proc), for fresh jobs and for jobs with an hour of reports behind them; then the
   latency at paced loads, the ratio to upstream Kubeflow's 5 requests/s, and the HTTP floor (a GET
   of a path with no route: 404 without touching the store). The load generator is a minimal
   HTTP/1.1 client by default: httpx.AsyncClient (``--client httpx``) costs several times the
   server's CPU per request, and with 2 cores it would starve the server it measures;
2. step to SSE: a real reporter (``stepwatch.init``, default interval) steps a counter; a subscriber
   of ``GET /api/v1/events?job=NAME`` notes when each ``points`` event arrives;
3. history: ``GET .../history?metrics=loss&max_points=1000`` of a job with 1,000,000 stored windows;
4. listing: ``GET /api/v1/jobs?limit=10000`` (and ``limit=50``) over 10,000 jobs;
5. memory: the server's RSS with 10,000 jobs and 10,000,000 points stored, after a list and a
   history read;
6. one process, and replicas, side by side: the back-to-back load of section 1 (fresh jobs, 10 s)
   against, in turn, a bare uvicorn + Starlette endpoint that reads the same body and answers 200
   (the floor), SQLite served by one process with the code before (``--baseline REV``, a ``git
   archive`` of that commit's src/, or ``--baseline-src PATH``) and with this tree, and PostgreSQL
   (``--database-url``: a throwaway database made there and dropped) with 1 and with 2 replicas, the
   load generators split across the replicas' ports (no load balancer). Reports/s, p50/p99, and the
   CPU per report of the server processes and of PostgreSQL's backends (``--rounds N`` measures each
   target N times, in turn)::

    .venv/bin/python benchmarks/server_ingest.py --sections 6 --baseline main \
        --database-url postgresql://root@127.0.0.1/test

Sections 3-5 share one database, built with the server stopped: jobs through ``SQLiteStore.register``
and one ``SQLiteStore.ingest_report`` each, points with ``executemany`` into the ``points`` table (a
report holds one window per metric, so 1,000,000 windows through ``ingest_report`` would take a
million transactions; the rate of that path is measured and printed too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
NAMESPACE = "default"

# Targets of the issue, printed beside the figures.
TARGET_INGEST_RPS = 2_000.0
TARGET_INGEST_P99_MS = 50.0
KUBEFLOW_QPS = 5.0
"""Upstream's status server writes each update through client-go, whose default rate limit is 5 QPS."""
TARGET_SSE_EXTRA_MS = 100.0
TARGET_HISTORY_MS = 100.0
TARGET_LIST_MS = 200.0
TARGET_RSS_MB = 200.0

FLOOR_PATH = "/api/v1/benchmark-floor"
"""No route: the server answers 404 through its router and error handler, touching no store. (Not
``/api/v1/version`` or ``/healthz``: they read the installed version from package metadata on every
call, about 0.5 ms.)"""

METRICS = ("loss", "lr", "grad_norm", "accuracy", "tokens_per_s")
STEPS_PER_WINDOW = 20
TOTAL_STEPS = 10_000_000
"""Of the load generator's jobs: far enough that no job of section 1 finishes."""
"""A reporter at 10 steps/s with the default 2 s interval folds 20 steps into each window."""

FULL = {
    "reporters": 200,
    "loadgen_procs": 2,
    "client": "raw",
    "start_delay_s": 2.5,
    "floor_s": 5.0,
    "warmup_s": 3.0,
    "paced_half": True,
    "paced_warmup_s": 2.0,
    "duration_s": 20.0,
    "paced_s": 10.0,
    "sse_samples": 30,
    "sse_interval": 2.0,
    "history_windows": 1_000_000,
    "jobs": 10_000,
    "points": 10_000_000,
    "compare_s": 10.0,
    "rounds": 1,
}
QUICK = {
    "reporters": 40,
    "loadgen_procs": 2,
    "client": "raw",
    "start_delay_s": 1.5,
    "floor_s": 1.0,
    "warmup_s": 0.5,
    "paced_half": False,
    "paced_warmup_s": 1.0,
    "duration_s": 2.0,
    "paced_s": 2.0,
    "sse_samples": 4,
    "sse_interval": 0.5,
    "history_windows": 20_000,
    "jobs": 500,
    "points": 200_000,
    "compare_s": 2.0,
    "rounds": 1,
}


# ------------------------------------------------------------------------------------------ helpers


def free_port() -> int:
    """A loopback port nobody listens on now (bound, noted, closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    # after the command name: state is field 3, utime 14 and stime 15 (1-based in proc(5))
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kb(pid: int, field: str) -> int:
    """A field of /proc/PID/status in KiB (VmRSS: resident now; VmHWM: peak resident)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def machine_cpu_s() -> dict[str, float]:
    """CPU seconds of the whole machine since boot, all CPUs, from /proc/stat: busy, idle, steal."""
    with open("/proc/stat", encoding="ascii") as fh:
        values = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    return {
        "busy": (user + nice + system + irq + softirq) / CLK_TCK,
        "idle": (idle + iowait) / CLK_TCK,
        "steal": steal / CLK_TCK,
    }


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, nearest rank on the sorted list."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def fmt_ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 1000:
        return f"{value / 1000:,.2f} s"
    return f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "MISSED")


def run_child(kind: str, args: dict[str, Any]) -> subprocess.Popen[str]:
    """Start this script as ``--child kind`` in a fresh interpreter (stdout: one RESULT line)."""
    cmd = [sys.executable, str(HERE), "--child", kind, "--child-args", json.dumps(args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def child_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"unavailable": f"load generator timed out after {timeout:.0f} s"}
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    tail = (err.strip().splitlines() or ["no output"])[-1]
    return {"unavailable": f"load generator exited {proc.returncode}: {tail[:300]}"}


def emit(result: dict[str, Any]) -> None:
    sys.stdout.flush()
    print("RESULT " + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------ the server


class Server:
    """``python -m stepwatch server`` on a free loopback port, in its own process: on the SQLite file ``db``,
    or on ``database_url``; the stepwatch of ``src`` (default: this tree's); ``command`` instead of the
    stepwatch server (the bare endpoint: it gets ``--port PORT``)."""

    def __init__(
        self,
        db: Path | None,
        log: Path,
        *,
        database_url: str | None = None,
        src: Path | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.db = db
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.bases = [self.base]
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        where = ["--database-url", database_url] if database_url else ["--db", str(db)]
        server = [sys.executable, "-m", "stepwatch", "server", *where, "--log-level", "warning"]
        # BENCH_SERVER_PREFIX wraps the server for profiling, e.g. "py-spy record -r 200 -f raw -o prof.txt --"
        cmd = [*shlex.split(os.environ.get("BENCH_SERVER_PREFIX", "")), *(command or server), "--port", str(self.port)]
        source = str(src or REPO / "src")
        env = {**os.environ, "PYTHONPATH": source + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.base + "/healthz", timeout=1.0).status_code == 200:
                    self.ready_s = time.perf_counter() - self.started
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the server did not answer within {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-800:]
        except OSError:
            return ""

    def cpu_s(self) -> float:
        return proc_cpu_s(self.pid)

    def db_cpu_s(self) -> float:
        """CPU of the database's own processes (none: SQLite works inside the server)."""
        return 0.0

    def rss_mb(self, field: str = "VmRSS") -> float:
        return proc_status_kb(self.pid, field) / 1024

    def threads(self) -> int:
        return proc_status_kb(self.pid, "Threads")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def register_jobs(base: str, names: list[str]) -> list[tuple[str, str]]:
    """Register jobs through the API; (name, token) pairs."""
    import httpx

    out = []
    with httpx.Client(base_url=base, timeout=30.0) as client:
        for name in names:
            response = client.post(
                f"/api/v1/namespaces/{NAMESPACE}/jobs", json={"name": name, "total_steps": TOTAL_STEPS}
            )
            response.raise_for_status()
            out.append((name, response.json()["token"]))
    return out


# ------------------------------------------------------------------------------------- 1. ingest


def report_dict(run_id: str, seq: int, rng: random.Random, pid: int, base_step: int = 0) -> dict[str, Any]:
    """A realistic native report as ``Report(...).to_dict()`` gives it: rank 0, 20 steps, 5 metric windows.

    Built as a dict (a few microseconds of load-generator CPU); ``check_report_dict`` proves it is what
    ``stepwatch.protocol.Report`` reads and writes back unchanged.
    """
    step = base_step + (seq + 1) * STEPS_PER_WINDOW
    decay = math.exp(-step / 20_000)
    centres = (0.2 + 2.0 * decay, 3e-4 * min(1.0, step / 2_000), 0.5 + decay, 0.95 - 0.6 * decay, 41_000.0)
    windows = []
    for name, centre in zip(METRICS, centres):
        spread = abs(centre) * 0.05 + 1e-9
        low, high = centre - spread * rng.random(), centre + spread * rng.random()
        windows.append(
            {
                "name": name,
                "last": rng.uniform(low, high),
                "min": low,
                "max": high,
                "mean": (low + high) / 2,
                "count": STEPS_PER_WINDOW,
                "nonfinite": 0,
                "first_step": step - STEPS_PER_WINDOW + 1,
                "last_step": step,
            }
        )
    body: dict[str, Any] = {
        "api_version": "v1",
        "run_id": run_id,
        "seq": seq,
        "sent_at": time.time(),
        "state": "running",
        "identity": {"rank": 0, "world_size": 1, "local_rank": 0, "host": "bench-node", "pid": pid},
        "progress": {
            "step": step,
            "total_steps": TOTAL_STEPS,
            "samples": step * 32,
            "steps_per_second": 10.0,
            "samples_per_second": 320.0,
            "step_time": 0.1,
        },
        "metrics": windows,
    }
    if seq == 0:
        body["params"] = {"lr": 3e-4, "batch_size": 32, "model": "bench"}
    return body


def check_report_dict() -> None:
    """The load generator's bodies are exactly what the protocol's Report writes (validated both ways)."""
    from stepwatch.protocol import Report

    rng = random.Random(0)
    for seq in (0, 1, 500):
        body = report_dict("check", seq, rng, 1)
        if Report.from_dict(body).to_dict() != body:
            raise AssertionError("the load generator's report differs from Report(...).to_dict()")


class RawClient:
    """A minimal HTTP/1.1 client on one kept-alive connection (the default load generator).

    Like the report core's transport, it reconnects (once) when the server has closed an idle
    connection: uvicorn closes connections idle for 5 s.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reconnects = 0

    async def request(self, method: str, path: str, headers: bytes, body: bytes) -> int:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Length: {len(body)}\r\n"
        message = head.encode() + headers + b"\r\n" + body
        if self.reader is not None and self.reader.at_eof():
            await self.close()  # closed by the server while idle
            self.reconnects += 1
        reused = self.writer is not None
        try:
            return await self._exchange(message)
        except (ConnectionError, asyncio.IncompleteReadError):
            if not reused:
                raise
            self.reconnects += 1  # the server closed it as we sent: once more on a new connection
            return await self._exchange(message)

    async def _exchange(self, message: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert self.reader is not None
        try:
            self.writer.write(message)
            line = await self.reader.readline()
            if not line:
                raise ConnectionResetError("the server closed the connection")
            status = int(line.split(None, 2)[1])
            length, chunked, close = 0, False, False
            while True:
                header = await self.reader.readline()
                if header in (b"\r\n", b"\n", b""):
                    break
                key, _, value = header.partition(b":")
                key = key.strip().lower()
                if key == b"content-length":
                    length = int(value)
                elif key == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
                elif key == b"connection":
                    close = value.strip().lower() == b"close"
            if chunked:
                while True:
                    size = int((await self.reader.readline()).split(b";")[0], 16)
                    await self.reader.readexactly(size + 2)
                    if size == 0:
                        break
            elif length:
                await self.reader.readexactly(length)
            if close:
                await self.close()
            return status
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        writer, self.writer, self.reader = self.writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


def child_loadgen(args: dict[str, Any]) -> dict[str, Any]:
    """One load-generator process: its share of the reporters, each on its own kept-alive connection."""
    check_report_dict()
    return asyncio.run(LoadGenerator(args).run())


class LoadGenerator:
    """The reporters of one load-generator process and what they saw in the measured window."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.args = args
        self.start_at: float = args["start_at"]
        self.measure_from: float = args["measure_from"]
        self.end_at: float = args["end_at"]
        self.period: float | None = args["period"]
        self.floor = args["target"] == "floor"
        self.expect = "404" if self.floor else "200"
        host, port = args["base"].removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.latencies: list[float] = []
        self.statuses: dict[str, int] = {}
        self.errors: list[str] = []
        self.per_second: dict[int, int] = {}
        self.reconnects = 0
        self.slow: list[tuple[float, float]] = []
        """(seconds into the measurement, ms) of each answer slower than :data:`TARGET_INGEST_P99_MS`."""

    async def run(self) -> dict[str, Any]:
        import httpx

        jobs: list[list[str]] = self.args["jobs"]
        limits = httpx.Limits(max_connections=len(jobs), max_keepalive_connections=len(jobs))
        async with httpx.AsyncClient(base_url=self.args["base"], limits=limits, timeout=60.0) as pool:
            await asyncio.gather(*(self.reporter(pool, name, token) for name, token in jobs))
        return {
            "latencies_ms": self.latencies,
            "statuses": self.statuses,
            "errors": self.errors,
            "per_second": self.per_second,
            "reconnects": self.reconnects,
            "slow": self.slow,
        }

    async def reporter(self, pool: Any, name: str, token: str) -> None:
        """One reporter: the next report as soon as the previous one is answered, or on its pace."""
        from stepwatch.protocol import encode_body, report_path

        rng = random.Random(f"{name}-{self.args['seed']}")
        path = FLOOR_PATH if self.floor else report_path(NAMESPACE, name)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        raw = RawClient(self.host, self.port) if self.args["client"] == "raw" else None
        run_id = f"bench-{self.args['seed']}-{name}"
        seq = 0
        next_at = self.start_at + (rng.uniform(0, self.period) if self.period else 0.0)
        try:
            while True:
                if self.period:
                    await asyncio.sleep(max(0.0, next_at - time.time()))
                    next_at = max(next_at + self.period, time.time())
                else:
                    await asyncio.sleep(max(0.0, self.start_at - time.time()))
                if time.time() >= self.end_at:
                    return
                body = (
                    b""
                    if self.floor
                    else encode_body(report_dict(run_id, seq, rng, os.getpid(), self.args["base_step"]))
                )
                seq += 1
                t0 = time.perf_counter()
                code = await self.send(pool, raw, path, headers, body, name)
                self.record(code, time.perf_counter() - t0)
                if not code.isdigit():
                    await asyncio.sleep(0.1)  # a broken connection: do not spin
        finally:
            if raw is not None:
                self.reconnects += raw.reconnects
                await raw.close()

    async def send(
        self, pool: Any, raw: RawClient | None, path: str, headers: dict[str, str], body: bytes, name: str
    ) -> str:
        import httpx

        try:
            if raw is not None:
                raw_headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
                return str(await raw.request("GET" if self.floor else "POST", path, raw_headers, body))
            if self.floor:
                return str((await pool.get(path)).status_code)
            return str((await pool.post(path, content=body, headers=headers)).status_code)
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError, httpx.HTTPError) as exc:
            if len(self.errors) < 5:
                self.errors.append(f"{name}: {exc!r}")
            return type(exc).__name__

    def record(self, code: str, elapsed: float) -> None:
        done = time.time()
        if self.measure_from <= done < self.end_at:
            self.statuses[code] = self.statuses.get(code, 0) + 1
            if code == self.expect:
                self.latencies.append(round(elapsed * 1000, 3))
                if elapsed * 1000 > TARGET_INGEST_P99_MS:
                    self.slow.append((round(done - self.measure_from, 3), round(elapsed * 1000, 1)))
            second = int(done - self.measure_from)
            self.per_second[second] = self.per_second.get(second, 0) + 1


def ingest_phase(
    server: Server | Replicas,
    jobs: list[tuple[str, str]],
    cfg: dict[str, Any],
    duration_s: float,
    period: float | None,
    seed: str,
    target: str = "reports",
    warmup_s: float | None = None,
    base_step: int = 0,
) -> dict[str, Any]:
    """One load phase: load generators share the jobs; server and generator CPU from /proc over the window."""
    procs = max(cfg["loadgen_procs"], len(server.bases))  # every replica gets a generator of its own
    warmup = cfg["warmup_s"] if warmup_s is None else warmup_s
    start_at = time.time() + cfg["start_delay_s"]  # the generators import httpx and build their clients meanwhile
    measure_from = start_at + warmup
    end_at = measure_from + duration_s
    children = [
        run_child(
            "loadgen",
            {
                "base": server.bases[i % len(server.bases)],  # replicas: the generators split across their ports
                "jobs": jobs[i::procs],
                "start_at": start_at,
                "measure_from": measure_from,
                "end_at": end_at,
                "period": period,
                "seed": f"{seed}{i}",
                "client": cfg["client"],
                "target": target,
                "base_step": base_step,
            },
        )
        for i in range(procs)
    ]
    time.sleep(max(0.0, measure_from - time.time()))
    cpu0, db0 = server.cpu_s(), server.db_cpu_s()
    gen0 = [proc_cpu_s(c.pid) for c in children]
    machine0 = machine_cpu_s()
    wall0 = time.perf_counter()
    time.sleep(max(0.0, end_at - time.time()))
    cpu1, db1 = server.cpu_s(), server.db_cpu_s()
    gen1 = [proc_cpu_s(c.pid) for c in children]
    machine1 = machine_cpu_s()
    wall = time.perf_counter() - wall0
    results = [child_result(c, timeout=duration_s + warmup + 120) for c in children]
    missing = [r["unavailable"] for r in results if "unavailable" in r]
    if missing:
        return {"unavailable": "; ".join(missing)}
    latencies = [x for r in results for x in r["latencies_ms"]]
    bursts = slow_bursts([tuple(x) for r in results for x in r.get("slow", [])])
    statuses: dict[str, int] = {}
    per_second: dict[int, int] = {}
    for r in results:
        for code, n in r["statuses"].items():
            statuses[code] = statuses.get(code, 0) + n
        for second, n in r["per_second"].items():
            per_second[int(second)] = per_second.get(int(second), 0) + n
    accepted = statuses.get("404" if target == "floor" else "200", 0)
    seconds = [per_second.get(s, 0) for s in range(int(duration_s))]
    server_cpu = cpu1 - cpu0
    db_cpu = db1 - db0
    gen_cpu = sum(b - a for a, b in zip(gen0, gen1))
    busy = machine1["busy"] - machine0["busy"]
    return {
        "reporters": len(jobs),
        "load_generators": procs,
        "client": cfg["client"],
        "period_s": period,
        "duration_s": duration_s,
        "wall_s": wall,
        "requests": sum(statuses.values()),
        "statuses": statuses,
        "errors": [e for r in results for e in r["errors"]][:5],
        "all_ok": accepted == sum(statuses.values()) and accepted > 0,
        "reconnects": sum(r["reconnects"] for r in results),
        "accepted_per_s": accepted / duration_s,
        "per_second_min": min(seconds) if seconds else 0,
        "per_second_max": max(seconds) if seconds else 0,
        "p50_ms": pct(latencies, 0.50),
        "p90_ms": pct(latencies, 0.90),
        "p99_ms": pct(latencies, 0.99),
        "max_ms": max(latencies) if latencies else math.nan,
        "slow_bursts": bursts,
        "server_cpu_s": server_cpu,
        "server_cores": server_cpu / wall,
        "server_cpu_ms_per_request": 1000 * server_cpu / accepted if accepted else math.nan,
        "db_cpu_ms_per_request": 1000 * db_cpu / accepted if accepted else math.nan,
        "loadgen_cpu_s": gen_cpu,
        "loadgen_cores": gen_cpu / wall,
        "loadgen_cpu_ms_per_request": 1000 * gen_cpu / accepted if accepted else math.nan,
        "other_cores": max(0.0, (busy - server_cpu - db_cpu - gen_cpu) / wall),
        "steal_cores": (machine1["steal"] - machine0["steal"]) / wall,
        "idle_cores": (machine1["idle"] - machine0["idle"]) / wall,
    }


def slow_bursts(slow: list[tuple[float, float]], gap_s: float = 0.5) -> list[dict[str, float]]:
    """Answers slower than the target, grouped into bursts (answered less than ``gap_s`` apart): when each
    began (seconds into the measurement), how many answers, the slowest (ms). A tail made of a few bursts
    is something stopping the server for a moment (a pause, a copy, a collection), not a queue."""
    bursts: list[dict[str, float]] = []
    for at, ms in sorted(slow):
        if bursts and at - bursts[-1]["last_s"] < gap_s:
            burst = bursts[-1]
            burst["answers"] += 1
            burst["last_s"] = at
            burst["slowest_ms"] = max(burst["slowest_ms"], ms)
        else:
            bursts.append({"at_s": at, "last_s": at, "answers": 1, "slowest_ms": ms})
    return bursts


def seed_progress_history(db: Path, names: list[str], seconds: float, interval: float) -> tuple[int, int]:
    """Give each job the rank-0 reports of a job that has reported every ``interval`` for ``seconds``, up
    to now (rows of the ``reports`` table, written beside the running server: SQLite in WAL mode allows
    it); the number of rows and the last step."""
    conn = sqlite3.connect(db, timeout=30.0, isolation_level=None)
    try:
        marks = ", ".join("?" for _ in names)
        query = f"SELECT id FROM jobs WHERE namespace = ? AND name IN ({marks})"
        ids = [r[0] for r in conn.execute(query, (NAMESPACE, *names))]
        now = time.time()
        count = int(seconds / interval)
        rows = [
            (job_id, "earlier", 0, k, now - seconds + k * interval, now - seconds + k * interval, k * STEPS_PER_WINDOW)
            for job_id in ids
            for k in range(1, count + 1)
        ]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
        return len(rows), count * STEPS_PER_WINDOW
    finally:
        conn.close()


def last_step(db: Path) -> int:
    """The highest step reported so far (a later phase goes on from there: no job steps backwards)."""
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        return int(conn.execute("SELECT COALESCE(MAX(step), 0) FROM reports").fetchone()[0])
    finally:
        conn.close()


def section_ingest(server: Server, cfg: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    """Fresh jobs, then other jobs with an hour of reports behind them (back to back, then paced)."""
    n = cfg["reporters"]
    db = server.db
    assert db is not None, "section 1 runs on SQLite"
    t0 = time.perf_counter()
    fresh_jobs = register_jobs(server.base, [f"fresh-{i:04d}" for i in range(n)])
    hour_names = [f"hour-{i:04d}" for i in range(n)]
    hour_jobs = register_jobs(server.base, hour_names)
    out: dict[str, Any] = {"register_s": time.perf_counter() - t0, "reporters": n}
    progress(f"   HTTP floor: GET {FLOOR_PATH} (404), {n} connections back to back, {cfg['floor_s']:g} s")
    out["floor"] = ingest_phase(server, fresh_jobs, cfg, cfg["floor_s"], None, "f", target="floor", warmup_s=1.0)
    progress(f"   fresh jobs: {n} reporters back to back, {cfg['duration_s']:g} s")
    out["fresh"] = ingest_phase(server, fresh_jobs, cfg, cfg["duration_s"], None, "s")
    out["seeded_reports"], step = seed_progress_history(db, hour_names, 3600.0, 2.0)
    progress(
        f"   {n} other jobs with an hour of reports ({out['seeded_reports']:,} rows): back to back, "
        f"{cfg['duration_s']:g} s"
    )
    out["steady"] = steady = ingest_phase(server, hour_jobs, cfg, cfg["duration_s"], None, "t", base_step=step)
    out["paced"] = []
    out["rss_after_mb"] = server.rss_mb()
    if not cfg.get("paced", True):
        return out
    # Paced: each reporter sends every `period` seconds with one request outstanding, as the report
    # core does. The production pace (every 2 s), then half the capacity measured just above.
    progress(f"   paced: every 2 s, {cfg['paced_s']:g} s")
    phase = ingest_phase(
        server, hour_jobs, cfg, cfg["paced_s"], 2.0, "p", warmup_s=cfg["paced_warmup_s"], base_step=last_step(db)
    )
    out["paced"].append({"label": f"every 2 s ({n / 2:,.0f}/s offered)", **phase})
    capacity = steady.get("accepted_per_s", 0.0)
    if cfg["paced_half"] and capacity > 0:
        rate = min(TARGET_INGEST_RPS, capacity / 2)
        period = n / rate
        progress(f"   paced: every {period:.2f} s, {cfg['paced_s']:g} s")
        phase = ingest_phase(
            server,
            hour_jobs,
            cfg,
            cfg["paced_s"],
            period,
            "h",
            warmup_s=cfg["paced_warmup_s"],
            base_step=last_step(db),
        )
        out["paced"].append({"label": f"every {period:.2f} s ({rate:,.0f}/s, half the capacity)", **phase})
    out["rss_after_mb"] = server.rss_mb()
    return out


# ------------------------------------------------------------------------------- 2. step to SSE


class SseSubscriber:
    """``GET /api/v1/events?job=NAME`` read in a thread: the arrival time of each ``points`` event."""

    def __init__(self, base: str, job: str, metric: str) -> None:
        self.base, self.job, self.metric = base, job, metric
        self.arrivals: list[tuple[float, dict[str, Any]]] = []
        self.problems: list[str] = []
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.response: Any = None
        self.thread = threading.Thread(target=self._read, name="sse-subscriber", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(10)
        time.sleep(0.2)  # the server registers the subscription as the response starts

    def _read(self) -> None:
        import httpx

        try:
            with (
                httpx.Client(timeout=httpx.Timeout(10.0, read=None)) as client,
                client.stream("GET", self.base + "/api/v1/events", params={"job": self.job}) as response,
            ):
                self.response = response
                self.ready.set()
                kind = None
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:") and kind == "points":
                        now = time.perf_counter()
                        point = json.loads(line[5:])["points"].get(self.metric)
                        if point is not None:
                            self.arrivals.append((now, point))
                    elif not line:
                        kind = None
        except Exception as exc:  # the stream is closed under the reader at the end
            if not self.stopping.is_set():
                self.problems.append(repr(exc))
        finally:
            self.ready.set()

    def stop(self) -> None:
        self.stopping.set()
        if self.response is not None:
            try:
                self.response.close()
            except Exception:
                pass
        self.thread.join(2)


def section_sse(server: Server, cfg: dict[str, Any]) -> dict[str, Any]:
    """A real reporter steps a counter (10 steps/s, jittered); each points event is matched to its steps."""
    import stepwatch

    interval = cfg["sse_interval"]
    samples = cfg["sse_samples"]
    name = "sse-delay"
    ((_, token),) = register_jobs(server.base, [name])
    subscriber = SseSubscriber(server.base, name, "counter")
    subscriber.start()
    step_times: dict[int, float] = {}
    rng = random.Random(3)
    run = stepwatch.init(job=name, namespace=NAMESPACE, url=server.base, token=token, interval=interval)
    started = time.perf_counter()
    deadline = started + (samples + 3) * interval + 15
    counter = 0
    try:
        while len(subscriber.arrivals) < samples + 1 and time.perf_counter() < deadline and not subscriber.problems:
            counter += 1
            step_times[counter] = time.perf_counter()
            run.step(counter=float(counter))
            time.sleep(rng.uniform(0.05, 0.15))  # jitter: no phase lock with the sender's ticks
    finally:
        run.finish()
        subscriber.stop()
    last_delays: list[float] = []
    all_delays: list[float] = []
    # the first window waited for the reporter's start; it is dropped
    for arrived, point in subscriber.arrivals[1 : samples + 1]:
        if int(point["last"]) in step_times:
            last_delays.append(1000 * (arrived - step_times[int(point["last"])]))
        steps = range(int(point["min"]), int(point["max"]) + 1)
        all_delays += [1000 * (arrived - step_times[v]) for v in steps if v in step_times]
    return {
        "interval_s": interval,
        "step_period_s": 0.1,
        "windows": len(last_delays),
        "steps": len(all_delays),
        "last_p50_ms": pct(last_delays, 0.5),
        "last_p99_ms": pct(last_delays, 0.99),
        "last_max_ms": max(last_delays) if last_delays else math.nan,
        "all_p50_ms": pct(all_delays, 0.5),
        "all_p99_ms": pct(all_delays, 0.99),
        "all_max_ms": max(all_delays) if all_delays else math.nan,
        "problems": subscriber.problems,
        "seconds": time.perf_counter() - started,
    }


# ------------------------------------------------------------------- 3-5. the bulk database


def build_bulk(db: Path, cfg: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    """10,000 jobs (store API), one with 1,000,000 windows of loss, points up to 10,000,000 (executemany)."""
    from stepwatch.server.store import SQLiteStore

    out, job_ids = bulk_jobs(db, cfg["jobs"], progress)
    out.update(bulk_points(db, job_ids, cfg["history_windows"], max(cfg["points"], cfg["history_windows"]), progress))
    # Ingest keeps the roll-ups of every series as it stores windows; these were written beside the store,
    # so build them as ingest would have (SQLiteStore.rebuild_rollups), and time it.
    store = SQLiteStore(db)
    try:
        t0 = time.perf_counter()
        out["rollup_windows"] = store.rebuild_rollups()
        out["rollups_s"] = time.perf_counter() - t0
    finally:
        store.close()
    out["db_mb"] = db.stat().st_size / 2**20
    progress(
        f"   roll-ups of {out['rollup_windows']:,} windows built in {out['rollups_s']:.1f} s "
        f"({out['rollup_windows'] / out['rollups_s']:,.0f} windows/s); database {out['db_mb']:,.0f} MB"
    )
    return out


def bulk_jobs(db: Path, n_jobs: int, progress: Callable[[str], None]) -> tuple[dict[str, Any], list[int]]:
    """Jobs through SQLiteStore.register, then one report each through SQLiteStore.ingest_report (5 metrics,
    a step of its total); every 100th job ends (finished, failed or stopped in turn, or stays running)."""
    from stepwatch.protocol import Identity, MetricWindow, Progress, Report
    from stepwatch.server.api.request import hash_token
    from stepwatch.server.store import SQLiteStore

    out: dict[str, Any] = {}
    store = SQLiteStore(db)
    now = time.time() - 86_400
    rng = random.Random(7)
    try:
        t0 = time.perf_counter()
        jobs = []
        for i in range(n_jobs):
            name = "history-1m" if i == 0 else f"job-{i:05d}"
            total = rng.choice((1_000, 10_000, 100_000))
            jobs.append(store.register(NAMESPACE, name, token_hash=hash_token(f"t{i}"), now=now + i, total_steps=total))
        out["register_s"] = time.perf_counter() - t0
        progress(f"   registered {n_jobs:,} jobs in {out['register_s']:.1f} s (SQLiteStore.register)")
        t0 = time.perf_counter()
        for i, job in enumerate(jobs):
            step = rng.randrange(STEPS_PER_WINDOW, job.total_steps or 1000)
            first = step - STEPS_PER_WINDOW + 1
            windows = tuple(MetricWindow(m, 0.5, 0.4, 0.6, 0.5, STEPS_PER_WINDOW, 0, first, step) for m in METRICS)
            report = Report(
                run_id=f"bulk-{i}",
                seq=0,
                sent_at=now + n_jobs + i,
                identity=Identity(host="bench-node", pid=1000 + i),
                progress=Progress(step=step, total_steps=job.total_steps, steps_per_second=10.0),
                metrics=windows,
            )
            fresh = store.ingest_report(job, report, now + n_jobs + i).job
            if i % 100 == 99 and (i // 100) % 4 < 3:
                store.set_state(fresh, ("finished", "failed", "stopped")[(i // 100) % 4], now + 2 * n_jobs + i)
        out["ingest_s"] = time.perf_counter() - t0
        out["ingest_per_s"] = n_jobs / out["ingest_s"]
        progress(
            f"   one report per job through SQLiteStore.ingest_report: {out['ingest_s']:.1f} s "
            f"({out['ingest_per_s']:,.0f} reports/s)"
        )
        return out, [j.id for j in jobs]
    finally:
        store.close()


def window_rows(job_id: int, metric: str, windows: int, t_start: float) -> Iterator[tuple[Any, ...]]:
    """Rows of the points table: a window every 2 s of 20 steps, a decaying noisy curve, a rare NaN."""
    for k in range(windows):
        centre = 0.2 + 2.0 * math.exp(-k / (windows / 5 + 1)) + 0.05 * math.sin(k / 7)
        last: float | str = centre + 0.01
        nonfinite = 0
        if k % 100_000 == 99_999:  # a divergence: stored as the text 'NaN', as the store does
            last, nonfinite = "NaN", 1
        step = (k + 1) * STEPS_PER_WINDOW
        yield (job_id, metric, step, t_start + 2.0 * k, last, centre - 0.02, centre + 0.02, centre, 20, nonfinite)


def insert_points(conn: sqlite3.Connection, rows: Iterator[tuple[Any, ...]], batch: int = 200_000) -> int:
    """executemany into the points table, one transaction per batch."""
    sql = (
        "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    done = 0
    while True:
        chunk = [row for _, row in zip(range(batch), rows)]
        if not chunk:
            return done
        conn.execute("BEGIN")
        conn.executemany(sql, chunk)
        conn.execute("COMMIT")
        done += len(chunk)


def bulk_points(
    db: Path, job_ids: list[int], history_windows: int, total_points: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """The long history of the first job, then the rest spread over the others (5 metrics each)."""
    out: dict[str, Any] = {}
    now = time.time() - 86_400
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        t0 = time.perf_counter()
        # ingest_report stored one window of loss already
        inserted = insert_points(
            conn, window_rows(job_ids[0], "loss", history_windows - 1, now - 2.0 * history_windows)
        )
        out["history_insert_s"] = time.perf_counter() - t0
        progress(
            f"   {history_windows:,} windows of loss for history-1m in {out['history_insert_s']:.1f} s "
            f"({inserted / out['history_insert_s']:,.0f} rows/s, executemany)"
        )
        t0 = time.perf_counter()
        others = job_ids[1:]
        rest = total_points - (history_windows + len(METRICS) - 1) - len(others) * len(METRICS)  # stored so far
        rest_inserted = 0
        if rest > 0 and others:
            series = [(job_id, metric) for job_id in others for metric in METRICS]
            per_series, extra = divmod(rest, len(series))  # the first `extra` series get one window more
            rows = (
                row
                for i, (job_id, metric) in enumerate(series)
                for row in window_rows(job_id, metric, per_series + (i < extra), now - 2.0 * per_series)
            )
            rest_inserted = insert_points(conn, rows)
        out["rest_insert_s"] = time.perf_counter() - t0
        (out["points"],) = conn.execute("SELECT COUNT(*) FROM points").fetchone()
        (out["jobs"],) = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    out["db_mb"] = db.stat().st_size / 2**20
    if rest_inserted:
        progress(
            f"   {rest_inserted:,} more points over {len(others):,} jobs in {out['rest_insert_s']:.1f} s "
            f"({rest_inserted / out['rest_insert_s']:,.0f} rows/s); database {out['db_mb']:,.0f} MB"
        )
    return out


def timed_get(client: Any, path: str, params: dict[str, Any], runs: int = 5) -> dict[str, Any]:
    """One cold request, then ``runs`` timed ones: their median; the body size and item count."""
    times = []
    size = 0
    cold = math.nan
    for i in range(runs + 1):
        t0 = time.perf_counter()
        response = client.get(path, params=params)
        elapsed = 1000 * (time.perf_counter() - t0)
        response.raise_for_status()
        size = len(response.content)
        if i == 0:
            cold = elapsed
            body = response.json()
        else:
            times.append(elapsed)
    return {
        "cold_ms": cold,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "bytes": size,
        "body": body,
    }


def section_reads(server: Server, cfg: dict[str, Any], sections: str) -> dict[str, Any]:
    """On a fresh server over the bulk database: 4 (lists), 5 (RSS), then 3 (the long history)."""
    import httpx

    out: dict[str, Any] = {"rss_start_mb": server.rss_mb()}
    with httpx.Client(base_url=server.base, timeout=120.0) as client:
        if "4" in sections or "5" in sections:
            full = timed_get(client, "/api/v1/jobs", {"limit": 10_000})
            page = timed_get(client, "/api/v1/jobs", {"limit": 50})
            for row in (full, page):
                row["items"] = len(row["body"]["items"])
                row["total"] = row["body"]["total"]
                del row["body"]
            out["list_all"], out["list_page"] = full, page
            out["rss_after_list_mb"] = server.rss_mb()
            typical = timed_get(client, f"/api/v1/namespaces/{NAMESPACE}/jobs/job-00001/history", {"max_points": 1000})
            typical["series"] = {k: len(v) for k, v in typical["body"]["metrics"].items()}
            del typical["body"]
            out["history_typical"] = typical
            out["rss_after_list_history_mb"] = server.rss_mb()
            out["threads"] = server.threads()
        if "3" in sections or "5" in sections:
            long = timed_get(
                client,
                f"/api/v1/namespaces/{NAMESPACE}/jobs/history-1m/history",
                {"metrics": "loss", "max_points": 1000},
            )
            long["points"] = len(long["body"]["metrics"]["loss"])
            del long["body"]
            out["history_long"] = long
            out["rss_after_long_history_mb"] = server.rss_mb()
        out["rss_peak_mb"] = server.rss_mb("VmHWM")
    return out


def history_breakdown(db: Path, max_points: int = 1000) -> dict[str, Any]:
    """Where a long history read spends its time, in this process on the same file (not the server)."""
    from stepwatch.server.store import SQLiteStore
    from stepwatch.server.views.history import downsampled

    store = SQLiteStore(db)
    try:
        job = store.job(NAMESPACE, "history-1m")
        assert job is not None
        conn = sqlite3.connect(db)
        sql = (
            "SELECT step, t, last, min, max, mean, count, nonfinite FROM points WHERE job_id = ? AND metric = ? "
            "ORDER BY step, t"
        )
        t0 = time.perf_counter()
        rows = conn.execute(sql, (job.id, "loss")).fetchall()
        fetch = time.perf_counter() - t0
        n = len(rows)
        del rows
        plan = " | ".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, (job.id, "loss")))
        # the store read the history route uses: every window of the series as columns
        t0 = time.perf_counter()
        data = store.series_columns(job.id, "loss")
        series = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = downsampled(data, max_points)
        down = time.perf_counter() - t0
        t0 = time.perf_counter()
        json.dumps({"metrics": {"loss": result}})
        encode = time.perf_counter() - t0
        del data
        # The route's read: roll-ups and the windows after them (SQLiteStore.history_columns), then the same
        # downsampling; the raw read above is the baseline, in the same run.
        rollup_read = rollup_down = math.nan
        rollup_rows = 0
        if hasattr(store, "history_columns"):
            t0 = time.perf_counter()
            columns = store.history_columns(job.id, "loss", max_points)
            rollup_read = time.perf_counter() - t0
            rollup_rows = len(columns.steps)
            t0 = time.perf_counter()
            downsampled(columns, max_points)
            rollup_down = time.perf_counter() - t0
        # What bucketing inside SQLite costs (a candidate fix; same buckets of equal count).
        t0 = time.perf_counter()
        bucketed = conn.execute(
            "WITH numbered AS (SELECT step, t, last, min, max, mean, count, nonfinite, "
            "(ROW_NUMBER() OVER (ORDER BY step, t) - 1) * ? / (SELECT COUNT(*) FROM points "
            "WHERE job_id = ? AND metric = ?) AS bucket FROM points WHERE job_id = ? AND metric = ?) "
            "SELECT MAX(step), MIN(min), MAX(max), SUM(mean * (count - nonfinite)) / SUM(count - nonfinite), "
            "SUM(count), SUM(nonfinite) FROM numbered GROUP BY bucket ORDER BY bucket",
            (max_points, job.id, "loss", job.id, "loss"),
        ).fetchall()
        sql_bucket = time.perf_counter() - t0
        conn.close()
        return {
            "windows": n,
            "fetchall_ms": 1000 * fetch,
            "store_read": "SQLiteStore.series_columns",
            "store_series_ms": 1000 * series,
            "downsampled_ms": 1000 * down,
            "json_ms": 1000 * encode,
            "rollup_read_ms": 1000 * rollup_read,
            "rollup_rows": rollup_rows,
            "rollup_downsampled_ms": 1000 * rollup_down,
            "sql_bucketing_ms": 1000 * sql_bucket,
            "sql_buckets": len(bucketed),
            "query_plan": plan,
        }
    finally:
        store.close()


def list_breakdown(db: Path, limit: int = 10_000) -> dict[str, Any]:
    """Where ``GET /api/v1/jobs?limit=10000`` spends its time, in this process on the same file."""
    from stepwatch.server.api.responses import FastJSONResponse
    from stepwatch.server.store import JobFilter, SQLiteStore
    from stepwatch.server.views.serialisers import CompactViews, job_view

    store = SQLiteStore(db)
    try:
        where = JobFilter(limit=limit)
        t0 = time.perf_counter()
        jobs = store.jobs(where)
        fetch = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.jobs(where)  # again: the store now holds the jobs it read
        fetch_warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.count_jobs(where)
        count = time.perf_counter() - t0
        now = time.time()
        t0 = time.perf_counter()
        items = [job_view(j, now, compact=True) for j in jobs]  # built from scratch (the baseline)
        views = time.perf_counter() - t0
        kept = CompactViews()
        for j in jobs:
            kept.view(j, now)
        t0 = time.perf_counter()
        items = [kept.view(j, now + 1.0) for j in jobs]  # what the route does once the views are kept
        views_kept = time.perf_counter() - t0
        t0 = time.perf_counter()
        body = json.dumps({"items": items, "total": len(items)}, ensure_ascii=False, separators=(",", ":"))
        encode = time.perf_counter() - t0
        t0 = time.perf_counter()
        FastJSONResponse({"items": items, "total": len(items)})
        encode_fast = time.perf_counter() - t0
        return {
            "jobs": len(jobs),
            "store_jobs_ms": 1000 * fetch,
            "store_jobs_warm_ms": 1000 * fetch_warm,
            "count_jobs_ms": 1000 * count,
            "job_view_ms": 1000 * views,
            "job_view_kept_ms": 1000 * views_kept,
            "json_ms": 1000 * encode,
            "orjson_ms": 1000 * encode_fast,
            "bytes": len(body),
        }
    finally:
        store.close()


# ------------------------------------------------------------- 6. one process, and replicas


BARE_ANSWER = b'{"commands":[]}'
"""What the bare endpoint answers: the body of a report's answer with no command pending."""


def serve_bare(port: int) -> None:
    """The floor of section 6: uvicorn and Starlette as the server runs them, with one route that reads a
    report's body and answers 200 (no parsing, no auth, no store); ``/healthz`` for the start-up wait."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def report(request: Request) -> Response:
        await request.body()
        return Response(BARE_ANSWER, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    app = Starlette(
        routes=[
            Route("/api/v1/namespaces/{namespace}/jobs/{name}/reports", report, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=30)


def start_store_child(script: Path, src: Path, args: dict[str, Any]) -> subprocess.Popen[str]:
    """``script --store-child ARGS`` (a benchmark's store measured alone, in a process of its own) with the code
    of ``src`` first on its path, once it has said it is ready; the caller writes ``go``, reads the result's line of
    JSON, and writes ``end``."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{script.parent}"}
    proc = subprocess.Popen(
        [sys.executable, str(script), "--store-child", json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


class PostgresDatabase:
    """A throwaway database on the PostgreSQL server of ``admin_url`` (made here, dropped by :meth:`drop`),
    and the CPU of the backends that serve it (from /proc: the PostgreSQL server runs on this machine)."""

    def __init__(self, admin_url: str) -> None:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        self.name = f"stepwatch_bench_{os.getpid()}_{random.randrange(1 << 30):x}"
        self._admin = psycopg.connect(admin_url, autocommit=True)
        self._admin.execute(f'CREATE DATABASE "{self.name}"')
        params = conninfo_to_dict(admin_url)
        password = f":{params['password']}" if params.get("password") else ""
        where = f"{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}"
        self.url = f"postgresql://{params.get('user', '')}{password}@{where}/{self.name}"

    def cpu_s(self) -> float:
        """CPU seconds of the backends connected to this database now (not PostgreSQL's shared processes:
        its WAL writer and checkpointer serve every database of the server)."""
        rows = self._admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.name,)).fetchall()
        total = 0.0
        for (pid,) in rows:
            try:
                total += proc_cpu_s(int(pid))
            except OSError:  # gone meanwhile, or not on this machine
                pass
        return total

    def drop(self) -> None:
        self._admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._admin.close()


class Replicas:
    """Servers on one throwaway PostgreSQL database, used as one server by :func:`ingest_phase`: the load
    generators split across their ports (no load balancer here), their CPU is summed."""

    def __init__(self, admin_url: str, count: int, tmp: Path) -> None:
        self.database = PostgresDatabase(admin_url)
        self.servers: list[Server] = []
        try:
            for i in range(count):  # one after the other: the first makes the schema
                self.servers.append(Server(None, tmp / f"server-pg{count}-{i}.log", database_url=self.database.url))
        except BaseException:
            self.stop()
            raise
        self.base = self.servers[0].base
        self.bases = [s.base for s in self.servers]

    def cpu_s(self) -> float:
        return sum(s.cpu_s() for s in self.servers)

    def db_cpu_s(self) -> float:
        return self.database.cpu_s()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.database.drop()

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def source_label(src: Path) -> str:
    """The commit of a checkout's ``src`` folder (or the folder, outside git)."""
    git = ["git", "-C", str(src), "rev-parse", "--short", "HEAD"]
    done = subprocess.run(git, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else str(src)


def export_source(rev: str, into: Path) -> Path:
    """The ``src`` folder of commit ``rev`` of this repository (``git archive``), for the baseline."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


Target = tuple[str, str, "Callable[[], Server | Replicas] | str"]
"""Section 6's targets: key, label, and how to start it (or why it is not run)."""


def compare_targets(cfg: dict[str, Any], tmp: Path) -> list[Target]:
    """What section 6 measures, in this order."""
    bare = [sys.executable, str(HERE), "--serve-bare"]
    before = cfg.get("baseline_src")
    url = cfg.get("database_url")
    return [
        ("bare", "bare uvicorn + Starlette endpoint (floor)", lambda: Server(None, tmp / "bare.log", command=bare)),
        (
            "sqlite_before",
            f"SQLite, one process, before ({cfg.get('baseline_label') or before})",
            (lambda: Server(tmp / "before.db", tmp / "before.log", src=Path(before))) if before else "no --baseline",
        ),
        ("sqlite", "SQLite, one process, this tree", lambda: Server(tmp / "this.db", tmp / "this.log")),
        ("postgres_1", "PostgreSQL, 1 replica", (lambda: Replicas(url, 1, tmp)) if url else "no --database-url"),
        ("postgres_2", "PostgreSQL, 2 replicas", (lambda: Replicas(url, 2, tmp)) if url else "no --database-url"),
        ("postgres_3", "PostgreSQL, 3 replicas", (lambda: Replicas(url, 3, tmp)) if url else "no --database-url"),
    ]


def section_compare(cfg: dict[str, Any], tmp: Path, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every target in turn, ``rounds`` times: fresh jobs, back to back. The bare endpoint gets the same
    bodies on the paths of jobs nobody registered."""
    n = cfg["reporters"]
    tmp.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for round_no in range(1, cfg["rounds"] + 1):
        for key, label, start in compare_targets(cfg, tmp):
            row: dict[str, Any] = {"key": key, "label": label, "round": round_no}
            rows.append(row)
            if isinstance(start, str):
                row["unavailable"] = start
                continue
            progress(f"6. round {round_no}, {label}: {n} reporters back to back, {cfg['compare_s']:g} s")
            try:
                with start() as server:
                    names = [f"r{round_no}-{i:04d}" for i in range(n)]
                    jobs = [(name, "none") for name in names] if key == "bare" else register_jobs(server.base, names)
                    row.update(ingest_phase(server, jobs, cfg, cfg["compare_s"], None, f"c{round_no}{key}"))
            except Exception as exc:  # cannot start (no psycopg, PostgreSQL down, a bad baseline): said in its row
                row["unavailable"] = f"{type(exc).__name__}: {exc}"[:160]
    return rows


def compare_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Section 6's table, one line per target and round; CPU per report beside the floor of the same round."""
    floors = {r["round"]: r["server_cpu_ms_per_request"] for r in rows if r["key"] == "bare" and "unavailable" not in r}
    rounds = max((r["round"] for r in rows), default=1)
    out: list[tuple[str, ...]] = []
    for r in rows:
        name = r["label"] + (f", round {r['round']}" if rounds > 1 else "")
        if "unavailable" in r:
            out.append((name, "-", "-", "-", "-", "-", r["unavailable"]))
            continue
        ms = r["server_cpu_ms_per_request"]
        floor = floors.get(r["round"])
        bad = sum(v for k, v in r["statuses"].items() if k != "200")
        out.append(
            (
                name,
                f"{r['accepted_per_s']:,.0f}",
                f"{fmt_ms(r['p50_ms'])} / {fmt_ms(r['p99_ms'])}",
                f"{ms:.2f}",
                f"{r['db_cpu_ms_per_request']:.2f}" if r["key"].startswith("postgres") else "-",
                f"{ms / floor:.1f}x" if floor and r["key"] != "bare" else "-",
                f"{r['server_cores']:.2f} / {r['loadgen_cores']:.2f} / {r['other_cores']:.2f}"
                + (f"; {bad} not 200" if bad else ""),
            )
        )
    return out


def print_compare(results: dict[str, Any]) -> None:
    cfg = results["config"]
    header = (
        "6. one process, and replicas",
        "reports/s",
        "p50 / p99",
        "server CPU ms/report",
        "db CPU ms/report",
        "vs floor",
        "cores: server / load / other",
    )
    lines = [header, *compare_rows(results["compare"])]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print(
        f"\n{cfg['reporters']} reporters back to back, {cfg['compare_s']:g} s each, fresh jobs, "
        f"{cfg['loadgen_procs']} load generators (split across the replicas' ports); server: the stepwatch "
        "processes; db: PostgreSQL's backends of the throwaway database; vs floor: server CPU per report "
        "over the bare endpoint's"
    )
    for i, line in enumerate(lines):
        cells = [cell.ljust(widths[k]) if k == 0 else cell.rjust(widths[k]) for k, cell in enumerate(line[:-1])]
        print("  ".join([*cells, line[-1]]))
        if i == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))


# ------------------------------------------------------------------------------------ the table


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            models = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu_model"] = platform.processor()
    try:
        git = ["git", "-C", str(REPO)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "src"], capture_output=True, text=True, check=True)
        info["commit"] = commit.stdout.strip() + (" with uncommitted changes in src/" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        info["commit"] = "unknown"
    from importlib.metadata import version

    for name in ("starlette", "uvicorn", "httpx", "h11", "httptools", "uvloop"):
        try:
            info[name] = version(name)
        except Exception:
            info[name] = "not installed"
    return info


def table_rows(results: dict[str, Any], cfg: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    ing = results.get("ingest")
    if ing:
        n = ing["reporters"]
        for key, what in (("fresh", "fresh jobs"), ("steady", "jobs with 1 h of reports")):
            phase = ing[key]
            if "unavailable" in phase:
                rows.append(
                    (f"1 ingest, {what}", f">= {TARGET_INGEST_RPS:,.0f} reports/s", phase["unavailable"][:60], "MISSED")
                )
                continue
            bad = sum(v for k, v in phase["statuses"].items() if k != "200")
            rows.append(
                (
                    f"1 ingest, {n} reporters back to back, {what}",
                    f">= {TARGET_INGEST_RPS:,.0f} reports/s, all 200",
                    f"{phase['accepted_per_s']:,.0f} reports/s, {bad} not 200",
                    verdict(phase["accepted_per_s"] >= TARGET_INGEST_RPS and phase["all_ok"]),
                )
            )
            rows.append(
                (
                    "  latency p50 / p99, same run",
                    f"p99 < {TARGET_INGEST_P99_MS:g} ms",
                    f"{fmt_ms(phase['p50_ms'])} / {fmt_ms(phase['p99_ms'])}",
                    verdict(phase["p99_ms"] < TARGET_INGEST_P99_MS),
                )
            )
            rows.append(
                (
                    "  server CPU per report; server busy",
                    "-",
                    f"{phase['server_cpu_ms_per_request']:.2f} ms; {phase['server_cores']:.2f} cores",
                    "-",
                )
            )
        for paced in ing["paced"]:
            if "unavailable" in paced:
                rows.append((f"1 paced {paced['label']}", "", paced["unavailable"][:60], "-"))
                continue
            rows.append(
                (
                    f"1 latency p50 / p99, {n} reporters paced {paced['label']}",
                    f"p99 < {TARGET_INGEST_P99_MS:g} ms",
                    f"{fmt_ms(paced['p50_ms'])} / {fmt_ms(paced['p99_ms'])} at {paced['accepted_per_s']:,.0f}/s",
                    verdict(paced["p99_ms"] < TARGET_INGEST_P99_MS and paced["all_ok"]),
                )
            )
        steady = ing["steady"]
        if "unavailable" not in steady:
            rows.append(
                (
                    "1 vs upstream Kubeflow status server (client-go 5 QPS)",
                    "ratio measured / 5",
                    f"{steady['accepted_per_s'] / KUBEFLOW_QPS:,.0f}x (jobs with 1 h of reports)",
                    "-",
                )
            )
    sse = results.get("sse")
    if sse:
        limit = 1000 * sse["interval_s"] + TARGET_SSE_EXTRA_MS
        rows.append(
            (
                f"2 step -> SSE points, step of `last`, p50 ({sse['windows']} windows)",
                f"< {limit:,.0f} ms",
                f"{fmt_ms(sse['last_p50_ms'])} (p99 {fmt_ms(sse['last_p99_ms'])})",
                verdict(sse["last_p50_ms"] < limit),
            )
        )
        rows.append(
            (
                f"2 step -> SSE points, every step, p50 ({sse['steps']} steps)",
                f"< {limit:,.0f} ms",
                f"{fmt_ms(sse['all_p50_ms'])} (max {fmt_ms(sse['all_max_ms'])})",
                verdict(sse["all_p50_ms"] < limit),
            )
        )
    reads = results.get("reads")
    if reads:
        long = reads.get("history_long")
        if long and "3" in results["sections"]:
            windows = results["bulk"]["history_windows"]
            rows.append(
                (
                    f"3 history, {windows:,} windows -> max_points=1000, median of 5",
                    f"< {TARGET_HISTORY_MS:g} ms",
                    f"{fmt_ms(long['median_ms'])}",
                    verdict(long["median_ms"] < TARGET_HISTORY_MS),
                )
            )
        if "list_all" in reads and "4" in results["sections"]:
            full, page = reads["list_all"], reads["list_page"]
            rows.append(
                (
                    f"4 list jobs, limit=10000 ({full['items']:,} items), median of 5",
                    f"< {TARGET_LIST_MS:g} ms",
                    f"{fmt_ms(full['median_ms'])}",
                    verdict(full["median_ms"] < TARGET_LIST_MS),
                )
            )
            rows.append(
                (
                    f"4 list jobs, limit=50 of {page['total']:,}, median of 5",
                    f"< {TARGET_LIST_MS:g} ms",
                    f"{fmt_ms(page['median_ms'])}",
                    verdict(page["median_ms"] < TARGET_LIST_MS),
                )
            )
        if "rss_after_list_history_mb" in reads and "5" in results["sections"]:
            bulk = results["bulk"]
            scale = FULL["points"] / bulk["points"] if bulk["points"] < FULL["points"] else 1.0
            label = f"5 server RSS, {bulk['jobs']:,} jobs, {bulk['points']:,} points, after list + history"
            shown = f"{reads['rss_after_list_history_mb']:,.0f} MB"
            rows.append((label, f"< {TARGET_RSS_MB:g} MB", shown, verdict(reads["rss_after_list_history_mb"] < 200)))
            if "rss_after_long_history_mb" in reads:
                rows.append(
                    (
                        f"5 server RSS after the {bulk['history_windows']:,}-window history reads too (peak)",
                        f"< {TARGET_RSS_MB:g} MB",
                        f"{reads['rss_after_long_history_mb']:,.0f} MB (peak {reads['rss_peak_mb']:,.0f} MB)",
                        verdict(reads["rss_peak_mb"] < TARGET_RSS_MB),
                    )
                )
            if scale > 1:
                rows.append((f"5 (stored {bulk['points']:,} points, not the target's 10,000,000)", "", "", "-"))
    return rows


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    widths = [max(len(r[i]) for r in [*rows, ("measure", "target", "measured", "verdict")]) for i in range(3)]
    header = f"{'measure':<{widths[0]}}  {'target':<{widths[1]}}  {'measured':<{widths[2]}}  verdict"
    print(header)
    print("-" * len(header))
    for label, target, measured, ok in rows:
        print(f"{label:<{widths[0]}}  {target:<{widths[1]}}  {measured:<{widths[2]}}  {ok}")


def print_details(results: dict[str, Any]) -> None:
    ing = results.get("ingest")
    if ing:
        print(
            "\n1. ingest: CPU over each measured window, in cores (CPU seconds / wall seconds) of the 2 here; "
            "ms = CPU per accepted request"
        )
        phases = [(f"HTTP floor: GET {FLOOR_PATH} (404)", ing["floor"]), ("fresh jobs", ing["fresh"])]
        phases += [("jobs with 1 h of reports", ing["steady"])] + [(f"paced {p['label']}", p) for p in ing["paced"]]
        for label, phase in phases:
            if "unavailable" in phase:
                print(f"   {label}: unavailable: {phase['unavailable']}")
                continue
            print(
                f"   {label}: {phase['accepted_per_s']:,.0f}/s; server {phase['server_cores']:.2f} cores "
                f"({phase['server_cpu_ms_per_request']:.2f} ms), load generators ({phase['load_generators']} x "
                f"{phase['client']}) {phase['loadgen_cores']:.2f} cores "
                f"({phase['loadgen_cpu_ms_per_request']:.2f} ms), "
                f"other processes {phase['other_cores']:.2f}, hypervisor steal {phase['steal_cores']:.2f}, "
                f"idle {phase['idle_cores']:.2f}"
            )
            print(
                f"      {phase['requests']:,} requests, statuses {phase['statuses']}, "
                f"{phase['reconnects']} reconnections; p50 {fmt_ms(phase['p50_ms'])}, "
                f"p90 {fmt_ms(phase['p90_ms'])}, p99 {fmt_ms(phase['p99_ms'])}, max {fmt_ms(phase['max_ms'])}; "
                f"per second {phase['per_second_min']:,}..{phase['per_second_max']:,}"
            )
            bursts = phase.get("slow_bursts") or []
            if bursts and phase["period_s"]:  # (back to back, every answer waits in the queue: one long burst)
                shown = ", ".join(
                    f"{b['at_s']:.1f} s ({b['answers']:,.0f}, {fmt_ms(b['slowest_ms'])})" for b in bursts[:8]
                )
                more = f" and {len(bursts) - 8} more" if len(bursts) > 8 else ""
                print(
                    f"      over {TARGET_INGEST_P99_MS:g} ms: {sum(b['answers'] for b in bursts):,.0f} answers in "
                    f"{len(bursts)} burst{'s' if len(bursts) > 1 else ''} at {shown}{more} (start, answers, slowest)"
                )
            if phase["errors"]:
                print(f"      errors: {phase['errors']}")
        steady = ing["steady"]
        if "unavailable" not in steady and steady["accepted_per_s"] > 0:
            for key, label in (("fresh", "fresh jobs"), ("steady", "jobs with 1 h of reports")):
                ms = ing[key].get("server_cpu_ms_per_request", math.nan)
                if ms > 0:
                    print(
                        f"   {label}: one whole core for the server (one process, one event loop, GIL-bound) "
                        f"would allow about {1000 / ms:,.0f} reports/s at {ms:.2f} ms of CPU each"
                    )
            mean = 1000 * ing["reporters"] / steady["accepted_per_s"]
            print(
                f"   Little's law: {ing['reporters']} reporters with one request outstanding each at "
                f"{steady['accepted_per_s']:,.0f}/s wait {mean:,.0f} ms on average; back to back, a p99 under "
                f"{TARGET_INGEST_P99_MS:g} ms needs more than {ing['reporters'] / (TARGET_INGEST_P99_MS / 1000):,.0f} "
                "reports/s"
            )
        print(f"   server RSS after the ingest runs: {ing['rss_after_mb']:.0f} MB")
    sse = results.get("sse")
    if sse:
        print(
            f"\n2. step -> SSE: interval {sse['interval_s']:g} s, a step every 50-150 ms (random) with a "
            f"counter as the metric; delay from the step call to the arrival of the points event that carries it. "
            f"`last`: the window's last step (p50 {fmt_ms(sse['last_p50_ms'])}, max {fmt_ms(sse['last_max_ms'])}); "
            f"every step: min..max of the window (p50 {fmt_ms(sse['all_p50_ms'])}, "
            f"p99 {fmt_ms(sse['all_p99_ms'])}); idle server; {sse['seconds']:.0f} s"
        )
        if sse["problems"]:
            print(f"   problems: {sse['problems']}")
    bulk = results.get("bulk")
    if bulk:
        print(
            f"\n3-5. database: {bulk['jobs']:,} jobs, {bulk['points']:,} points, {bulk['db_mb']:,.0f} MB; built in "
            f"{bulk['register_s'] + bulk['ingest_s'] + bulk['history_insert_s'] + bulk['rest_insert_s']:.0f} s "
            f"(SQLiteStore.ingest_report: {bulk['ingest_per_s']:,.0f} reports/s in-process)"
        )
    reads = results.get("reads")
    if reads:
        for key, label in (
            ("list_all", "list limit=10000"),
            ("list_page", "list limit=50"),
            ("history_typical", "history of a typical job"),
            ("history_long", "history of history-1m"),
        ):
            row = reads.get(key)
            if row:
                print(
                    f"   {label}: cold {fmt_ms(row['cold_ms'])}, median {fmt_ms(row['median_ms'])} "
                    f"(min {fmt_ms(row['min_ms'])}, max {fmt_ms(row['max_ms'])}), {row['bytes'] / 1024:,.0f} KiB"
                )
        rss = [f"start {reads['rss_start_mb']:.0f} MB"]
        for key, label in (
            ("rss_after_list_mb", "after lists"),
            ("rss_after_list_history_mb", "+ typical history"),
            ("rss_after_long_history_mb", "+ long history x6"),
            ("rss_peak_mb", "peak"),
        ):
            if key in reads:
                rss.append(f"{label} {reads[key]:.0f} MB")
        print(f"   server RSS: {', '.join(rss)}")
    brk = results.get("list_breakdown")
    if brk:
        print(
            f"   list of {brk['jobs']:,} jobs in this process on the same file: SQLiteStore.jobs "
            f"{fmt_ms(brk['store_jobs_ms'])} cold, {fmt_ms(brk['store_jobs_warm_ms'])} warm; count_jobs "
            f"{fmt_ms(brk['count_jobs_ms'])}; job_view x{brk['jobs']:,} {fmt_ms(brk['job_view_ms'])} from scratch, "
            f"{fmt_ms(brk['job_view_kept_ms'])} kept (CompactViews); json {fmt_ms(brk['json_ms'])}, orjson "
            f"{fmt_ms(brk['orjson_ms'])} ({brk['bytes'] / 2**20:.1f} MB)"
        )
    brk = results.get("history_breakdown")
    if brk:
        print(
            f"   history-1m in this process on the same file, every window (baseline): fetchall "
            f"{fmt_ms(brk['fetchall_ms'])}, {brk['store_read']} {fmt_ms(brk['store_series_ms'])}, "
            f"history.downsampled {fmt_ms(brk['downsampled_ms'])}, json {fmt_ms(brk['json_ms'])}; bucketing in SQL "
            f"{fmt_ms(brk['sql_bucketing_ms'])}; plan: {brk['query_plan']}"
        )
        print(
            f"   history-1m through the roll-ups (SQLiteStore.history_columns): {brk['rollup_rows']:,} rows in "
            f"{fmt_ms(brk['rollup_read_ms'])}, history.downsampled {fmt_ms(brk['rollup_downsampled_ms'])}"
        )


# ----------------------------------------------------------------------------------------- main

CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"loadgen": child_loadgen}


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in under a minute")
    parser.add_argument("--sections", default="123456", help="which sections to run (digits 1-6)")
    parser.add_argument("--reporters", type=int, help="concurrent reporters of section 1")
    parser.add_argument("--loadgen-procs", type=int, help="load-generator processes of section 1")
    parser.add_argument("--duration", type=float, help="seconds of each saturated ingest run")
    parser.add_argument(
        "--client",
        choices=("httpx", "raw"),
        help="load generator: a minimal HTTP/1.1 client on kept-alive connections (raw, the default: about a "
        "tenth of httpx's CPU per request) or httpx.AsyncClient",
    )
    parser.add_argument(
        "--database-url",
        help="section 6: a PostgreSQL server to measure replicas on (e.g. postgresql://root@127.0.0.1/test): a "
        "throwaway database is created there and dropped at the end",
    )
    base = parser.add_mutually_exclusive_group()
    base.add_argument(
        "--baseline", metavar="REV", help="section 6: also the code of this commit (git archive of its src/)"
    )
    base.add_argument(
        "--baseline-src", metavar="PATH", help="section 6: also the code of this src/ folder (another checkout's)"
    )
    parser.add_argument("--rounds", type=int, help="section 6: how many times each target is measured, in turn")
    parser.add_argument("--points", type=int, help="points stored for section 5 (default 10,000,000)")
    parser.add_argument("--keep", metavar="DIR", help="keep the databases and server logs in this directory")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-args", help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def print_header(m: dict[str, Any], cfg: dict[str, Any], quick: bool) -> None:
    print("stepwatch server benchmark" + (" (--quick: small sizes, not the targets' sizes)" if quick else ""))
    print(
        f"machine: {m['cpu_model']}, {m['cpu_count']} CPUs ({m['cpus_usable']} usable), load avg "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg'] or ())}; python {m['python']}, SQLite {m['sqlite']}; "
        f"stepwatch at {m['commit']}"
    )
    client = f"httpx {m['httpx']} AsyncClient" if cfg["client"] == "httpx" else "minimal HTTP/1.1 client (--client raw)"
    print(
        f"server: python -m stepwatch server (uvicorn {m['uvicorn']}, starlette {m['starlette']}, h11 {m['h11']}, "
        f"httptools {m['httptools']}, uvloop {m['uvloop']}); load generator: {client} "
        f"in {cfg['loadgen_procs']} processes"
    )


def run_sections(
    results: dict[str, Any], cfg: dict[str, Any], sections: str, tmp: Path, progress: Callable[[str], None]
) -> None:
    if "1" in sections or "2" in sections:
        with Server(tmp / "ingest.db", tmp / "server-ingest.log") as server:
            progress(f"server up in {server.ready_s:.2f} s at {server.base}")
            if "1" in sections:
                progress(f"1. ingest: {cfg['reporters']} reporters, {cfg['duration_s']:g} s back to back, then paced")
                results["ingest"] = section_ingest(server, cfg, progress)
            if "2" in sections:
                progress(f"2. step -> SSE: {cfg['sse_samples']} windows at interval {cfg['sse_interval']:g} s")
                results["sse"] = section_sse(server, cfg)
    if set(sections) & set("345"):
        bulk_cfg = dict(cfg)
        if not set(sections) & set("45"):
            bulk_cfg["jobs"] = 1
        if "5" not in sections:
            bulk_cfg["points"] = cfg["history_windows"]
        if not set(sections) & set("35"):
            bulk_cfg["history_windows"] = bulk_cfg["points"] = 1
        db = tmp / "bulk.db"
        points = max(bulk_cfg["points"], cfg["history_windows"])
        progress(f"building the database: {bulk_cfg['jobs']:,} jobs, {points:,} points")
        results["bulk"] = build_bulk(db, bulk_cfg, progress)
        results["bulk"]["history_windows"] = cfg["history_windows"]
        with Server(db, tmp / "server-bulk.log") as server:
            progress("3-5. reads on a fresh server")
            results["reads"] = section_reads(server, cfg, sections)
        if "3" in sections:
            progress("3. where the history read spends its time (in this process)")
            results["history_breakdown"] = history_breakdown(db)
        if "4" in sections:
            results["list_breakdown"] = list_breakdown(db)
    if "6" in sections:
        if cfg.get("baseline"):
            cfg["baseline_src"] = str(export_source(cfg["baseline"], tmp / "baseline"))
        if cfg.get("baseline_src"):
            cfg["baseline_label"] = cfg.get("baseline") or source_label(Path(cfg["baseline_src"]))
        results["compare"] = section_compare(cfg, tmp / "compare", progress)


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(argv)
    if opts.child:
        emit(CHILDREN[opts.child](json.loads(opts.child_args)))
        return 0
    if opts.serve_bare:
        serve_bare(opts.port)
        return 0

    sys.path.insert(0, str(REPO / "src"))
    cfg = dict(QUICK if opts.quick else FULL)
    overrides = {
        "reporters": opts.reporters,
        "loadgen_procs": opts.loadgen_procs,
        "duration_s": opts.duration,
        "client": opts.client,
        "points": opts.points,
        "rounds": opts.rounds,
        "database_url": opts.database_url,
        "baseline": opts.baseline,
        "baseline_src": opts.baseline_src,
    }
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    sections = "".join(sorted(set(opts.sections) & set("123456")))
    started = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {what}", file=sys.stderr, flush=True)

    results: dict[str, Any] = {"machine": machine_info(), "config": cfg, "sections": sections, "quick": opts.quick}
    print_header(results["machine"], cfg, opts.quick)
    tmp = Path(opts.keep) if opts.keep else Path(tempfile.mkdtemp(prefix="stepwatch-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        run_sections(results, cfg, sections, tmp, progress)
    finally:
        if not opts.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    rows = table_rows(results, cfg)
    if rows:
        print()
        print_table(rows)
    if "compare" in results:
        print_compare(results)
    print_details(results)
    results["elapsed_s"] = time.perf_counter() - started
    print(f"\ntotal time {results['elapsed_s']:.0f} s")
    if opts.json:
        path = Path(opts.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"figures written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
