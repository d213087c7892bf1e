"""Keras 3 against a real server: steps, epochs, batch logs, val metrics, hparams, commands, install().

Keras reads its backend when it is imported: these tests use PyTorch's (eager, and the fastest to
start on CPU) unless ``KERAS_BACKEND`` says otherwise.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras", reason="Keras is not installed (pip install 'stepwatch[keras]')")
np = pytest.importorskip("numpy")

import stepwatch  # noqa: E402
import stepwatch.integrations.keras as sw_keras  # noqa: E402
from progression_trainee import polled_in_process  # noqa: E402
from stepwatch.integrations.keras import StepwatchCallback  # noqa: E402
from stepwatch.protocol.progression import ProgressionStatus  # noqa: E402
from stepwatch.testing import read_termination_message  # noqa: E402

LiveJob = Any  # tests/integrations/conftest.py: LiveJob

# Keras's own conversion of torch logs to floats (numpy 2 and torch's __array__), not stepwatch's.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")

BATCHES = 16  # per epoch: 256 samples in batches of 16


def _model() -> Any:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)], name="tiny"
    )
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="mse", metrics=["mae"])
    return model


def _data() -> tuple[Any, Any, Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 8)).astype("float32")
    y = (2 * x[:, :1] - x[:, 1:2] + 0.1 * rng.normal(size=(320, 1))).astype("float32")
    return x[:256], y[:256], x[256:], y[256:]


class _Pause(keras.callbacks.Callback):  # type: ignore[misc]
    """Slows each step down (at batch begin: the batch-end hooks stay asynchronous), while ``until()`` is false."""

    def __init__(self, seconds: float, until: Any = lambda: False) -> None:
        super().__init__()
        self.seconds = seconds
        self.until = until

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if not self.until():
            time.sleep(self.seconds)


def _count(points: list[dict[str, Any]]) -> int:
    return sum(p["count"] for p in points)


def test_fit_reports_steps_epochs_metrics_and_hparams(live_job: LiveJob) -> None:
    x, y, x_val, y_val = _data()
    model = _model()
    history = model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        validation_data=(x_val, y_val),
        verbose=0,
        callbacks=[StepwatchCallback(batch_size=16)],
    )
    job = live_job.get()
    progress = job["progress"]
    assert job["state"] == "finished"
    assert (progress["step"], progress["total_steps"], progress["percent"]) == (32, 32, 100)
    assert (progress["epoch"], progress["total_epochs"]) == (2, 2)
    assert progress["samples"] == 32 * 16
    series = live_job.history("loss", "mae", "val_loss", "val_mae", "learning_rate")
    counts = {name: _count(points) for name, points in series.items()}
    assert counts == {"loss": 32, "mae": 32, "val_loss": 2, "val_mae": 2, "learning_rate": 2}
    assert job["metrics"]["loss"] == pytest.approx(history.history["loss"][-1])
    assert job["metrics"]["val_loss"] == pytest.approx(history.history["val_loss"][-1])
    assert job["metrics"]["learning_rate"] == 0.05
    params = job["params"]
    assert (params["optimizer"], params["epochs"], params["steps_per_epoch"], params["batch_size"]) == (
        "sgd",
        2,
        16,
        16,
    )
    assert params["optimizer.learning_rate"] == 0.05  # not 0.05000000074505806, its float32
    assert (params["model"], params["model.parameters"], params["backend"]) == ("tiny", 161, keras.backend.backend())
    assert stepwatch.current() is None  # the callback's own run is finished


def test_stop_command_stops_then_saves_the_model(live_job: LiveJob, checkpoint_dir: Path) -> None:
    x, y, x_val, _ = _data()
    model = _model()
    callback = StepwatchCallback(checkpoint_dir=checkpoint_dir)

    def stop_once_running() -> None:
        live_job.wait(lambda job: (job["progress"]["step"] or 0) >= 5)
        live_job.command("stop", "diverging")

    thread = threading.Thread(target=stop_once_running, daemon=True)
    thread.start()
    model.fit(x, y, batch_size=16, epochs=40, verbose=0, callbacks=[_Pause(0.005), callback])
    thread.join(5)
    steps = int(model.optimizer.iterations.numpy())
    assert 5 <= steps < 40 * BATCHES
    assert callback.last_checkpoint is not None
    saved = Path(callback.last_checkpoint)
    assert saved.parent == checkpoint_dir and saved.suffix == ".keras" and saved.is_file()
    restored = keras.saving.load_model(saved)
    assert np.allclose(restored.predict(x_val, verbose=0), model.predict(x_val, verbose=0))  # the model as it stopped
    job = live_job.get()
    assert (job["state"], job["reason"], job["progress"]["step"]) == ("stopped", "diverging", steps)
    assert job["progress"]["total_steps"] == 40 * BATCHES and job["pending_commands"] == []


def test_checkpoint_command_saves_weights_and_training_goes_on(live_job: LiveJob, checkpoint_dir: Path) -> None:
    x, y, _, _ = _data()
    live_job.command("checkpoint", "nightly")  # delivered with the answer to the first report
    callback = StepwatchCallback(checkpoint_dir=checkpoint_dir, weights_only=True)
    pause = _Pause(0.05, until=lambda: callback.last_checkpoint is not None)  # 2.4 s at most
    _model().fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[pause, callback])
    assert callback.last_checkpoint is not None
    saved = Path(callback.last_checkpoint)
    assert saved.name.endswith(".weights.h5") and saved.is_file()
    _model().load_weights(saved)
    job = live_job.get()
    assert (job["state"], job["progress"]["step"], job["pending_commands"]) == ("finished", 48, [])


def test_install_gives_every_fit_a_callback(live_job: LiveJob, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keras.Model, "fit", keras.Model.fit)  # undone after the test
    assert sw_keras.install()
    assert not sw_keras.install()  # idempotent
    x, y, x_val, y_val = _data()
    _model().fit(x, y, 16, 1, 0, validation_data=(x_val, y_val))  # batch_size, epochs, verbose by position
    job = live_job.get()
    assert (job["state"], job["progress"]["step"], job["progress"]["total_steps"]) == ("finished", 16, 16)
    assert job["progress"]["samples"] == 16 * 16  # fit's batch_size reached the callback
    assert _count(live_job.history("loss")["loss"]) == 16
    assert job["metrics"]["val_loss"] > 0


def test_installed_fit_that_raises_fails_the_run(live_job: LiveJob, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keras.Model, "fit", keras.Model.fit)
    sw_keras.install()

    def fail(batch: int, logs: Any) -> None:
        if batch == 5:
            raise RuntimeError("out of memory")

    x, y, _, _ = _data()
    with pytest.raises(RuntimeError, match="out of memory"):
        _model().fit(
            x,
            y,
            batch_size=16,
            epochs=2,
            verbose=0,
            callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=fail)],
        )
    job = live_job.get()
    assert (job["state"], job["reason"]) == ("failed", "RuntimeError: out of memory")


def test_a_failing_callback_body_does_not_stop_training(
    live_job: LiveJob, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        raise ValueError("a bug in the integration")

    monkeypatch.setattr(stepwatch.Run, "step", broken)
    x, y, _, _ = _data()
    model = _model()
    with caplog.at_level(logging.WARNING, logger="stepwatch"):
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[StepwatchCallback()])
    assert len(history.history["loss"]) == 2  # training went on
    failures = [r.getMessage().split(" (")[0] for r in caplog.records if "integration failed" in r.getMessage()]
    assert "stepwatch: the keras integration failed in StepwatchCallback.on_train_batch_end" in failures
    assert len(failures) == len(set(failures))  # each failing hook logged once, not once per step
    assert live_job.get()["state"] == "finished"


def test_joins_the_users_run_and_leaves_it_open(live_job: LiveJob) -> None:
    x, y, _, _ = _data()
    with stepwatch.init(params={"experiment": "fine-tune"}) as run:
        _model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[StepwatchCallback()])
        assert run.current_step == BATCHES and stepwatch.current() is run
        job = live_job.wait(lambda job: job["progress"]["step"] == BATCHES)
        assert (job["state"], job["progress"]["total_steps"]) == ("running", BATCHES)
    assert live_job.get()["state"] == "finished"


class _SlowValidation(keras.callbacks.Callback):  # type: ignore[misc]
    """Each validation batch takes 1.5 s: 4 batches, a 6 s validation per epoch with the step standing."""

    def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
        time.sleep(1.5)


@pytest.mark.parametrize(("announced", "where"), [(True, "on"), (False, "off"), (False, "on")])
def test_validation_is_announced_and_no_stall(
    strict_job: LiveJob, monkeypatch: pytest.MonkeyPatch, announced: bool, where: str
) -> None:
    """On a server that calls a 3 s standstill a stall (tests/integrations/conftest.py: STRICT_STALLS), a fit
    with 6 s validations stays healthy because the callback says ``eval`` from on_test_begin to
    on_test_end; without that (the hook taken out) and without the stack readings of where a rank stands
    (``STEPWATCH_WHERE=off``, as an older report core), the same fit is flagged stalled; with the readings,
    an evaluation without the hook is no stall either (issue 29)."""
    monkeypatch.setenv("STEPWATCH_WHERE", where)
    if not announced:
        monkeypatch.setattr(StepwatchCallback, "on_test_begin", lambda self, logs=None: None)
    x, y, x_val, y_val = _data()
    _model().fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        validation_data=(x_val, y_val),
        verbose=0,
        callbacks=[StepwatchCallback(batch_size=16), _SlowValidation()],
    )
    job = strict_job.get()
    assert job["state"] == "finished" and job["progress"]["step"] == 2 * BATCHES
    states = [span["state"] for span in job["health_history"]]
    assert ("stalled" not in states) is (announced or where == "on"), job["health"]


def test_fit_serves_openshift_ai_progression_with_no_server(progression_env: Path) -> None:
    """OpenShift AI's controller polls rank 0 while ``fit`` runs and reads the termination message at the end
    (docs/openshift-ai.md): no stepwatch server, no code beyond the callback (which auto-instrumentation adds)."""
    x, y, x_val, y_val = _data()
    model = _model()
    callbacks = [_Pause(0.01), StepwatchCallback(batch_size=16)]
    with polled_in_process() as polls:
        model.fit(x, y, batch_size=16, epochs=2, validation_data=(x_val, y_val), verbose=0, callbacks=callbacks)
    assert polls and all(isinstance(p, ProgressionStatus) for p in polls), polls[:3]
    assert any(0 < (p.current_step or 0) < 2 * BATCHES for p in polls if isinstance(p, ProgressionStatus))
    message = read_termination_message(progression_env)
    assert (message.progress_percentage, message.estimated_remaining_seconds) == (100, 0)
    assert (message.current_step, message.total_steps, message.total_epochs) == (32, 32, 2)
    assert message.train_metrics and {"loss", "mae", "throughput_samples_sec"} <= set(message.train_metrics)
    assert message.eval_metrics and set(message.eval_metrics) == {"val_loss", "val_mae"}
