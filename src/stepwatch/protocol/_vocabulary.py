"""The words of the wire: the API version, job and report states, command kinds, phases, activities, and
what policies act on and do."""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "ACTIVITIES",
    "API_VERSION",
    "COMMAND_KINDS",
    "ENDED_STATES",
    "HEALTH_STATES",
    "JOB_SORT_KEYS",
    "JOB_STATES",
    "PHASES",
    "POLICY_ACTIONS",
    "POLICY_HEALTH_TRIGGERS",
    "POLICY_NOTIFY_ONLY",
    "POLICY_TRIGGERS",
    "REPORT_STATES",
    "CommandKind",
    "ReportState",
]


API_VERSION: Final = "v1"

ReportState = Literal["running", "finished", "failed", "stopped"]
CommandKind = Literal["stop", "checkpoint"]
REPORT_STATES: Final[tuple[str, ...]] = ("running", "finished", "failed", "stopped")
JOB_STATES: Final[tuple[str, ...]] = ("pending", "running", "finished", "failed", "stopped")
"""A job's lifecycle, as the API shows it (``pending`` until its first report)."""
ENDED_STATES: Final[frozenset[str]] = frozenset({"finished", "failed", "stopped"})
"""The states a job ends in; its progress then stays its real step over its total."""
HEALTH_STATES: Final[tuple[str, ...]] = ("healthy", "stalled", "not_learning", "diverging", "straggling", "unknown")
"""A job's health, as the API shows it (``unknown`` until it can be judged)."""
JOB_SORT_KEYS: Final[tuple[str, ...]] = ("name", "namespace", "state", "progress", "step", "created", "updated", "eta")
"""What job lists can be sorted by (``-`` first for descending)."""
COMMAND_KINDS: Final[tuple[str, ...]] = ("stop", "checkpoint")
PHASES: Final[tuple[str, ...]] = ("train", "eval")
"""What a rank may say it is doing (``Progress.phase``): training, or evaluating (its step stands)."""
ACTIVITIES: Final[tuple[str, ...]] = (
    "computing",
    "communicating",
    "loading_data",
    "checkpointing",
    "evaluating",
    "waiting",
    "other",
)
"""What a rank's main thread is doing, read from its stack (:class:`Where`): framework compute
(forward, backward, optimizer), a collective or barrier, waiting on data, saving or loading a
checkpoint, evaluating, sleeping or waiting on a lock or queue, or anything else."""
POLICY_HEALTH_TRIGGERS: Final[tuple[str, ...]] = ("stalled", "not_learning", "diverging")
"""Policy triggers that are a job's health."""
POLICY_NOTIFY_ONLY: Final[tuple[str, ...]] = ("finished", "failed", "late")
"""Policy triggers that can only be notified (the job has ended, or its ETA is past its deadline)."""
POLICY_TRIGGERS: Final[tuple[str, ...]] = (*POLICY_HEALTH_TRIGGERS, "over_budget", "past_deadline", *POLICY_NOTIFY_ONLY)
"""What a policy can act on (see ``stepwatch.server.policies``)."""
POLICY_ACTIONS: Final[tuple[str, ...]] = ("none", "notify", "checkpoint_stop", "stop")
"""What a policy can do on a trigger."""
