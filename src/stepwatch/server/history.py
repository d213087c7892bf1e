"""History reads: stored windows downsampled to what a chart can show, extremes and NaNs kept."""

from __future__ import annotations

from typing import Any

from .analysis import downsample
from .store import SeriesPoint
from .views import json_float

__all__ = ["downsampled"]


def downsampled(points: list[SeriesPoint], max_points: int) -> list[dict[str, Any]]:
    """At most ``max_points`` JSON points per series (see :func:`analysis.downsample`)."""
    return [
        {
            "step": p.step,
            "first_step": p.first_step,
            "t": p.t,
            "last": json_float(p.last),
            "min": p.min,
            "max": p.max,
            "mean": p.mean,
            "count": p.count,
            "nonfinite": p.nonfinite,
            "windows": p.windows,
        }
        for p in downsample(points, max_points)
    ]
