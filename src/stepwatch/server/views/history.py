"""History reads: stored windows downsampled to what a chart can show, extremes and NaNs kept."""

from __future__ import annotations

from typing import Any

from ..analysis import downsample_columns
from ..store import SeriesColumns
from .serialisers import point_view

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
        point_view(
            c.steps[i],
            c.first_steps[i],
            c.times[i],
            c.lasts[i],
            c.mins[i],
            c.maxs[i],
            c.means[i],
            c.counts[i],
            c.nonfinites[i],
            c.windows[i],
        )
        for i in range(len(c))
    ]
