"""History reads: stored windows downsampled to what a chart can show, extremes and NaNs kept."""

from __future__ import annotations

from typing import Any

from .analysis import downsample_columns
from .store import SeriesColumns
from .views import json_float

__all__ = ["downsampled"]


def downsampled(series: SeriesColumns, max_points: int) -> list[dict[str, Any]]:
    """At most ``max_points`` JSON points of a series (see :func:`analysis.downsample_columns`)."""
    c = downsample_columns(
        series.steps,
        series.times,
        series.lasts,
        series.mins,
        series.maxs,
        series.means,
        series.counts,
        series.nonfinites,
        max_points,
        first_steps=series.first_steps,
        windows=series.windows,
    )
    return [
        {
            "step": c.steps[i],
            "first_step": c.first_steps[i],
            "t": c.times[i],
            "last": json_float(c.lasts[i]),
            "min": c.mins[i],
            "max": c.maxs[i],
            "mean": c.means[i],
            "count": c.counts[i],
            "nonfinite": c.nonfinites[i],
            "windows": c.windows[i],
        }
        for i in range(len(c))
    ]
