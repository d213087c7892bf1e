"""The HTTP side of a report over real sockets (issue 31): what a report costs the server between the socket
and the ingest service, and the whole trip beside it.

Each target is served as ``stepwatch server`` serves it (its own command line: ``create_app``,
``tune_for_serving``, uvicorn with ``protocol_class``'s bounded httptools protocol) on a loopback port, from
a ``src/`` folder (``--src KEY=PATH``, e.g. a ``git worktree`` of main's beside this tree). The load is
``server_ingest.py``'s (its ``ingest_phase``): ``--conns`` kept-alive clients in a separate load-generator
process post ``server_ingest.report_dict`` bodies (rank 0, 5 metric windows) back to back, fresh jobs
every round; the server's CPU (every thread, from /proc) over the measured window. Rounds alternate the
targets' order; the bare uvicorn + Starlette endpoint of ``server_ingest.py``'s section 6 (the floor)
is measured first in every round unless ``--no-bare``.

    .venv/bin/python benchmarks/report_http.py --src base=/tmp/base/src --src this=src --stub --rounds 4 --seconds 5
    .venv/bin/python benchmarks/report_http.py --src base=/tmp/base/src --src this=src --rounds 6 --seconds 5 --no-bare

``--stub`` replaces the ingest service with one that answers at once (no store, no analysis): what is
left is the HTTP side alone. With it, ``--cut STAGE`` cuts the report route short after a stage and
answers (``answer``: at once; ``body``: after reading the body; ``auth``: after finding the job and
checking its token, then reading the body; ``decode``: and decoding the JSON; ``parse``: and
``Report.from_dict``); it needs a tree whose report route is direct (``server/api/direct.py``).
``--profile PATH`` writes a cProfile (thread CPU clock) of each server's event-loop thread over its
whole life (``PATH``, or ``PATH.KEY`` with several targets).

Exits 1 when a target answered anything but 200 in a measured window (the table says how many).
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server_ingest
from server_ingest import Server, fmt_ms, ingest_phase, register_jobs

HERE = Path(__file__).resolve()
CUTS = ("answer", "body", "auth", "decode", "parse")
_OK = {"accepted_seq": 1, "commands": []}


# ------------------------------------------------------------------------------ the served process


class _Done:
    """What the stubbed ingest service answers: a new report, no command pending."""

    duplicate = False
    commands = ()


async def _answer_at_once(svc: Any, job: Any, report: Any) -> _Done:
    return _Done()


def _cut_route(cut: str) -> Any:
    """The report route cut short after ``cut`` (see the module's docstring), from this tree's own pieces."""
    from stepwatch.protocol import Report
    from stepwatch.server.api.direct import Receive, Scope, Send, first_headers, send_json
    from stepwatch.server.api.request import bearer_of, decode_json, receive_body, writer_of

    names = frozenset({b"authorization", b"content-length"})

    async def short(scope: Scope, receive: Receive, send: Send) -> None:
        if cut == "answer":
            await send_json(send, _OK)
            return
        state, params = scope["app"].state, scope["path_params"]
        head = first_headers(scope, names)
        if cut != "body":
            token = bearer_of(head[b"authorization"].decode("latin-1")) if b"authorization" in head else None
            await writer_of(state.services.store, params["namespace"], params["name"], token, hide=state.auth.enabled)
        declared = head[b"content-length"].decode("latin-1") if b"content-length" in head else None
        body = await receive_body(receive, declared, state.settings.body_timeout_s)
        if cut in ("decode", "parse"):
            data = decode_json(body)
            if cut == "parse":
                Report.from_dict(data)
        await send_json(send, _OK)

    return short


def serve(db: str, port: int, stub: bool, cut: str | None, profile: str | None) -> int:
    """``stepwatch server --db DB --port PORT`` in this process, the ingest service stubbed (and the route
    cut short) when asked, the event-loop thread profiled when asked."""
    from stepwatch.cli import main as cli_main

    if stub:
        import stepwatch.server.api.routes.ingest as ingest_routes

        ingest_routes.ingest_report = _answer_at_once  # type: ignore[attr-defined,assignment]
        if cut is not None:
            endpoint = ingest_routes.report
            if not hasattr(endpoint, "func"):
                print("--cut needs a tree whose report route is direct (server/api/direct.py)", file=sys.stderr)
                return 2
            endpoint.func = _cut_route(cut)
    argv = ["server", "--db", db, "--port", str(port), "--log-level", "warning"]
    if not profile:
        return cli_main(argv)
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    try:
        return cli_main(argv)
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


# ---------------------------------------------------------------------------------------- the driver


@contextmanager
def started(opts: argparse.Namespace, tmp: Path) -> Iterator[list[tuple[str, Server]]]:
    """Every target's server, up for the whole run: the bare endpoint first (unless ``--no-bare``)."""
    with ExitStack() as stack:
        out: list[tuple[str, Server]] = []
        if not opts.no_bare:
            bare = [sys.executable, server_ingest.__file__, "--serve-bare"]
            out.append(("bare", stack.enter_context(Server(None, tmp / "bare.log", command=bare))))
        for key, src in opts.src:
            cmd = [sys.executable, str(HERE), "--serve", "--db", str(tmp / f"{key}.db")]
            cmd += ["--stub"] if opts.stub else []
            cmd += ["--cut", opts.cut] if opts.cut else []
            if opts.profile:
                cmd += ["--profile", opts.profile if len(opts.src) == 1 else f"{opts.profile}.{key}"]
            out.append((key, stack.enter_context(Server(None, tmp / f"{key}.log", src=Path(src), command=cmd))))
        yield out


def measure(opts: argparse.Namespace, targets: list[tuple[str, Server]]) -> list[dict[str, Any]]:
    """``opts.rounds`` rounds over every target, the targets' order reversed every other round (the floor
    stays first); one row per target and round."""
    cfg = {"loadgen_procs": 1, "client": "raw", "start_delay_s": 1.0, "warmup_s": opts.warm}
    fixed = 0 if opts.no_bare else 1
    rows: list[dict[str, Any]] = []
    for round_no in range(1, opts.rounds + 1):
        order = targets if round_no % 2 else [*targets[:fixed], *reversed(targets[fixed:])]
        for key, server in order:
            names = [f"r{round_no}-{i:04d}" for i in range(opts.conns)]
            jobs = [(name, "none") for name in names] if key == "bare" else register_jobs(server.base, names)
            row = ingest_phase(server, jobs, cfg, opts.seconds, None, f"{key}{round_no}")
            row.update(key=key, round=round_no, load=os.getloadavg()[0])
            rows.append(row)
            print_row(row, rows)
    return rows


def refused(row: dict[str, Any]) -> int:
    """Requests of the measured window not answered 200 (or none answered at all: the whole row)."""
    statuses: dict[str, int] = row.get("statuses", {})
    if "unavailable" in row or not statuses.get("200"):
        return max(1, sum(statuses.values()))
    return sum(n for code, n in statuses.items() if code != "200")


def print_row(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """One line of the table, as soon as it is measured (vs floor: over the same round's bare endpoint)."""
    if len(rows) == 1:
        head = ("target", "round", "reports/s", "p50 / p99", "server CPU ms/report", "vs floor", "cores srv/load")
        print(f"{head[0]:<10}{head[1]:>6}{head[2]:>11}{head[3]:>20}{head[4]:>22}{head[5]:>10}  {head[6]}")
        print("-" * 100)
    if "unavailable" in row:
        print(f"{row['key']:<10}{row['round']:>6}  {row['unavailable']}", flush=True)
        return
    floor = [r for r in rows if r["key"] == "bare" and r["round"] == row["round"] and "unavailable" not in r]
    ms = row["server_cpu_ms_per_request"]
    bad = refused(row)
    versus = f"{ms / floor[0]['server_cpu_ms_per_request']:.2f}x" if floor and row["key"] != "bare" and not bad else "-"
    cpu = "-" if math.isnan(ms) else f"{ms:.3f}"
    print(
        f"{row['key']:<10}{row['round']:>6}{row['accepted_per_s']:>11,.0f}"
        f"{fmt_ms(row['p50_ms']) + ' / ' + fmt_ms(row['p99_ms']):>20}{cpu:>22}{versus:>10}"
        f"  {row['server_cores']:.2f} / {row['loadgen_cores']:.2f}  load {row['load']:.1f}"
        + (f"  {bad} NOT 200: {row['statuses']} {row['errors'][:1]}" if bad else ""),
        flush=True,
    )


def print_summary(rows: list[dict[str, Any]], keys: list[str]) -> None:
    """The median over rounds of each target (the CPU's range beside it)."""
    print("\nmedian over rounds:")
    floor = [r["server_cpu_ms_per_request"] for r in rows if r["key"] == "bare" and not refused(r)]
    for key in keys:
        mine = [r for r in rows if r["key"] == key and not refused(r)]
        if not mine:
            print(f"  {key:>8}: no round answered 200 throughout")
            continue
        cpu = [r["server_cpu_ms_per_request"] for r in mine]
        ratio = statistics.median(cpu) / statistics.median(floor) if floor and key != "bare" else None
        beyond = f", {ratio:.2f}x the floor" if ratio else ""
        print(
            f"  {key:>8}: server CPU {statistics.median(cpu):.3f} ms/report ({min(cpu):.3f}-{max(cpu):.3f}{beyond}), "
            f"{statistics.median(r['accepted_per_s'] for r in mine):,.0f} reports/s, "
            f"p50 {fmt_ms(statistics.median(r['p50_ms'] for r in mine))}, "
            f"p99 {fmt_ms(statistics.median(r['p99_ms'] for r in mine))}"
        )


def target(value: str) -> tuple[str, str]:
    key, sep, path = value.partition("=")
    if not sep or not key or not path or key == "bare":
        raise argparse.ArgumentTypeError(f"expected KEY=PATH (KEY not 'bare'), got {value!r}")
    return key, str(Path(path).resolve())


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--src", type=target, action="append", metavar="KEY=PATH", help="serve the stepwatch of this src/ folder "
        "as KEY (repeatable; default: this tree's src/ as 'this')"
    )  # fmt: skip
    parser.add_argument("--stub", action="store_true", help="the ingest service answers at once: the HTTP side alone")
    parser.add_argument("--cut", choices=CUTS, help="with --stub: the report route cut short after this stage")
    parser.add_argument("--rounds", type=int, default=4, help="rounds over every target (default 4)")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds of each target in a round")
    parser.add_argument("--warm", type=float, default=1.5, help="seconds of load before each measured window")
    parser.add_argument("--conns", type=int, default=40, help="kept-alive clients, one fresh job each (default 40)")
    parser.add_argument("--no-bare", action="store_true", help="leave out the bare uvicorn + Starlette endpoint")
    parser.add_argument("--profile", metavar="PATH", help="cProfile (thread CPU clock) of each server's event loop")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.cut and not opts.stub:
        parser.error("--cut needs --stub")
    opts.src = opts.src or [("this", str(HERE.parent.parent / "src"))]
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(argv)
    if opts.serve:
        return serve(opts.db, opts.port, opts.stub, opts.cut, opts.profile)
    what = "HTTP side only (--stub" + (f", cut after {opts.cut})" if opts.cut else ")") if opts.stub else "whole trip"
    print(
        f"{what}: {opts.conns} kept-alive clients back to back, {opts.warm:g} s warm + {opts.seconds:g} s measured, "
        f"{opts.rounds} rounds; targets: "
        + ", ".join(([] if opts.no_bare else ["bare (floor)"]) + [f"{k}={p}" for k, p in opts.src])
    )
    try:
        with tempfile.TemporaryDirectory(prefix="stepwatch-http-") as tmp, started(opts, Path(tmp)) as targets:
            rows = measure(opts, targets)
    except RuntimeError as exc:  # a server that did not start: its log's tail says why
        print(f"report_http: {exc}", file=sys.stderr)
        return 2
    print_summary(rows, [key for key, _ in targets])
    bad = sum(refused(r) for r in rows)
    if bad:
        print(f"\n{bad} requests of the measured windows were not answered 200", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
