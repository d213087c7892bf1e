"""The demo training job: each scenario runs as a real subprocess reporting to a loopback sink.

The jobs train for real (a NumPy MLP on generated fraud-like data), with few steps and a tiny step
delay, so that each test takes a few seconds and the sink still receives a dozen windows or more.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from stepwatch.cli import demo_training
from stepwatch.protocol import MetricWindow, Report
from stepwatch.testing import ReportSink

pytestmark = pytest.mark.slow

TIMEOUT = 30.0


def _env(sink: ReportSink | None, job: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_SERVER_"))}
    env["STEPWATCH_JOB"] = job
    if sink is not None:
        env["STEPWATCH_URL"] = sink.url
        env["STEPWATCH_INTERVAL"] = "0.2"
    return env


def _args(scenario: str, steps: int, delay: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stepwatch.cli.demo_training",
        "--scenario",
        scenario,
        "--steps",
        str(steps),
        "--step-delay",
        str(delay),
        *extra,
    ]


def _run(
    sink: ReportSink | None, job: str, scenario: str, steps: int, delay: float, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _args(scenario, steps, delay, *extra),
        env=_env(sink, job),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _windows(reports: Sequence[Report], name: str) -> list[MetricWindow]:
    return [m for r in reports for m in r.metrics if m.name == name]


def _mean(windows: Sequence[MetricWindow]) -> float:
    """Mean over all the values of these windows (each window's mean weighted by its count)."""
    total = sum(w.count for w in windows)
    return sum((w.mean or 0.0) * w.count for w in windows) / total


def _final(reports: Sequence[Report]) -> Report:
    finals = [r for r in reports if r.state != "running"]
    assert finals, f"no final report among {len(reports)}"
    return finals[-1]


# ----------------------------------------------------------------------------------- scenarios


def test_converge_learns_and_finishes(tmp_path: Path) -> None:
    with ReportSink() as sink:
        done = _run(sink, "fraud-converge", "converge", 1000, 0.002, "--checkpoint-dir", str(tmp_path))
        reports = sink.by_job["default/fraud-converge"]
    assert done.returncode == 0, done.stderr
    final = _final(reports)
    assert final.state == "finished"
    assert final.progress.step == final.progress.total_steps == 1000
    assert final.progress.total_epochs == pytest.approx(1000 / 125)
    params = next(r.params for r in reports if r.params)
    assert params["scenario"] == "converge"
    assert params["optimizer"] == "adam"
    assert params["batch_size"] == 128
    loss = _windows(reports, "loss")
    assert sum(w.count for w in loss) == 1000
    assert sum(w.nonfinite for w in loss) == 0
    assert len(loss) >= 5
    first, last = _mean(loss[:2]), _mean(loss[-2:])
    assert last < first / 4, (first, last)
    auc = _windows(reports, "eval_auc")
    assert auc[-1].last > 0.95
    assert auc[-1].last > auc[0].last
    assert _windows(reports, "eval_loss")[-1].last < 0.06
    assert 0 < _windows(reports, "eval_precision_at_recall")[-1].last <= 1
    assert {w.name for w in final.metrics} | {w.name for r in reports for w in r.metrics} >= {
        "loss",
        "grad_norm",
        "learning_rate",
    }
    progress_lines = [line for line in done.stdout.splitlines() if "%) loss" in line]
    assert len(progress_lines) == 10
    assert "fraud-converge: step 1000/1000 (100%)" in progress_lines[-1]
    assert not list(tmp_path.iterdir())  # no checkpoint asked for, none written


def test_diverge_goes_nonfinite_and_keeps_running() -> None:
    with ReportSink() as sink:
        done = _run(sink, "fraud-diverge", "diverge", 500, 0.002)
        reports = sink.by_job["default/fraud-diverge"]
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr  # overflow is silenced, not spammed
    final = _final(reports)
    assert final.state == "finished"
    assert final.progress.step == 500  # nobody stopped it: it ran out its steps
    loss = _windows(reports, "loss")
    assert sum(w.count for w in loss) == 500
    assert sum(w.nonfinite for w in loss) > 0
    assert loss[0].nonfinite == 0
    assert loss[0].min is not None and loss[0].min < 0.5  # it started as a run that learns...
    assert max(w.max for w in loss if w.max is not None) > 1e6  # ...blew up...
    # ...went non-finite within a few hundred steps: the first step is somewhere in the first window that holds a
    # non-finite value, whose bounds follow the reporter's clock (on a slow machine a window spans more steps)
    first_bad = next(w for w in loss if w.nonfinite)
    assert first_bad.first_step <= 450 and first_bad.last_step > 150, (first_bad.first_step, first_bad.last_step)
    assert loss[-1].nonfinite == loss[-1].count  # ...and stayed NaN to the end
    assert _windows(reports, "grad_norm")[-1].nonfinite > 0


def test_plateau_improves_then_stays_flat() -> None:
    with ReportSink() as sink:
        done = _run(sink, "fraud-plateau", "plateau", 600, 0.003)
        reports = sink.by_job["default/fraud-plateau"]
    assert done.returncode == 0, done.stderr
    assert _final(reports).state == "finished"
    eval_loss = _windows(reports, "eval_loss")
    early = eval_loss[0].max  # the first evaluation, at step 20
    assert early is not None
    late = [w.last for w in eval_loss if w.first_step > 300]
    assert late
    assert max(late) < early / 2  # the first part improved
    assert (max(late) - min(late)) / min(late) < 1e-3  # then nothing moved
    loss = _windows(reports, "loss")
    third = [w for w in loss if 300 < w.first_step <= 450]
    fourth = [w for w in loss if w.first_step > 450]
    assert third
    assert fourth
    assert abs(_mean(third) - _mean(fourth)) / _mean(third) < 0.3  # flat, up to batch noise
    assert _mean(loss[:1]) > 2 * _mean(fourth)
    assert _windows(reports, "learning_rate")[-1].last < 1e-9
    assert _windows(reports, "eval_auc")[-1].last < 0.95  # stuck short of what converge reaches


def test_hang_stops_advancing_until_terminated() -> None:
    with ReportSink() as sink:
        proc = subprocess.Popen(
            _args("hang", 500, 0.002),
            env=_env(sink, "fraud-hang"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            key = "default/fraud-hang"

            def steps() -> list[int]:
                return [r.progress.step or 0 for r in sink.by_job.get(key, [])]

            assert sink.wait_for(lambda s: any(step >= 190 for step in steps()), timeout=TIMEOUT)
            time.sleep(0.5)  # the report after the last step has landed
            stuck_at = max(steps())
            seen = len(steps())
            time.sleep(2.0)
            assert proc.poll() is None  # alive...
            assert len(steps()) > seen + 3  # ...still reporting...
            assert max(steps()) == stuck_at  # ...and no step since
            assert 190 <= stuck_at <= 210  # at ~40% of 500
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.communicate()
        assert proc.returncode == -signal.SIGTERM
        final = _final(sink.by_job[key])
        assert final.state == "stopped"
        assert final.reason == "SIGTERM"
        assert final.progress.step == stuck_at


def test_stop_command_checkpoints_and_exits_cleanly(tmp_path: Path) -> None:
    with ReportSink() as sink:
        sink.command("stop", "not learning for 30 min")
        done = _run(sink, "fraud-stop", "converge", 3000, 0.002, "--checkpoint-dir", str(tmp_path))
        reports = sink.by_job["default/fraud-stop"]
    assert done.returncode == 0, done.stderr
    final = _final(reports)
    assert final.state == "stopped"
    assert final.reason == "not learning for 30 min"
    assert 0 < (final.progress.step or 0) < 3000
    stop_lines = [line for line in done.stdout.splitlines() if "stopping at step" in line]
    assert len(stop_lines) == 1
    assert "not learning for 30 min" in stop_lines[0]
    (checkpoint,) = tmp_path.glob("*.npz")
    with np.load(checkpoint) as saved:
        assert int(saved["step"]) == final.progress.step
        assert saved["w1"].shape == (demo_training.N_FEATURES, demo_training.HIDDEN)
        assert saved["w2"].shape == (demo_training.HIDDEN, 1)
    assert not sink.pending_commands  # acknowledged


def test_checkpoint_command_saves_and_carries_on(tmp_path: Path) -> None:
    with ReportSink() as sink:
        sink.command("checkpoint", "before maintenance")
        done = _run(sink, "fraud-ckpt", "converge", 400, 0.003, "--checkpoint-dir", str(tmp_path))
        reports = sink.by_job["default/fraud-ckpt"]
    assert done.returncode == 0, done.stderr
    final = _final(reports)
    assert final.state == "finished"
    assert final.progress.step == 400
    (checkpoint,) = tmp_path.glob("fraud-ckpt-step*.npz")
    with np.load(checkpoint) as saved:
        assert 0 < int(saved["step"]) < 400
    assert not sink.pending_commands


# ------------------------------------------------------------------------- determinism, metrics


def test_same_seed_same_losses() -> None:
    def losses(seed: int) -> list[str]:
        done = _run(None, "fraud-seed", "converge", 200, 0.0, "--seed", str(seed))
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stdout.splitlines() if "%) loss" in line]
        assert len(lines) == 10
        return lines

    first = losses(7)
    assert losses(7) == first
    assert losses(8) != first
    a, b = demo_training.make_data(7), demo_training.make_data(7)
    assert np.array_equal(a.x_train, b.x_train)
    assert np.array_equal(a.y_eval, b.y_eval)


def test_generated_data_are_imbalanced_and_standardised() -> None:
    data = demo_training.make_data(0)
    assert data.x_train.shape == (16_000, 30)
    assert data.x_eval.shape == (4_000, 30)
    positives = (data.y_train.sum() + data.y_eval.sum()) / 20_000
    assert positives == pytest.approx(0.02)
    assert 40 <= data.y_eval.sum() <= 120
    assert np.allclose(data.x_train.mean(axis=0), 0, atol=1e-4)
    assert np.allclose(data.x_train.std(axis=0), 1, atol=1e-3)


def test_auc_matches_pairwise_count() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(300) < 0.2).astype(np.float32)
    scores = np.round(rng.standard_normal(300) + y, 1).astype(np.float32)  # rounded: many ties
    pos, neg = scores[y == 1], scores[y == 0]
    pairs = list(itertools.product(pos, neg))
    expected = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)
    assert demo_training.roc_auc(y, scores) == pytest.approx(expected)
    assert demo_training.roc_auc(y, np.where(y == 1, 1.0, 0.0).astype(np.float32)) == 1.0
    assert np.isnan(demo_training.roc_auc(y, np.full(300, np.nan, dtype=np.float32)))
    assert np.isnan(demo_training.roc_auc(np.zeros(3, dtype=np.float32), np.arange(3, dtype=np.float32)))


def test_precision_at_recall() -> None:
    y = np.array([1, 0, 1, 0, 0, 1, 0, 1, 0, 0], dtype=np.float32)
    scores = np.arange(10, 0, -1).astype(np.float32)  # ranked as listed
    # 80% of 4 positives -> 4 (ceil 3.2): the 4th positive is at rank 8, precision 4/8
    assert demo_training.precision_at_recall(y, scores) == pytest.approx(0.5)
    # 50% -> 2 positives: at rank 3, precision 2/3
    assert demo_training.precision_at_recall(y, scores, recall=0.5) == pytest.approx(2 / 3)


def test_gradients_match_finite_differences() -> None:
    data = demo_training.make_data(0, n=400)
    model = demo_training.Model(demo_training.N_FEATURES, 8, np.random.default_rng(0))
    model.params = {k: v.astype(np.float64) for k, v in model.params.items()}
    x, y = data.x_train[:64].astype(np.float64), data.y_train[:64].astype(np.float64)
    y[:3] = 1.0  # a few positives in the batch
    _, grads = model.loss_and_grads(x, y)  # type: ignore[arg-type]
    rng = np.random.default_rng(1)
    for name, value in model.params.items():
        for index in map(tuple, rng.integers(0, value.shape, size=(3, value.ndim))):
            saved = value[index]
            value[index] = saved + 1e-6
            up, _ = model.loss_and_grads(x, y)  # type: ignore[arg-type]
            value[index] = saved - 1e-6
            down, _ = model.loss_and_grads(x, y)  # type: ignore[arg-type]
            value[index] = saved
            assert grads[name][index] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-8)


def test_cli_package_does_not_import_numpy() -> None:
    code = "import sys, stepwatch.cli; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.stdout.strip() == "False", done.stderr


def test_bad_arguments_are_refused() -> None:
    done = subprocess.run(_args("explode", 10, 0.0), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
    done = subprocess.run(_args("converge", 0, 0.0), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2
