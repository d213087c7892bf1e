"""LightGBM: boosting rounds as steps, eval results as metrics, stop and checkpoint commands obeyed.

::

    import lightgbm as lgb
    from stepwatch.integrations.lightgbm import StepwatchCallback

    booster = lgb.train(
        {"objective": "binary", "learning_rate": 0.1},
        train_set,
        num_boost_round=500,
        valid_sets=[train_set, valid_set],
        valid_names=["train", "valid"],
        callbacks=[StepwatchCallback(checkpoint="model.txt")],
    )

The total is the last round (``num_boost_round`` plus the rounds of an ``init_model``), the
hyperparameters are ``params``; ``train/binary_logloss`` and ``valid/binary_logloss`` arrive as
metrics. ``lgb.cv`` and the scikit-learn estimators (``LGBMClassifier().fit(...,
callbacks=[...])``) work the same way. On a ``stop`` command the model is saved to ``checkpoint``
(a path, or a function of the booster) and training ends with LightGBM's ``EarlyStopException``
(the booster keeps every round trained so far); on ``checkpoint`` it is saved and training goes on.

:func:`install` adds the callback to every ``lgb.train``/``lgb.cv`` (estimators included) that has
none: the auto-instrumentation of ``stepwatch run`` calls it, so a script needs no change at all.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

try:
    import lightgbm
    import lightgbm.callback
    import lightgbm.engine
    import lightgbm.sklearn
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("stepwatch.integrations.lightgbm needs LightGBM: pip install 'stepwatch[lightgbm]'") from exc

from ._boosting import Checkpoint, Reporter, patch_train_and_cv
from ._guard import guarded

if TYPE_CHECKING:
    from .._run import Run

__all__ = ["StepwatchCallback", "install"]

_installed = False


class StepwatchCallback:
    """A LightGBM callback (called after each round) that reports the round to stepwatch.

    ``run``: the run to report to (default: the current one, else a new one from the environment,
    finished when training ends). ``checkpoint``: where the model is saved when the server asks for
    a checkpoint or a stop (a file name for ``Booster.save_model``, or a function of the booster).
    """

    order = 25
    """After LightGBM's own loggers (10, 20) and before early stopping (30)."""
    before_iteration = False

    def __init__(self, run: Run | None = None, *, checkpoint: Checkpoint = None) -> None:
        self.reporter = Reporter("lightgbm", run, checkpoint)

    @property
    def saved(self) -> str | None:
        """The file the model was last saved to on a command, if any."""
        return self.reporter.saved

    def __deepcopy__(self, memo: dict[int, Any]) -> StepwatchCallback:
        clone = copy.copy(self)
        clone.reporter = Reporter("lightgbm", self.reporter.given, self.reporter.checkpoint)
        return clone

    def __call__(self, env: lightgbm.callback.CallbackEnv) -> None:
        """Report round ``env.iteration``; raise ``EarlyStopException`` when the server sent ``stop``."""
        if self._round(env):
            results = list(env.evaluation_result_list or ())
            raise lightgbm.callback.EarlyStopException(env.iteration, results)

    @guarded(fallback=False)
    def _round(self, env: lightgbm.callback.CallbackEnv) -> bool:
        reporter = self.reporter
        if env.iteration == env.begin_iteration or reporter.run is None:
            reporter.end()  # a callback object reused for a second training
            reporter.start(env.end_iteration, _params(env))
        stop = reporter.round(env.iteration, _results(env), env.model)
        if stop or env.iteration + 1 >= env.end_iteration:
            reporter.end()
        return stop


def _params(env: lightgbm.callback.CallbackEnv) -> dict[str, Any]:
    params = dict(env.params or {})
    params.setdefault("num_boost_round", env.end_iteration - env.begin_iteration)
    return params


def _results(env: lightgbm.callback.CallbackEnv) -> Iterator[tuple[str, str, Any]]:
    """``(data, metric, value)``; ``lgb.cv`` gives ``cv_agg`` and ``valid binary_logloss`` names."""
    for result in env.evaluation_result_list or ():
        data, metric, value = result[0], result[1], result[2]
        if data == "cv_agg" and " " in metric:  # lgb.cv: ("cv_agg", "valid binary_logloss", mean, ..., std)
            data, metric = metric.split(" ", 1)
        yield data, metric, value


def install() -> bool:
    """Add :class:`StepwatchCallback` to every ``lightgbm.train``/``cv`` that has none. Idempotent."""
    global _installed
    if _installed:
        return True
    patch_train_and_cv(lightgbm.engine, (lightgbm, lightgbm.sklearn), StepwatchCallback)
    _installed = True
    return True
