"""The attacks of issue 21 (items 2, 3 and 11) on a real server, before and after the limits.

Each variant runs as ``python -m stepwatch server`` in a subprocess on a free loopback port with a
fresh SQLite file; "after" is this tree's ``src``, "before" another source tree (by default ``main``,
exported with ``git archive`` into a temporary directory)::

    .venv/bin/python benchmarks/server_limits.py                    # before (main) and after, full sizes
    .venv/bin/python benchmarks/server_limits.py --quick            # after only, small sizes: a smoke run
    .venv/bin/python benchmarks/server_limits.py --baseline-ref HEAD~5 --seconds 60 --streams 8000

1. metric names: one job's write token posts reports of 256 new metric names each, back to back,
   for ``--seconds`` (from a subprocess, stdlib HTTP). Meanwhile, every 50 ms: ``GET /healthz`` and
   a small report of another job, timed. Figures: names stored, reports accepted / refused, the
   server's RSS, the size of one ``GET`` of the job, and the medians of both latencies against the
   same server idle just before (target: within 2x).
2. streams: ``--streams`` live streams (``GET /api/v1/events``) opened from one client address and
   read by a subprocess that drains them; then another job's report latency (median of 40) with
   them open, against idle (target: within 2x), the server's RSS, and how many streams were refused.
3. memory returned: the streams closed, 3 s later, the server's RSS (item 11).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "src"))

from stepwatch.protocol import Identity, MetricWindow, Progress, Report  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def report_body(seq: int, metrics: dict[str, float], run_id: str = "bench") -> bytes:
    windows = tuple(
        MetricWindow(name=n, last=v, min=v, max=v, mean=v, count=1, nonfinite=0, first_step=seq, last_step=seq)
        for n, v in metrics.items()
    )
    report = Report(
        run_id=run_id,
        seq=seq,
        sent_at=1_700_000_000.0 + seq,
        identity=Identity(rank=0, world_size=1, host="bench", pid=1),
        progress=Progress(step=seq),
        metrics=windows,
    )
    return json.dumps(report.to_dict()).encode()


class Http:
    """One kept-alive stdlib connection (cheap on a 2-core machine, unlike an async client)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: bytes | None = None, token: str | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def timed(self, method: str, path: str, body: bytes | None = None, token: str | None = None) -> float:
        """Milliseconds to a 200 (a request still unanswered after 30 s counts as 30 s)."""
        began = time.perf_counter()
        try:
            status, _ = self.call(method, path, body, token)
        except TimeoutError:
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            return 30_000.0
        assert status == 200, status
        return (time.perf_counter() - began) * 1000

    def register(self, name: str) -> str:
        status, body = self.call("POST", "/api/v1/namespaces/default/jobs", json.dumps({"name": name}).encode())
        assert status == 201, (status, body)
        token: str = json.loads(body)["token"]
        return token


class Server:
    """``python -m stepwatch server`` from a source tree, on a free port, with a fresh database."""

    def __init__(self, src: Path, workdir: Path, settings: dict[str, str] | None = None) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
        env.update(settings or {})
        env["PYTHONPATH"] = str(src)
        cmd = [sys.executable, "-m", "stepwatch", "server", "--port", str(self.port), "--db", str(workdir / "sw.db")]
        self.log = open(workdir / "server.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*cmd, "--log-level", "warning"], env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                assert self.proc.poll() is None, "the server did not start"
                assert time.monotonic() < deadline, "the server did not start within 60 s"
                time.sleep(0.1)

    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ----------------------------------------------------------------------------------------- children


def child_attack(port: int, token: str, seconds: float) -> None:
    """Reports of 256 new metric names each, back to back (Retry-After ignored); prints the answers."""
    client = Http(port)
    accepted = refused = held = 0
    seq = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        names = {f"attack/r{seq:06d}/m{i:03d}": float(i) for i in range(256)}
        status, _ = client.call(
            "POST", "/api/v1/namespaces/default/jobs/attacker/reports", report_body(seq, names), token
        )
        seq += 1
        if status == 200:
            accepted += 1
        elif status == 429:
            held += 1
        else:
            refused += 1
    print(json.dumps({"accepted": accepted, "refused": refused, "held": held}), flush=True)


def child_streams(port: int, count: int) -> None:
    """Open ``count`` streams, say how many the server took, drain them until stdin closes."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (20_000, 20_000))
    selector = selectors.DefaultSelector()
    opened = refused = 0
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        conn.sendall(b"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        if head.startswith(b"HTTP/1.1 200"):
            opened += 1
            conn.setblocking(False)
            selector.register(conn, selectors.EVENT_READ)
        else:
            refused += 1
            conn.close()
    print(json.dumps({"streams_opened": opened, "streams_refused": refused}), flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        for key, _ in selector.select(0.2):
            try:
                if not key.fileobj.recv(1 << 16):  # type: ignore[union-attr]
                    selector.unregister(key.fileobj)
            except OSError:
                selector.unregister(key.fileobj)
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


# ----------------------------------------------------------------------------------------- phases


def median_latency(client: Http, token: str, seq: list[int], n: int) -> tuple[float, float]:
    """Medians (ms) of ``GET /healthz`` and of a small report of the other job, ``n`` of each."""
    health, report = [], []
    for _ in range(n):
        health.append(client.timed("GET", "/healthz"))
        seq[0] += 1
        body = report_body(seq[0], {"loss": 1.0 / seq[0]}, run_id="other")
        report.append(client.timed("POST", "/api/v1/namespaces/default/jobs/other/reports", body, token))
        time.sleep(0.02)
    return statistics.median(health), statistics.median(report)


def run_variant(label: str, src: Path, cfg: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"variant": label}
    with_server(src, label, lambda server: names_attack(server, cfg, result))
    with_server(src, label, lambda server: streams_attack(server, cfg, result))
    return result


RAISED = {"STEPWATCH_LIVE_STREAMS": "100000", "STEPWATCH_LIVE_STREAMS_PER_CLIENT": "100000"}
"""The stream limits lifted: what the memory of many streams comes to, and how much goes back (item 11)."""


def run_raised(src: Path, cfg: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"variant": "after, stream limits lifted"}
    with_server(src, "raised", lambda server: streams_attack(server, cfg, result), RAISED)
    return result


def with_server(src: Path, label: str, phase: Any, settings: dict[str, str] | None = None) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=f"sw-limits-{label.split(maxsplit=1)[0]}-"))
    server = Server(src, workdir, settings)
    try:
        phase(server)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def names_attack(server: Server, cfg: argparse.Namespace, result: dict[str, Any]) -> None:
    """Item 2 on a fresh server."""
    client = Http(server.port)
    other = client.register("other")
    attacker = client.register("attacker")
    seq = [0]
    median_latency(client, other, seq, 10)  # warm up
    result["idle_health_ms"], result["idle_report_ms"] = median_latency(client, other, seq, 40)
    result["rss_idle_mb"] = server.rss()
    # one argument, in JSON after "=": a token may begin with "-", which argparse would take for an option
    attack = spawn("--child-attack=" + json.dumps([server.port, attacker, cfg.seconds]))
    health, report = [], []
    while attack.poll() is None:
        h, r = median_latency(client, other, seq, 1)
        health.append(h)
        report.append(r)
        time.sleep(0.03)
    out, _ = attack.communicate()
    result.update(json.loads(out.strip().splitlines()[-1]))
    result["attack_health_ms"] = statistics.median(health)
    result["attack_report_ms"] = statistics.median(report)
    result["rss_attack_mb"] = server.rss()
    status, body = client.call("GET", "/api/v1/namespaces/default/jobs/attacker")
    assert status == 200
    result["names"] = len(json.loads(body)["metric_names"])
    result["job_get_bytes"] = len(body)


def streams_attack(server: Server, cfg: argparse.Namespace, result: dict[str, Any]) -> None:
    """Items 3 and 11 on a fresh server: many streams from one address, then closed."""
    client = Http(server.port)
    other = client.register("other")
    seq = [0]
    median_latency(client, other, seq, 10)  # warm up
    _, result["idle2_report_ms"] = median_latency(client, other, seq, 40)
    result["rss_before_streams_mb"] = server.rss()
    streams = spawn("--child-streams", str(server.port), str(cfg.streams))
    assert streams.stdout is not None
    result.update(json.loads(streams.stdout.readline()))
    time.sleep(1)
    _, result["streams_report_ms"] = median_latency(client, other, seq, 40)
    result["rss_streams_mb"] = server.rss()
    streams.communicate("", timeout=120)
    time.sleep(3)
    result["rss_closed_mb"] = server.rss()


def export(ref: str) -> Path:
    target = Path(tempfile.mkdtemp(prefix="sw-baseline-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "src"


ROWS = [
    ("1. names stored (256 new a report, one job token)", "names", "{:,.0f}"),
    (
        "   reports accepted / refused 422 / held back 429",
        ("accepted", "refused", "held"),
        "{:,.0f} / {:,.0f} / {:,.0f}",
    ),
    ("   one GET of the attacked job", "job_get_bytes", "{:,.0f} B"),
    ("   server RSS: idle -> during the attack", ("rss_idle_mb", "rss_attack_mb"), "{:.0f} -> {:.0f} MB"),
    ("   /healthz median: idle -> attack", ("idle_health_ms", "attack_health_ms"), "{:.1f} -> {:.1f} ms"),
    ("   other job's report median: idle -> attack", ("idle_report_ms", "attack_report_ms"), "{:.1f} -> {:.1f} ms"),
    ("2. streams opened / refused (one address)", ("streams_opened", "streams_refused"), "{:,.0f} / {:,.0f}"),
    ("   other job's report median: idle -> streams", ("idle2_report_ms", "streams_report_ms"), "{:.1f} -> {:.1f} ms"),
    ("   server RSS: before -> streams open", ("rss_before_streams_mb", "rss_streams_mb"), "{:.0f} -> {:.0f} MB"),
    ("3. server RSS 3 s after the streams closed", "rss_closed_mb", "{:.0f} MB"),
]


def print_table(results: list[dict[str, Any]]) -> None:
    labels = [r["variant"] for r in results]
    print(f"\n| figure | {' | '.join(labels)} |")
    print("|---|" + "---|" * len(results))
    for title, keys, fmt in ROWS:
        cells = []
        for r in results:
            values = [r.get(k) for k in (keys if isinstance(keys, tuple) else (keys,))]
            cells.append(fmt.format(*values) if all(v is not None for v in values) else "-")
        print(f"| {title} | {' | '.join(cells)} |")
    for r in results:
        if "attack_report_ms" not in r:
            continue
        a = r["attack_report_ms"] / r["idle_report_ms"]
        s = r["streams_report_ms"] / r["idle2_report_ms"]
        print(
            f"{r['variant']}: report latency x{a:.1f} under the names attack, x{s:.1f} with the streams (target <= 2)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="after only, 3 s of attack, 200 streams")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the metric-names attack")
    parser.add_argument("--streams", type=int, default=3000, help="live streams to open")
    parser.add_argument("--baseline-ref", default="main", help="git ref of the 'before' server ('' for none)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    parser.add_argument("--lifted", action="store_true", help="also the streams with their limits lifted (item 11)")
    parser.add_argument("--child-attack", help=argparse.SUPPRESS)
    parser.add_argument("--child-streams", nargs=2, help=argparse.SUPPRESS)
    cfg = parser.parse_args(argv)
    if cfg.child_attack:
        port, token, seconds = json.loads(cfg.child_attack)
        child_attack(int(port), str(token), float(seconds))
        return 0
    if cfg.child_streams:
        child_streams(int(cfg.child_streams[0]), int(cfg.child_streams[1]))
        return 0
    if cfg.quick:
        cfg.seconds, cfg.streams, cfg.baseline_ref = 3.0, 200, ""
    resource.setrlimit(resource.RLIMIT_NOFILE, (20_000, 20_000))  # the servers inherit it
    results = []
    if cfg.baseline_ref:
        before = export(cfg.baseline_ref)
        try:
            results.append(run_variant(f"before ({cfg.baseline_ref})", before, cfg))
        finally:
            shutil.rmtree(before.parent, ignore_errors=True)
    results.append(run_variant("after", REPO / "src", cfg))
    if cfg.lifted:
        results.append(run_raised(REPO / "src", cfg))
    print_table(results)
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
