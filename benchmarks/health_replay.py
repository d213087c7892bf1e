"""Verdicts identical: simulated jobs replayed through the server's HealthMonitor, hashed, tree against tree.

The tool every change of the health code needs. The jobs are those of ``health_detection.py`` (healthy
and faulty curves, several ranks, evaluation pauses, learning rate and evaluation metric) and
``health_pace.py`` (stalls at 3 paces with 1 and 4 ranks, GPU readings, blow-ups to NaN, plateaus,
where-each-rank-stands jobs with saves and hangs, stragglers with activity shares). They are recorded
once, in this process, by a stand-in tracker that answers ``healthy`` (so every job runs to its end, past
its trouble), and cached in a file, so that every tree replays the SAME streams.

Each tree replays them in its own subprocess (which imports that tree's ``stepwatch``) through
``stepwatch.server.ingest.health_monitor.HealthMonitor`` as the server drives it: each recorded progress
call is one report (the window, learning rate, evaluation, GPU, where and shares calls after it belong to
it); a job's first report tracks it through ``start`` as ``track`` does (a replay of what is stored, this
report included) and every later one goes through ``observe``; a sweep every 5 s of simulated time
(``sweep``, and ``silence`` for an untracked job); every ``--restart-every``-th job is forgotten half-way
(a restart: tracked again from its stored windows); its last report ends the job. Every answer of the
monitor (an update's state, since and evidence, or none) at every report and sweep is hashed.

The table gives, per tree: jobs, reports, sweeps, updates per state, the hash, and the monitor's CPU
(thread time) per report of rank 0, per heartbeat (a report of another rank), per sweep, and in all the
starts (replays of stored windows). The last line says IDENTICAL or DIFFERENT (exit status 1), and where
two trees first differ: the job, the answer (which report or sweep) and both answers.

    .venv/bin/python benchmarks/health_replay.py --baseline 19d89fd            # 2 seeds: 134 jobs, ~30 s
    .venv/bin/python benchmarks/health_replay.py --baseline-src /tmp/base/src --rounds 3   # CPU: min of 3
    .venv/bin/python benchmarks/health_replay.py --jobs 8 --seeds 1            # a smoke run (seconds)
    .venv/bin/python benchmarks/health_replay.py --only where --baseline HEAD~1

``--baseline REV`` exports that commit's ``src/`` with ``git archive`` into a temporary directory;
``--baseline-src PATH`` takes another checkout's (a ``git worktree``). The recording is cached under the
system's temporary directory, keyed by the options and the source of the benchmarks that generate it;
``--streams PATH`` keeps it there instead (an existing file is replayed as it is; ``--record`` makes it
anew).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar
from unittest.mock import patch

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
SWEEP_S = 5.0
"""Seconds of simulated time between sweeps (the server's ``SWEEP_EVERY_S``)."""

Event = tuple[Any, ...]
"""``("tick", t)`` (time passes: the benchmark asked for a verdict without a report) or ``("report", t,
rank, step, total, evaluating, windows, gpus, where, shares, host)``."""
Stream = tuple[int, str, str, list[Event]]
"""One recorded job: its index among all jobs, name, direction (``min``/``max``) and events."""

# ------------------------------------------------------------------------------------------------
# Recording (this process: this tree's benchmarks generate the jobs)


class _Verdict:
    """What the stand-in tracker answers: healthy, so that each job runs to its end."""

    state = "healthy"
    since = None
    evidence: ClassVar[dict[str, Any]] = {}


class Recorder:
    """A ``HealthTracker`` stand-in that records the calls a benchmark makes (one job at a time)."""

    calls: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        direction = kwargs.get("direction", args[2] if len(args) > 2 else "min")
        Recorder.calls.append(("new", direction))

    def observe_progress(
        self, t: float, rank: int, step: int | None, total_steps: int | None = None, *, evaluating: Any = None
    ) -> None:
        Recorder.calls.append(("progress", t, rank, step, total_steps, evaluating))

    def observe_window(self, t: float, step: int, *values: Any) -> None:
        last, lo, hi, mean, count, nonfinite, first = (*values, None)[:7]
        Recorder.calls.append(("window", step, last, lo, hi, mean, count, nonfinite, step if first is None else first))

    def observe_lr(self, t: float, step: int, lr: float) -> None:
        Recorder.calls.append(("second", "learning_rate", step, lr))

    def observe_eval(self, t: float, step: int, value: float, metric: str = "eval_loss") -> None:
        Recorder.calls.append(("second", metric, step, value))

    def observe_where(
        self, t: float, rank: int, step: int, activity: str, stood: float, detail: str = "", frames: Any = ()
    ) -> None:
        Recorder.calls.append(("where", (activity, stood, detail, tuple(frames))))

    def observe_shares(self, rank: int, shares: dict[str, float], host: str = "") -> None:
        Recorder.calls.append(("shares", dict(shares), host))

    def observe_gpu(self, rank: int, utilization: float) -> None:
        Recorder.calls.append(("gpu", utilization))

    def verdict(self, now: float, *, live: bool = True) -> _Verdict:
        Recorder.calls.append(("verdict", now))
        return _Verdict()


def events_of(calls: list[tuple[Any, ...]]) -> tuple[str, list[Event]]:
    """One job's recorded calls as its direction and events: each progress call a report, with the calls
    after it until the next progress or verdict call."""
    direction = "min"
    events: list[Event] = []
    report: list[Any] | None = None
    for call in calls:
        kind = call[0]
        if kind in ("progress", "verdict") and report is not None:
            events.append(_report_event(report, direction))
            report = None
        if kind == "new":
            direction = call[1]
        elif kind == "progress":
            report = [call]
        elif kind == "verdict":
            events.append(("tick", call[1]))
        else:
            assert report is not None, call
            report.append(call)
    if report is not None:
        events.append(_report_event(report, direction))
    return direction, events


def _report_event(calls: list[tuple[Any, ...]], direction: str) -> Event:
    """A progress call and what belongs to it, as a report event (windows named as the server stores them:
    the primary metric ``loss``, or ``accuracy`` when higher is better)."""
    _, t, rank, step, total, evaluating = calls[0]
    windows: list[tuple[Any, ...]] = []
    gpus: list[float] = []
    where = shares = None
    host = ""
    for call in calls[1:]:
        if call[0] == "window":
            windows.append(("loss" if direction == "min" else "accuracy", *call[1:]))
        elif call[0] == "second":
            _, name, wstep, value = call
            windows.append((name, wstep, value, value, value, value, 1, 0, wstep))
        elif call[0] == "gpu":
            gpus.append(call[1])
        elif call[0] == "where":
            where = call[1]
        elif call[0] == "shares":
            shares, host = call[1], call[2]
    return ("report", t, rank, step, total, evaluating, tuple(windows), tuple(gpus), where, shares, host)


Task = tuple[str, Callable[[], object]]


RECORDING = ModuleType("recording")
"""What the benchmarks' jobs take for the health module while they are recorded."""
vars(RECORDING).update(HealthTracker=Recorder)


def tasks(seeds: int) -> list[Task]:
    """Every job of both benchmarks for ``seeds`` seeds, in a fixed order: its name and how to run it."""
    sys.path.insert(0, str(HERE.parent))
    import health_detection as hd
    import health_pace as hp

    out: list[Task] = []
    run: Callable[[], object]
    for seed in range(seeds):
        for total in (4000, 12000):
            signals, phase = "all" if seed % 2 == 0 else "lr", seed % 3 != 2
            for job in hd.healthy_curves(seed, total) + hd.faulty_curves(seed, total):
                out.append((f"hd {job.name} {seed} {total}", partial(hd.run, job, signals=signals, phase=phase)))
        for spt in (0.1, 1.0, 10.0):
            for hang in (True, False):
                for ranks in (1, 4):
                    run = partial(hp.stall_job, RECORDING, spt, 100 + seed, hang, ranks)
                    out.append((f"stall {spt} {hang} {ranks} {seed}", run))
        for growth in (1.05, 1.2, 2.0):
            out.append((f"blowup {growth} {seed}", partial(hp.blowup_job, RECORDING, growth, seed)))
        for minutes in (20.0, 60.0):
            run = partial(hp.plateau_job, RECORDING, minutes, 4.0, seed, signals=seed % 2 == 1)
            out.append((f"plateau {minutes} {seed}", run))
        for ranks in (1, 4):
            for hang in (True, False):
                for sampling in (True, False):
                    run = partial(hp.where_job, RECORDING, 5000 + seed, ranks=ranks, hang=hang, sampling=sampling)
                    out.append((f"where {ranks} {hang} {sampling} {seed}", run))
        for ratio in (1.3, 2.0):
            out.append((f"straggler {ratio} {seed}", partial(hp.straggler_job, seed, ratio, minutes=20.0)))
    return out


@contextmanager
def recording() -> Iterator[None]:
    """The benchmarks' trackers replaced by :class:`Recorder` (``health_detection`` and ``health_pace``'s
    straggler job use their modules' own), and put back after."""
    import health_detection as hd
    import health_pace as hp

    with patch.object(hd, "HealthTracker", Recorder), patch.object(hp, "now_health", RECORDING):
        yield


def select(all_tasks: list[Task], only: str | None, jobs: int | None) -> list[tuple[int, Task]]:
    """The tasks whose name holds ``only``; with ``jobs``, that many spread evenly over them (every kind)."""
    chosen = [(i, task) for i, task in enumerate(all_tasks) if not only or only in task[0]]
    if jobs is not None and jobs < len(chosen):
        chosen = [chosen[k * len(chosen) // jobs] for k in range(jobs)]
    return chosen


def record(seeds: int, only: str | None, jobs: int | None) -> list[Stream]:
    """Run the chosen jobs against the recorder; their streams."""
    streams: list[Stream] = []
    with recording():
        for index, (name, run) in select(tasks(seeds), only, jobs):
            Recorder.calls = []
            run()
            direction, events = events_of(Recorder.calls)
            streams.append((index, name, direction, events))
    Recorder.calls = []
    return streams


def streams_file(args: argparse.Namespace) -> Path:
    """The file of the recording the options ask for, recorded now when it is not there (or ``--record``)."""
    if args.streams:
        path = Path(args.streams)
    else:
        key = hashlib.sha256(json.dumps([args.seeds, args.only, args.jobs]).encode())
        for source in ("health_detection.py", "health_pace.py", HERE.name):
            key.update((HERE.parent / source).read_bytes())
        path = Path(tempfile.gettempdir()) / f"stepwatch-health-replay-{key.hexdigest()[:16]}.pkl"
    if path.exists() and not args.record:
        print(f"replaying the recording in {path}")
        return path
    c0 = time.process_time()
    streams = record(args.seeds, args.only, args.jobs)
    header = {"seeds": args.seeds, "only": args.only, "jobs": args.jobs, "commit": label_of(ROOT / "src")}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.part")
    with partial.open("wb") as f:
        pickle.dump((header, streams), f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, path)
    print(f"recorded {len(streams)} jobs in {time.process_time() - c0:.1f} s of CPU into {path}")
    return path


# ------------------------------------------------------------------------------------------------
# Replaying (a subprocess per tree: it imports that tree's stepwatch, and nothing of this one)


class Totals:
    """What a tree's replay counts and hashes."""

    def __init__(self) -> None:
        self.reports = self.sweeps = self.rank0 = self.others = 0
        self.cpu_rank0 = self.cpu_others = self.cpu_sweeps = self.cpu_starts = 0.0
        self.states: dict[str, int] = {}
        self.digest = hashlib.sha256()
        self.per_job: list[str] = []


class JobReplay:
    """One job through a fresh ``HealthMonitor``, as the server drives it (see the module docstring)."""

    def __init__(self, api: SimpleNamespace, stream: Stream, restart_every: int, totals: Totals) -> None:
        index, _name, direction, self.events = stream
        self.api, self.totals = api, totals
        self.metric = "loss" if direction == "min" else "accuracy"
        named = None if direction == "min" else self.metric
        self.monitor = api.hm.HealthMonitor(metric_of=lambda job: (named, direction))
        self.job = api.Job(
            id=index + 1,
            namespace="default",
            name=f"j{index}",
            attempt=1,
            state="running",
            created_at=0.0,
            updated_at=0.0,
        )
        self.stored: dict[str, list[tuple[Any, ...]]] = {}
        reports = [i for i, e in enumerate(self.events) if e[0] == "report"]
        self.last = reports[-1] if reports else -1
        self.restart_at = reports[len(reports) // 2] if reports and index % restart_every == 0 else -1
        self.digest = hashlib.sha256()
        self.trace: list[tuple[str, str]] | None = None
        self.n_reports = self.n_sweeps = 0

    def run(self) -> str:
        """Every event; the job's digest (hex)."""
        next_sweep: float | None = None
        for i, event in enumerate(self.events):
            t = event[1]
            next_sweep = t + SWEEP_S if next_sweep is None else next_sweep
            while next_sweep <= t and self.job.state == "running":
                self.sweep(next_sweep)
                next_sweep += SWEEP_S
            if event[0] == "report" and self.job.state == "running":
                self.report(i, event)
        return self.digest.hexdigest()

    def emit(self, kind: str, t: float, update: Any) -> None:
        """Hash one answer of the monitor (and keep what the store would: the job's health)."""
        if update is None:
            text = f"{kind} {t!r} -"
        else:
            v = update.verdict
            text = f"{kind} {t!r} {v.state} {v.since!r} " + json.dumps(v.evidence, sort_keys=True, default=repr)
            self.job = self.job.changed(health=v.state, health_since=v.since, health_evidence=v.evidence)
            self.totals.states[v.state] = self.totals.states.get(v.state, 0) + 1
        self.digest.update(text.encode())
        if self.trace is not None:
            count = self.n_reports if kind == "report" else self.n_sweeps
            self.trace.append((f"{kind} {count}", text))

    def sweep(self, now: float) -> None:
        """One sweep of the job: judged by its tracker, or by its silence when it has none."""
        c0 = time.thread_time()
        updates = self.monitor.sweep([self.job], now)
        if self.job.id not in self.monitor:
            silent = self.monitor.silence(self.job, now)
            updates += [silent] if silent is not None else []
        self.totals.cpu_sweeps += time.thread_time() - c0
        self.n_sweeps += 1
        self.totals.sweeps += 1
        for update in updates or [None]:
            self.emit("sweep", now, update)

    def report(self, i: int, event: Event) -> None:
        """One report: stored (the job row, its windows), then judged as ``assess`` judges it."""
        _, t, rank, step, total, evaluating, windows, gpus, where, shares, host = event
        points = tuple(self.window(w) for w in windows)
        for w in windows:
            self.stored.setdefault(w[0], []).append((t, *w[1:]))
        changes: dict[str, Any] = {"last_report_at": t, "updated_at": t}
        if rank == 0 and step is not None:
            changes["step"] = step
        if total is not None:
            changes["total_steps"] = total
        if points:
            changes["last_metrics"] = {**self.job.last_metrics, **{p.name: p.last for p in points}}
        if i == self.last:
            changes.update(state="finished", finished_at=t)
        self.job = self.job.changed(**changes)
        if i == self.restart_at:
            self.monitor.forget_all()
        result = self.api.IngestResult(self.job, False, new_points=points)
        readings, reading = [self.api.GpuReading(0, u) for u in gpus], self.where(where)
        c0 = time.thread_time()
        if self.job.id in self.monitor:
            update = self.monitor.observe(
                result, rank, step, t, total, readings, evaluating=evaluating, where=reading,
                activity_shares=shares, host=host,
            )  # fmt: skip
            self.count_report(rank, time.thread_time() - c0)
        elif self.job.state == "running":
            self.start()
            update = self.monitor.judge(self.job, t)
            self.totals.cpu_starts += time.thread_time() - c0
        else:
            update = None
        self.n_reports += 1
        self.totals.reports += 1
        self.emit("report", t, update)

    def count_report(self, rank: int, spent: float) -> None:
        """The CPU of one observed report: rank 0's (windows) or a heartbeat (any other rank's)."""
        if rank == 0:
            self.totals.cpu_rank0 += spent
            self.totals.rank0 += 1
        else:
            self.totals.cpu_others += spent
            self.totals.others += 1

    def start(self) -> None:
        """Track the job from what is stored, as ``track`` does."""
        hm = self.api.hm
        named, direction = self.monitor.metric_of(self.job)
        metric = named or hm.primary_metric(self.job.last_metrics)
        history = self.columns(metric) if metric is not None and metric in self.stored else None
        second = {}
        if metric is not None:
            for name in hm.second_metrics(self.job.last_metrics):
                if name is not None and name in self.stored:
                    second[name] = self.columns(name)
        self.monitor.start(self.job, history, metric, direction, second)

    def columns(self, metric: str) -> Any:
        """What ``Store.history_columns`` answers for a stored metric."""
        rows = list(zip(*self.stored[metric]))
        names = ("times", "steps", "lasts", "mins", "maxs", "means", "counts", "nonfinites", "first_steps")
        return self.api.SeriesColumns(**{name: list(column) for name, column in zip(names, rows)})

    def window(self, w: tuple[Any, ...]) -> Any:
        """A metric window as the protocol holds it, unvalidated (the benchmarks' values, as recorded)."""
        name, step, last, lo, hi, mean, count, nonfinite, first = w
        window = object.__new__(self.api.MetricWindow)
        fields = {"name": name, "last": last, "min": lo, "max": hi, "mean": mean, "count": count}
        fields.update(nonfinite=nonfinite, first_step=first, last_step=step)
        for key, value in fields.items():
            object.__setattr__(window, key, value)
        return window

    def where(self, reading: tuple[Any, ...] | None) -> Any:
        """Where a rank stands, from the recorded reading (frames as ``function (file:line)``)."""
        if reading is None:
            return None
        activity, stood, detail, frames = reading
        parsed = []
        for text in frames:
            function, rest = text.rsplit(" (", 1)
            file, line = rest.rstrip(")").rsplit(":", 1)
            parsed.append(self.api.Frame(function, file, int(line)))
        return self.api.Where(activity, stood, detail, tuple(parsed))


def replay(src: str, path: str, restart_every: int, trace: int | None) -> dict[str, Any]:
    """Replay the recording in ``path`` through the HealthMonitor of ``src``; the figures (with ``trace``, a
    job index, that job's answers only)."""
    sys.path.insert(0, src)
    from stepwatch.protocol import Frame, GpuReading, MetricWindow, Where
    from stepwatch.server.ingest import health_monitor as hm
    from stepwatch.server.store import IngestResult, Job, SeriesColumns

    api = SimpleNamespace(
        hm=hm, Frame=Frame, GpuReading=GpuReading, MetricWindow=MetricWindow, Where=Where, Job=Job,
        IngestResult=IngestResult, SeriesColumns=SeriesColumns,
    )  # fmt: skip
    with open(path, "rb") as f:
        _header, streams = pickle.load(f)
    totals = Totals()
    for stream in streams:
        if trace is not None and stream[0] != trace:
            continue
        job = JobReplay(api, stream, restart_every, totals)
        if trace is not None:
            job.trace = []
            job.run()
            return {"module": hm.__file__, "trace": job.trace}
        totals.per_job.append(job.run())
        totals.digest.update(bytes.fromhex(totals.per_job[-1]))
    names = [stream[1] for stream in streams]
    figures = {k: v for k, v in vars(totals).items() if k not in ("digest", "per_job")}
    return {
        **figures,
        "module": hm.__file__,
        "hash": totals.digest.hexdigest(),
        "per_job": totals.per_job,
        "names": names,
    }


# ------------------------------------------------------------------------------------------------
# Comparing (this process)


def label_of(src: Path) -> str:
    """The commit of a checkout's ``src`` folder (``+`` when its files differ from it), or the folder."""
    git = ["git", "-C", str(src), "rev-parse", "--short", "HEAD"]
    done = subprocess.run(git, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return str(src)
    dirty = subprocess.run(
        ["git", "-C", str(src), "status", "--porcelain", "."], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def export(rev: str, into: Path) -> Path:
    """The ``src`` folder of commit ``rev`` of this repository (``git archive``)."""
    sys.path.insert(0, str(HERE.parent))
    from server_ingest import export_source

    return export_source(rev, into)


def child(src: Path, path: Path, restart_every: int, trace: int | None = None) -> dict[str, Any]:
    """One tree's replay, in a subprocess of its own; its figures."""
    command = [sys.executable, str(HERE), "--child", str(src), "--streams", str(path)]
    command += ["--restart-every", str(restart_every)] + (["--trace", str(trace)] if trace is not None else [])
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the replay of {src} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if not Path(result["module"]).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"the replay of {src} imported {result['module']}: not that tree's stepwatch")
    return result


def measure(trees: list[tuple[str, Path]], path: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each tree's replay, ``--rounds`` times in turn; per tree the first round's figures with the least
    CPU of every round. A tree whose rounds hash differently is not repeatable: exit status 1."""
    results: list[dict[str, Any]] = [{} for _ in trees]
    for _ in range(args.rounds):
        for k, (label, src) in enumerate(trees):
            r = child(src, path, args.restart_every)
            best = results[k]
            if best and best["hash"] != r["hash"]:
                raise SystemExit(f"NOT REPEATABLE: two replays of {label} hash differently")
            for key in ("cpu_rank0", "cpu_others", "cpu_sweeps", "cpu_starts"):
                r[key] = min(r[key], best.get(key, r[key]))
            results[k] = r
    return results


def _updates(state: str, result: dict[str, Any]) -> str:
    """How many updates of a tree's replay said ``state``."""
    return f"{result['states'].get(state, 0):,}"


def table(trees: list[tuple[str, Path]], results: list[dict[str, Any]], rounds: int, load: str) -> None:
    """The figures of every tree, side by side."""
    states = sorted({s for r in results for s in r["states"]})
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("jobs", lambda r: f"{len(r['per_job']):,}"),
        ("reports", lambda r: f"{r['reports']:,}"),
        ("  of rank 0, observed", lambda r: f"{r['rank0']:,}"),
        ("  heartbeats (rank > 0), observed", lambda r: f"{r['others']:,}"),
        ("  starts (first report, restart)", lambda r: f"{r['reports'] - r['rank0'] - r['others']:,}"),
        ("sweeps", lambda r: f"{r['sweeps']:,}"),
    ]
    rows += [(f"updates: {s}", partial(_updates, s)) for s in states]
    rows += [
        ("hash (sha256, first 16)", lambda r: r["hash"][:16]),
        ("CPU us / report of rank 0", lambda r: f"{1e6 * r['cpu_rank0'] / max(r['rank0'], 1):.1f}"),
        ("CPU us / heartbeat", lambda r: f"{1e6 * r['cpu_others'] / max(r['others'], 1):.1f}"),
        ("CPU us / sweep", lambda r: f"{1e6 * r['cpu_sweeps'] / max(r['sweeps'], 1):.1f}"),
        ("CPU s in starts (replays)", lambda r: f"{r['cpu_starts']:.3f}"),
    ]
    print(f"CPU: the monitor's thread time, the least of {rounds} round(s); load avg {load}")
    width = max(24, *(len(label) + 2 for label, _ in trees))
    print(f"{'':34}" + "".join(f"{label:>{width}}" for label, _ in trees))
    for name, cell in rows:
        print(f"{name:34}" + "".join(f"{cell(r):>{width}}" for r in results))


def first_difference(trees: list[tuple[str, Path]], results: list[dict[str, Any]], path: Path, every: int) -> str:
    """Where the last tree's answers first differ from the first's: job, answer, both answers."""
    (label_a, src_a), (label_b, src_b) = trees[0], trees[-1]
    a, b = results[0], results[-1]
    if a["names"] != b["names"]:
        return "the trees replayed different recordings"
    k = next(k for k, (x, y) in enumerate(zip(a["per_job"], b["per_job"])) if x != y)
    with open(path, "rb") as f:
        index = pickle.load(f)[1][k][0]
    trace_a = child(src_a, path, every, index)["trace"]
    trace_b = child(src_b, path, every, index)["trace"]
    lines = [f"first difference: job {a['names'][k]!r} (#{index}, {k + 1} of {len(a['names'])})"]
    for n, (x, y) in enumerate(zip(trace_a, trace_b)):
        if x != y:
            lines += [
                f"  answer {n + 1}, {label_a}: {x[0]}: {x[1][:600]}",
                f"  answer {n + 1}, {label_b}: {y[0]}: {y[1][:600]}",
            ]
            return "\n".join(lines)
    return "\n".join([*lines, f"  answers: {len(trace_a)} ({label_a}) and {len(trace_b)} ({label_b})"])


def parser() -> argparse.ArgumentParser:
    """The options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=2, help="seeds of every kind of job (default 2: 134 jobs)")
    p.add_argument("--jobs", type=int, help="at most this many jobs, spread evenly over the kinds")
    p.add_argument("--only", help="only the jobs whose name holds this text (hd, stall, blowup, plateau, where, ...)")
    base = p.add_mutually_exclusive_group()
    base.add_argument("--baseline", metavar="REV", help="also replay this commit's src/ (git archive)")
    base.add_argument("--baseline-src", metavar="PATH", help="also replay this src/ folder (another checkout's)")
    p.add_argument("--rounds", type=int, default=1, help="replays of each tree, in turn (CPU: the least)")
    p.add_argument("--restart-every", type=int, default=3, help="forget every Nth job half-way (a restart)")
    p.add_argument("--streams", metavar="PATH", help="the recording's file (replayed as it is when it exists)")
    p.add_argument("--record", action="store_true", help="record anew even when the recording's file exists")
    p.add_argument("--child", metavar="SRC", help=argparse.SUPPRESS)
    p.add_argument("--trace", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        print(json.dumps(replay(args.child, args.streams, args.restart_every, args.trace)))
        return 0
    with tempfile.TemporaryDirectory(prefix="health_replay_") as tmp:
        path = streams_file(args)
        trees = [(f"this tree {label_of(ROOT / 'src')}", ROOT / "src")]
        if args.baseline:
            trees.append((f"baseline {args.baseline}", export(args.baseline, Path(tmp))))
        elif args.baseline_src:
            trees.append((f"baseline {label_of(Path(args.baseline_src))}", Path(args.baseline_src)))
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        results = measure(trees, path, args)
        table(trees, results, args.rounds, load)
        if len(trees) == 1:
            return 0
        if results[0]["hash"] == results[-1]["hash"]:
            print(f"IDENTICAL: every answer of the monitor, at {results[0]['reports']:,} reports and "
                  f"{results[0]['sweeps']:,} sweeps, is the same in both trees")  # fmt: skip
            return 0
        print(first_difference(trees, results, path, args.restart_every))
        print("DIFFERENT: the trees' verdicts differ (see above)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
