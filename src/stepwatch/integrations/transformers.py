"""Hugging Face Transformers: :class:`StepwatchCallback` for ``transformers.Trainer`` (and TRL's trainers).

::

    from stepwatch.integrations.transformers import StepwatchCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[StepwatchCallback()])
    trainer.train()

Or with no code at all: under ``stepwatch run`` (or with the ``.pth`` hook and ``STEPWATCH_URL`` set)
:func:`install` is called when ``transformers`` is imported, and every ``Trainer`` gets the callback.

What it reports: total steps (``state.max_steps``) and epochs at train start, the step and epoch at
every step end (no tensor is read: the Trainer's own logs carry the numbers), every numeric key the
Trainer logs (``loss``, ``grad_norm``, ``learning_rate``, ``eval_*``, ...), and a clean subset of
the ``TrainingArguments`` as hyperparameters. It obeys the server's commands at the next step end:
``checkpoint`` saves one, ``stop`` saves one and ends training; the run then finishes ``stopped``.

Exactly one reporter per job: where transformers' own ``KubeflowCallback`` switched itself on
(``KUBEFLOW_TRAINER_SERVER_URL`` is set), a trainer that has a ``StepwatchCallback`` drops it:
stepwatch posts the same Kubeflow status itself, and more (epochs, eval metrics kept at the end,
commands, history on a stepwatch server).

OpenShift AI's progression (the status rank 0 serves on port 28080 and the termination message,
``docs/openshift-ai.md``) comes with the run. Where the trainer also carries Red Hat's own
``KubeflowProgressCallback`` (Red Hat's SDK adds it to every ``Trainer`` of a job with progression
tracking), that callback serves it: the run then neither listens on the port nor writes the message.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "stepwatch.integrations.transformers needs transformers: pip install 'stepwatch[transformers]'"
    ) from exc

import stepwatch

from ._guard import guarded

__all__ = ["StepwatchCallback", "install", "uninstall"]

_log = logging.getLogger("stepwatch")

HYPERPARAMETERS = (
    "learning_rate",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "seed",
    "weight_decay",
    "warmup_steps",
    "warmup_ratio",
    "lr_scheduler_type",
    "optim",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "bf16",
    "fp16",
    "gradient_checkpointing",
)
"""The ``TrainingArguments`` sent as hyperparameters (the others are paths, switches and plumbing)."""


class StepwatchCallback(TrainerCallback):
    """Reports a ``Trainer``'s progress, logs and hyperparameters to stepwatch, and obeys its commands.

    ``run``: report into this run instead of starting one at train begin (it is then not finished by
    the callback). Otherwise the callback uses the current run if the script started one, or starts
    one from the environment (``STEPWATCH_*``, ``KUBEFLOW_TRAINER_SERVER_*``) and finishes it at
    train end: ``finished``, or ``stopped`` when a stop command ended the training.
    """

    def __init__(self, run: stepwatch.Run | None = None) -> None:
        self._given = run
        self.run: stepwatch.Run | None = run
        self._owned = False
        self._trainer_callbacks: list[Any] | None = None
        """The callbacks of the trainer this one was given to (set when the trainer is made)."""
        self._stopping = False
        self._saving = False
        self._reason = ""
        _patch_trainer()  # drops transformers' KubeflowCallback from trainers that have this one

    # ------------------------------------------------------------------------------ events

    @guarded
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._stopping = self._saving = False
        params = _hyperparameters(args, kwargs.get("model"))
        epochs = args.num_train_epochs if args.max_steps is None or args.max_steps <= 0 else None
        total = state.max_steps if state.max_steps and state.max_steps > 0 else None
        if total is not None:  # the epochs the max_steps cover: num_train_epochs, or what max_steps amounts to
            epochs = epochs or _epochs_of(state)
        epochs = epochs if epochs and epochs > 0 else None
        batch = _global_batch_size(args, state)
        red_hat = _red_hat_progression(self._trainer_callbacks)
        if self._given is not None:
            self.run, self._owned = self._given, False
        elif stepwatch.current() is not None:
            self.run, self._owned = stepwatch.current(), False
        else:  # with the totals at once: the first status it serves has them
            port = False if red_hat else None
            self.run = stepwatch.init(params=params, total_steps=total, total_epochs=epochs, metrics_port=port)
            self._owned = True
        run = self.run
        assert run is not None
        if red_hat:
            run.yield_progression(_RED_HAT_REASON)
        run.update(total_steps=total, total_epochs=epochs, batch_size=batch)
        if state.global_step:
            run.step(state.global_step)  # resumed from a checkpoint

    @guarded
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        run = self.run
        if run is None:
            return
        run.step(state.global_step)
        run.set_phase("train")  # an evaluation that ended without on_evaluate (a predict() in between)
        if state.epoch is not None:
            run.epoch(state.epoch)
        stop, checkpoint, reason = _agreed(run, state.global_step, args)
        if (stop or checkpoint) and not self._saving:
            self._saving = True
            control.should_save = True
        if stop and not self._stopping:
            self._stopping = True
            self._reason = reason or "stopped by a stepwatch command"
            control.should_training_stop = True

    @guarded
    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Each batch of an evaluation (or a prediction): the step stands by design, say so."""
        if self.run is not None:
            self.run.set_phase("eval")

    @guarded
    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """After an evaluation (its metrics come with the next on_log): training again."""
        if self.run is not None:
            self.run.set_phase("train")

    @guarded
    def on_predict(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics: Any = None, **kwargs: Any
    ) -> None:
        """After a prediction run (``Trainer.predict``): training again, if it trains."""
        if self.run is not None:
            self.run.set_phase("train")

    @guarded
    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.run is None or not logs:
            return
        metrics = {k: v for k, v in logs.items() if k != "epoch" and _is_number(v)}
        if metrics:
            self.run.log(**metrics)

    @guarded
    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.run is not None and self._saving:
            self._saving = False
            self.run.checkpoint_done()
            _log.info("stepwatch: checkpoint saved at step %d, as the server asked", state.global_step)

    @guarded
    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        run = self.run
        if run is None:
            return
        run.step(state.global_step)
        if self._owned:
            if self._stopping:
                run.finish("stopped", self._reason)
            else:
                run.finish("finished")
        self.run = self._given


# ------------------------------------------------------------------------------------ helpers


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _hyperparameters(args: TrainingArguments, model: Any) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name in HYPERPARAMETERS:
        value = getattr(args, name, None)
        if value is None:
            continue
        value = getattr(value, "value", value)  # enums (lr_scheduler_type, optim)
        params[name] = value
    try:
        params["world_size"] = int(args.world_size)
    except Exception:
        pass
    config = getattr(model, "config", None)
    for key in ("model_type", "_name_or_path"):
        value = getattr(config, key, None)
        if isinstance(value, str) and value:
            params["model_name" if key == "_name_or_path" else key] = value
    try:
        params["model_parameters"] = int(sum(p.numel() for p in model.parameters()))
    except Exception:
        pass
    return params


def _global_batch_size(args: TrainingArguments, state: TrainerState) -> int | None:
    try:
        per_step = int(state.train_batch_size or args.per_device_train_batch_size)
        return per_step * int(args.gradient_accumulation_steps) * max(1, int(args.world_size))
    except Exception:
        return None


def _epochs_of(state: TrainerState) -> float | None:
    num: Any = getattr(state, "num_train_epochs", None)
    return float(num) if _is_number(num) and num > 0 else None


def _agreed(run: stepwatch.Run, step: int, args: TrainingArguments) -> tuple[bool, bool, str]:
    """``(stop, checkpoint, reason)``, the same on every rank.

    The server hands a command to whichever rank reports first, and a save or a stop must happen on
    all ranks at once. With more than one process the ranks agree (``integrations.torch.agree``: one
    small all-reduce over gloo) every ``logging_steps`` steps; one process: its own flags.
    """
    stop, checkpoint, reason = run.should_stop, run.should_checkpoint, run.command_reason
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return stop, checkpoint, reason
    every = args.logging_steps if isinstance(args.logging_steps, int) and args.logging_steps >= 1 else 10
    if step % every:
        return False, False, ""
    from .torch import agree

    agreed = agree(run)
    return agreed.stop, agreed.checkpoint, agreed.reason


# ------------------------------------------------------------------------------------ install

_patched = False
_auto = False


def install() -> bool:
    """Give every ``Trainer`` created from now on a :class:`StepwatchCallback`, unless it has one.

    Idempotent; returns ``True`` when the patch is in place. Called by the auto-instrumentation
    hook when ``transformers`` is imported.
    """
    global _auto
    _auto = True
    return _patch_trainer()


def _patch_trainer() -> bool:
    global _patched
    if _patched:
        return True
    from transformers import Trainer

    original: Callable[..., None] = Trainer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _after_trainer_init(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._stepwatch = True  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    Trainer.__init__ = __init__  # type: ignore[method-assign]
    _patched = True
    return True


def uninstall() -> bool:
    """Undo :func:`install` (and the de-duplication patch); returns whether there was one to undo."""
    global _patched, _auto
    from transformers import Trainer

    _auto = False
    if not _patched or not getattr(Trainer.__init__, "_stepwatch", False):
        return False  # not patched, or patched again by someone else since: leave theirs alone
    Trainer.__init__ = Trainer.__init__.__wrapped__  # type: ignore[attr-defined, method-assign]
    _patched = False
    return True


@guarded(integration="transformers", event="Trainer.__init__")
def _after_trainer_init(trainer: Any) -> None:
    handler = trainer.callback_handler
    ours = [cb for cb in handler.callbacks if isinstance(cb, StepwatchCallback)]
    if not ours and _auto:
        handler.add_callback(StepwatchCallback())
        ours = [cb for cb in handler.callbacks if isinstance(cb, StepwatchCallback)]
    for cb in ours:  # read at train begin: Red Hat's callback may be added after this one, by an outer patch
        cb._trainer_callbacks = handler.callbacks
    if ours and _reports():
        for cb in list(handler.callbacks):
            if type(cb).__name__ == "KubeflowCallback":
                handler.remove_callback(cb)
                _log.info("stepwatch: transformers' KubeflowCallback is replaced by stepwatch's callback")


_RED_HAT_CALLBACK = "KubeflowProgressCallback"
"""The class Red Hat's SDK (``kubeflow/trainer/rhai/transformers.py``) adds to every ``Trainer``."""
_RED_HAT_REASON = (
    "the trainer carries Red Hat's KubeflowProgressCallback, which serves OpenShift AI's progression status "
    "and writes the termination message"
)


def _red_hat_progression(callbacks: list[Any] | None) -> bool:
    """Whether Red Hat's progression callback is among a trainer's callbacks (it serves port 28080 itself)."""
    return any(type(cb).__name__ == _RED_HAT_CALLBACK for cb in callbacks or ())


def _reports() -> bool:
    """Whether a run started now would report (an endpoint is set and reporting is not disabled)."""
    from .._settings import resolve

    try:
        settings = resolve({})
    except Exception:
        return False
    return bool(settings.url) and not settings.disabled
