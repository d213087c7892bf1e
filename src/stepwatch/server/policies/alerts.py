"""A policy's decisions as notifications: one message per decision, to the server's and the policy's targets."""

from __future__ import annotations

import functools
import logging
from typing import Any

from ..notify import Notification, Notifier, NotifyTarget, TargetRules, check_target, parse_targets
from ..store import Job
from ..views.figures import cost_of, remaining_seconds
from .decide import Decision
from .enforce import Notify
from .model import HEALTH_TRIGGERS, PolicyError

__all__ = ["DEFAULT_NOTIFY_ON", "check_targets", "notification_for", "notify_hook"]

_log = logging.getLogger("stepwatch.server")

DEFAULT_NOTIFY_ON = {
    "stalled": "notify",
    "not_learning": "notify",
    "diverging": "notify",
    "failed": "notify",
    "late": "notify",
}
"""The server's layer when notification targets are configured and ``STEPWATCH_POLICY`` says nothing:
configuring a webhook and hearing nothing would be a surprise."""

_KIND = {"finished": "finished", "failed": "failed", "late": "deadline", "past_deadline": "deadline"}


def notification_for(job: Job, decision: Decision, now: float, base_url: str | None = None) -> Notification:
    """The message about one decision of a job's policy."""
    if decision.action != "notify":
        kind = "action"
    else:
        kind = _KIND.get(decision.trigger, "health" if decision.trigger in HEALTH_TRIGGERS else "action")
    what = decision.trigger.replace("_", " ")
    title = f"{job.key} {what}" + ("" if decision.action == "notify" else f": {decision.message.split(' (')[0]}")
    remaining = remaining_seconds(job, now)
    data: dict[str, Any] = {
        "state": job.state,
        "health": job.health,
        "trigger": decision.trigger,
        "action": decision.action,
        "evidence": job.health_evidence,
        "cost": cost_of(job, now, remaining).to_dict(),
        "saved": decision.saved,
        "progress": {"step": job.step, "total_steps": job.total_steps, "eta_seconds": remaining},
    }
    if base_url:
        data["url"] = f"{base_url.rstrip('/')}/#/jobs/{job.namespace}/{job.name}"
    return Notification(
        kind=kind,  # type: ignore[arg-type]
        namespace=job.namespace,
        job=job.name,
        attempt=job.attempt,
        title=title,
        message=decision.message,
        key=f"{job.id}:{decision.trigger}:{now:.0f}",
        data=data,
    )


def check_targets(urls: tuple[str, ...], secret: str | None, rules: TargetRules | None = None) -> None:
    """Refuse policy targets the notifier could not use, or that point where policies may not send
    (``rules``: loopback, private and link-local addresses unless allowed): :class:`PolicyError` on ``notify``.
    Resolves the targets' names: call it off the event loop."""
    try:
        for target in _targets(urls, secret):
            if rules is not None:
                rules.check(target.url)
            check_target(target)
    except (ValueError, ImportError) as exc:
        raise PolicyError("notify", str(exc)) from None


def notify_hook(notifier: Notifier, secret: str | None, base_url: str | None = None) -> Notify:
    """The :class:`~.enforce.PolicyEngine` hook: hand each decision to the notifier (never blocks)."""

    def notify(job: Job, decision: Decision, urls: tuple[str, ...], now: float) -> None:
        try:
            extra = _targets(urls, secret) if urls else ()
        except ValueError as exc:  # checked when set: a stored one that no longer parses is logged
            _log.error("the notification targets of %s's policy are ignored: %s", job.key, exc)
            extra = ()
        targets = tuple(dict.fromkeys((*notifier.targets, *extra)))
        if targets:
            notifier.notify(notification_for(job, decision, now, base_url), targets)

    return notify


@functools.lru_cache(maxsize=256)
def _targets(urls: tuple[str, ...], secret: str | None) -> tuple[NotifyTarget, ...]:
    return parse_targets(",".join(urls), secret)
