"""A job's verdict history: every health it had, each with its time span, kept with the job.

The job row holds its current health (``health``, ``health_since``, ``health_evidence``); the table
``health_spans`` holds one span per verdict it had, oldest first (the current one open, ``to`` unset),
the span at position ``seq`` of the list a job reads as ``Job.health_history``. :func:`next_history` is
the one place the spans change, and :func:`write_spans` writes what it changed: the store calls both in
``set_health``, in the same transaction as the change of health, so a verdict's span is never lost when
the job recovers or ends, and the cost it wasted (``analysis.cost.wasted_seconds``) never shrinks.

Why a table of their own: in the job's row (schema versions 7 to 11) the spans were rewritten with the
row at every report, which SQLite stores whole: a job whose health changed hundreds of times cost
100-600 µs more a report (``benchmarks/job_row_cost.py``). Now a report writes none of them, and a change
of health writes the spans that changed (usually one or two rows).

A span is a JSON object: ``state``; ``from`` (server time it was recorded); ``since`` (when the
analysis says it began: for ``not_learning`` the last real improvement, earlier than ``from``);
``to`` (when another verdict replaced it; ``None`` while it stands: it then ends when the job ends,
or now); ``message`` (the evidence's sentence) and ``rank`` where one is named.
A job recorded before the history existed starts it from its stored health (nothing is lost).
"""

from __future__ import annotations

from typing import Any

from ..analysis.cost import WASTEFUL_HEALTH
from .rows import span_text
from .sql_dialect import Connection

__all__ = ["MAX_SPANS", "next_history", "write_spans"]

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


def write_spans(conn: Connection, job_id: int, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """Make a job's rows of ``health_spans`` hold ``new`` where they held ``old`` (its spans before and after
    :func:`next_history`), writing only the spans that changed.

    The rows keep the spans' order by ``seq``, which may have gaps: a span dropped past :data:`MAX_SPANS` loses its
    row and the others keep theirs. Only the rows from the first span that differs on are looked at (their ``seq``,
    read newest first): a change of health closes the open span and adds one (an update and an insert), new words
    rewrite the open span (an update), the cap drops one row more.
    """
    first = next((i for i, (was, now) in enumerate(zip(old, new, strict=False)) if was != now), min(len(old), len(new)))
    if first == len(old) == len(new):
        return
    rest_old, rest_new = old[first:], new[first:]
    rows = conn.execute(
        "SELECT seq FROM health_spans WHERE job_id = ? ORDER BY seq DESC LIMIT ?", (job_id, max(len(rest_old), 1))
    ).fetchall()
    seqs = [int(r[0]) for r in reversed(rows)] if rest_old else []
    top = int(rows[0][0]) if rows else -1
    if len(rest_old) > 1 and rest_new and rest_old[1] == rest_new[0]:  # the span at ``first`` was dropped (the cap)
        conn.execute("DELETE FROM health_spans WHERE job_id = ? AND seq = ?", (job_id, seqs[0]))
        rest_old, seqs = rest_old[1:], seqs[1:]
    pairs = zip(seqs, rest_old, rest_new, strict=False)
    updates = [(span_text(span), job_id, seq) for seq, was, span in pairs if was != span]
    if updates:
        conn.executemany("UPDATE health_spans SET span = ? WHERE job_id = ? AND seq = ?", updates)
    added = rest_new[len(seqs) :]
    if added:
        conn.executemany(
            "INSERT INTO health_spans (job_id, seq, span) VALUES (?, ?, ?)",
            [(job_id, top + 1 + k, span_text(span)) for k, span in enumerate(added)],
        )
    if len(rest_new) < len(seqs):
        conn.execute("DELETE FROM health_spans WHERE job_id = ? AND seq >= ?", (job_id, seqs[len(rest_new)]))
