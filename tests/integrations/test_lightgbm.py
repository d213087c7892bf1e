"""LightGBM against a real server: rounds as steps, eval results as metrics, a stop command obeyed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

lgb = pytest.importorskip("lightgbm", reason="LightGBM is not installed (pip install 'stepwatch[test-frameworks]')")
np = pytest.importorskip("numpy")

import stepwatch  # noqa: E402
import stepwatch.integrations.lightgbm as sw_lightgbm  # noqa: E402
from stepwatch.integrations.lightgbm import StepwatchCallback  # noqa: E402

LiveJob = Any  # tests/integrations/conftest.py: LiveJob

PARAMS = {"objective": "binary", "learning_rate": 0.2, "num_leaves": 7, "verbose": -1, "seed": 1}


def _data() -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4))
    y = (x[:, 0] - x[:, 1] + 0.5 * rng.normal(size=300) > 0).astype(np.float32)
    train = lgb.Dataset(x[:200], y[:200])
    return train, lgb.Dataset(x[200:], y[200:], reference=train), x[200:]


def _slow(env: Any) -> None:
    """Makes each round last a few milliseconds, so that a stop command arrives mid-training."""
    time.sleep(0.005)


def _count(points: list[dict[str, Any]]) -> int:
    return sum(p["count"] for p in points)


def test_rounds_are_steps_and_evals_are_metrics(live_job: LiveJob) -> None:
    train, valid, _ = _data()
    booster = lgb.train(
        PARAMS,
        train,
        num_boost_round=25,
        valid_sets=[train, valid],
        valid_names=["train", "valid"],
        callbacks=[StepwatchCallback()],
    )
    assert booster.current_iteration() == 25
    job = live_job.get()
    assert job["state"] == "finished"
    assert (job["progress"]["step"], job["progress"]["total_steps"], job["progress"]["percent"]) == (25, 25, 100)
    assert job["progress"]["epoch"] is None
    assert job["params"]["num_leaves"] == 7 and job["params"]["learning_rate"] == 0.2
    history = live_job.history("train/binary_logloss", "valid/binary_logloss")
    assert {name: _count(points) for name, points in history.items()} == {
        "train/binary_logloss": 25,
        "valid/binary_logloss": 25,
    }
    assert history["train/binary_logloss"][-1]["last"] < history["train/binary_logloss"][0]["max"]
    final = booster.best_score["valid"]["binary_logloss"]
    assert history["valid/binary_logloss"][-1]["last"] == pytest.approx(final)


def test_installed_callback_joins_the_users_run(live_job: LiveJob, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (lgb, lgb.engine, lgb.sklearn):
        for name in ("train", "cv"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(sw_lightgbm, "_installed", False)
    assert sw_lightgbm.install() and sw_lightgbm.install()
    train, valid, _ = _data()
    with stepwatch.init(params={"experiment": "two boosters"}) as run:
        lgb.train(PARAMS, train, num_boost_round=10, valid_sets=[valid])
        lgb.train({**PARAMS, "learning_rate": 0.05}, train, num_boost_round=5, valid_sets=[valid])
        assert run.current_step == 15  # the second training continued the run's steps
        job = live_job.get()
        assert job["state"] == "running"  # the user's run is the user's to finish
    job = live_job.get()
    assert (job["state"], job["progress"]["step"], job["progress"]["total_steps"]) == ("finished", 15, 15)
    assert _count(live_job.history("valid_0/binary_logloss")["valid_0/binary_logloss"]) == 15


def test_stop_command_saves_the_model_then_stops(live_job: LiveJob, checkpoint_dir: Path) -> None:
    train, valid, x_valid = _data()
    live_job.command("stop", "budget spent")  # delivered with the answer to the first report
    path = checkpoint_dir / "model.txt"
    callback = StepwatchCallback(checkpoint=path)
    booster = lgb.train(PARAMS, train, num_boost_round=1000, valid_sets=[valid], callbacks=[callback, _slow])
    rounds = booster.current_iteration()
    assert 1 <= rounds < 1000
    assert callback.saved == str(path)
    saved = lgb.Booster(model_file=str(path))
    assert saved.current_iteration() == rounds  # the checkpoint is the model as it stopped
    assert np.allclose(saved.predict(x_valid), booster.predict(x_valid))
    job = live_job.get()
    assert (job["state"], job["reason"], job["progress"]["step"]) == ("stopped", "budget spent", rounds)
    assert job["pending_commands"] == []
