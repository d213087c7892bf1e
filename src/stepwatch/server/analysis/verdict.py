"""A job's health at one time (:class:`Verdict`), its evidence, and the words its sentences use.

Shared by the rules behind :class:`~.health.HealthTracker` (:mod:`.divergence`, :mod:`.stall_rules`,
:mod:`.learning`), each of which says its verdict in the same shape: ``metric``, ``window``,
``threshold``, ``observed``, ``since`` and ``message`` (one sentence), and what else it knows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Verdict", "dur", "evidence", "num", "pct", "signed"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A job's health at one time, with the evidence for it (JSON-ready)."""

    state: str
    """One of :data:`~.health.HEALTH_STATES`."""
    since: float | None
    """Server time the state began (for ``not_learning``: the last real improvement)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """``metric``, ``window``, ``threshold``, ``observed``, ``since`` and ``message`` (one sentence)."""


def evidence(
    metric: str, window: Any, threshold: Any, observed: Any, since: float | None, message: str, **more: Any
) -> dict[str, Any]:
    """A verdict's evidence: the common fields first, then what the rule adds."""
    return {
        "metric": metric,
        "window": window,
        "threshold": threshold,
        "observed": observed,
        "since": since,
        "message": message,
        **more,
    }


def signed(x: float) -> str:
    """A relative change for a sentence: '-0.3%', '+1.2%' (an improvement is positive)."""
    return f"{x * 100:+.2g}%"


def num(x: float) -> str:
    """A metric value for a sentence: 4 significant digits."""
    return f"{x:.4g}"


def dur(seconds: float) -> str:
    """A duration for a sentence: '45 s', '12 min', '2.5 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def pct(x: float) -> str:
    """A share for a sentence: '1%', '0.5%'."""
    return f"{x * 100:.3g}%"
