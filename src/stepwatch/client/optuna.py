"""Optuna studies whose trials are stepwatch jobs: live metrics feed Optuna's pruner, and a pruned trial is
checkpointed and stopped through stepwatch (``pip install 'stepwatch[optuna]'``).

::

    import optuna, sys
    from stepwatch.client import Client
    from stepwatch.client.optuna import run_trial, savings

    client = Client()

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        return run_trial(client, trial, [sys.executable, "train.py", f"--lr={lr}"], metric="val_loss",
                         study="lr-sweep", total_steps=2000, gpus=1)

    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_warmup_steps=100))
    study.optimize(objective, n_trials=20)
    print(savings(study))          # trials pruned, steps and GPU time they did not spend

Each trial is a job ``{study}-{number}`` started like ``stepwatch run`` starts one (its command gets
``STEPWATCH_URL``, ``STEPWATCH_TOKEN``, ``STEPWATCH_JOB``, ``STEPWATCH_NAMESPACE``), so it shows in the
dashboard, ``stepwatch jobs`` and ``stepwatch top`` with its progress, health and cost. The metric's
points reach ``trial.report()`` from the live stream as the job reports them; when
``trial.should_prune()`` says so, the job gets a checkpoint then a stop command (its training loop sees
``run.should_stop``), the process is given ``grace`` seconds to end, and :class:`optuna.TrialPruned` is
raised. A trial started elsewhere (a Kubeflow TrainJob, a cluster scheduler) is followed with
:func:`follow_trial` instead.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol import sanitize_name
from ._client import Client
from ._errors import StepwatchError
from ._live import JobUpdate, PointsUpdate, Resync

try:
    import optuna
except ImportError as exc:  # a leaf module: only this needs optuna
    raise ImportError(f"stepwatch.client.optuna needs optuna ({exc}): pip install 'stepwatch[optuna]'") from None

__all__ = ["Savings", "follow_trial", "report_grid", "run_trial", "savings"]

_ATTR = "stepwatch"
"""Where a trial keeps what stepwatch knows of it (``trial.user_attrs["stepwatch"]``)."""


GRID_POINTS = 50
"""Values reported to a trial over its planned steps (``report_every`` defaults to total steps over this)."""
GRID_UNKNOWN_TOTAL = 10
"""``report_every`` of a job that says no total steps."""


def report_grid(total_steps: int | None) -> int:
    """The steps between two values reported to a trial: the same for trials of the same length."""
    if not total_steps:
        return GRID_UNKNOWN_TOTAL
    return max(1, total_steps // GRID_POINTS)


class _Reporter:
    """Hands a job's new points of one metric to an Optuna trial, on a grid of steps, in order.

    A job's points land at whatever step its report windows end on, different in every trial; Optuna's
    pruners compare the values of trials at the *same* step (MedianPruner takes the median of the other
    trials' values at this trial's step). Each value is therefore reported at the grid steps (multiples
    of ``every``) that its point reached since the last one: every trial of the study reports the same
    steps, and the pruner has values to compare.
    """

    def __init__(self, trial: optuna.trial.Trial, metric: str, use: str, every: int) -> None:
        self.trial = trial
        self.metric = metric
        self.use = use
        self.every = every
        self.last_step = -1
        self.last_value: float | None = None
        self.last_grid = 0
        self.reported = 0

    def offer(self, step: int | None, value: float | None) -> None:
        if step is None or value is None or step <= self.last_step:
            return
        self.last_step, self.last_value = step, value
        for grid in range(self.last_grid + self.every, step + 1, self.every):
            self.trial.report(value, grid)
            self.last_grid = grid
            self.reported += 1

    def catch_up(self, client: Client, name: str, namespace: str | None) -> None:
        """Report what the history has and the stream did not bring (before it was open, or while it was down)."""
        try:
            history = client.history(name, namespace, metrics=[self.metric], max_points=10_000)
        except StepwatchError:
            return
        if self.metric in history:
            for point in history[self.metric]:
                self.offer(point.step, getattr(point, "last" if self.use == "last" else self.use))


def follow_trial(
    client: Client,
    trial: optuna.trial.Trial,
    name: str,
    namespace: str | None = None,
    *,
    metric: str,
    value: str = "last",
    reason: str | None = None,
    timeout: float | None = None,
    report_every: int | None = None,
) -> float:
    """Follow a running job as an Optuna trial until it ends; returns the metric's final value.

    Each new point of ``metric`` (its ``last`` value, or ``mean``/``min``/``max`` of the window with
    ``value``) goes to ``trial.report`` at the grid steps it reached (multiples of ``report_every``,
    by default the job's total steps over 50, else 10: the same steps in every trial of the same
    length, which pruners that compare equal steps need); once ``trial.should_prune()``, the job is
    asked to checkpoint and stop, and :class:`optuna.TrialPruned` is raised when it has ended. Once
    the job has ended, its history is read again: the value returned is that of its final point,
    which the live stream may bring after the end. Also usable on its own for jobs started elsewhere.
    """
    namespace = namespace or client.namespace
    if report_every is None:
        try:
            report_every = report_grid(client.job(name, namespace).progress.total_steps)
        except StepwatchError:
            report_every = GRID_UNKNOWN_TOTAL
    reporter = _Reporter(trial, metric, value, report_every)
    pruned_at: int | None = None
    for update in client._watch(client._session(name, namespace, None, True, timeout, announce=True)):
        if isinstance(update, Resync):
            reporter.catch_up(client, name, namespace)
            job = client.job(name, namespace)
        elif isinstance(update, PointsUpdate) and metric in update.points:
            point = update.points[metric]
            reporter.offer(point.step, getattr(point, "last" if value == "last" else value))
            job = None
        elif isinstance(update, JobUpdate):
            job = update.job
        else:
            continue
        if pruned_at is None and reporter.reported and trial.should_prune():
            pruned_at = reporter.last_step
            said = reason or f"pruned by optuna at step {pruned_at} ({metric}={reporter.last_value:.4g})"
            try:
                client.stop(name, namespace, checkpoint=True, reason=said[:1024])
            except StepwatchError:
                pass  # it has ended by itself meanwhile
        if job is not None and job.ended:
            break
    _remember(client, trial, name, namespace, pruned_at)
    if pruned_at is not None:
        raise optuna.TrialPruned(f"{namespace}/{name} pruned at step {pruned_at}")
    reporter.catch_up(client, name, namespace)  # the final points may come after the end on the stream
    if reporter.last_value is None:
        raise StepwatchError(f"{namespace}/{name} ended without reporting {metric}")
    return reporter.last_value


def _remember(client: Client, trial: optuna.trial.Trial, name: str, namespace: str, pruned_at: int | None) -> None:
    try:
        job = client.job(name, namespace)
    except StepwatchError:
        return
    trial.set_user_attr(
        _ATTR,
        {
            "job": job.key,
            "state": job.state,
            "pruned_at": pruned_at,
            "step": job.progress.step,
            "total_steps": job.progress.total_steps,
            "seconds": job.times.elapsed_seconds,
            "spent": job.cost.spent,
            # the price of the job's hour, not its live rate: an ended job has no live rate (issue 30)
            "rate_per_hour": job.resources.gpus * job.resources.gpu_hour_cost or None,
        },
    )


def run_trial(
    client: Client,
    trial: optuna.trial.Trial,
    command: Sequence[str],
    *,
    metric: str,
    study: str | None = None,
    namespace: str | None = None,
    value: str = "last",
    total_steps: int | None = None,
    gpus: float = 0.0,
    gpu_hour_cost: float = 0.0,
    grace: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> float:
    """Start ``command`` as the stepwatch job of this trial, follow it (see :func:`follow_trial`) and
    return the metric's last value; :class:`optuna.TrialPruned` when the pruner stopped it.

    The job is ``{study}-{trial.number}`` (``study`` defaults to the Optuna study's name), registered
    with the trial's parameters. A process that does not end within ``grace`` seconds of its stop
    command is terminated. Its outcome is recorded as ``stepwatch run`` records it.
    """
    namespace = namespace or client.namespace
    name = sanitize_name(f"{study or trial.study.study_name}-{trial.number}", fallback="trial")
    params = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in trial.params.items()}
    _, token = client.register(
        name,
        namespace,
        source="runner",
        params=params or None,
        gpus=gpus,
        gpu_hour_cost=gpu_hour_cost,
        supersede=True,
        **({"total_steps": total_steps} if total_steps else {}),
    )
    child_env = {
        **os.environ,
        **(env or {}),
        "STEPWATCH_URL": client.url,
        "STEPWATCH_TOKEN": token,
        "STEPWATCH_JOB": name,
        "STEPWATCH_NAMESPACE": namespace,
    }
    child_env.pop("STEPWATCH_TOKEN_FILE", None)
    process = subprocess.Popen(list(command), env=child_env, cwd=cwd)
    outcome: dict[str, Any] = {}
    watcher = threading.Thread(
        target=_supervise, args=(client, process, name, namespace, token, grace, outcome), daemon=True
    )
    watcher.start()
    try:
        every = report_grid(total_steps) if total_steps else None
        return follow_trial(client, trial, name, namespace, metric=metric, value=value, report_every=every)
    finally:
        outcome["following"] = False
        watcher.join(grace + 15)
        if process.poll() is None:
            process.kill()
            process.wait()


def _supervise(
    client: Client,
    process: subprocess.Popen[bytes],
    name: str,
    namespace: str,
    token: str,
    grace: float,
    outcome: dict[str, Any],
) -> None:
    """Wait for the process; after a stop command, end it once its grace period is over; record how it ended."""
    stop_seen: float | None = None
    last_event = 0
    while process.poll() is None:
        time.sleep(0.1)
        if stop_seen is None:
            try:  # a stop command, from the pruner or anyone else (`stepwatch stop`)
                for event in client.events(name, namespace, after=last_event, limit=1000):
                    last_event = max(last_event, event.id or 0)
                    if event.kind == "command" and event.data.get("kind") == "stop":
                        stop_seen = time.monotonic()
            except StepwatchError:
                pass
        elif time.monotonic() - stop_seen > grace:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
    code = process.returncode
    state = "finished" if code == 0 and stop_seen is None else ("stopped" if stop_seen is not None else "failed")
    try:
        client.set_state(name, state, token, namespace, exit_code=code, reason=f"exit code {code}")
    except StepwatchError:
        pass
    outcome["code"] = code


@dataclass(frozen=True)
class Savings:
    """What pruning saved in a study: trials, steps and time not spent (and money, when the jobs had a price)."""

    trials: int
    pruned: int
    steps_run: int
    steps_planned: int
    seconds_run: float
    seconds_saved: float
    money_saved: float | None

    @property
    def steps_saved(self) -> int:
        """Steps the pruned trials did not run."""
        return self.steps_planned - self.steps_run

    @property
    def fraction_saved(self) -> float:
        """Of the compute the trials would have used unpruned, the part they did not."""
        return self.steps_saved / self.steps_planned if self.steps_planned else 0.0

    def __str__(self) -> str:
        money = f", {self.money_saved:.3g} USD" if self.money_saved is not None else ""
        return (
            f"{self.pruned} of {self.trials} trials pruned: {self.steps_saved} of {self.steps_planned} steps "
            f"({self.fraction_saved:.0%}) and {self.seconds_saved:.1f} s of compute saved{money}"
        )


def savings(study: optuna.study.Study) -> Savings:
    """What pruning saved in ``study`` (trials run with :func:`run_trial` or :func:`follow_trial`, with a
    ``total_steps``): each pruned trial's remaining steps at its own pace (and price)."""
    trials = pruned = run = saved = 0
    seconds_run = seconds_saved = 0.0
    money: float | None = None
    for trial in study.trials:
        info = trial.user_attrs.get(_ATTR)
        if not info or not info.get("total_steps") or info.get("step") is None:
            continue
        trials += 1
        step, total, seconds = int(info["step"]), int(info["total_steps"]), float(info.get("seconds") or 0.0)
        seconds_run += seconds
        run += step
        if trial.state == optuna.trial.TrialState.PRUNED and step < total:
            pruned += 1
            saved += total - step
            per_step = seconds / step if step else 0.0
            seconds_saved += per_step * (total - step)
            if info.get("rate_per_hour"):
                money = (money or 0.0) + per_step * (total - step) * float(info["rate_per_hour"]) / 3600
    return Savings(trials, pruned, run, run + saved, seconds_run, seconds_saved, money)
