"""What authorisation costs: ingest and a read path with ``STEPWATCH_AUTH=none`` vs ``tokens``, in one run.

Two real servers (``python -m stepwatch server``, each on a fresh SQLite file, loopback) run side by
side; the load alternates between them in rounds (none, tokens, none, tokens, ...) so that drift of a
shared machine hits both alike. Per round and server:

- ingest: native reports of registered jobs, each with its job's write token (the path a training
  job takes; authorisation modes do not change it, which is what this checks), from 4 threads over
  kept-alive connections;
- read: ``GET /api/v1/namespaces/default/jobs/NAME``, without credentials (none) and with a viewer
  API token (tokens: hash, cached lookup, role check).

The figure that decides is the server's CPU per request (user + system time of its process, from
/proc, divided by the requests of the round): unlike wall time it does not depend on the load
generator sharing the cores. The median round is shown; the target is < 5 % more with tokens::

    .venv/bin/python benchmarks/auth_overhead.py            # about a minute
    .venv/bin/python benchmarks/auth_overhead.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import http.client
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from stepwatch.protocol import Identity, MetricWindow, Progress, Report  # noqa: E402

TARGET_PCT = 5.0
THREADS = 4
JOBS = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A ``stepwatch server`` subprocess with ``auth`` and, for tokens, an admin and a viewer token."""

    def __init__(self, root: Path, auth: str) -> None:
        self.auth = auth
        self.port = free_port()
        self.db = root / f"{auth}.db"
        env = {**os.environ, "STEPWATCH_HOME": str(root), "STEPWATCH_AUTH": auth}
        env.pop("STEPWATCH_API_TOKEN", None)
        self.admin = self.viewer = ""
        if auth == "tokens":
            self.admin = self._token(env, "admin", "bench-admin")
            self.viewer = self._token(env, "viewer", "bench-viewer")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepwatch", "server", "--port", str(self.port), "--db", str(self.db)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the {auth} server did not start") from None
                time.sleep(0.1)
        self.jobs: list[tuple[str, str]] = []

    def _token(self, env: dict[str, str], role: str, name: str) -> str:
        command = ["token", "create", "--role", role, "-A", "--name", name, "--db", str(self.db)]
        out = subprocess.run(
            [sys.executable, "-m", "stepwatch", *command],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def headers(self, secret: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    def register(self, count: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port)
        for i in range(count):
            body = json.dumps({"name": f"job-{i}", "total_steps": 10_000_000})
            conn.request(
                "POST",
                "/api/v1/namespaces/default/jobs",
                body,
                {"Content-Type": "application/json", **self.headers(self.admin)},
            )
            answer = conn.getresponse()
            data = json.loads(answer.read())
            assert answer.status == 201, data
            self.jobs.append((f"job-{i}", data["token"]))
        conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)


def report_body(name: str, seq: int) -> bytes:
    windows = tuple(
        MetricWindow(metric, 0.5, 0.4, 0.6, 0.5, 20, 0, seq * 20, seq * 20 + 19)
        for metric in ("loss", "lr", "grad_norm", "accuracy", "tokens_per_s")
    )
    report = Report(
        run_id=f"run-{name}",
        seq=seq,
        sent_at=time.time(),
        identity=Identity(rank=0, world_size=1, host="bench", pid=1),
        progress=Progress(step=seq * 20 + 19, total_steps=10_000_000),
        metrics=windows,
    )
    return json.dumps(report.to_dict()).encode()


def load(server: Server, kind: str, count: int, seqs: dict[str, int]) -> dict[str, float]:
    """``count`` requests of ``kind`` from THREADS threads: server CPU and client latencies."""
    per_thread = count // THREADS
    latencies: list[float] = []
    lock = threading.Lock()
    failures: list[str] = []

    def work(t: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port)
        mine: list[float] = []
        for i in range(per_thread):
            name, job_token = server.jobs[(t * per_thread + i) % len(server.jobs)]
            if kind == "ingest":
                with lock:
                    seqs[name] = seq = seqs.get(name, 0) + 1
                body = report_body(name, seq)
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {job_token}"}
                path, method = f"/api/v1/namespaces/default/jobs/{name}/reports", "POST"
            else:
                body, headers = b"", server.headers(server.viewer)
                path, method = f"/api/v1/namespaces/default/jobs/{name}", "GET"
            started = time.perf_counter()
            conn.request(method, path, body or None, headers)
            answer = conn.getresponse()
            answer.read()
            mine.append(time.perf_counter() - started)
            if answer.status != 200:
                failures.append(f"{kind} {answer.status}")
        conn.close()
        with lock:
            latencies.extend(mine)

    before = cpu_s(server.proc.pid)
    wall = time.perf_counter()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    spent = cpu_s(server.proc.pid) - before
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed on the {server.auth} server: {failures[:3]}")
    done = per_thread * THREADS
    latencies.sort()
    return {
        "cpu_us": spent / done * 1e6,
        "rps": done / wall,
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1e3,
    }


def authorization_step_us(calls: int) -> dict[str, float]:
    """The authorisation step alone, in-process: identify a request and check its role (µs per call),
    for auth none and for a cached API token. Small against a request, so timed directly."""
    import asyncio

    from starlette.requests import Request

    from stepwatch.server.api.auth import Authenticator, mint_token
    from stepwatch.server.api.request import hash_token
    from stepwatch.server.store import AuditEntry, SQLiteStore
    from stepwatch.server.store.offload import blocking

    with tempfile.TemporaryDirectory(prefix="stepwatch-auth-step-") as tmp:
        store = SQLiteStore(Path(tmp) / "step.db")
        token, secret = mint_token("viewer", ("default",), "bench", time.time())
        store.create_token(token, hash_token(secret), AuditEntry(time.time(), "bench", "token_created"))
        headers = [(b"authorization", f"Bearer {secret}".encode())]
        request = Request({"type": "http", "method": "GET", "path": "/", "headers": headers, "client": None})

        async def timed(auth: Authenticator) -> float:
            await auth.identify(request, store, time.time(), offload=blocking)  # warm: the token is cached from here on
            started = time.perf_counter()
            for _ in range(calls):
                identity = await auth.identify(request, store, time.time(), offload=blocking)
                identity.allows("viewer", "default")
            return (time.perf_counter() - started) / calls * 1e6

        try:
            return {
                "none": asyncio.run(timed(Authenticator("none"))),
                "tokens": asyncio.run(timed(Authenticator("tokens"))),
            }
        finally:
            store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few rounds and requests (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None, help="per round, kind and server")
    parser.add_argument("--json", metavar="PATH", help="write the figures here too")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 7)
    count = args.requests or (200 if args.quick else 2000)

    with tempfile.TemporaryDirectory(prefix="stepwatch-auth-bench-") as tmp:
        servers = [Server(Path(tmp), "none"), Server(Path(tmp), "tokens")]
        try:
            for server in servers:
                server.register(JOBS)
            seqs: dict[str, dict[str, int]] = {s.auth: {} for s in servers}
            for server in servers:  # warm-up: caches, code paths, SQLite pages
                load(server, "ingest", count // 4, seqs[server.auth])
                load(server, "read", count // 4, seqs[server.auth])
            results: dict[str, dict[str, list[dict[str, float]]]] = {
                s.auth: {"ingest": [], "read": []} for s in servers
            }
            for r in range(rounds):
                order = servers if r % 2 == 0 else servers[::-1]
                for kind in ("ingest", "read"):
                    for server in order:
                        results[server.auth][kind].append(load(server, kind, count, seqs[server.auth]))
        finally:
            for server in servers:
                server.stop()

    def median(auth: str, kind: str, key: str) -> float:
        return statistics.median(r[key] for r in results[auth][kind])

    print(f"auth overhead: {rounds} rounds x {count} requests per kind and server, {THREADS} client threads, "
          f"{os.cpu_count()} CPUs; medians of the rounds")  # fmt: skip
    print()
    header = f"{'path':<8} {'figure':<22} {'auth none':>10} {'auth tokens':>12} {'change':>8}  target"
    print(header)
    print("-" * len(header))
    summary: dict[str, Any] = {"rounds": rounds, "requests": count, "threads": THREADS}
    ok = True
    for kind in ("ingest", "read"):
        for key, label in (("cpu_us", "server CPU / request us"), ("rps", "requests/s"), ("p50_ms", "p50 ms"),
                           ("p99_ms", "p99 ms")):  # fmt: skip
            none, tokens = median("none", kind, key), median("tokens", kind, key)
            change = (tokens - none) / none * 100
            target = ""
            if key == "cpu_us":
                met = change < TARGET_PCT
                ok = ok and met
                target = f"< {TARGET_PCT:g} %: {'met' if met else 'NOT met'}"
            print(f"{kind:<8} {label:<22} {none:>10.1f} {tokens:>12.1f} {change:>+7.1f}%  {target}")
            summary[f"{kind}_{key}"] = {"none": none, "tokens": tokens, "change_pct": change}
    step = authorization_step_us(2_000 if args.quick else 50_000)
    extra = step["tokens"] - step["none"]
    share = extra / median("none", "read", "cpu_us") * 100
    print()
    print(
        f"the authorisation step alone (in-process): {step['none']:.2f} us with auth none, {step['tokens']:.2f} us "
        f"with a cached API token: +{extra:.2f} us, {share:.2f} % of a read request's server CPU"
    )
    summary["authorization_step_us"] = {**step, "extra_us": extra, "share_of_read_pct": share}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
