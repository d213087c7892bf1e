"""The divergence rules of one metric segment: a non-finite value, a blow-up of the level, and the
fast rules (orders of magnitude above the running best, or growing per window).

:class:`Divergence` is owned by a :class:`~.health.HealthTracker` (a new one per metric segment) and
fed the metric's windows in the tracker's order; each ``observe_*`` returns the sentence of a
recovery when the window ended a divergence, which the tracker keeps for its ``recovered from``.
The *level* (the median of the last ``level_blocks`` block means, a block being the count-weighted
mean of ``block_windows`` windows) and its best are also what the learning verdicts quote.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from statistics import median
from typing import Any

from .health_params import HealthParams
from .verdict import Verdict, evidence, num

__all__ = ["Divergence"]


class Divergence:
    """Non-finite values, blow-ups and the fast rules of one metric segment; O(1) per window."""

    def __init__(self, params: HealthParams, sign: float, metric: str) -> None:
        self.params = params
        self._sign = sign
        self._metric = metric
        self._b_sum = 0.0
        self._b_weight = 0
        self._b_n = 0
        self._blocks: deque[float] = deque(maxlen=params.level_blocks)
        self.level: float | None = None
        """The metric's level: the median of the last block means (``None`` until enough blocks)."""
        self.best: float | None = None
        """The best level (for blow-ups)."""
        self.best_step = 0
        """The step of :attr:`best`."""
        self._blow_since: float | None = None
        # the fast divergence rules (orders of magnitude above the running best, or doubling per window)
        self._recent: deque[float] = deque(maxlen=params.diverge_smooth)
        self._fast_best: tuple[float, int] | None = None  # (best median of recent window means, its step)
        self._prev_mean: float | None = None
        self._orders_run: list[tuple[float, int]] = []  # (time, step) of the windows in a row over the bound
        self._grow_run: list[tuple[float, int]] = []
        self._fast: dict[str, Any] | None = None  # the evidence while the fast rules hold
        self._nan_since: float | None = None
        self._nan_step = 0
        self._nan_value = math.nan
        self._clean = 0  # finite windows since the last non-finite one

    def observe_values(self, t: float, step: int, last: float, nonfinite: int) -> str | None:
        """A window's non-finite count and last value: a NaN or an Inf diverges at once; enough finite
        windows after it end that (the sentence of the recovery)."""
        if nonfinite > 0 or not math.isfinite(last):
            if self._nan_since is None:
                self._nan_since, self._nan_step = t, step
                self._nan_value = last if not math.isfinite(last) else math.nan
            self._clean = 0
        elif self._nan_since is not None:
            self._clean += 1
            if self._clean >= self.params.nonfinite_recover_windows:
                self._nan_since = None
                return f"{self._metric} is finite again"
        return None

    def observe_mean(self, t: float, step: int, mean: float) -> str | None:
        """A finite window mean, for the fast rules of a minimised metric (the sentence of a recovery)."""
        return self._fast_divergence(t, step, mean) if self._sign > 0 else None

    def observe_block(self, t: float, step: int, mean: float, weight: int) -> str | None:
        """A finite window mean of ``weight`` values into the level's blocks (the sentence of a recovery
        from a blow-up, when a new level ends one)."""
        self._b_sum += mean * weight
        self._b_weight += weight
        self._b_n += 1
        if self._b_n >= self.params.block_windows:
            self._blocks.append(self._b_sum / self._b_weight)
            self._b_sum, self._b_weight, self._b_n = 0.0, 0, 0
            if len(self._blocks) == self.params.level_blocks:
                return self._new_level(t, step)
        return None

    def _fast_divergence(self, t: float, step: int, mean: float) -> str | None:
        """The fast divergence rules of a minimised metric, one finite window mean at a time: the mean
        ``10 ** diverge_orders`` times its running best for ``diverge_windows`` windows in a row, or
        growing ``diverge_growth`` times per window for ``diverge_windows`` + 1 windows in a row while
        above 10 x that best. Both compare window means (many steps each) with a best that is a median
        of window means, so neither a lucky window nor a one-window spike decides."""
        p = self.params
        found = self._fast_best
        prev = self._prev_mean
        self._prev_mean = mean
        recovered = None
        if found is not None and found[0] > 0:
            best, best_step = found
            ratio = mean / best
            if ratio >= 10**p.diverge_orders:
                self._orders_run.append((t, step))
            else:
                self._orders_run.clear()
            if ratio >= 10 and prev is not None and prev > 0 and mean >= p.diverge_growth * prev:
                self._grow_run.append((t, step))
            else:
                self._grow_run.clear()
            rule = None
            if len(self._orders_run) >= p.diverge_windows:
                rule, run = "orders", self._orders_run
            elif len(self._grow_run) >= p.diverge_windows + 1:
                rule, run = "growth", self._grow_run
            if rule is not None and self._fast is None:
                since, since_step = run[0]
                self._fast = {"rule": rule, "since": since, "since_step": since_step}
                self._fast.update(best=best, best_step=best_step)
            if self._fast is not None:
                self._fast.update(observed=mean, step=step, ratio=ratio)
                if ratio < 10:
                    recovered = f"{self._metric} is back within 10x its best"
                    self._fast = None
            if ratio >= 10:
                return recovered  # a window of a blow-up makes no best
        self._recent.append(mean)
        level = median(self._recent)
        if found is None or level < found[0]:
            self._fast_best = (level, step)
        return recovered

    def _new_level(self, t: float, step: int) -> str | None:
        ordered = sorted(self._blocks)
        half = len(ordered) // 2
        level = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
        self.level = level
        sign = self._sign
        best = self.best
        if best is None or sign * level < sign * best:
            self.best, self.best_step = level, step
            best = level
        threshold = self._blow_threshold(best)
        if threshold is not None and sign * level > sign * threshold:
            if self._blow_since is None:
                self._blow_since = t
        elif self._blow_since is not None:
            self._blow_since = None
            return f"{self._metric} came back under the blow-up threshold"
        return None

    def _blow_threshold(self, best: float) -> float | None:
        k = self.params.diverge_factor
        if best == 0 or k <= 1:
            return None
        if self._sign > 0:
            return best * k if best > 0 else best + (k - 1) * abs(best)
        return best / k if best > 0 else best - (1 - 1 / k) * abs(best)

    def verdict(self, report_interval: Callable[[], float]) -> Verdict | None:
        """``diverging`` with its evidence, or ``None``; ``report_interval`` gives the job's usual report
        interval, which the level's window is told in."""
        m = self._metric
        if self._nan_since is not None:
            value = "NaN" if math.isnan(self._nan_value) else ("Inf" if self._nan_value > 0 else "-Inf")
            message = f"{m} became non-finite ({value}) at step {self._nan_step:,}"
            ev = evidence(m, {"windows": 1}, "finite", value, self._nan_since, message)
            return Verdict("diverging", self._nan_since, ev)
        if self._fast is not None:
            return self._fast_verdict(self._fast)
        if self._blow_since is not None and self.best is not None and self.level is not None:
            threshold = self._blow_threshold(self.best)
            word = "above" if self._sign > 0 else "below"
            message = (
                f"{m} level {num(self.level)} is {word} {self.params.diverge_factor:g}x its best "
                f"({num(self.best)} at step {self.best_step:,})"
            )
            p = self.params
            window = {"seconds": round(p.block_windows * p.level_blocks * report_interval(), 1)}
            ev = evidence(m, window, threshold, self.level, self._blow_since, message, best=self.best)
            return Verdict("diverging", self._blow_since, ev)
        return None

    def _fast_verdict(self, fast: dict[str, Any]) -> Verdict:
        m = self._metric
        orders = math.log10(fast["ratio"]) if fast["ratio"] > 0 else 0.0
        steps = fast["step"] - fast["since_step"]
        if fast["rule"] == "orders":
            why = f"{orders:.1f} orders of magnitude above its best"
        else:
            growth = self.params.diverge_growth
            why = f"{growth:g}x or more per report for {steps:,} steps, {fast['ratio']:.3g}x its best"
        message = (
            f"{m} climbs: {num(fast['observed'])} at step {fast['step']:,}, {why} "
            f"({num(fast['best'])} at step {fast['best_step']:,}), since step {fast['since_step']:,}"
        )
        threshold = fast["best"] * (10**self.params.diverge_orders if fast["rule"] == "orders" else 10)
        ev = evidence(
            m,
            {"windows": self.params.diverge_windows, "steps": steps},
            threshold,
            fast["observed"],
            fast["since"],
            message,
            best=fast["best"],
            best_step=fast["best_step"],
            step=fast["step"],
            since_step=fast["since_step"],
            ratio=fast["ratio"],
            rule=fast["rule"],
        )
        return Verdict("diverging", fast["since"], ev)
