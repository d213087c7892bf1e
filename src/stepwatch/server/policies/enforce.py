"""Policies at work: the layers in memory, and the actions taken (events, commands, notifications).

:class:`PolicyBook` holds the server's and the namespaces' layers (read from the store at start, kept
when changed through the API) and gives a job its effective policy. :class:`PolicyEngine` reviews a job
(after each report, when it ends, and in the periodic sweep): what :func:`.decide.decide` asks for is
recorded atomically with the job (event ``policy``, commands queued for the reporter), published on the
live stream, and notified. A stop reaches the local runner as a stop command event: it gives the job its
grace period to checkpoint and stop, then terminates it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ...protocol import Command
from ..analysis.checkpoint import CheckpointAdvice, advise
from ..live.broadcaster import Broadcaster
from ..live.publish import publish_events
from ..store import Event, Job, Store
from ..store.offload import Offload
from ..views.figures import cost_of, remaining_seconds
from .decide import Decision, decide, rearmed, stopping
from .model import DEFAULT_CHECKPOINT_COST_S, DEFAULT_MTBF_HOURS, Policy, PolicyError, parse_policy

__all__ = ["Notify", "PolicyBook", "PolicyEngine", "checkpoint_advice"]

_log = logging.getLogger("stepwatch.server")

Notify = Callable[[Job, Decision, tuple[str, ...], float], None]
"""Hands a notification about a decision (the job, the decision, the policy's targets, the time) to the
notifier; never blocks."""


def checkpoint_advice(policy: Policy, job: Job, now: float) -> CheckpointAdvice | None:
    """The job's next checkpoint, when its policy asks for advice (``max_at_risk`` or ``auto_checkpoint``)."""
    if (policy.max_at_risk is None and not policy.auto_checkpoint) or job.started_at is None:
        return None
    if job.state not in ("pending", "running"):
        return None
    remaining = remaining_seconds(job, now)
    last = float(job.policy_fired.get("checkpoint", {}).get("t") or job.started_at)
    return advise(
        now=now,
        last=last,
        rate_per_hour=cost_of(job, now, remaining).rate_per_hour,
        remaining_s=remaining,
        max_at_risk=policy.max_at_risk,
        checkpoint_cost_s=policy.checkpoint_cost_s or DEFAULT_CHECKPOINT_COST_S,
        mtbf_s=(policy.mtbf_hours or DEFAULT_MTBF_HOURS) * 3600.0,
    )


class PolicyBook:
    """The server's and the namespaces' policy layers; a job's effective policy."""

    def __init__(self, server: Policy | None = None) -> None:
        self.server = (server or Policy()).with_origin("server")
        self._namespaces: dict[str, Policy] = {}
        self.check_targets: Callable[[tuple[str, ...]], None] = lambda urls: None
        """Refuses (:class:`PolicyError`) notification targets a policy names that cannot be used."""

    def load(self, stored: dict[str, dict[str, Any]]) -> None:
        """Take the namespaces' layers as stored (one that no longer parses is skipped, and logged)."""
        self._namespaces.clear()
        for namespace, data in stored.items():
            try:
                self._namespaces[namespace] = parse_policy(data)
            except PolicyError as exc:
                _log.error("the stored policy of namespace %s is ignored: %s", namespace, exc)

    def namespace(self, namespace: str) -> Policy | None:
        """A namespace's own layer."""
        return self._namespaces.get(namespace)

    def set_namespace(self, namespace: str, policy: Policy | None) -> None:
        """Replace (``None``: remove) a namespace's layer."""
        if policy is None:
            self._namespaces.pop(namespace, None)
        else:
            self._namespaces[namespace] = policy

    def effective(self, job: Job) -> Policy:
        """The job's layer over its namespace's over the server's."""
        policy = self.server
        ns = self._namespaces.get(job.namespace)
        if ns is not None:
            policy = ns.over(policy, "namespace")
        if job.policy:
            try:
                policy = parse_policy(job.policy).over(policy, "job")
            except PolicyError as exc:  # validated when set; a bad row must not stop the others
                _log.error("the stored policy of %s is ignored: %s", job.key, exc)
        return policy

    def metric_of(self, job: Job) -> tuple[str | None, str]:
        """The metric health follows for this job when its policy names one, and its direction."""
        policy = self.effective(job)
        return policy.metric, policy.mode or "min"


class PolicyEngine:
    """Reviews jobs against their policies and acts (see the module docstring)."""

    def __init__(
        self, book: PolicyBook, store: Store, live: Broadcaster, offload: Offload, notify: Notify | None = None
    ) -> None:
        self.book = book
        self.store = store
        self.live = live
        self.offload = offload
        self.notify = notify

    async def review(self, job: Job, now: float) -> Job:
        """Act on what the job's policy asks for now; the job as it then stands."""
        triggers = rearmed(job)
        if triggers:
            job = await self.offload(self.store.rearm, job.id, triggers, now)
        policy = self.book.effective(job)
        if not policy.on and not policy.auto_checkpoint:
            return job
        remaining = remaining_seconds(job, now)
        for decision in decide(policy, job, cost_of(job, now, remaining), remaining, now):
            job = await self._act(job, decision, policy, now)
        if policy.auto_checkpoint and job.state == "running" and not stopping(job):
            advice = checkpoint_advice(policy, job, now)
            if advice is not None and advice.due(now):
                job = await self._checkpoint(job, advice, policy, now)
        return job

    async def _checkpoint(self, job: Job, advice: CheckpointAdvice, policy: Policy, now: float) -> Job:
        at_risk = f"work at risk {advice.at_risk:.2f}" if advice.at_risk is not None else "no checkpoint"
        reason = f"{at_risk} since {time.strftime('%H:%M:%S UTC', time.gmtime(advice.last))}: {advice.reason}"
        dry = policy.is_dry_run
        message = ("dry run: would checkpoint" if dry else "checkpoint") + f" (by policy): {reason}"
        fired = {"t": now, "action": "checkpoint", "dry_run": dry, "reason": reason, "saved": None, "layer": ""}
        commands = () if dry else (("checkpoint", f"policy: {reason}"),)
        return await self._record(job, "checkpoint", fired, message, commands, now)

    async def _act(self, job: Job, decision: Decision, policy: Policy, now: float) -> Job:
        fired = decision.fired(now)
        job = await self._record(job, decision.trigger, fired, decision.message, decision.commands, now)
        if self.notify is not None and not decision.dry_run:
            try:
                self.notify(job, decision, policy.notify, now)
            except Exception:
                _log.exception("could not hand a notification about %s to the notifier", job.key)
        return job

    async def _record(
        self,
        job: Job,
        trigger: str,
        fired: dict[str, Any],
        message: str,
        commands: tuple[tuple[str, str], ...],
        now: float,
    ) -> Job:
        """Store an action on ``trigger`` with its commands, publish the events that appended; the job."""
        stored: tuple[tuple[Job, list[Command]], list[Event]] = await self.offload(
            self.store.with_events, self.store.act, job.id, trigger, fired, message, commands, now
        )
        (job, _), events = stored
        publish_events(self.live, events)
        return job
