"""PyTorch Lightning: a callback that reports a ``Trainer.fit`` to stepwatch and obeys its commands.

::

    import lightning as L
    from stepwatch.integrations.lightning import StepwatchCallback

    trainer = L.Trainer(max_epochs=3, callbacks=[StepwatchCallback()])
    trainer.fit(model, train_loader, val_loader)

What it reports: total steps (``trainer.estimated_stepping_batches``), total epochs (``max_epochs``,
or what ``max_steps`` allows), the optimizer step (``trainer.global_step``) and the fractional epoch
after every training batch, with every metric the module logged for that step (``self.log``) and the
loss the training step returned; validation metrics at the end of each validation; epoch-level
metrics (``loss_epoch``) at the end of each training epoch; hyperparameters from
``self.save_hyperparameters()`` and the trainer's configuration; the batch size (samples per
optimizer step across all processes). Metric values are tensors passed by reference: the report
core reads them in its sender thread, so no step waits for a device.

Commands: ``checkpoint`` saves ``stepwatch-epoch=E-step=S.ckpt`` with ``trainer.save_checkpoint``
(into ``checkpoint_dir``, else the ``ModelCheckpoint`` directory, else
``<default_root_dir>/checkpoints``); ``stop`` saves one and sets ``trainer.should_stop``. With more
than one process the server tells whichever rank reports first, so the ranks agree on the commands
every ``command_every`` batches (:func:`stepwatch.integrations.torch.agree`: one small all-reduce)
and every rank saves and stops at the same batch. The run ends ``finished``, ``stopped`` (by a command or
Ctrl-C) or ``failed`` (``on_exception``).

Both namespaces work: ``lightning.pytorch`` and ``pytorch_lightning`` (:func:`callback_class` gives
the callback class of either). :func:`install` adds the callback to every ``Trainer`` created
afterwards that has none.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import stepwatch
from stepwatch.integrations._guard import guarded

try:
    if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules:
        raise ImportError  # the script uses the standalone namespace: do not load a second copy of Lightning
    import lightning.pytorch as pl
except ImportError:
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError(
            "stepwatch.integrations.lightning needs PyTorch Lightning: pip install 'stepwatch[lightning]'"
        ) from exc

if TYPE_CHECKING:
    from stepwatch import Run

__all__ = ["StepwatchCallback", "callback_class", "install"]

_NAMESPACES = ("lightning", "pytorch_lightning")


class _Reporter:
    """The behaviour of the callback, kept apart from the framework's base class.

    Lightning ships twice (``lightning.pytorch`` and ``pytorch_lightning``), with two ``Callback``
    classes; each namespace gets a subclass of this mixin and its own base (:func:`callback_class`).
    """

    def __init__(
        self,
        run: Run | None = None,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        command_every: int = 20,
        params: Mapping[str, Any] | None = None,
        **init_kwargs: Any,
    ) -> None:
        """Report the fit of the trainer this callback is given to.

        Args:
            run: the run to report to; by default the current run (:func:`stepwatch.current`) or a
                new one from :func:`stepwatch.init`. A run this callback started is finished when
                the fit ends; a run it was given (or found) is left to its owner.
            checkpoint_dir: where checkpoints asked for by the server go.
            command_every: with several processes, how often (in training batches) the ranks
                agree on the server's commands (a collective: not every step).
            params: extra hyperparameters, sent with the module's ``hparams``.
            init_kwargs: passed to :func:`stepwatch.init` (``job``, ``namespace``, ``url``...).
        """
        super().__init__()
        self.run: Run | None = run
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.command_every = max(int(command_every), 1)
        self.last_checkpoint: str | None = None
        """The path of the last checkpoint this callback saved for a command."""
        self._params = dict(params or {})
        self._init_kwargs = init_kwargs
        self._given = run
        self._owns = False
        self._stopped = False
        self._stop_reason = ""
        self._world = 1
        self._since_check = 0
        self._batches = 0.0
        self._accumulate = 1
        self._seen: dict[str, Any] = {}

    # ------------------------------------------------------------------------------- lifecycle

    @guarded
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Start (or join) the run, with the hyperparameters; totals follow at ``on_train_start``."""
        self._stopped, self._stop_reason, self._since_check = False, "", 0
        self._seen = {}
        self._world = max(int(getattr(trainer, "world_size", 1) or 1), 1)
        self._accumulate = max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)
        run = self._given or stepwatch.current()
        self._owns = run is None
        if run is None:
            run = stepwatch.init(params=_params(trainer, pl_module, self._params), **self._init_kwargs)
        else:
            run.update(params=_params(trainer, pl_module, self._params))  # added to the user's own params
        self.run = run

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Total steps, total epochs and batch size, once the data is loaded."""
        run = self.run
        if run is None:
            return
        total = trainer.estimated_stepping_batches
        total_steps = int(total) if isinstance(total, (int, float)) and math.isfinite(total) and total >= 1 else None
        run.update(
            total_steps=total_steps,
            total_epochs=_total_epochs(trainer, self._accumulate),
            batch_size=_batch_size(trainer, self._accumulate * self._world),
        )
        run.step(trainer.global_step)  # a resumed fit starts where its checkpoint left off

    @guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """The epoch and its number of batches (for fractional epochs)."""
        batches = trainer.num_training_batches
        self._batches = float(batches) if isinstance(batches, (int, float)) and 0 < batches < math.inf else 0.0
        if self.run is not None:
            self.run.epoch(trainer.current_epoch)

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """One step: the optimizer step, the fractional epoch and this step's metrics; then commands."""
        run = self.run
        if run is None:
            return
        metrics = self._fresh(trainer.callback_metrics, drop="_step")
        if "loss" not in metrics:
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            if loss is not None and hasattr(loss, "detach"):
                # Lightning divides the returned loss by the accumulation factor: undone, on the device.
                metrics["loss"] = loss * self._accumulate if self._accumulate > 1 else loss
        run.step(trainer.global_step, **metrics)
        if self._batches:
            run.epoch(trainer.current_epoch + min((batch_idx + 1) / self._batches, 1.0))
        self._obey(trainer)

    @guarded
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Epoch-level training metrics (``self.log(..., on_epoch=True)``)."""
        if self.run is not None:
            metrics = self._fresh(trainer.callback_metrics, drop="_epoch")
            if metrics:
                self.run.log(**metrics)
            self.run.epoch(trainer.current_epoch + 1)

    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """The step stands by design while the loop validates: the reports say so."""
        if self.run is not None:
            self.run.set_phase("eval")

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Training again; the validation metrics, at the current step (not the sanity check's)."""
        if self.run is None:
            return
        self.run.set_phase("train")
        if trainer.sanity_checking:
            return
        metrics = self._fresh(trainer.callback_metrics, drop="_epoch")
        if metrics:
            self.run.log(**metrics)

    @guarded
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Finish the run this callback started: ``stopped`` after a stop command, else ``finished``."""
        run = self.run
        if run is None:
            return
        run.step(trainer.global_step)
        if self._owns:
            run.finish("stopped" if self._stopped else "finished", self._stop_reason)

    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Finish the run this callback started: ``stopped`` on Ctrl-C, else ``failed`` with the error."""
        run = self.run
        if run is None or not self._owns:
            return
        if isinstance(exception, KeyboardInterrupt):
            run.finish("stopped", "KeyboardInterrupt")
        else:
            run.finish("failed", f"{type(exception).__name__}: {exception}")

    # --------------------------------------------------------------------------------- helpers

    def _fresh(self, metrics: Mapping[str, Any], drop: str) -> dict[str, Any]:
        """The metrics logged since the last call: Lightning keeps every value it ever logged.

        A value logged again is a new tensor; Lightning hands out a fresh ``detach()`` view of the
        same tensor on every read, so a value whose storage is the one seen last time is stale (the
        tensors seen are kept, so their memory cannot be reused meanwhile). Lightning lists a metric
        logged both per step and per epoch under ``name`` and ``name_step`` (or ``name_epoch``): one
        copy is kept, the plain name for steps and the ``_epoch`` name for epochs (so that ``loss``
        counts one value per step).
        """
        seen = self._seen
        fresh: dict[str, Any] = {}
        for name, value in metrics.items():
            if not _same(seen.get(name), value):
                seen[name] = value
                fresh[name] = value
        if drop == "_step":
            for name in [n for n in fresh if n.endswith("_step")]:
                if _same(fresh.get(name[:-5]), fresh[name]):
                    del fresh[name]
        else:
            for name in [n for n in fresh if n.endswith("_epoch")]:
                if _same(fresh.get(name[:-6]), fresh[name]):
                    del fresh[name[:-6]]
        return fresh

    def _obey(self, trainer: Any) -> None:
        """Save and/or stop when the server asked; every rank together when there are several."""
        run = self.run
        assert run is not None
        if self._stopped:
            return  # obeyed already (the fit may go on until min_epochs is reached)
        if self._world > 1:
            self._since_check += 1
            if self._since_check < self.command_every:
                return
            self._since_check = 0
            stop, checkpoint, reason = _agree(trainer, run)
        elif run.should_stop or run.should_checkpoint:
            stop, checkpoint, reason = run.should_stop, True, run.command_reason
        else:
            return
        if not (stop or checkpoint):
            return
        self.last_checkpoint = self._save(trainer)
        run.checkpoint_done()
        if stop:
            self._stopped = True
            self._stop_reason = reason or "stopped by a stepwatch command"
            trainer.should_stop = True

    def _save(self, trainer: Any) -> str:
        directory = self.checkpoint_dir
        if directory is None:
            checkpoint = getattr(trainer, "checkpoint_callback", None)
            directory = getattr(checkpoint, "dirpath", None)
        if directory is None:
            directory = os.path.join(trainer.default_root_dir, "checkpoints")
        path = os.path.join(
            os.fspath(directory), f"stepwatch-epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt"
        )
        trainer.save_checkpoint(path)
        return path


class StepwatchCallback(_Reporter, pl.Callback):
    """Reports a Lightning fit to stepwatch and obeys its ``checkpoint`` and ``stop`` commands.

    A ``Callback`` of the namespace this module found first (``lightning.pytorch`` unless the script
    had already imported ``pytorch_lightning`` only); :func:`callback_class` gives the other.
    """


_classes: dict[str, type[_Reporter]] = {pl.__name__.partition(".")[0]: StepwatchCallback}


def callback_class(namespace: str = "lightning") -> type[_Reporter]:
    """The callback class for ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``."""
    root = namespace.partition(".")[0]
    if root not in _classes:
        if root not in _NAMESPACES:
            raise ValueError(f"namespace must be one of {_NAMESPACES}, got {namespace!r}")
        import importlib

        module = importlib.import_module("lightning.pytorch" if root == "lightning" else root)
        made = type("StepwatchCallback", (_Reporter, module.Callback), {"__doc__": StepwatchCallback.__doc__})
        _classes[root] = cast("type[_Reporter]", made)
    return _classes[root]


def install() -> bool:
    """Give every ``Trainer`` created from now on a stepwatch callback, unless it already has one.

    Patches ``Trainer.__init__`` of each Lightning namespace already imported (``lightning.pytorch``
    and ``pytorch_lightning``), and of the one this module loaded. Idempotent: returns ``True`` when
    it patched something now, ``False`` when everything was already patched.
    """
    installed = False
    for root in _NAMESPACES:
        module = sys.modules.get("lightning.pytorch" if root == "lightning" else root)
        if module is None or not hasattr(module, "Trainer"):
            continue
        trainer_class = module.Trainer
        if getattr(trainer_class.__init__, "_stepwatch_patched", False):
            continue
        trainer_class.__init__ = _patched_init(trainer_class.__init__, root)
        installed = True
    return installed


def _patched_init(original: Any, root: str) -> Any:
    import functools

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _add_callback(self, root)

    __init__._stepwatch_patched = True  # type: ignore[attr-defined]
    return __init__


@guarded(event="install")
def _add_callback(trainer: Any, root: str) -> None:
    callbacks = trainer.callbacks
    if not any(isinstance(callback, _Reporter) for callback in callbacks):
        callbacks.append(callback_class(root)())


# ------------------------------------------------------------------------------------- reading


def _same(old: Any, new: Any) -> bool:
    """Whether two logged values are the same value (the same object, or views of one tensor)."""
    if old is new:
        return True
    if old is None:
        return False
    try:
        return bool(old.data_ptr() == new.data_ptr() and old.shape == new.shape)
    except Exception:  # not tensors
        return False


def _agree(trainer: Any, run: Run) -> tuple[bool, bool, str]:
    """``(stop, checkpoint, reason)`` the same on every rank: the server tells whichever rank reports first."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from stepwatch.integrations.torch import agree  # one all-reduce over gloo, off the GPU stream

        agreed = agree(run)
        return agreed.stop, agreed.checkpoint, agreed.reason
    strategy = trainer.strategy  # another kind of process group (XLA): Lightning's own reduction
    stop = bool(strategy.reduce_boolean_decision(run.should_stop, all=False))
    checkpoint = bool(strategy.reduce_boolean_decision(stop or run.should_checkpoint, all=False))
    return stop, checkpoint, run.command_reason


def _params(trainer: Any, pl_module: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The module's hyperparameters, the trainer's configuration, then the user's extras."""
    params: dict[str, Any] = {}
    hparams = getattr(pl_module, "hparams", None)
    if isinstance(hparams, Mapping):
        params.update(hparams)
    for name in ("max_epochs", "max_steps", "accumulate_grad_batches", "precision", "world_size", "num_nodes"):
        value = getattr(trainer, name, None)
        if value is not None and f"trainer.{name}" not in params:
            params[f"trainer.{name}"] = value
    params["trainer.strategy"] = type(getattr(trainer, "strategy", None)).__name__
    params["model"] = type(pl_module).__name__
    params.update(extra)
    return params


def _total_epochs(trainer: Any, accumulate: int) -> float | None:
    """``max_epochs``, or fewer when ``max_steps`` ends the fit first."""
    max_epochs = trainer.max_epochs
    epochs = float(max_epochs) if isinstance(max_epochs, int) and max_epochs > 0 else math.inf
    max_steps = trainer.max_steps
    batches = trainer.num_training_batches
    if isinstance(max_steps, int) and max_steps > 0 and isinstance(batches, (int, float)) and 0 < batches < math.inf:
        epochs = min(epochs, max_steps / math.ceil(batches / accumulate))
    if not math.isfinite(epochs):
        return None
    return int(epochs) if float(epochs).is_integer() else epochs


def _batch_size(trainer: Any, factor: int) -> int | None:
    loader = getattr(trainer, "train_dataloader", None)
    size = getattr(loader, "batch_size", None)
    return size * factor if isinstance(size, int) and size > 0 else None
