"""A job's verdict history: every health it had, each with its time span, kept with the job.

The job row holds its current health (``health``, ``health_since``, ``health_evidence``) and, in
``health_history``, one span per verdict it had, oldest first (the current one open, ``to`` unset).
:func:`next_history` is the one place the spans change: the store calls it in ``set_health``, in
the same transaction as the change of health, so a verdict's span is never lost when the job
recovers or ends, and the cost it wasted (``analysis.cost.wasted_seconds``) never shrinks.

A span is a JSON object: ``state``; ``from`` (server time it was recorded); ``since`` (when the
analysis says it began: for ``not_learning`` the last real improvement, earlier than ``from``);
``to`` (when another verdict replaced it; ``None`` while it stands: it then ends when the job ends,
or now); ``message`` (the evidence's sentence) and ``rank`` where one is named.
A job recorded before the history existed starts it from its stored health (nothing is lost).
"""

from __future__ import annotations

from typing import Any

from ..analysis.cost import WASTEFUL_HEALTH

__all__ = ["MAX_SPANS", "next_history"]

MAX_SPANS = 500
"""Spans kept per job: past it the oldest spans without waste (healthy, straggling) go first."""


def _span(state: str, since: float | None, start: float, evidence: dict[str, Any]) -> dict[str, Any]:
    span: dict[str, Any] = {
        "state": state,
        "from": start,
        "since": since,
        "to": None,
        "message": str(evidence.get("message") or ""),
    }
    if evidence.get("rank") is not None:
        span["rank"] = evidence["rank"]
    return span


def _reworded(history: list[dict[str, Any]], evidence: dict[str, Any]) -> list[dict[str, Any]]:
    if not history or history[-1].get("to") is not None or history[-1].get("state") == "unknown":
        return history
    fresh = _span(str(history[-1]["state"]), history[-1].get("since"), 0.0, evidence)
    last = history[-1]
    if fresh["message"] == last.get("message") and fresh.get("rank") == last.get("rank"):
        return history
    spans = [*history[:-1], {**{k: v for k, v in last.items() if k != "rank"}, "message": fresh["message"]}]
    if "rank" in fresh:
        spans[-1]["rank"] = fresh["rank"]
    return spans


def next_history(
    history: list[dict[str, Any]],
    old: tuple[str, float | None, dict[str, Any]],
    new: tuple[str, float | None, dict[str, Any]],
    now: float,
) -> list[dict[str, Any]]:
    """The spans after a job's health goes from ``old`` to ``new`` (each ``(state, since, evidence)``)
    at server time ``now``. When the state is the same, the open span takes the new evidence's words and
    rank (the evidence is rewritten as the verdict holds: how long a rank has stood, where); the same list
    when they did not change either."""
    old_state, old_since, old_evidence = old
    state, since, evidence = new
    if state == old_state:
        return _reworded(history, evidence)
    spans = [dict(s) for s in history]
    if not spans and old_state != "unknown":  # recorded before the history: its health as it was
        spans.append(_span(old_state, old_since, old_since if old_since is not None else now, old_evidence))
    if spans and spans[-1].get("to") is None:
        spans[-1]["to"] = now
    if state != "unknown":
        spans.append(_span(state, since, now, evidence))
    while len(spans) > MAX_SPANS:
        cheap = next((i for i, s in enumerate(spans[:-1]) if s.get("state") not in WASTEFUL_HEALTH), 0)
        del spans[cheap]
    return spans
