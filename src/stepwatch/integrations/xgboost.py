"""XGBoost: boosting rounds as steps, eval results as metrics, stop and checkpoint commands obeyed.

::

    import xgboost as xgb
    from stepwatch.integrations.xgboost import StepwatchCallback

    booster = xgb.train(
        {"objective": "binary:logistic", "eval_metric": "logloss"},
        dtrain,
        num_boost_round=500,
        evals=[(dtrain, "train"), (dvalid, "valid")],
        callbacks=[StepwatchCallback(checkpoint="model.ubj")],
    )

The total is ``num_boost_round`` and the hyperparameters are ``params`` (read from ``xgb.train``'s
arguments when training starts); ``train/logloss`` and ``valid/logloss`` arrive as metrics. The
scikit-learn estimators (``XGBClassifier(callbacks=[...])``) and ``xgb.cv`` work the same way. On a
``stop`` command the model is saved to ``checkpoint`` (a path, or a function of the booster) and
training ends after the round; on ``checkpoint`` it is saved and training goes on.

:func:`install` adds the callback to every ``xgb.train`` (and estimator ``fit``) that has none: the
auto-instrumentation of ``stepwatch run`` calls it, so a script needs no change at all.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

try:
    import xgboost
    import xgboost.callback
    import xgboost.sklearn
    import xgboost.training
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("stepwatch.integrations.xgboost needs XGBoost: pip install 'stepwatch[xgboost]'") from exc

from ._boosting import Checkpoint, Reporter, patch_train_and_cv
from ._guard import guarded

if TYPE_CHECKING:
    from .._run import Run

__all__ = ["StepwatchCallback", "install"]

_installed = False


class StepwatchCallback(xgboost.callback.TrainingCallback):
    """Reports each boosting round of ``xgb.train``/``xgb.cv``/the estimators to stepwatch.

    ``run``: the run to report to (default: the current one, else a new one from the environment,
    finished when training ends). ``checkpoint``: where the model is saved when the server asks for
    a checkpoint or a stop (a file name for ``Booster.save_model``, or a function of the booster).
    ``total_steps``: the number of rounds, when it cannot be read from ``num_boost_round``.
    """

    def __init__(
        self, run: Run | None = None, *, checkpoint: Checkpoint = None, total_steps: int | None = None
    ) -> None:
        super().__init__()
        self.total_steps = total_steps
        self.reporter = Reporter("xgboost", run, checkpoint)

    @property
    def saved(self) -> str | None:
        """The file the model was last saved to on a command, if any."""
        return self.reporter.saved

    def __deepcopy__(self, memo: dict[int, Any]) -> StepwatchCallback:
        # The estimators copy their callbacks; a run (a thread, a socket) is shared, never copied.
        clone = copy.copy(self)
        clone.reporter = Reporter("xgboost", self.reporter.given, self.reporter.checkpoint)
        return clone

    @guarded(fallback=None)
    def _start(self) -> None:
        rounds, params = _train_arguments()
        total = self.total_steps if self.total_steps is not None else rounds
        hyper = dict(params) if params else {}
        if isinstance(rounds, int):
            hyper.setdefault("num_boost_round", rounds)
        self.reporter.start(total if isinstance(total, int) else None, hyper or None)

    def before_training(self, model: Any) -> Any:
        """Start (or join) the run, with the number of rounds as its total."""
        self._start()
        return model

    @guarded(fallback=False)
    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        """Report the round; ``True`` (stop training) when the server sent ``stop``."""
        return self.reporter.round(epoch, _latest(evals_log), model)

    def after_training(self, model: Any) -> Any:
        """Finish the run if this callback started it (``stopped`` after a stop command)."""
        self._end()
        return model

    @guarded
    def _end(self) -> None:
        self.reporter.end()


def _latest(evals_log: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, str, Any]]:
    """``(data, metric, value)`` of the round just evaluated (``xgb.cv`` logs ``(mean, std)``)."""
    for data, metrics in evals_log.items():
        for metric, history in metrics.items():
            if history:
                value = history[-1]
                yield data, metric, value[0] if isinstance(value, tuple) else value


def _train_arguments() -> tuple[int | None, Mapping[str, Any] | None]:
    """``num_boost_round`` and ``params`` of the ``xgboost.train``/``cv`` call running this callback."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame.f_globals.get("__name__") == "xgboost.training" and frame.f_code.co_name in ("train", "cv"):
            rounds = frame.f_locals.get("num_boost_round")
            params = frame.f_locals.get("params")
            if isinstance(params, list):  # the old list-of-pairs form
                params = dict(params)
            return (
                rounds if isinstance(rounds, int) else None,
                params if isinstance(params, Mapping) else None,
            )
        if frame.f_back is None:
            break
        frame = frame.f_back
    return None, None


def install() -> bool:
    """Add :class:`StepwatchCallback` to every ``xgboost.train``/``cv`` that has none. Idempotent."""
    global _installed
    if _installed:
        return True
    patch_train_and_cv(xgboost.training, (xgboost, xgboost.sklearn), StepwatchCallback)
    _installed = True
    return True
