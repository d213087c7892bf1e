"""The SDK's speed against a real server (``stepwatch server`` in its own process, on 127.0.0.1, on a fresh
SQLite file), each figure beside a baseline measured in the same run::

    .venv/bin/python benchmarks/client.py            # 10,000 jobs
    .venv/bin/python benchmarks/client.py --quick    # 2,000 jobs, fewer repeats (a smoke run)

1. ``import stepwatch.client`` in a fresh interpreter (median of 9), beside ``import httpx`` alone and
   ``import stepwatch`` (the report core, which every part imports); also the first ``Client()``, which
   imports httpx then.
2. ``Client.jobs()`` of 10,000 jobs (median of 7), beside the same request with httpx and ``json.loads``
   (what any client must pay: the server's answer and the transfer), for the list's default form (items,
   one JSON object per job) and for the column form the SDK asks for (``form=columns``); and the server's
   part: the time to the first byte of each form's answer (the server sends the headers once the body is
   built).
3. ``watch()`` delivery: from the server storing a report (the ``t`` it stamps on the points update) to
   ``watch()`` handing the typed update to the caller, over 50 reports (median and 95th percentile);
   beside the same stream read with httpx and a hand-written line parser.

The database is built beside the server with ``SQLiteStore.register`` and ``ingest_reports``, as
benchmarks/dashboard.py does; the server runs in a subprocess so that it does not share this
process's interpreter lock with the client being measured.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TARGETS = {"import": 0.150, "jobs": 0.300, "watch": 0.200}


def build(db: Path, jobs: int) -> float:
    from stepwatch.protocol import Identity, MetricWindow, Progress, Report
    from stepwatch.server.store import PendingReport, SQLiteStore

    t0 = time.perf_counter()
    store = SQLiteStore(db)
    now = time.time()
    registered = [
        store.register(f"team-{i % 7}", f"job-{i:05d}", token_hash="-", now=now - 7200, total_steps=100_000,
                       gpus=float(i % 8 + 1), gpu_hour_cost=2.5)
        for i in range(jobs)
    ]  # fmt: skip
    batch = []
    for i, job in enumerate(registered):
        windows = tuple(
            MetricWindow(name, v, v, v, v, 1, 0, 100 + i, 100 + i)
            for name, v in (("loss", 0.1 + 2.0 / (1 + i % 97)), ("learning_rate", 3e-4), ("grad_norm", 1.5))
        )
        report = Report(
            run_id="r", seq=1, sent_at=now - 30, identity=Identity(rank=0, world_size=1, host="h", pid=1),
            progress=Progress(step=100 + i, total_steps=100_000), metrics=windows, state="running",
        )  # fmt: skip
        batch.append(PendingReport(job, report, now - 30, None))
    for start in range(0, len(batch), 1000):
        store.ingest_reports(batch[start : start + 1000])
    store.close()
    return time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(db: Path) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "server", "--db", str(db), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    sys.exit("the server did not start")


def import_time(statement: str, repeat: int) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    times = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        times.append(float(out.stdout))
    return statistics.median(times)


def median_of(fn: Any, repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def watch_delays(url: str, reports: int) -> tuple[list[float], list[float]]:
    """Delays of the SDK's watch and of a hand-written httpx SSE reader, for the same reports."""
    import httpx

    from stepwatch.client import Client, PointsUpdate

    http = httpx.Client(base_url=url, timeout=10)
    token = http.post("/api/v1/namespaces/bench/jobs", json={"name": "live", "total_steps": 10_000}).json()["token"]
    sdk_delays: list[float] = []
    raw_delays: list[float] = []

    def sdk() -> None:
        with Client(url) as client:
            for update in client.watch("live", "bench", timeout=120):
                if isinstance(update, PointsUpdate) and update.t is not None:
                    sdk_delays.append(time.time() - update.t)
                    if len(sdk_delays) >= reports:
                        return

    def raw() -> None:
        with (
            httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=120)) as c,
            c.stream("GET", "/api/v1/events", params={"namespace": "bench", "job": "live"}) as r,
        ):
            kind = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:") and kind == "points":
                    data = json.loads(line[5:])
                    raw_delays.append(time.time() - data["t"])
                    if len(raw_delays) >= reports:
                        return

    threads = [threading.Thread(target=sdk, daemon=True), threading.Thread(target=raw, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # both streams open
    for seq in range(1, reports + 1):
        body = {
            "api_version": "v1", "run_id": "bench", "seq": seq, "sent_at": time.time(),
            "identity": {"rank": 0, "world_size": 1, "host": "h", "pid": 1},
            "progress": {"step": seq * 10, "total_steps": 10_000},
            "metrics": [{"name": "loss", "last": 1.0 / seq, "min": 1.0 / seq, "max": 1.0 / seq, "mean": 1.0 / seq,
                         "count": 1, "nonfinite": 0, "first_step": seq * 10, "last_step": seq * 10}],
            "state": "running",
        }  # fmt: skip
        answer = http.post(
            "/api/v1/namespaces/bench/jobs/live/reports", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
        time.sleep(0.05)
    for t in threads:
        t.join(30)
    http.close()
    return sdk_delays, raw_delays


def list_rows(url: str, jobs: int, repeat: int) -> list[tuple[str, str, str, str, str]]:
    """``jobs()`` of the whole list, beside httpx + ``json.loads`` of each form; the server's part; the sizes."""
    import httpx

    from stepwatch.client import Client

    with Client(url) as client, httpx.Client(base_url=url, timeout=60) as http:
        client.jobs(limit=10)  # connect, check the version
        forms = {"items": {"limit": jobs}, "columns": {"limit": jobs, "form": "columns"}}
        # each call's result is dropped before the next measurement: 10,000 decoded jobs kept alive would make the
        # collector's passes slower for whatever is measured after them
        raw = {form: median_of(lambda p=p: json.loads(http.get("/api/v1/jobs", params=p).content)["total"], repeat)
               for form, p in forms.items()}  # fmt: skip
        sdk_s, listed = median_of(lambda: len(client.jobs(limit=jobs)), repeat)
        assert listed == jobs == raw["items"][1] == raw["columns"][1], (listed, jobs)
        touched_s, _ = median_of(lambda: len([j.progress.percent for j in client.jobs(limit=jobs)]), repeat)
        sizes = {form: len(http.get("/api/v1/jobs", params=p).content) for form, p in forms.items()}

        def first_byte(query: dict[str, Any]) -> int:
            with http.stream("GET", "/api/v1/jobs", params=query) as r:  # headers come once the body is built
                return r.status_code

        server = {form: median_of(lambda p=p: first_byte(p), repeat)[0] for form, p in forms.items()}
    ms = {form: f"{found[0] * 1000:.1f} ms" for form, found in raw.items()}
    return [
        (f"jobs() of {jobs:,} jobs", "< 300 ms", f"{sdk_s * 1000:.1f} ms",
         f"httpx GET + json.loads {ms['items']}; of columns {ms['columns']}",
         "met" if sdk_s < TARGETS["jobs"] else "NOT met"),
        ("  ... reading every job's progress", "-", f"{touched_s * 1000:.1f} ms", "", ""),
        ("  ... of which the server's answer", "-", f"{server['columns'] * 1000:.1f} ms",
         f"(first byte, columns; items {server['items'] * 1000:.1f} ms)", ""),
        ("  ... answer size", "-", f"{sizes['columns'] / 1e6:.1f} MB",
         f"(columns; items {sizes['items'] / 1e6:.1f} MB)", ""),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs and fewer repeats")
    args = parser.parse_args()
    jobs = 2_000 if args.quick else args.jobs
    repeat = 3 if args.quick else 7

    rows: list[tuple[str, str, str, str, str]] = []

    # 1. import
    base_httpx = import_time("import httpx", repeat + 2)
    base_core = import_time("import stepwatch", repeat + 2)
    ours = import_time("import stepwatch.client", repeat + 2)
    first_client = import_time("import stepwatch.client; stepwatch.client.Client()", repeat + 2)
    rows.append(("import stepwatch.client", "< 150 ms", f"{ours * 1000:.1f} ms",
                 f"import httpx {base_httpx * 1000:.1f} ms; import stepwatch {base_core * 1000:.1f} ms",
                 "met" if ours < TARGETS["import"] else "NOT met"))  # fmt: skip
    rows.append(("  ... and the first Client()", "-", f"{first_client * 1000:.1f} ms", "(imports httpx then)", ""))

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        built = build(db, jobs)
        process, url = serve(db)
        try:
            rows += list_rows(url, jobs, repeat)

            sdk_delays, raw_delays = watch_delays(url, 20 if args.quick else 50)
            sdk_delays.sort()
            raw_delays.sort()
            med = statistics.median(sdk_delays)
            p95 = sdk_delays[int(len(sdk_delays) * 0.95) - 1]
            rows.append(("watch() delivery, server -> caller", "< 200 ms",
                         f"median {med * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms",
                         f"httpx + line parser: median {statistics.median(raw_delays) * 1000:.1f} ms",
                         "met" if med < TARGETS["watch"] else "NOT met"))  # fmt: skip
        finally:
            process.terminate()
            process.wait(10)

    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; database of {jobs:,} jobs built in "
          f"{built:.1f} s")  # fmt: skip
    header = ("what", "target", "measured", "baseline (same run)", "")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(5)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
