"""A real Optuna study of 8 trials, each a stepwatch job: a tiny model (a line fitted by gradient descent,
pure Python, CPU) trained in its own process and reporting through ``stepwatch.init``. Optuna's
MedianPruner decides on the live metric; pruned trials get a checkpoint and a stop command, save their
checkpoint and stop early; the test checks they did and reports the compute saved."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from stepwatch.client import Client  # noqa: E402
from stepwatch.client.optuna import run_trial, savings  # noqa: E402

STEPS = 100  # about 3 s a trial: time for the pruner's verdict to reach a bad trial on a loaded machine
TRAIN = """
import json, sys, time
from pathlib import Path
import stepwatch

lr, steps, out = float(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
xs = [i / 20 for i in range(20)]
ys = [3.0 * x + 0.5 for x in xs]
w = b = 0.0
run = stepwatch.init(total_steps=steps, params={"lr": lr})
for step in range(1, steps + 1):
    gw = sum(2 * (w * x + b - y) * x for x, y in zip(xs, ys)) / len(xs)
    gb = sum(2 * (w * x + b - y) for x, y in zip(xs, ys)) / len(xs)
    w, b = w - lr * gw, b - lr * gb
    loss = sum((w * x + b - y) ** 2 for x, y in zip(xs, ys)) / len(xs)
    run.step(val_loss=loss)
    if run.should_stop:
        out.write_text(json.dumps({"step": step, "w": w, "b": b, "reason": run.command_reason}))
        run.finish("stopped", run.command_reason)
        sys.exit(0)
    time.sleep(0.03)
run.finish()
"""


@pytest.mark.slow
def test_a_study_prunes_trials_through_stepwatch(server: str, ns: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    client = Client(server, namespace=ns)
    study = optuna.create_study(
        study_name="line",
        direction="minimize",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=8),
    )
    rates = (0.5, 0.45, 0.002, 0.5, 0.001, 0.0005, 0.48, 0.0002)  # good and too small, in a fixed order
    for lr in rates:
        study.enqueue_trial({"lr": lr})

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        out = tmp_path / f"ckpt-{trial.number}.json"
        command = [sys.executable, str(script), str(lr), str(STEPS), str(out)]
        return run_trial(
            client, trial, command, metric="val_loss", total_steps=STEPS, gpus=1, gpu_hour_cost=2.0,
            env={"STEPWATCH_INTERVAL": "0.2"}, grace=10,
        )  # fmt: skip

    study.optimize(objective, n_trials=8)

    states = {t.number: t.state for t in study.trials}
    pruned = [n for n, s in states.items() if s == optuna.trial.TrialState.PRUNED]
    complete = [n for n, s in states.items() if s == optuna.trial.TrialState.COMPLETE]
    too_small = {n for n, lr in enumerate(rates) if lr < 0.01}
    assert len(study.trials) == 8 and too_small <= set(pruned) and len(complete) >= 2, states
    assert study.best_params["lr"] >= 0.45
    for n in pruned:  # stopped early through stepwatch, after saving a checkpoint
        saved = json.loads((tmp_path / f"ckpt-{n}.json").read_text())
        assert saved["step"] < STEPS and "pruned by optuna" in saved["reason"]
        job = client.job(f"line-{n}")
        assert job.state == "stopped" and (job.progress.step or 0) < STEPS
        kinds = [e.data.get("kind") for e in client.events(f"line-{n}", limit=1000) if e.kind == "command"]
        assert kinds == ["checkpoint", "stop"]
    for n in complete:
        assert client.job(f"line-{n}").state == "finished"
        assert not (tmp_path / f"ckpt-{n}.json").exists()
    report = savings(study)
    assert report.trials == 8 and report.pruned == len(pruned)
    assert report.steps_saved > 0 and report.seconds_saved > 0 and report.money_saved is not None
    print(f"\n{report}")
    client.close()


PACED = """
import sys, time
import stepwatch

level, pause, steps = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
run = stepwatch.init(total_steps=steps)
for step in range(1, steps + 1):
    run.step(val_loss=level / step)
    if run.should_stop:
        run.finish("stopped", run.command_reason)
        sys.exit(0)
    time.sleep(pause)
run.finish()
"""


@pytest.mark.slow
def test_median_pruner_prunes_a_clearly_worse_trial_at_equal_steps(server: str, ns: str, tmp_path: Path) -> None:
    """Two trials step at different paces, so their report windows end on different steps; values reach the trials
    on the same grid of steps, so MedianPruner (which compares equal steps) has the good trial's values to compare
    the bad one with, and prunes it. The objective is the metric at the job's final step."""
    script = tmp_path / "paced.py"
    script.write_text(PACED)
    client = Client(server, namespace=ns)
    study = optuna.create_study(
        study_name="paced", pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    )
    steps = 150
    runs = [(0.01, 0.011), (300.0, 0.017)]  # good (1e-4 at the end), then 10^4 times worse, at another pace

    def objective(trial: optuna.Trial) -> float:
        level, pause = runs[trial.number]
        command = [sys.executable, str(script), str(level), str(pause), str(steps)]
        return run_trial(
            client, trial, command, metric="val_loss", total_steps=steps, grace=10, env={"STEPWATCH_INTERVAL": "0.3"}
        )

    study.optimize(objective, n_trials=2)
    good, bad = study.trials
    assert good.state == optuna.trial.TrialState.COMPLETE
    assert good.value == pytest.approx(0.01 / steps)  # the final point, not one the stream brought earlier
    assert set(good.intermediate_values) <= set(range(3, steps + 1, 3))  # the grid: 150 / 50
    assert bad.state == optuna.trial.TrialState.PRUNED, bad.intermediate_values
    assert set(bad.intermediate_values) <= set(good.intermediate_values)
    assert client.job("paced-1").state == "stopped"
    client.close()
