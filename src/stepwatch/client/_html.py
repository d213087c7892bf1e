"""The pieces of a job's HTML in a notebook: colours, badges, a progress bar, numbers and durations.

The card of one job and the table of many are drawn by :mod:`._job` (``Job._repr_html_``) from these.
Every string that comes from a job (names, metric names, health evidence, reasons) is escaped: a job
named by anyone must not run script in the notebook of someone who lists it.
"""

from __future__ import annotations

import math
from html import escape

__all__ = ["HEALTH_COLOURS", "MAX_ROWS", "STATE_COLOURS", "badge", "duration", "money", "number", "progress_bar"]

HEALTH_COLOURS = {
    "healthy": "#1a7f37",
    "stalled": "#bf8700",
    "not_learning": "#bf8700",
    "straggling": "#bf8700",
    "diverging": "#cf222e",
    "unknown": "#6e7781",
}
STATE_COLOURS = {"running": "#0969da", "finished": "#1a7f37", "failed": "#cf222e", "stopped": "#9a6700"}
MAX_ROWS = 500
"""A notebook table shows at most this many jobs (the list itself keeps them all)."""


def duration(seconds: float | None) -> str:
    """Seconds as a short duration (``42s``, ``3m07s``, ``5h02m``, ``2d03h``); ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    total = max(round(seconds), 0)
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 24 else f"{hours // 24}d{hours % 24:02d}h"


def number(value: float | None) -> str:
    """A metric value to four digits (``NaN``, ``Inf``, ``-Inf`` said so); ``-`` when there is none."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"


def money(value: float | None, currency: str) -> str:
    """An amount with its (escaped) currency; ``-`` when unknown."""
    return "-" if value is None else f"{value:,.2f} {escape(currency)}"


def progress_bar(percent: float | None, colour: str = "#0969da", width: str = "12em") -> str:
    """A bar of ``percent`` (grey and empty when unknown) with the figure beside it."""
    shown = "-" if percent is None else f"{percent:.1f}%"
    fill = 0.0 if percent is None or not math.isfinite(percent) else max(0.0, min(100.0, percent))
    return (
        f'<div style="display:flex;align-items:center;gap:.5em">'
        f'<div style="width:{width};height:.8em;background:#e5e7eb;border-radius:.4em;overflow:hidden">'
        f'<div style="width:{fill:.1f}%;height:100%;background:{colour}"></div></div>'
        f"<span>{shown}</span></div>"
    )


def badge(text: str, colour: str) -> str:
    """``text`` (escaped) in a rounded frame of ``colour``."""
    return (
        f'<span style="padding:0 .4em;border-radius:.3em;border:1px solid {colour};color:{colour}">'
        f"{escape(text)}</span>"
    )
