"""What a job's policy asks for now: pure, from the job, its cost, its ETA and the clock.

A stop for ``stalled`` acts only on what is sure (issue 29): the stall's evidence is a reading of where
the ranks stand (a rank hung in its own code, a lock, its data loader, or a collective that does not
complete) or reports that stopped entirely; it never stops a rank that saves a checkpoint or evaluates
(it notifies instead, and says why). A stall seen from steps alone (a report core that cannot sample its
stack) is notified, not stopped: a slow step and a hang look the same there.

A trigger acts once: what a policy did is kept with the job (``policy_fired``), and a trigger that has
acted stays quiet until its condition ends (a health trigger is re-armed when the job is healthy again,
so that a second plateau acts again). A job that is already being stopped gets no second stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ...protocol import ENDED_STATES
from ..analysis.cost import Cost
from ..store.base import Job
from .model import HEALTH_TRIGGERS, Policy

__all__ = ["Decision", "decide", "rearmed", "stopping", "unsure_stall"]

_COMMANDS = {"checkpoint_stop": ("checkpoint", "stop"), "stop": ("stop",), "notify": ()}
_DOING = {"notify": "notify", "checkpoint_stop": "checkpoint, then stop", "stop": "stop"}


@dataclass(frozen=True)
class Decision:
    """One action a policy takes on one trigger."""

    trigger: str
    action: str
    dry_run: bool
    reason: str
    """Why, in one sentence (the condition and its evidence)."""
    saved: float | None
    """Money a stop saves: the cost rate times the time the job still had to run (``None``: unknown)."""
    layer: str

    @property
    def commands(self) -> tuple[tuple[str, str], ...]:
        """The commands to queue, ``(kind, reason)`` in order (none in a dry run)."""
        if self.dry_run:
            return ()
        return tuple((kind, f"policy: {self.reason}") for kind in _COMMANDS[self.action])

    @property
    def message(self) -> str:
        """The event's sentence."""
        doing = _DOING[self.action]
        by = f"by the {self.layer} policy" if self.layer else "by policy"
        if self.dry_run:
            return f"dry run: would {doing} ({by}): {self.reason}"
        return f"{doing} ({by}): {self.reason}"

    def fired(self, now: float) -> dict[str, Any]:
        """What is kept with the job (and is the event's data)."""
        return {
            "t": now,
            "action": self.action,
            "dry_run": self.dry_run,
            "reason": self.reason,
            "saved": self.saved,
            "layer": self.layer,
        }


def decide(policy: Policy, job: Job, cost: Cost, remaining: float | None, now: float) -> list[Decision]:
    """The actions the policy takes now (each trigger once; see the module docstring)."""
    live = job.state not in ENDED_STATES
    being_stopped = stopping(job)
    decisions = []
    for trigger, reason in _conditions(policy, job, cost, remaining, now, live):
        action = policy.action(trigger)
        if action == "none" or trigger in job.policy_fired:
            continue
        if action != "notify" and (not live or being_stopped):
            action = "notify"  # an ended job is not stopped, and a job being stopped is not stopped twice
        if action != "notify" and trigger == "stalled":
            unsure = unsure_stall(job.health_evidence)
            if unsure:
                action, reason = "notify", f"{reason} (not stopped: {unsure})"  # noqa: PLW2901
        saved = None
        if action != "notify" and cost.rate_per_hour is not None and remaining is not None:
            saved = cost.rate_per_hour * remaining / 3600.0
        dry_run = policy.is_dry_run
        decisions.append(Decision(trigger, action, dry_run, reason, saved, policy.origin.get(trigger, "")))
        if action != "notify" and not dry_run:
            being_stopped = True
    return decisions


def unsure_stall(evidence: dict[str, Any]) -> str:
    """Why a stall's evidence is not sure enough to stop the job on (empty: it is sure).

    Sure: the reports stopped entirely (``metric`` ``reports`` or ``heartbeats``), or a reading of where
    the ranks stand names a hang (``kind`` ``hang``) or a step standing far past its tail while computing
    or in a collective (``kind`` ``busy`` with an ``activity``). Not sure: a save or an evaluation
    (``kind`` ``patient``, or any rank in one), or a step that stands with no reading of where."""
    metric = evidence.get("metric")
    if metric in ("reports", "heartbeats"):
        return ""
    kind = evidence.get("kind")
    if (
        kind == "patient"
        or evidence.get("activity") in ("checkpointing", "evaluating")
        or evidence.get("phase") == "eval"
    ):
        return "a rank is saving a checkpoint or evaluating; the stop waits it out"
    if kind == "hang" or (kind == "busy" and evidence.get("activity")):
        return ""
    return "its reports say only that the step stands, not where; a slow step and a hang look the same"


def stopping(job: Job) -> bool:
    """Whether the job's policy has already asked it to stop (not in a dry run)."""
    return any(
        f.get("action") in ("stop", "checkpoint_stop") and not f.get("dry_run") for f in job.policy_fired.values()
    )


def rearmed(job: Job) -> tuple[str, ...]:
    """Health triggers to forget: the job is healthy again, so its next bad spell acts again."""
    if job.health != "healthy":
        return ()
    return tuple(t for t in HEALTH_TRIGGERS if t in job.policy_fired)


def _conditions(
    policy: Policy, job: Job, cost: Cost, remaining: float | None, now: float, live: bool
) -> list[tuple[str, str]]:
    found = []
    if job.health in HEALTH_TRIGGERS and live:
        message = str(job.health_evidence.get("message") or job.health.replace("_", " "))
        found.append((job.health, message))
    if policy.budget is not None and cost.spent is not None and cost.spent >= policy.budget:
        found.append(("over_budget", f"spent {cost.spent:.2f} of a budget of {policy.budget:.2f}"))
    if policy.deadline is not None and live:
        if now >= policy.deadline:
            found.append(("past_deadline", f"still {job.state} at its deadline {_when(policy.deadline)}"))
        elif remaining is not None and now + remaining > policy.deadline:
            found.append(("late", f"its ETA {_when(now + remaining)} is past its deadline {_when(policy.deadline)}"))
    if job.state in ("finished", "failed"):
        found.append((job.state, job.reason or job.state))
    return found


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
