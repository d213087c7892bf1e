"""What the XGBoost and LightGBM callbacks share: boosting rounds as steps, eval results as metrics.

A gradient-boosting training has no epochs: round ``i`` (0-based) is step ``i + 1`` and the number
of rounds asked for is the total. Each evaluation result becomes a metric named
``<data set>/<metric>`` (``train/logloss``, ``valid/auc``, ``validation_0/rmse``). Between rounds
the reporter obeys the server: a ``checkpoint`` command saves the model, a ``stop`` command saves
it and ends the training early (the framework's own way: XGBoost's callback returns ``True``,
LightGBM's raises ``EarlyStopException``).

Standard library only; the framework modules hand in their models and results.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Union

from ._guard import report_failure

if TYPE_CHECKING:
    from .._run import Run

__all__ = ["Checkpoint", "Reporter", "add_callback_to", "metric_name", "patch_train_and_cv"]

_log = logging.getLogger("stepwatch")

Checkpoint = Union[str, "os.PathLike[str]", Callable[[Any], object], None]
"""Where a model goes when the server asks for a checkpoint or a stop: a file, or a function of it."""

_MAX_NAME = 64  # LIMITS.max_metric_name_length, without importing the protocol on every round


def metric_name(data: str, metric: str) -> str:
    """``validation_0`` and ``logloss`` become ``validation_0/logloss``: printable, at most 64 characters."""
    name = f"{data}/{metric}" if data else str(metric)
    if not name.isprintable():
        name = "".join(c if c.isprintable() else "_" for c in name)
    return name[:_MAX_NAME] or "metric"


class Reporter:
    """One training of one booster: the run it reports to, the names it uses, what it saved."""

    def __init__(self, integration: str, run: Run | None, checkpoint: Checkpoint) -> None:
        self.integration = integration
        self.given = run
        self.checkpoint = checkpoint
        self.run: Run | None = None
        self.owned = False
        self.offset = 0
        self.stopped = False
        self.saved: str | None = None
        """The last file the model was saved to (when ``checkpoint`` is a path)."""
        self._names: dict[tuple[str, str], str] = {}

    def start(self, total: int | None, params: Mapping[str, Any] | None) -> Run:
        """Find the run (given, current, else a new one from the environment) and say the total."""
        import stepwatch

        run = self.given if self.given is not None else stepwatch.current()
        if run is None:
            run = stepwatch.init(total_steps=total if total and total > 0 else None, params=params)
            self.owned = True
        else:  # a run the user holds: this training continues its steps
            self.offset = run.current_step
            if total and total > 0:
                run.update(total_steps=self.offset + total)
        self.run = run
        self.stopped = False
        return run

    def round(self, index: int, results: Iterable[tuple[str, str, Any]], model: Any) -> bool:
        """Report round ``index`` (0-based) with its eval results; ``True`` when training must stop."""
        run = self.run
        if run is None:
            return False
        metrics: dict[str, Any] = {}
        names = self._names
        for data, metric, value in results:
            key = (data, metric)
            name = names.get(key)
            if name is None:
                name = names[key] = metric_name(data, metric)
            metrics[name] = value
        run.step(self.offset + index + 1, **metrics)
        if run.should_checkpoint:
            self.save(model)
            run.checkpoint_done()
        if run.should_stop:
            self.save(model)
            self.stopped = True
            return True
        return False

    def save(self, model: Any) -> None:
        """Save ``model`` where ``checkpoint`` says (nothing when it says nowhere)."""
        target = self.checkpoint
        if target is None:
            _log.info(
                "stepwatch: %s has no checkpoint= to save the model to; the model trained so far is "
                "what train() returns",
                self.integration,
            )
            return
        try:
            if callable(target):
                target(model)
                return
            path = os.fspath(target)
            model.save_model(path)
            self.saved = path
        except Exception as exc:  # a failed save must not end the training with an error
            report_failure(self.integration, "save checkpoint", exc)

    def end(self) -> None:
        """Finish the run if this training started it."""
        run, self.run = self.run, None
        if run is not None and self.owned:
            self.owned = False
            if self.stopped:
                run.finish("stopped", run.command_reason or "stopped by a stepwatch command")
            else:
                run.finish("finished")


def add_callback_to(train: Callable[..., Any], callback_type: type, make: Callable[[], Any]) -> Callable[..., Any]:
    """``train`` that adds ``make()`` to its ``callbacks`` unless one of ``callback_type`` is there.

    When ``train`` returns, the reporters of those callbacks end their runs (a training that
    stopped early by the framework's own early stopping finishes too).
    """
    signature = inspect.signature(train)

    @functools.wraps(train)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ours: list[Any] = []
        try:
            bound = signature.bind(*args, **kwargs)
            callbacks = list(bound.arguments.get("callbacks") or ())
            ours = [c for c in callbacks if isinstance(c, callback_type)]
            if not ours:
                ours = [make()]
                bound.arguments["callbacks"] = [*callbacks, *ours]
                args, kwargs = bound.args, bound.kwargs
        except TypeError:  # arguments train() will refuse: let it say so
            pass
        except Exception as exc:
            report_failure(callback_type.__module__.rpartition(".")[2], "install", exc)
        result = train(*args, **kwargs)
        for callback in ours:
            try:
                callback.reporter.end()
            except Exception as exc:
                report_failure(callback_type.__module__.rpartition(".")[2], "end", exc)
        return result

    wrapper.__stepwatch_original__ = train  # type: ignore[attr-defined]
    return wrapper


def patch_train_and_cv(engine: Any, modules: Iterable[Any], callback: type) -> None:
    """Replace ``train`` and ``cv`` of ``engine`` (and the same functions re-exported by ``modules``)
    with versions that add ``callback()`` to calls that have none."""
    for name in ("train", "cv"):
        original = getattr(engine, name)
        patched = add_callback_to(original, callback, callback)
        for module in (engine, *modules):
            if getattr(module, name, None) is original:
                setattr(module, name, patched)
