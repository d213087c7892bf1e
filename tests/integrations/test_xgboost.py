"""XGBoost against a real server: rounds as steps, eval results as metrics, a stop command obeyed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

xgb = pytest.importorskip("xgboost", reason="XGBoost is not installed (pip install 'stepwatch[test-frameworks]')")
np = pytest.importorskip("numpy")

import stepwatch.integrations.xgboost as sw_xgboost  # noqa: E402
from stepwatch.integrations.xgboost import StepwatchCallback  # noqa: E402

LiveJob = Any  # tests/integrations/conftest.py: LiveJob

PARAMS = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "max_depth": 2, "eta": 0.3}


def _data() -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4))
    y = (x[:, 0] - x[:, 1] + 0.5 * rng.normal(size=300) > 0).astype(np.float32)
    return xgb.DMatrix(x[:200], label=y[:200]), xgb.DMatrix(x[200:], label=y[200:])


class Slow(xgb.callback.TrainingCallback):
    """Makes each round last a few milliseconds, so that a stop command arrives mid-training."""

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        time.sleep(0.005)
        return False


def _count(points: list[dict[str, Any]]) -> int:
    return sum(p["count"] for p in points)


def test_rounds_are_steps_and_evals_are_metrics(live_job: LiveJob) -> None:
    dtrain, dvalid = _data()
    booster = xgb.train(
        PARAMS,
        dtrain,
        num_boost_round=30,
        evals=[(dtrain, "train"), (dvalid, "valid")],
        callbacks=[StepwatchCallback()],
        verbose_eval=False,
    )
    assert booster.num_boosted_rounds() == 30
    job = live_job.get()
    assert job["state"] == "finished"
    assert job["progress"]["step"] == 30
    assert job["progress"]["total_steps"] == 30
    assert job["progress"]["percent"] == 100
    assert job["progress"]["epoch"] is None and job["progress"]["total_epochs"] is None
    assert job["params"]["max_depth"] == 2 and job["params"]["num_boost_round"] == 30
    history = live_job.history("train/logloss", "valid/logloss", "valid/error")
    assert {name: _count(points) for name, points in history.items()} == {
        "train/logloss": 30,
        "valid/logloss": 30,
        "valid/error": 30,
    }
    train_loss = history["train/logloss"]
    assert train_loss[-1]["last"] < train_loss[0]["max"]  # it learned
    final = float(booster.eval(dvalid).split()[1].split(":")[1])
    assert history["valid/logloss"][-1]["last"] == pytest.approx(final, rel=1e-4)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``install()``, undone after the test (the patched functions are put back)."""
    for module in (xgb, xgb.training, xgb.sklearn):
        for name in ("train", "cv"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(sw_xgboost, "_installed", False)
    assert sw_xgboost.install()
    assert sw_xgboost.install()  # idempotent


@pytest.mark.usefixtures("installed")
def test_installed_callback_needs_no_code_change(live_job: LiveJob) -> None:
    dtrain, dvalid = _data()
    xgb.train(PARAMS, dtrain, num_boost_round=12, evals=[(dvalid, "valid")], verbose_eval=False)
    job = live_job.get()
    assert (job["state"], job["progress"]["step"], job["progress"]["total_steps"]) == ("finished", 12, 12)
    assert _count(live_job.history("valid/logloss")["valid/logloss"]) == 12


def test_stop_command_saves_the_model_then_stops(live_job: LiveJob, checkpoint_dir: Path) -> None:
    dtrain, dvalid = _data()
    live_job.command("stop", "not learning")  # delivered with the answer to the first report
    path = checkpoint_dir / "model.ubj"
    callback = StepwatchCallback(checkpoint=path)
    booster = xgb.train(
        PARAMS,
        dtrain,
        num_boost_round=1000,
        evals=[(dvalid, "valid")],
        callbacks=[callback, Slow()],
        verbose_eval=False,
    )
    rounds = booster.num_boosted_rounds()
    assert 1 <= rounds < 1000
    assert callback.saved == str(path)
    saved = xgb.Booster(model_file=str(path))
    assert saved.num_boosted_rounds() == rounds  # the checkpoint is the model as it stopped
    job = live_job.get()
    assert job["state"] == "stopped"
    assert job["reason"] == "not learning"
    assert job["progress"]["step"] == rounds
    assert job["pending_commands"] == []  # acknowledged
