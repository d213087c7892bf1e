"""Jobs as HTML for notebooks: a card for one job, a table for many, each with a progress bar.

Every string that comes from a job (names, metric names, health evidence, reasons) is escaped: a job
named by anyone must not run script in the notebook of someone who lists it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._job import Job

__all__ = ["job_html", "jobs_html", "progress_bar"]

_HEALTH_COLOURS = {
    "healthy": "#1a7f37",
    "stalled": "#bf8700",
    "not_learning": "#bf8700",
    "straggling": "#bf8700",
    "diverging": "#cf222e",
    "unknown": "#6e7781",
}
_STATE_COLOURS = {"running": "#0969da", "finished": "#1a7f37", "failed": "#cf222e", "stopped": "#9a6700"}
_MAX_ROWS = 500
"""A notebook table shows at most this many jobs (the list itself keeps them all)."""


def _duration(seconds: float | None) -> str:
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


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"


def _money(value: float | None, currency: str) -> str:
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


def _badge(text: str, colour: str) -> str:
    return (
        f'<span style="padding:0 .4em;border-radius:.3em;border:1px solid {colour};color:{colour}">'
        f"{escape(text)}</span>"
    )


def _step(job: Job) -> str:
    p = job.progress
    if p.step is None:
        return "-"
    return f"{p.step}/{p.total_steps}" if p.total_steps else str(p.step)


def job_html(job: Job) -> str:
    """One job: name, state, health (with its evidence), progress bar, step, epoch, ETA, metrics, cost."""
    p, health, cost = job.progress, job.health, job.cost
    colour = _HEALTH_COLOURS.get(health.state, "#6e7781")
    epoch = "-" if p.epoch is None else (f"{p.epoch:g}/{p.total_epochs:g}" if p.total_epochs else f"{p.epoch:g}")
    metrics = "".join(
        f"<tr><td>{escape(name)}</td><td>{_number(value)}</td></tr>" for name, value in sorted(job.metrics.items())[:32]
    )
    why = f"<div><i>{escape(health.message)}</i></div>" if health.message else ""
    reason = f"<div>reason: {escape(job.reason)}</div>" if job.reason else ""
    return (
        '<div class="stepwatch-job" style="font-family:system-ui,sans-serif;line-height:1.5">'
        f"<div><b>{escape(job.namespace)}/{escape(job.name)}</b> #{job.attempt} "
        f"{_badge(job.state, _STATE_COLOURS.get(job.state, '#6e7781'))} {_badge(health.state, colour)}</div>"
        f"{progress_bar(job.progress.percent, colour)}"
        + (f"<div>{escape(job.ended_short)}</div>" if job.ended_short else "")
        + f"<div>step {_step(job)} · epoch {escape(epoch)} · ETA {_duration(job.eta.remaining_seconds)}"
        f" · loss {_number(job.loss)}</div>"
        f"<div>cost: spent {_money(cost.spent, cost.currency)} · projected {_money(cost.projected, cost.currency)}"
        f" · wasted {_money(cost.wasted, cost.currency)}</div>"
        f"{why}{reason}" + (f'<table style="font-size:.9em">{metrics}</table>' if metrics else "") + "</div>"
    )


def jobs_html(jobs: Sequence[Job]) -> str:
    """A table of jobs with a progress bar each."""
    head = "".join(
        f"<th>{h}</th>" for h in ("job", "state", "health", "progress", "step", "ETA", "loss", "spent", "wasted")
    )
    rows = []
    for job in jobs[:_MAX_ROWS]:
        colour = _HEALTH_COLOURS.get(job.health.state, "#6e7781")
        rows.append(
            "<tr>"
            f"<td>{escape(job.namespace)}/{escape(job.name)}</td>"
            f"<td>{_badge(job.state, _STATE_COLOURS.get(job.state, '#6e7781'))}</td>"
            f"<td>{_badge(job.health.state, colour)}</td>"
            f"<td>{progress_bar(job.progress.percent, colour, '8em')}</td>"
            f"<td>{_step(job)}</td><td>{_duration(job.eta.remaining_seconds)}</td><td>{_number(job.loss)}</td>"
            f"<td>{_money(job.cost.spent, job.cost.currency)}</td><td>{_money(job.cost.wasted, job.cost.currency)}</td>"
            "</tr>"
        )
    more = f"<p>and {len(jobs) - _MAX_ROWS} more</p>" if len(jobs) > _MAX_ROWS else ""
    return (
        '<table class="stepwatch-jobs" style="font-family:system-ui,sans-serif">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"
        if jobs
        else "<p>no jobs</p>"
    )
