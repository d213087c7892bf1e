"""History reads: stored windows downsampled to what a chart can show, extremes and NaNs kept."""

from __future__ import annotations

from typing import Any

from .store import SeriesPoint
from .views import json_float

__all__ = ["downsampled"]


def downsampled(points: list[SeriesPoint], max_points: int) -> list[dict[str, Any]]:
    """At most ``max_points`` JSON points; placeholder bucketing until analysis.downsample lands."""
    if len(points) > max_points:
        size = -(-len(points) // max_points)
        merged = []
        for i in range(0, len(points), size):
            bucket = points[i : i + size]
            mins = [p.min for p in bucket if p.min is not None]
            maxs = [p.max for p in bucket if p.max is not None]
            finite = sum(p.count - p.nonfinite for p in bucket)
            total = sum((p.mean or 0.0) * (p.count - p.nonfinite) for p in bucket)
            merged.append(
                SeriesPoint(
                    step=bucket[-1].step,
                    t=bucket[-1].t,
                    last=bucket[-1].last,
                    min=min(mins) if mins else None,
                    max=max(maxs) if maxs else None,
                    mean=total / finite if finite else None,
                    count=sum(p.count for p in bucket),
                    nonfinite=sum(p.nonfinite for p in bucket),
                )
            )
        points = merged
    return [
        {
            "step": p.step,
            "t": p.t,
            "last": json_float(p.last),
            "min": p.min,
            "max": p.max,
            "mean": p.mean,
            "count": p.count,
            "nonfinite": p.nonfinite,
        }
        for p in points
    ]
