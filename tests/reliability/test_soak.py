"""Soak: many simulated jobs report every 2 s to a real server, which is restarted and SIGKILLed meanwhile.

A real ``python -m stepwatch server`` on a temporary SQLite file; one asyncio process plays every job,
each on its own keep-alive connection (as the report core does), with a raw HTTP/1.1 client so that the
load generator costs little next to the server on a small machine. A third into the run the server is
stopped gracefully (SIGTERM) and started again; two thirds in it is SIGKILLed and started again. Jobs
whose reports fail meanwhile reconnect and go on.

Checked afterwards:

- **no acknowledged report lost**: every report answered 200 (each carries its own step) is a point of
  its job's history, read back through the API from the last server;
- **memory flat**: the server's RSS in the second half of each server's life grows by at most
  ``STEPWATCH_SOAK_RSS_GROWTH_MB`` over its first half;
- **p99 ingest latency** (request written to response read, 200s only) under the run's own report
  interval (a job's report is answered before its next one is due: the server keeps pace), or under
  ``STEPWATCH_SOAK_P99_MS`` when set; also shown in steady state (outside the 10 s after each restart).

Knobs (read at import, before the autouse fixture clears ``STEPWATCH_*``): ``STEPWATCH_SOAK_JOBS``
(default 200), ``STEPWATCH_SOAK_SECONDS`` (default 90), ``STEPWATCH_SOAK_INTERVAL`` (2.0),
``STEPWATCH_SOAK_P99_MS`` (unset: the interval, for shared machines; the issue's target is 100),
``STEPWATCH_SOAK_RSS_GROWTH_MB`` (default 64), ``STEPWATCH_SOAK_RESULT`` (a JSON file for the figures).
The issue's full figure: ``STEPWATCH_SOAK_JOBS=1000 STEPWATCH_SOAK_SECONDS=600``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Identity, MetricWindow, Progress, Report

JOBS = int(os.environ.get("STEPWATCH_SOAK_JOBS", "200"))
SECONDS = float(os.environ.get("STEPWATCH_SOAK_SECONDS", "90"))
INTERVAL = float(os.environ.get("STEPWATCH_SOAK_INTERVAL", "2.0"))
P99_LIMIT_MS = float(os.environ.get("STEPWATCH_SOAK_P99_MS") or INTERVAL * 1000)
RSS_GROWTH_MB = float(os.environ.get("STEPWATCH_SOAK_RSS_GROWTH_MB", "64"))
RESULT_FILE = os.environ.get("STEPWATCH_SOAK_RESULT", "")

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m stepwatch server`` as a subprocess, restartable on the same port and database."""

    def __init__(self, db: Path, log: Path) -> None:
        self.db = db
        self.log = log
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives: list[list[tuple[float, int]]] = []
        """RSS samples (monotonic time, bytes) of each server process, in order."""

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stepwatch",
                    "server",
                    "--port",
                    str(self.port),
                    "--db",
                    str(self.db),
                    "--log-level",
                    "warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.lives.append([])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited: {self.log.read_text()[-2000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError("server did not answer /healthz within 30 s")

    def stop(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError("the server did not stop within 30 s of SIGTERM") from None

    def sample_rss(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError, IndexError):  # Linux: resident pages, 2nd field
                pages = int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1])
                self.lives[-1].append((time.monotonic(), pages * os.sysconf("SC_PAGE_SIZE")))


@dataclass
class Tally:
    acked: dict[str, set[int]] = field(default_factory=dict)
    latencies: list[tuple[float, float]] = field(default_factory=list)
    """(monotonic time sent, seconds) of every 200."""
    sent: int = 0
    failed: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    lag: list[float] = field(default_factory=list)
    """How late each report started against its schedule: the load generator's own lag, not the server's."""


def _body_template() -> str:
    """A report as the report core sends it (checked by the protocol once), with holes for seq and step."""
    window = MetricWindow("loss", 0.5, 0.5, 0.5, 0.5, 1, 0, 1, 1)
    report = Report(
        run_id="soak",
        seq=1,
        sent_at=1.0,
        identity=Identity(host="soak", pid=1),
        progress=Progress(step=1, total_steps=10_000_000),
        metrics=(window,),
    )
    text = json.dumps(report.to_dict(), separators=(",", ":")).replace("{", "{{").replace("}", "}}")
    return (
        text.replace('"seq":1', '"seq":{seq}')
        .replace('"sent_at":1.0', '"sent_at":{sent_at}')
        .replace('"step":1,', '"step":{step},')
        .replace('"first_step":1,"last_step":1', '"first_step":{step},"last_step":{step}')
        .replace('"last":0.5', '"last":{loss}')
    )


async def _post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> int:
    writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("closed before answering")
    status = int(status_line.split()[1])
    length = 0
    close = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            close = True
    await reader.readexactly(length)
    if close:
        raise ConnectionResetError("the server closes the connection")  # the next report reconnects
    return status


async def _job(name: str, token: str, server: Server, tally: Tally, start: float, end: float, offset: float) -> None:
    template = _body_template()
    head = (
        f"POST /api/v1/namespaces/default/jobs/{name}/reports HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {token}\r\n"
    ).encode()
    acked = tally.acked[name] = set()
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    due = start + offset
    seq = 0
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(max(due - loop.time(), 0))
        if loop.time() >= end:
            break
        tally.lag.append(max(loop.time() - due, 0.0))
        seq += 1
        body = template.format(seq=seq, step=seq, sent_at=time.time(), loss=1.0 / seq).encode()
        tally.sent += 1
        t0 = time.monotonic()
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.port), 5)
            status = await asyncio.wait_for(_post(*conn, head, body), 15)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            tally.failed += 1
            if conn is not None:
                conn[1].close()
            conn = None
        else:
            tally.statuses[status] = tally.statuses.get(status, 0) + 1
            if status == 200:
                acked.add(seq)
                tally.latencies.append((t0, time.monotonic() - t0))
        due += INTERVAL
        while due < loop.time():  # fell behind (the server was down): skip, as a sender merges
            due += INTERVAL
    if conn is not None:
        conn[1].close()


async def _drive(server: Server, tokens: dict[str, str], tally: Tally, events: list[tuple[str, float]]) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + SECONDS
    jobs = [
        asyncio.create_task(_job(name, token, server, tally, start, end, INTERVAL * i / len(tokens)))
        for i, (name, token) in enumerate(tokens.items())
    ]

    async def sampler() -> None:
        while loop.time() < end:
            server.sample_rss()
            await asyncio.sleep(1.0)

    async def chaos() -> None:
        for at, sig in ((SECONDS / 3, signal.SIGTERM), (2 * SECONDS / 3, signal.SIGKILL)):
            await asyncio.sleep(max(start + at - loop.time(), 0))
            events.append((sig.name, time.monotonic()))
            await asyncio.to_thread(server.stop, sig)
            await asyncio.to_thread(server.start)
            events.append(("up", time.monotonic()))

    await asyncio.gather(sampler(), chaos(), *jobs)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_soak_no_acknowledged_report_lost_memory_flat(tmp_path: Path) -> None:
    server = Server(tmp_path / "soak.db", tmp_path / "server.log")
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            tokens = {}
            for i in range(JOBS):
                name = f"soak-{i:04d}"
                response = client.post("/api/v1/namespaces/default/jobs", json={"name": name})
                assert response.status_code == 201, response.text
                tokens[name] = response.json()["token"]
        tally = Tally()
        events: list[tuple[str, float]] = []
        asyncio.run(_drive(server, tokens, tally, events))

        missing: dict[str, list[int]] = {}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for name, acked in tally.acked.items():
                response = client.get(
                    f"/api/v1/namespaces/default/jobs/{name}/history", params={"metrics": "loss", "max_points": 10000}
                )
                assert response.status_code == 200, response.text
                points = response.json()["metrics"].get("loss", [])
                assert all(p["windows"] == 1 for p in points if "windows" in p), "history came back downsampled"
                lost = sorted(acked - {p["step"] for p in points})
                if lost:
                    missing[name] = lost
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop(signal.SIGTERM)

    latencies = [d for _, d in tally.latencies]
    quiet = [d for t, d in tally.latencies if not any(kind == "up" and up <= t < up + 10 for kind, up in events)]
    growth = []
    for life in server.lives:
        if len(life) >= 6:
            half = len(life) // 2
            first = max(r for _, r in life[1:half])  # the first sample is start-up
            second = max(r for _, r in life[half:])
            growth.append((first, second))
    figures: dict[str, Any] = {
        "jobs": JOBS,
        "seconds": SECONDS,
        "interval": INTERVAL,
        "sent": tally.sent,
        "acknowledged": len(latencies),
        "failed_requests": tally.failed,
        "statuses": tally.statuses,
        "lost": sum(len(v) for v in missing.values()),
        "ingest_per_second": round(len(latencies) / SECONDS, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "p99_steady_ms": round(_percentile(quiet, 0.99) * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2) if latencies else None,
        "generator_lag_p99_ms": round(_percentile(tally.lag, 0.99) * 1000, 2),
        "rss_mb_per_life": [(round(a / 2**20, 1), round(b / 2**20, 1)) for a, b in growth],
        "events": [(kind, round(t - (events[0][1] if events else 0), 1)) for kind, t in events],
    }
    print("\nsoak figures:", json.dumps(figures))
    if RESULT_FILE:
        Path(RESULT_FILE).write_text(json.dumps(figures, indent=2) + "\n")

    assert not missing, f"acknowledged reports missing from history: {dict(list(missing.items())[:5])}"
    assert tally.statuses.get(200, 0) > 0.6 * tally.sent, figures
    assert set(tally.statuses) == {200}, f"answers other than 200: {tally.statuses}"
    assert figures["p99_ms"] < P99_LIMIT_MS, figures
    assert growth, "too few RSS samples"
    for first, second in growth:
        assert second - first < RSS_GROWTH_MB * 2**20, f"server RSS grew: {figures['rss_mb_per_life']}"
