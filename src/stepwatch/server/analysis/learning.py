"""The learning rules of one job: ``not_learning`` from the plateau test, from a learning rate at zero,
and the evaluation metric's veto; the calm verdict (``healthy``, ``unknown``) with the test's figures.

:class:`LearningRules` is owned by a :class:`~.health.HealthTracker` (one per job; :meth:`reset` with
each metric segment) beside the segment's :class:`~.plateau.PlateauDetector` and
:class:`~.divergence.Divergence`, whose level and best its sentences quote. The second signals are
:class:`~.signals.LearningRate` (a rate of zero is ``not_learning``; its area is the plateau test's
clock) and :class:`~.signals.EvalTrend` (an evaluation that improves beyond its noise since the loss
went flat keeps the job healthy); ``docs/health.md`` gives the rules and the curves behind them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .divergence import Divergence
from .health_params import HealthParams
from .plateau import PlateauDetector
from .signals import EvalTrend, LearningRate, eval_direction
from .verdict import Verdict, dur, evidence, num, pct, signed

__all__ = ["LearningRules"]


class LearningRules:
    """Is the job learning: the plateau's verdict, the learning rate and the evaluation's veto, said in
    words. What it needs from the job is asked of its tracker, lazily: the plateau window, the time
    from which learning is judged, and whether the job is in the last share of its planned steps."""

    def __init__(
        self,
        params: HealthParams,
        metric: str,
        window: Callable[[], float],
        judged_from: Callable[[], float],
        finishing: Callable[[], bool],
    ) -> None:
        self.params = params
        self._metric = metric
        self._window = window
        self._judged_from = judged_from
        self._finishing = finishing
        self.eval_metric: str | None = None
        """The evaluation metric followed: the first one the job reported."""
        self._eval_direction = "min"
        self._calm_cache: tuple[tuple[Any, ...], Verdict] | None = None
        self._flagged = False  # the newest judgement of learning was not_learning
        self._plateau: PlateauDetector | None = None
        self._div: Divergence | None = None
        self.lr = LearningRate()
        self._lr_flat = False
        self._eval = EvalTrend(self._eval_direction)
        self._veto_cache: tuple[tuple[float, float, float], tuple[float, float, int] | None] | None = None

    def reset(self, plateau: PlateauDetector, divergence: Divergence) -> None:
        """A new metric segment (a restart from an earlier checkpoint): its plateau test and divergence
        rules, and the second signals learnt afresh."""
        self._plateau = plateau
        self._div = divergence
        self.lr = LearningRate()
        self._lr_flat = False  # the learning rate has been zero for the confirmation (decided on observation)
        self._eval = EvalTrend(self._eval_direction)
        self._veto_cache = None

    @property
    def plateau(self) -> PlateauDetector:
        """The segment's plateau test."""
        assert self._plateau is not None
        return self._plateau

    @property
    def divergence(self) -> Divergence:
        """The segment's divergence rules (their level and best are quoted)."""
        assert self._div is not None
        return self._div

    def observe_lr(self, t: float, step: int, lr: float, started: bool) -> str | None:
        """The learning rate in force at ``step`` (``started``: a window of the metric segment is in);
        the sentence of a recovery when a rate at zero comes back."""
        lr_state = self.lr
        lr_state.observe(t, step, lr, self.params.lr_zero_fraction)
        zero = lr_state.zero_since
        if zero is None:
            recovered = f"the learning rate is {lr:.3g} again" if self._lr_flat else None
            self._lr_flat = False
            return recovered
        if not self._lr_flat and started:
            # held for the confirmation past the warm-up: a rate that reached zero inside the warm-up
            # (a short schedule, a bad config) counts from the warm-up's end, never not at all
            held = t - max(zero[0], self._judged_from()) >= self.params.plateau_confirm * self._window()
            self._lr_flat = held and not self._finishing()
        return None

    def observe_eval(self, t: float, value: float, metric: str) -> None:
        """An evaluation metric's newest value; the first metric reported is followed, its direction
        from its name."""
        if self.eval_metric is None:
            self.eval_metric, self._eval_direction = metric, eval_direction(metric)
            self._eval = EvalTrend(self._eval_direction)
        elif metric != self.eval_metric:
            return
        self._eval.observe(t, value)

    def eval_vetoes(self, since: float) -> tuple[float, float, int] | None:
        """The evaluation metric's improvement since ``since`` when it is significant (the job learns)."""
        if self.eval_metric is None:
            return None
        p = self.params
        window = self._window()
        key = (since, self._eval.newest(), window)
        if self._veto_cache is not None and self._veto_cache[0] == key:
            return self._veto_cache[1]  # a verdict follows every ingest; the evaluations change every few minutes
        found = self._eval.improvement(since, window, p.eval_min_points)
        if found is None:
            return None
        gain, se, _ = found
        vetoed = found if gain > 0 and gain >= p.noise_z * se else None
        self._veto_cache = (key, vetoed)
        return vetoed

    def eval_since(self, since: float) -> float:
        """Where the evaluation is judged from when the loss is flat since ``since``: there when the
        loss's evidence is a drop of its rate (a significant slowing since its history); from the
        start of that history when its evidence is the history itself, which did not improve
        significantly: the evaluation then answers the same question over the same span
        (``eval_over_history``). Never from before that history: a flat stretch that began before a
        plateau (a confirmation begun on noise and kept by the hysteresis) must not let the
        learning before it veto the plateau for ever."""
        p = self.params
        test = self.plateau.test
        if test is None or test.long_gain is None:
            return since
        start = test.t - max(p.plateau_history, 2.0) * test.window
        if not p.eval_over_history or test.dropped:
            return max(since, start)
        return start

    def not_learning(self, m_t: float, m_step: int) -> Verdict | None:
        """``not_learning`` with its evidence, or ``None``; ``m_t`` and ``m_step`` are the time and step of
        the metric's newest window."""
        plateau = self.plateau
        test = plateau.test
        lr_zero = self.lr.zero_since if self._lr_flat else None
        if lr_zero is not None:
            if self.eval_vetoes(lr_zero[0]) is None:
                return self._lr_verdict(lr_zero, m_t, m_step)
            return None
        if not plateau.flat or test is None:
            self._flagged = False
            return None
        m = self._metric
        since, since_step = plateau.flat_from
        if self.eval_vetoes(self.eval_since(since)) is not None:
            self._flagged = False
            return None  # the evaluation metric still improves beyond its noise: the job learns
        if self._finishing() and not self._flagged:
            return None  # a veto that lapses in the last planned steps raises nothing new there either
        self._flagged = True
        steps = m_step - since_step
        message = (
            f"{m} has not improved by {pct(self.params.min_delta)} over the last {steps:,} steps "
            f"({dur(m_t - since)}): {signed(test.gain)} per {dur(test.window)} "
            f"(standard error {pct(test.se)}), level {num(test.new)}"
        )
        div = self.divergence
        if div.best is not None:  # the best of the smoothed level, which lags the recent mean: said so, so
            # that a recent mean below it ("level 0.0678 (best 0.0708)") does not read as a contradiction
            message += f" (a recent mean; the best smoothed level was {num(div.best)} at step {div.best_step:,})"
        if self.eval_metric is None:  # without one, about twice as many healthy runs are flagged (docs/health.md)
            message += "; no evaluation metric reported to confirm it"
        ev = evidence(
            m,
            {"seconds": round(test.window, 1), "steps": test.steps},
            self.params.min_delta,
            round(test.gain, 6),
            since,
            message,
            noise=round(test.se, 6),
            noise_z=self.params.noise_z,
            best=self.divergence.best,
            best_step=self.divergence.best_step,
            level=test.new,
        )
        lr = self.lr.last
        if lr is not None:
            ev["learning_rate"] = lr
        if self.eval_metric is not None:
            ev["eval_metric"] = self.eval_metric
        return Verdict("not_learning", since, ev)

    def _lr_verdict(self, zero: tuple[float, int], m_t: float, m_step: int) -> Verdict:
        """``not_learning`` because the learning rate is zero (the loss cannot improve)."""
        since, since_step = zero
        lr = self.lr.last or 0.0
        steps = m_step - since_step
        message = (
            f"the learning rate is {lr:.3g} ({pct(lr / self.lr.peak)} of its peak {self.lr.peak:.3g}) "
            f"since step {since_step:,} ({steps:,} steps, {dur(m_t - since)}): {self._metric} cannot improve"
        )
        if self.divergence.level is not None:
            message += f"; level {num(self.divergence.level)}"
        threshold = self.params.lr_zero_fraction * self.lr.peak
        ev = evidence(
            "learning_rate",
            {"seconds": round(m_t - since, 1), "steps": steps},
            threshold,
            lr,
            since,
            message,
            best=self.divergence.best,
            best_step=self.divergence.best_step,
            level=self.divergence.level,
            learning_rate=lr,
        )
        return Verdict("not_learning", since, ev)

    def calm(self, finite: bool) -> Verdict:
        """``healthy`` (with the plateau test's figures, and the evaluation's veto of a flat loss) or
        ``unknown`` (``finite``: a finite value of the metric has arrived in this segment)."""
        # what _calm_verdict reads: not the learning rate itself (a schedule moves it at every report), only
        # whether it has stood at zero long enough and since when; the window the evaluation's veto reads
        flat = self.plateau.flat_from if self.plateau.flat else None
        lr_zero = self.lr.zero_since if self._lr_flat else None
        veto_window = self._window() if self.eval_metric else None
        key = (
            finite, self.divergence.level, self.plateau.test, self._finishing(), len(self._eval), lr_zero, flat,
            veto_window,
        )  # fmt: skip
        if self._calm_cache is not None and self._calm_cache[0] == key:
            return self._calm_cache[1]  # unchanged since the last verdict (a verdict follows each ingest)
        verdict = self._calm_verdict(finite)
        self._calm_cache = (key, verdict)
        return verdict

    def _calm_verdict(self, finite: bool) -> Verdict:
        m = self._metric
        if not finite:
            message = f"no value of {m} has arrived yet, so learning cannot be judged"
            return Verdict("unknown", None, evidence(m, None, None, None, None, message))
        level = self.divergence.level
        if level is None:
            message = f"{m} is finite; too few windows yet to judge learning"
            return Verdict("healthy", None, evidence(m, None, None, None, None, message))
        test = self.plateau.test
        if test is None:
            message = f"{m} level {num(level)}; learning is judged after the warm-up and one plateau window"
            return Verdict("healthy", None, evidence(m, None, None, level, None, message))
        message = (
            f"{m} level {num(test.new)}, {signed(test.gain)} per {dur(test.window)} (standard error {pct(test.se)})"
        )
        if self._finishing():
            message += "; the last planned steps are not judged"
        more: dict[str, Any] = {}
        flat_since = self.lr.zero_since if self._lr_flat else (self.plateau.flat_from if self.plateau.flat else None)
        if flat_since is None:
            vetoed = None
        else:
            vetoed = self.eval_vetoes(flat_since[0] if self._lr_flat else self.eval_since(flat_since[0]))
        if vetoed is not None:
            gain, se, n = vetoed
            message += (
                f"; flat, but {self.eval_metric} improves by {signed(gain)} per {dur(test.window)} "
                f"(standard error {pct(se)}, {n} evaluations): the job learns"
            )
            more = {"eval_metric": self.eval_metric, "eval_gain": round(gain, 6), "eval_noise": round(se, 6)}
        ev = evidence(
            m,
            {"seconds": round(test.window, 1), "steps": test.steps},
            self.params.min_delta,
            test.new,  # the level, as before; the improvement per window and its error beside it
            None,
            message,
            gain=round(test.gain, 6),
            noise=round(test.se, 6),
            **more,
        )
        return Verdict("healthy", None, ev)
