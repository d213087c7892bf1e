"""Policies: what to do when a job goes bad, runs over budget or past its deadline (see ``model``)."""

from .decide import Decision, decide, rearmed
from .enforce import Notify, PolicyBook, PolicyEngine
from .model import ACTIONS, HEALTH_TRIGGERS, NOTIFY_ONLY, TRIGGERS, Policy, PolicyError, parse_policy

__all__ = [
    "ACTIONS",
    "HEALTH_TRIGGERS",
    "NOTIFY_ONLY",
    "TRIGGERS",
    "Decision",
    "Notify",
    "Policy",
    "PolicyBook",
    "PolicyEngine",
    "PolicyError",
    "decide",
    "parse_policy",
    "rearmed",
]
