"""The OpenAPI schema of a job view (``GET .../jobs/{name}`` and the list's items): what each figure means,
as :mod:`stepwatch.server.views.figures` computes it (one rule per figure, every reader shows it as sent),
and what a health verdict's evidence holds — for a verdict by where each rank stands (issue 29), the rank,
what it does and the frames of its own code in words. Kept beside :mod:`.openapi`, which serves it.
"""

from __future__ import annotations

from typing import Any

from ...protocol import ACTIVITIES, HEALTH_STATES

__all__ = ["EVIDENCE_SCHEMA", "JOB_SCHEMA"]

_NUM = {"oneOf": [{"type": "number"}, {"enum": ["NaN", "Infinity", "-Infinity"]}]}
_NULL_NUM = {"type": ["number", "null"]}
_NULL_INT = {"type": ["integer", "null"]}
_TIME = {"type": ["number", "null"], "description": "Unix seconds (server time)"}
_RANKS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_SHARES = {
    "type": ["object", "null"],
    "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1},
    "description": f"activity -> share of the rank's time (0..1), smoothed over its recent reports; activities: "
    f"{', '.join(ACTIVITIES)}",
}


def _d(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {**schema, "description": description}


EVIDENCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "Why the verdict holds. Every verdict has metric, window, threshold, observed, since and message (one "
        "line a person reads: every reader shows it as is — dashboard panel and list tooltip, `stepwatch "
        "describe` and `watch`, the SDK's Health.message, events, notifications). A stall whose report core "
        "read where its ranks stand names the rank holding the others and its place in words: 'rank 1 has "
        "stood 36 s after step 29 in wait_for_lock (train.py:31), waiting (threading.Lock.acquire); rank 0 "
        "waits for it in torch.distributed.all_reduce'. A straggler (metric rank_pace) names its rank, host, "
        "how many times slower it is, where its extra time goes and what the job would gain without it. "
        "Fields are added as the analysis learns more: ignore those you do not know. See docs/health.md."
    ),
    "properties": {
        "metric": _d(
            {"type": ["string", "null"]},
            "what was measured: a metric name (loss), step (a rank's step "
            "stands), reports (reports stopped) or rank_pace (a straggler)",
        ),
        "window": _d({"type": ["object", "null"]}, "the span looked at: seconds, steps, windows"),
        "threshold": _d(
            _NULL_NUM,
            "the limit the observed value was held to: seconds for step and reports, "
            "times slower than the median rank for rank_pace (1.5)",
        ),
        "observed": _d(_NULL_NUM, "the value measured: seconds the step has stood, times slower, ..."),
        "since": _TIME,
        "message": _d({"type": "string"}, "the verdict in words, rank and place included"),
        "rank": _d({"type": "integer", "minimum": 0}, "the rank named: the one holding the others, the straggler"),
        "step": _d({"type": "integer", "minimum": 0}, "the step the rank stands after"),
        "step_time": _d(_NULL_NUM, "the rank's usual (p99) step time, seconds"),
        "kind": _d(
            {"enum": ["hang", "busy", "patient"]},
            "what the rank stands in: hang (its own code, a lock "
            "or its loader, or a collective while another rank does), busy (a training step), patient (a "
            "save or an evaluation, allowed max(30 min, 4x its longest finished one))",
        ),
        "activity": _d({"enum": list(ACTIVITIES)}, "what its main thread does, read from its stack"),
        "detail": _d(
            {"type": "string"},
            "the library call that decided the activity (torch.save, "
            "torch.distributed.all_reduce, threading.Lock.acquire)",
        ),
        "frames": _d(
            {"type": "array", "items": {"type": "string"}},
            "the innermost frames of the user's own code, "
            "innermost first, as 'function (file:line)', paths relative to the working directory",
        ),
        "place": _d(
            {"type": "string"},
            "where it stands in words (in the message already): 'in wait_for_lock "
            "(train.py:31), waiting (threading.Lock.acquire)'",
        ),
        "holding": _d(_RANKS, "the ranks standing outside a collective, that the others wait for"),
        "waiting": _d(_RANKS, "the ranks waiting for them (in a collective)"),
        "ranks_standing": _d(_RANKS, "ranks whose step stands (jobs of several ranks only)"),
        "phase": _d({"type": "string"}, "eval while the rank says it evaluates"),
        "eval_seconds": _d({"type": "number"}, "seconds it has evaluated"),
        "host": _d({"type": "string"}, "a straggler's host (empty when its reports do not say)"),
        "ratio": _d(_NULL_NUM, "how many times slower than the median rank the straggler is (null: infinitely)"),
        "speedup_without": _d(_NULL_NUM, "how many times faster the job would run without the straggler"),
        "activity_shares": _d(_SHARES, "where the straggler's time goes"),
        "median_activity_shares": _d(_SHARES, "where the median rank's time goes"),
        "hint": _d(
            {"type": "string"},
            "the elastic hint in words (in the message already): 'without rank 2 the "
            "job would run 3.0x faster, ETA 2 h 24 min instead of 7 h 13 min'",
        ),
        "final": _d({"type": "boolean"}, "true on an ended job's final judgement (its message says how it ended)"),
        "recovered_from": _d({"type": "string"}, "the bad state a healthy verdict follows"),
    },
    "additionalProperties": True,
}

_PROGRESS = {
    "type": "object",
    "properties": {
        "percent": _d(
            _NULL_NUM,
            "the shown value: one decimal, rounded down (9.96 reads 9.9, 99.99 reads 99.9); "
            "100 only for a job that reached its total and ended; readers print it as is and draw bars "
            "from it, never round it again. A percentage an upstream Kubeflow client posted is as posted",
        ),
        "step": _NULL_INT,
        "total_steps": _NULL_INT,
        "epoch": _NULL_NUM,
        "total_epochs": _NULL_NUM,
        "samples": _NULL_INT,
        "steps_per_second": _d(
            _NULL_NUM,
            "the live rate; null when the job is stalled or has ended (a rate "
            "measured before it stopped moving is not its rate now: readers show —)",
        ),
        "samples_per_second": _d(_NULL_NUM, "as steps_per_second: null when stalled or ended"),
        "world_size": _NULL_INT,
    },
}

_COST = {
    "type": "object",
    "description": "null figures are unknown (no price), not free",
    "properties": {
        "currency": {"type": "string"},
        "rate_per_hour": _d(
            _NULL_NUM, "its price per hour while it runs; null once it has ended (what it spent stays)"
        ),
        "spent": _NULL_NUM,
        "projected": _d(_NULL_NUM, "spent plus the rate over the ETA"),
        "wasted": _d(
            _NULL_NUM, "the sum of health_history[].wasted: the time it stood stalled, not learning or diverging"
        ),
        "wasted_since": _TIME,
        "saved": _d(_NULL_NUM, "what its policy's stop saved"),
    },
}

_SPAN = {
    "type": "object",
    "description": (
        "One verdict the job had. from and to: when it was recorded and replaced (to is null while it stands); "
        "since: where the analysis says it began (for not_learning the last real improvement). start and end: "
        "the time it covers on the job's health timeline — the spans cover the job's elapsed time without "
        "overlap or gap (a verdict that reaches back cuts the earlier one short; a time with no verdict is a "
        "span of state unknown); seconds = end - start; cost and wasted for that time (null: no price)."
    ),
    "properties": {
        "state": {"enum": list(HEALTH_STATES)},
        "from": _TIME,
        "to": _TIME,
        "since": _TIME,
        "message": {"type": ["string", "null"]},
        "rank": _NULL_INT,
        "start": _d({"type": "number"}, "where the span begins on the timeline (Unix seconds)"),
        "end": _d({"type": "number"}, "where it ends: the next span's start, or now / the job's end"),
        "seconds": {"type": "number", "minimum": 0},
        "cost": _NULL_NUM,
        "wasted": _NULL_NUM,
    },
}

JOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "namespace": {"type": "string"},
        "name": {"type": "string"},
        "attempt": {"type": "integer"},
        "state": {"type": "string"},
        "progress": _PROGRESS,
        "eta": {"type": "object"},
        "times": {"type": "object"},
        "metrics": _d({"type": "object", "additionalProperties": _NUM}, "the last value of each metric"),
        "metric_means": _d(
            {"type": "object", "additionalProperties": _NUM},
            "the mean of each metric's latest window (what the list's LOSS shows, smoother than the last batch); "
            "for the metrics in metrics only; {} before a window arrived",
        ),
        "health": {
            "type": "object",
            "properties": {
                "state": {"enum": list(HEALTH_STATES)},
                "since": _TIME,
                "evidence": EVIDENCE_SCHEMA,
            },
        },
        "cost": _COST,
        "health_history": _d({"type": "array", "items": _SPAN}, "full views: every verdict, oldest first"),
    },
    "additionalProperties": True,
}
"""A job view; its description is set by :mod:`.openapi`."""
