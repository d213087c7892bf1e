"""Stalls by pace, a hung rank named, divergence before NaN: the health tracker now against before.

``health_detection.py`` runs its curves at one pace (4 steps/s); this one varies what the stall and
the fast divergence rules depend on, and runs the tracker of this tree and the tracker of an earlier
commit (``--before``, default ``ad9266a``: main before issue 19) on the same simulated jobs in the
same run. The earlier tracker is read with ``git show`` into a temporary package: nothing is copied
into the tree.

- **Stall, reports go on**: one rank steps with log-normal step times (sigma 0.3) around 0.1 s, 1 s
  or 10 s, reports every 2 s (+-10 %), the server sweeps every 5 s; at a random time the step stops
  (a deadlocked data loader) while the reports go on. Delay: from the last step to ``stalled``.
  Target (issue 19): 45 s for steps <= 1 s, max(45 s, 4 x p95 step time) for slower ones.
- **One hung rank of 4**: rank 0 reports every 2 s, ranks 1-3 heartbeat every 10 s; rank 2 hangs in
  its loader; the others block in the next collective at the same step (synchronous DDP), their
  GPUs spinning (100 %), the hung rank's idle (0 %). Named: the share of jobs whose verdict names rank 2.
- **Healthy at each pace**: 30 minutes of the same jitter, with a step 3x the usual one in 2 % of the
  steps: any stall is a false alarm.
- **Blow-up to NaN**: a loss at about 2 (5 % noise) for 10 minutes at 4 steps/s, then multiplied by
  1.05, 1.2 or 2 per step until it overflows float32 (NaN). Lead: from ``diverging`` to the first
  non-finite report (0 when only the NaN is flagged).

- **Plateau from the start** (``--only plateaus``; before: ``--plateau-before``, default ``bb17486``, main
  before issue 19 item 5): a loss flat from its 5th second in jobs planned for 20 min, 1 h and 10 h at
  50 and 4 steps/s; when ``not_learning`` comes, as a share of the planned duration (target 10 %, at
  most 15 min).

    .venv/bin/python benchmarks/health_pace.py            # 20 jobs per row (about a minute)
    .venv/bin/python benchmarks/health_pace.py --jobs 5   # a smoke run
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from stepwatch.server.analysis import health as now_health  # noqa: E402

INTERVAL = 2.0
SWEEP = 5.0
HEARTBEAT = 10.0


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _copy_tree(rev: str, source: str, target: Path, keep_init: bool) -> None:
    """The Python files of the folder ``rev:source`` into the package ``target`` (its ``__init__.py`` only
    with ``keep_init``), or the module ``rev:source.py`` into ``target.py`` (a commit before it was a folder)."""
    paths = [line.split("\t", 1)[1] for line in _git("ls-tree", rev, f"{source}/").splitlines()]
    if paths:
        target.mkdir(parents=True, exist_ok=True)
        (target / "__init__.py").write_text("")
        for path in paths:
            name = path.rsplit("/", 1)[-1]
            if name.endswith(".py") and (keep_init or name != "__init__.py"):
                (target / name).write_text(_git("show", f"{rev}:{path}"))
    elif _git("ls-tree", rev, f"{source}.py"):
        (target.parent / f"{target.name}.py").write_text(_git("show", f"{rev}:{source}.py"))


def load_before(rev: str) -> ModuleType:
    """The ``analysis.health`` module of commit ``rev``, imported from a temporary package laid out as the
    project's (``server/analysis`` beside ``protocol``, which its modules import since issue 32), named
    after the commit so that the trackers of two commits can be loaded in one run."""
    folder = Path(tempfile.mkdtemp(prefix="sw_before_"))
    name = "sw_before_" + "".join(c if c.isalnum() else "_" for c in rev)
    package = folder / name
    (package / "server").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "server" / "__init__.py").write_text("")
    _copy_tree(rev, "src/stepwatch/server/analysis", package / "server" / "analysis", keep_init=False)
    _copy_tree(rev, "src/stepwatch/protocol", package / "protocol", keep_init=True)
    sys.path.insert(0, str(folder))
    return importlib.import_module(f"{name}.server.analysis.health")


def _step_times(rng: np.random.Generator, spt: float, n: int) -> np.ndarray:
    times = spt * np.exp(rng.normal(0, 0.3, n) - 0.045)
    slow = rng.random(n) < 0.02
    times[slow] *= 3
    return times


def stall_job(module: ModuleType, spt: float, seed: int, hang: bool, ranks: int = 1) -> dict[str, Any]:
    """One job at ``spt`` seconds per step; with ``hang`` its rank (rank 2 of 4 with ``ranks``) hangs."""
    rng = np.random.default_rng(seed)
    duration = 1800.0
    n = int(duration / spt) + 10
    ends = 1000.0 + np.cumsum(_step_times(rng, spt, n))
    hang_t = 1000.0 + float(rng.uniform(600, 1200)) if hang else math.inf
    last_step_t = float(ends[ends <= hang_t][-1]) if hang else math.inf
    stop_step = int(np.searchsorted(ends, hang_t))  # the steps done when the rank hangs
    tracker = module.HealthTracker()
    total = n
    times = []
    t = 1000.0
    while t < 1000.0 + duration + 300:
        t += INTERVAL * float(rng.uniform(0.9, 1.1))
        times.append(("r0", t))
    beats = [(f"r{r}", 1000.0 + r * 2.5 + k * HEARTBEAT) for r in range(1, ranks) for k in range(int(2200 / HEARTBEAT))]
    sweeps = [("sweep", 1000.0 + k * SWEEP) for k in range(int(2200 / SWEEP))]
    last = float(ends[-1]) if not hang else math.inf  # a healthy job is judged while it steps
    events = sorted((e for e in times + beats + sweeps if e[1] <= last), key=lambda e: e[1])
    hung_rank = 2 if ranks > 1 else 0
    for who, t in events:
        done = int(np.searchsorted(ends, t))
        if hang:
            done = min(done, stop_step)  # the hung rank, and (synchronous DDP) the others at the same step
        if who != "sweep":
            rank = int(who[1:])
            tracker.observe_progress(t, rank, done, total)
            if ranks > 1 and hasattr(tracker, "observe_gpu"):
                busy = 0.0 if hang and t > hang_t and rank == hung_rank else 100.0
                tracker.observe_gpu(rank, busy)
        verdict = tracker.verdict(t)
        if verdict.state == "stalled":
            if not hang:
                return {"false": True}
            named = verdict.evidence.get("rank")
            return {
                "delay": t - last_step_t,
                "named": named == hung_rank,
                "p95": float(np.quantile(np.diff(ends[:stop_step]), 0.95)),
            }
    return {"false": False} if not hang else {"delay": None, "named": False}


def blowup_job(module: ModuleType, growth: float, seed: int) -> dict[str, Any]:
    """A loss that blows up by ``growth`` per step until float32 overflows: lead of diverging over NaN."""
    rng = np.random.default_rng(seed)
    rate = 4.0
    calm = 2400
    with np.errstate(over="ignore", invalid="ignore"):
        tail = np.float32(2.0) * np.power(np.float32(growth), np.arange(1, 4000, dtype=np.float32))
        tail = tail.astype(np.float64)
        first_bad = int(np.argmax(~np.isfinite(tail) | (tail > 3.4e38)))
        tail = tail[: first_bad + 20]
        tail[first_bad:] = np.nan
    loss = np.concatenate([2.0 * np.exp(rng.normal(0, 0.05, calm)), tail])
    tracker = module.HealthTracker()
    t, step = 1000.0, 0
    flagged = None
    while step < len(loss):
        dt = INTERVAL * float(rng.uniform(0.9, 1.1))
        new = min(step + round(dt * rate), len(loss))
        t += dt
        tracker.observe_progress(t, 0, new, len(loss))
        chunk = loss[step:new]
        finite = chunk[np.isfinite(chunk)]
        mean = float(finite.mean()) if len(finite) else None
        lo = float(finite.min()) if len(finite) else None
        hi = float(finite.max()) if len(finite) else None
        tracker.observe_window(t, new, float(chunk[-1]), lo, hi, mean, len(chunk), len(chunk) - len(finite), step + 1)
        nonfinite = len(finite) < len(chunk)
        step = new
        if tracker.verdict(t).state == "diverging" and flagged is None:
            flagged = t
        if nonfinite:
            return {"lead": t - flagged if flagged is not None else 0.0, "run": (first_bad) / rate}
    return {"lead": None}


def plateau_job(
    module: ModuleType,
    minutes: float,
    rate: float,
    seed: int,
    signals: bool = False,
    knobs: dict[str, Any] | None = None,
) -> float | None:
    """A loss flat from its 5th second (5 % noise per step) in a job planned for ``minutes`` at ``rate``
    steps/s, reporting every 2 s: when ``not_learning`` comes, as a share of the planned duration
    (``None``: not within 40 % of it). ``signals``: it also reports a constant learning rate; ``knobs``:
    health knobs for the tracker (this tree's only)."""
    rng = np.random.default_rng(seed)
    planned = minutes * 60.0
    total = round(planned * rate)
    tracker = module.HealthTracker(module.HealthParams(**knobs)) if knobs else module.HealthTracker()
    t0 = t = 1000.0
    step = 0
    while t - t0 < 0.4 * planned:
        dt = INTERVAL * float(rng.uniform(0.9, 1.1))
        new = min(step + max(round(dt * rate * float(rng.uniform(0.9, 1.1))), 1), total)
        t += dt
        steps = np.arange(step + 1, new + 1)
        values = (1.0 + 2.0 * np.exp(-steps / (rate * 1.0))) * np.exp(rng.normal(0, 0.05, len(steps)))
        tracker.observe_progress(t, 0, new, total)
        tracker.observe_window(
            t,
            new,
            float(values[-1]),
            float(values.min()),
            float(values.max()),
            float(values.mean()),
            len(values),
            0,
            step + 1,
        )
        if signals:
            tracker.observe_lr(t, new, 1e-3)
        step = new
        if tracker.verdict(t).state == "not_learning":
            return (t - t0) / planned
    return None


SAVE_EVERY_S = 1800.0
"""A job of ``where_job`` saves a checkpoint every 30 minutes..."""
SAVE_S = 300.0
"""...that lasts 5 minutes."""


def _where_steps(rng: np.random.Generator, n: int, save_s: float) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Ends of ``n`` heavy-tailed 10 s steps from t = 1000 with a save of ``save_s`` after the first step
    that ends past each 30 min mark; the saves as ``(start, end)``."""
    times = _step_times(rng, 10.0, n)
    ends = np.empty(n)
    saves: list[tuple[float, float]] = []
    t, mark = 1000.0, 1000.0 + SAVE_EVERY_S
    for i, dt in enumerate(times):
        t += float(dt)
        if t >= mark:
            saves.append((t, t + save_s))
            t += save_s
            mark += SAVE_EVERY_S
        ends[i] = t
    return ends, saves


def where_job(
    module: ModuleType,
    seed: int,
    *,
    ranks: int,
    hang: bool,
    sampling: bool,
    save_s: float = SAVE_S,
    minutes: float = 90.0,
) -> dict[str, Any]:
    """Issue 29's heavy-tailed job: 10 s steps (sigma 0.3, 2 % of them 3x slower) and a save of ``save_s``
    every 30 min, ``ranks`` ranks in synchronous data parallelism (rank 0 reports every 2 s, the others
    heartbeat every 10 s); with ``hang`` the last rank (rank 0 alone) blocks in its own code at a random
    time and the others wait for it in ``all_reduce``. With ``sampling`` the report core reads where each
    rank stands (``Report.where`` once its step has stood 3x its median step time, every report then, and
    its activity shares every report: a standing rank also reports every 2 s); without, the reports are
    main's (and the tracker keeps main's rules). The first ``stalled`` verdict: a false alarm, a hang
    flagged early (before it began) or its delay from the rank's last step."""
    rng = np.random.default_rng(seed)
    duration = minutes * 60.0
    n = int(duration / 10.0) + 10
    ends, saves = _where_steps(rng, n, save_s)
    hang_t = 1000.0 + float(rng.uniform(600, 1500)) if hang else math.inf
    stop_step = int(np.searchsorted(ends, hang_t))
    last_step_t = float(ends[stop_step - 1]) if hang and stop_step else math.inf
    hung = ranks - 1
    tracker = module.HealthTracker()
    reads = sampling and hasattr(tracker, "observe_where")
    end_t = min(1000.0 + duration, float(ends[-1])) if not hang else 1000.0 + duration
    events: list[tuple[float, str]] = []
    t = 1000.0
    while t < end_t:
        t += INTERVAL * float(rng.uniform(0.9, 1.1))
        events.append((t, "r0"))
    for r in range(1, ranks):
        events += [(1000.0 + r * 2.5 + k * INTERVAL, f"r{r}") for k in range(int(duration / INTERVAL))]
    events += [(1000.0 + k * SWEEP, "sweep") for k in range(int(duration / SWEEP))]
    events.sort()
    heard: dict[int, float] = {}
    for t, who in events:
        if t > end_t:
            break
        done = int(np.searchsorted(ends, t))
        if hang and t >= hang_t:
            done = min(done, stop_step)
        began = float(ends[done - 1]) if done else 1000.0
        stood = t - began
        if who != "sweep":
            rank = int(who[1:])
            standing = reads and stood > 30.0  # 3 x the median step time
            if rank and t - heard.get(rank, -math.inf) < HEARTBEAT and not standing:
                continue  # ranks other than 0 heartbeat every 10 s (promptly while they stand)
            heard[rank] = t
            tracker.observe_progress(t, rank, done, n)
            if reads:
                tracker.observe_shares(rank, {"computing": 0.95, "loading_data": 0.05})
                if standing:
                    activity, detail, frames = "computing", "torch.autograd.backward", ["train_step (train.py:40)"]
                    if hang and t >= hang_t:
                        if rank == hung:
                            activity, detail, frames = (
                                "waiting",
                                "threading.Lock.acquire",
                                ["wait_for_lock (train.py:31)"],
                            )
                        else:
                            activity, detail, frames = "communicating", "torch.distributed.all_reduce", []
                    elif any(a <= t < b for a, b in saves):
                        activity, detail, frames = "checkpointing", "torch.save", ["save (train.py:60)"]
                    tracker.observe_where(t, rank, done, activity, stood, detail, frames)
        verdict = tracker.verdict(t)
        if verdict.state == "stalled":
            if not hang or t < hang_t:
                return {"false": True, "early": hang, "delay": None}
            return {
                "false": False,
                "delay": t - last_step_t,
                "named": verdict.evidence.get("rank") == hung,
                "p99": float(np.quantile(np.diff(np.concatenate([[1000.0], ends[:stop_step]])), 0.99)),
                "message": verdict.evidence.get("message", ""),
            }
    return {"false": False, "delay": None, "named": False}


def straggler_job(seed: int, ratio: float, minutes: float = 40.0) -> dict[str, Any]:
    """4 ranks in synchronous data parallelism at 1 step/s, busy half their time (+-0.05 per report) and in
    ``all_reduce`` the rest; rank 0 reports every 2 s, the others every 10 s, each with its activity
    shares. From a random time rank 2 is ``ratio`` times slower (its busy time; the others wait for it).
    When ``straggling`` comes and whom it names (this tree's tracker only: main had no shares)."""
    rng = np.random.default_rng(seed)
    tracker = now_health.HealthTracker()
    slow_t = 1000.0 + float(rng.uniform(300, 900))
    t, end = 1000.0, 1000.0 + minutes * 60
    heard: dict[int, float] = {}
    while t < end:
        t += INTERVAL * float(rng.uniform(0.9, 1.1))
        step = int(t - 1000.0)
        for rank in range(4):
            if rank and t - heard.get(rank, -math.inf) < HEARTBEAT:
                continue
            heard[rank] = t
            busy = 0.5 + float(rng.normal(0, 0.05))
            if t >= slow_t:
                r = ratio if rank == 2 else 1.0
                busy = busy * r / (0.5 * ratio + 0.5)  # the step lasts the slow rank's busy time plus the rest
            tracker.observe_progress(t, rank, step, 100_000)
            busy = min(max(busy, 0.0), 1.0)
            tracker.observe_shares(rank, {"computing": busy, "communicating": 1 - busy}, f"node-{rank}")
        verdict = tracker.verdict(t)
        if verdict.state == "straggling":
            return {"delay": t - slow_t, "named": verdict.evidence.get("rank") == 2, "early": t < slow_t}
    return {"delay": None, "named": False, "early": False}


def where_rows(before: ModuleType, rev: str, seeds: range) -> None:
    """Issue 29's targets: main's rules (the tracker of ``rev``, main's reports) against this tree's
    with main's reports (no where: its rules must be main's) and with where, on the same jobs."""
    columns = (("main", before, False), ("now, no where", now_health, False), ("now, where", now_health, True))
    print(f"where each rank stands (issue 29): main = the tracker of {rev}; {len(seeds)} seeds per row, 1 and 4 ranks")
    print("\nhealthy: 90 min of 10 s steps (2 % of them 3x slower), a 5 min save every 30 min: jobs flagged stalled")
    for label, module, sampling in columns:
        flagged = sum(
            where_job(module, 5000 + s, ranks=ranks, hang=False, sampling=sampling)["false"]
            for s in seeds
            for ranks in (1, 4)
        )
        print(f"  {label:16} {flagged}/{2 * len(seeds)}")
    print(f"\n{'hang in its own code (delay from the last step)':48} {'found':>7} {'median':>8} {'worst':>8}", end="")
    print(f" {'in time':>8} {'early':>6}  named")
    for ranks in (1, 4):
        for label, module, sampling in columns:
            outs = [where_job(module, 6000 + s, ranks=ranks, hang=True, sampling=sampling) for s in seeds]
            delays = [o["delay"] for o in outs]
            found = [d for d in delays if d is not None]
            in_time = sum(1 for o in outs if o["delay"] is not None and o["delay"] <= max(45.0, 3 * o["p99"]))
            early = sum(1 for o in outs if o.get("early"))
            named = sum(1 for o in outs if o.get("named"))
            med = statistics.median(found) if found else math.nan
            worst = max(found) if found else math.nan
            print(
                f"{f'{ranks} rank(s), {label}':48} {len(found):3d}/{len(outs):<3d} {med:8.1f} {worst:8.1f}",
                f"{in_time:4d}/{len(outs):<3d} {early:6d}  {named}/{len(outs)}",
            )
    example = where_job(now_health, 6000, ranks=4, hang=True, sampling=True).get("message")
    print(f"  e.g. {example}")
    print("\nsaves of 10, 20 and 30 min (every 30 min of 10 s steps, 2 h): jobs flagged stalled")
    for save in (600.0, 1200.0, 1800.0):
        cells = []
        for label, module, sampling in columns:
            flagged = sum(
                where_job(module, 7000 + s, ranks=1, hang=False, sampling=sampling, save_s=save, minutes=120)["false"]
                for s in seeds
            )
            cells.append(f"{label} {flagged}/{len(seeds)}")
        print(f"  {save / 60:g} min saves: " + ", ".join(cells))
    print("\nstragglers: 4 ranks in sync DDP, rank 2 slower from a random time (this tree; target: named after 5 min)")
    print(f"{'rank 2 slower by':48} {'found':>7} {'median':>8} {'worst':>8}  named  early")
    for ratio in (1.2, 1.6, 2.0, 3.0):
        outs = [straggler_job(8000 + s, ratio) for s in seeds]
        found = [o["delay"] for o in outs if o["delay"] is not None]
        med = statistics.median(found) if found else math.nan
        worst = max(found) if found else math.nan
        named = sum(1 for o in outs if o["named"])
        early = sum(1 for o in outs if o["early"])
        print(f"{f'{ratio:g}x':48} {len(found):3d}/{len(outs):<3d} {med:8.1f} {worst:8.1f}  {named:5d}  {early:5d}")
    print()


def _row(label: str, values: list[float | None], target: float | None = None) -> str:
    found = [v for v in values if v is not None]
    med = statistics.median(found) if found else math.nan
    worst = max(found) if found else math.nan
    within = f"{sum(1 for v in found if target is None or v <= target)}/{len(values)}"
    return f"{label:44} {len(found):3d}/{len(values):<3d} {med:8.1f} {worst:8.1f} {within:>8}"


def plateau_rows(before: ModuleType, rev: str, seeds: range, knobs: dict[str, Any] | None = None) -> None:
    """Plateau delay as a share of the planned duration (target: 10 %, at most 15 min), before and now."""
    print("plateau: a loss flat from its 5th second; not_learning at what share of the planned duration")
    print(f"(before: the tracker of {rev}; {len(seeds)} jobs per row; target 10 % of planned, at most 15 min)")
    print(f"{'job':36} {'found':>7} {'median':>8} {'worst':>8} {'in time':>8}")
    for minutes in (20.0, 60.0, 600.0):
        for rate in (50.0, 4.0):
            target = min(0.10, 900.0 / (minutes * 60.0))
            for which, module in (("before", before), ("now", now_health)):
                mine = knobs if module is now_health else None
                shares = [plateau_job(module, minutes, rate, s, knobs=mine) for s in seeds]
                found = [x for x in shares if x is not None]
                med = statistics.median(found) if found else math.nan
                worst = max(found) if found else math.nan
                within = sum(1 for x in found if x <= target)
                label = f"{minutes:g} min at {rate:g} steps/s, {which}"
                print(
                    f"{label:36} {len(found):3d}/{len(shares):<3d} {med:8.1%} {worst:8.1%}",
                    f"{within:4d}/{len(shares):<3d}",
                )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="simulated jobs per row")
    parser.add_argument("--before", default="ad9266a", help="the commit whose tracker is 'before'")
    parser.add_argument(
        "--plateau-before", default="bb17486", help="the commit whose tracker is 'before' in the plateau rows"
    )
    parser.add_argument(
        "--only", choices=("all", "stalls", "plateaus", "where"), default="all", help="which rows to run"
    )
    parser.add_argument("--where-before", default="30b50a2", help="main's commit for the where rows (issue 29)")
    parser.add_argument("--params", default="", help='health knobs for the plateau rows\' "now", as JSON')
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.only in ("all", "where"):
        where_rows(load_before(args.where_before), args.where_before, range(args.jobs))
    if args.only == "where":
        print(f"\n(ran in {time.perf_counter() - started:.1f} s)")
        return 0
    if args.only not in ("stalls", "where"):
        knobs = json.loads(args.params) if args.params else None
        plateau_rows(load_before(args.plateau_before), args.plateau_before, range(args.jobs), knobs)
    if args.only == "plateaus":
        print(f"\n(ran in {time.perf_counter() - started:.1f} s)")
        return 0
    trackers = {"before": load_before(args.before), "now": now_health}
    seeds = range(args.jobs)
    print(f"before: the tracker of {args.before}; now: this tree's; {args.jobs} jobs per row")
    print(f"\n{'stall (from the last step to stalled)':44} {'found':>7} {'median':>8} {'worst':>8} {'in time':>8}")
    for spt in (0.1, 1.0, 10.0):
        for which, module in trackers.items():
            outs = [stall_job(module, spt, s, hang=True) for s in seeds]
            p95 = statistics.median(o["p95"] for o in outs if "p95" in o) if any("p95" in o for o in outs) else spt
            target = max(45.0, 4 * p95) if spt > 1 else 45.0
            print(
                _row(f"{spt:g} s steps, reports go on, {which}", [o["delay"] for o in outs], target),
                f" target {target:.0f} s",
            )
    print(
        f"\n{'one hung rank of 4 (sync DDP), heartbeats go on':44} {'found':>7} {'median':>8} {'worst':>8}",
        f"{'in time':>8}  named",
    )
    for spt in (0.1, 1.0, 10.0):
        for which, module in trackers.items():
            outs = [stall_job(module, spt, s, hang=True, ranks=4) for s in seeds]
            target = 45.0 if spt <= 1 else max(45.0, 4 * 1.6 * spt)
            named = sum(1 for o in outs if o.get("named"))
            print(
                _row(f"{spt:g} s steps, rank 2 hangs, {which}", [o["delay"] for o in outs], target),
                f" {named}/{len(outs)}",
            )
    print("\nhealthy jobs, 30 min each (jitter sigma 0.3, 2 % of steps 3x slower): jobs flagged stalled")
    for spt in (0.1, 1.0, 10.0):
        cells = []
        for which, module in trackers.items():
            flagged = sum(1 for s in seeds if stall_job(module, spt, 1000 + s, hang=False)["false"])
            flagged += sum(1 for s in seeds if stall_job(module, spt, 2000 + s, hang=False, ranks=4)["false"])
            cells.append(f"{which} {flagged}/{2 * len(seeds)}")
        print(f"  {spt:g} s steps (1 and 4 ranks): " + ", ".join(cells))
    print(f"\n{'blow-up to NaN (lead: diverging before NaN)':44} {'found':>7} {'median':>8} {'worst':>8}   run to NaN")
    for growth in (1.05, 1.2, 2.0):
        for which, module in trackers.items():
            outs = [blowup_job(module, growth, s) for s in seeds]
            leads = [o["lead"] for o in outs]
            found = [v for v in leads if v is not None]
            least = min(found) if found else math.nan
            run = statistics.median(o["run"] for o in outs if "run" in o)
            print(
                f"{f'x{growth:g} per step, {which}':44} {len(found):3d}/{len(leads):<3d}",
                f"{statistics.median(found):8.1f} {least:8.1f}   {run:.0f} s (least lead)",
            )
    print(f"\n(ran in {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
