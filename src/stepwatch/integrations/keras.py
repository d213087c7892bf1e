"""Keras 3: a callback that reports ``model.fit`` to stepwatch and obeys its commands.

::

    import keras
    from stepwatch.integrations.keras import StepwatchCallback

    model.fit(x, y, batch_size=32, epochs=5, validation_split=0.1, callbacks=[StepwatchCallback(batch_size=32)])

What it reports: total epochs (``epochs``) and total steps (steps per epoch times epochs, when the data
has a length), the step (``epoch * steps per epoch + batch``) and the fractional epoch after every
batch with the batch's logs (``loss`` and the compiled metrics: Keras gives running means over the
epoch so far), the ``val_*`` metrics and the optimizer's learning rate at each epoch end, and
hyperparameters (the optimizer's configuration, epochs, steps per epoch, batch size, the model's
name and size). Any backend works (JAX, PyTorch, TensorFlow).

The callback is ``async_safe``: where the backend allows it, Keras calls its batch-end hook in a
worker thread, so the conversion of the logs to floats does not hold the training loop up (with a
callback that is not async-safe, Keras does it in the loop, as it always did).

Commands are obeyed between two batches: ``checkpoint`` saves ``stepwatch-epoch=E-step=S.keras``
(``model.save``; ``.weights.h5`` with ``weights_only=True``) into ``checkpoint_dir`` (default
``./checkpoints``); ``stop`` sets ``model.stop_training``, and once Keras has left the loop the model
is saved the same way and the run ends ``stopped``. :func:`install` adds the callback to every
``fit`` that has none, and then also reports a ``fit`` that raises as ``failed``.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import stepwatch
from stepwatch.integrations._guard import guarded

try:
    import keras  # type: ignore[import-untyped]
except ImportError as exc:
    raise ImportError("stepwatch.integrations.keras needs Keras 3: pip install 'stepwatch[keras]'") from exc

if TYPE_CHECKING:
    from stepwatch import Run

__all__ = ["StepwatchCallback", "install"]


class StepwatchCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Reports a Keras ``fit`` to stepwatch and obeys its ``checkpoint`` and ``stop`` commands."""

    async_safe = True
    """Keras may call :meth:`on_train_batch_end` in a worker thread (see the module docstring)."""

    def __init__(
        self,
        run: Run | None = None,
        *,
        batch_size: int | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        weights_only: bool = False,
        params: Mapping[str, Any] | None = None,
        **init_kwargs: Any,
    ) -> None:
        """Report the ``fit`` this callback is passed to.

        Args:
            run: the run to report to; by default the current run (:func:`stepwatch.current`) or a
                new one from :func:`stepwatch.init`. A run this callback started is finished when
                ``fit`` ends; a run it was given (or found) is left to its owner.
            batch_size: samples per step (across all processes), for samples/s; ``fit``'s own
                ``batch_size`` when :func:`install` added the callback.
            checkpoint_dir: where checkpoints asked for by the server go (default ``./checkpoints``).
            weights_only: save weights (``.weights.h5``) instead of the whole model (``.keras``).
            params: extra hyperparameters.
            init_kwargs: passed to :func:`stepwatch.init` (``job``, ``namespace``, ``url``...).
        """
        super().__init__()
        self.run: Run | None = run
        self.batch_size = batch_size
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else "checkpoints"
        self.weights_only = weights_only
        self.last_checkpoint: str | None = None
        """The path of the last checkpoint this callback saved for a command."""
        self._params = dict(params or {})
        self._init_kwargs = init_kwargs
        self._given = run
        self._owns = False
        self._active = False
        self._stopping = False
        self._steps = 0
        self._base = 0
        self._epoch = 0
        self._done = 0
        self._batch = -1
        self._per_call = 1
        self._pending: list[tuple[int, int, Mapping[str, Any]]] = []
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------- lifecycle

    @guarded
    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        """Start (or join) the run with the totals and hyperparameters ``fit`` knows."""
        params = self.params or {}
        steps = params.get("steps")
        epochs = params.get("epochs")
        self._steps = steps if isinstance(steps, int) and steps > 0 else 0
        self._stopping, self._base, self._done, self._active = False, 0, 0, True
        per_call = getattr(self.model, "steps_per_execution", 1)  # a batch-end hook ends this many batches
        self._per_call = per_call if isinstance(per_call, int) and per_call > 0 else 1
        total_epochs = epochs if isinstance(epochs, int) and epochs > 0 else None
        total_steps = self._steps * total_epochs if self._steps and total_epochs else None
        run = self._given or stepwatch.current()
        self._owns = run is None
        if run is None:
            run = stepwatch.init(
                total_steps=total_steps,
                total_epochs=total_epochs,
                batch_size=self.batch_size,
                params=self._hyperparameters(),
                **self._init_kwargs,
            )
        else:
            run.update(total_steps=total_steps, total_epochs=total_epochs, batch_size=self.batch_size)
        self.run = run

    @guarded
    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Where this epoch's steps start (``initial_epoch`` included)."""
        self._epoch = epoch
        self._base = epoch * self._steps if self._steps else self._done
        self._batch = -1
        if self.run is not None:
            self.run.epoch(epoch)

    @guarded
    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Commands, between two batches and on the training thread."""
        run = self.run
        if run is None or not (run.should_checkpoint or run.should_stop):
            return
        if run.should_stop and not self._stopping:
            self._stopping = True  # saved after the loop, with the batch running now
            self.model.stop_training = True
        elif run.should_checkpoint:
            self.last_checkpoint = self._save()
            run.checkpoint_done()

    @guarded
    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        """One step with the batch's logs (floats: Keras converts them before calling callbacks)."""
        run = self.run
        if run is None:
            return
        # Keras's worker threads may run the hooks of two batches out of order: batches are put
        # back in order (a small heap, under a lock that only these threads take) and reported
        # from the next one on, so that steps never go back and a window's last value is the last.
        with self._lock:
            heapq.heappush(self._pending, (batch, next(self._arrivals), logs or {}))
            self._report(run, final=False)

    def _report(self, run: Run, final: bool) -> None:
        """Report the pending batches that follow the last one reported (all of them if ``final``)."""
        pending = self._pending
        while pending and (final or pending[0][0] <= self._batch + self._per_call):
            batch, _, logs = heapq.heappop(pending)
            self._batch = batch
            run.step(self._base + batch + 1, **logs)
            if self._steps:
                run.epoch(self._epoch + min((batch + 1) / self._steps, 1.0))

    @guarded
    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        """Validation (``fit``'s ``validation_data``, or ``evaluate``): the step stands by design."""
        if self.run is not None:
            self.run.set_phase("eval")

    @guarded
    def on_test_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self.run is not None:
            self.run.set_phase("train")

    @guarded
    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Validation metrics and the learning rate; all batch ends of the epoch have run by now."""
        run = self.run
        if run is None:
            return
        with self._lock:  # Keras has waited for the batch-end hooks before calling this
            self._report(run, final=True)
        self._done = run.current_step
        metrics = {name: value for name, value in (logs or {}).items() if name.startswith("val_")}
        if "learning_rate" not in (logs or {}):
            rate = _learning_rate(self.model)
            if rate is not None:
                metrics["learning_rate"] = rate
        if metrics:
            run.log(**metrics)
        run.epoch(epoch + 1)

    @guarded
    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        """Save the model when a stop was asked for, then finish the run this callback started."""
        run = self.run
        self._active = False
        if run is None:
            return
        if self._stopping:
            self.last_checkpoint = self._save()
            run.checkpoint_done()
        if self._owns:
            reason = (run.command_reason or "stopped by a stepwatch command") if self._stopping else ""
            run.finish("stopped" if self._stopping else "finished", reason)

    @guarded
    def on_fit_error(self, exception: BaseException) -> None:
        """``fit`` raised (called by the ``fit`` :func:`install` wraps): the run ends ``failed``."""
        run = self.run
        if run is None or not self._active or not self._owns:
            return
        self._active = False
        if isinstance(exception, KeyboardInterrupt):
            run.finish("stopped", "KeyboardInterrupt")
        else:
            run.finish("failed", f"{type(exception).__name__}: {exception}")

    # --------------------------------------------------------------------------------- helpers

    def _save(self) -> str:
        step = self.run.current_step if self.run is not None else 0
        suffix = ".weights.h5" if self.weights_only else ".keras"
        path = os.path.join(self.checkpoint_dir, f"stepwatch-epoch={self._epoch}-step={step}{suffix}")
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        model = self.model
        if self.weights_only:
            model.save_weights(path)
        else:
            model.save(path)
        return path

    def _hyperparameters(self) -> dict[str, Any]:
        params: dict[str, Any] = {}
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            try:
                config = optimizer.get_config()
            except Exception:  # a custom optimizer without a config: its name is enough
                config = {}
            params["optimizer"] = config.pop("name", type(optimizer).__name__)
            # Keras keeps these as float32: 0.001 is not 0.0010000000474974513
            params.update({f"optimizer.{key}": _tidy(value) for key, value in config.items() if value is not None})
        fit = self.params or {}
        params["epochs"] = fit.get("epochs")
        params["steps_per_epoch"] = fit.get("steps")
        params["batch_size"] = self.batch_size
        params["model"] = getattr(model, "name", type(model).__name__)
        try:
            params["model.parameters"] = int(model.count_params())
        except Exception:  # an unbuilt model has no parameters yet
            pass
        params["backend"] = keras.backend.backend()
        params.update(self._params)
        return {key: value for key, value in params.items() if value is not None}


def _tidy(value: Any) -> Any:
    """A float32 value rounded to the 7 significant digits a float32 holds (what the user typed, mostly)."""
    return float(f"{value:.7g}") if isinstance(value, float) and math.isfinite(value) else value


def _learning_rate(model: Any) -> float | None:
    """The optimizer's current learning rate (a schedule's value at this step), once per epoch."""
    optimizer = getattr(model, "optimizer", None)
    rate = getattr(optimizer, "learning_rate", None)
    if rate is None:
        return None
    value = float(getattr(rate, "value", rate))  # the backend's tensor: keras.ops.convert_to_numpy warns on torch
    return _tidy(value) if math.isfinite(value) else None


def install() -> bool:
    """Give every ``Model.fit`` from now on a stepwatch callback, unless it already has one.

    Also reports a ``fit`` that raises as ``failed`` (a Keras callback has no hook for that).
    Idempotent: returns ``True`` when it patched ``keras.Model.fit`` now.
    """
    model_class = keras.Model
    if getattr(model_class.fit, "_stepwatch_patched", False):
        return False
    model_class.fit = _patched_fit(model_class.fit)
    return True


def _patched_fit(original: Any) -> Any:
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(*args: Any, **kwargs: Any) -> Any:
        ours = _attach(signature, args, kwargs)
        if ours is None:  # the arguments did not bind: let Keras say why
            return original(*args, **kwargs)
        args, kwargs, callbacks = ours
        try:
            return original(*args, **kwargs)
        except BaseException as exc:
            for callback in callbacks:
                callback.on_fit_error(exc)
            raise

    fit._stepwatch_patched = True  # type: ignore[attr-defined]
    return fit


@guarded(event="install")
def _attach(
    signature: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[StepwatchCallback]] | None:
    """``fit``'s arguments with a stepwatch callback added (or found), and the stepwatch callbacks."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    given = bound.arguments.get("callbacks")
    if isinstance(given, keras.callbacks.CallbackList):
        callbacks = list(given.callbacks)
        return args, kwargs, [c for c in callbacks if isinstance(c, StepwatchCallback)]
    callbacks = list(given) if isinstance(given, (list, tuple)) else ([given] if given is not None else [])
    ours = [c for c in callbacks if isinstance(c, StepwatchCallback)]
    batch_size = bound.arguments.get("batch_size")
    if batch_size is None and hasattr(bound.arguments.get("x"), "shape"):
        batch_size = 32  # fit's default for arrays
    if not ours:
        ours = [StepwatchCallback()]
        callbacks.append(ours[0])
        bound.arguments["callbacks"] = callbacks
    for callback in ours:
        if callback.batch_size is None and isinstance(batch_size, int) and batch_size > 0:
            callback.batch_size = batch_size
    return bound.args, bound.kwargs, ours
