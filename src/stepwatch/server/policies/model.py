"""What a policy says: on which trigger which action, a budget, a deadline, dry run, the metric to follow.

A policy is a JSON object, set per job (at registration, ``stepwatch run --on ...``, or
``PUT .../jobs/{name}/policy``), per namespace (``PUT /api/v1/namespaces/{ns}/policy``) and for the
whole server (``STEPWATCH_POLICY``). Each layer says only what it changes; the job's layer wins over
its namespace's, which wins over the server's, key by key (and trigger by trigger under ``on``)::

    {
      "on": {"not_learning": "checkpoint_stop", "diverging": "stop", "stalled": "notify",
             "over_budget": "notify", "past_deadline": "checkpoint_stop", "late": "notify",
             "finished": "notify", "failed": "notify"},
      "budget": 250.0,                      # USD; over_budget once spent reaches it
      "deadline": "2026-12-07T09:00:00Z",   # or Unix seconds; past_deadline at it, late when the ETA passes it
      "dry_run": true,                      # record what would have been done, do nothing
      "metric": "eval_loss", "mode": "min", # what health follows (default: loss, lower is better)
      "notify": ["https://hooks.example.com/stepwatch"],  # more targets for this job or namespace
      "max_at_risk": 50.0, "auto_checkpoint": true,       # checkpoint advice (analysis/checkpoint.py)
      "checkpoint_cost_s": 60, "mtbf_hours": 24
    }

An action of ``"none"`` switches off what a lower layer set.

Setting a layer that stands (``PUT .../policy``, ``stepwatch policy set``) merges into it, as a JSON
merge patch (RFC 7396) would: each key given replaces that key (trigger by trigger under ``on``; a
``notify`` list replaces the list), ``null`` removes a key, and what is not named stays — see
:func:`merge_layer`. A replace, only when asked (``"replace": true`` in the body, or ``?replace=true``),
puts the layer given in place of the one that stands; ``{}`` alone clears the layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...protocol import LIMITS, POLICY_ACTIONS, POLICY_HEALTH_TRIGGERS, POLICY_NOTIFY_ONLY, POLICY_TRIGGERS
from ..views.bodyspec import Body, BodyError, Field

__all__ = [
    "ACTIONS",
    "HEALTH_TRIGGERS",
    "NOTIFY_ONLY",
    "POLICY",
    "TRIGGERS",
    "Policy",
    "PolicyError",
    "merge_layer",
    "parse_policy",
]

HEALTH_TRIGGERS = POLICY_HEALTH_TRIGGERS
NOTIFY_ONLY = POLICY_NOTIFY_ONLY
TRIGGERS = POLICY_TRIGGERS
ACTIONS = POLICY_ACTIONS
"""``checkpoint_stop`` queues a checkpoint then a stop command; ``stop`` a stop command. Every action
also notifies. The local runner ends a job that has not stopped by itself after its grace period."""

MAX_TARGETS = 8
MAX_MONEY = 1e12
"""Largest budget or money at risk."""
MAX_DURATION = 1e9
"""Largest checkpoint time (seconds) or MTBF (hours)."""
DEFAULT_CHECKPOINT_COST_S = 60.0
DEFAULT_MTBF_HOURS = 24.0

_ON = Body(
    "",
    tuple(
        Field(key=trigger, type="string", choices=("none", "notify") if trigger in NOTIFY_ONLY else ACTIONS)
        for trigger in TRIGGERS
    ),
    closed=True,
)
POLICY = Body(
    "Policy",
    (
        Field(
            key="on",
            type="object",
            body=_ON,
            description="trigger: action (finished, failed and late can only be notified; none switches off "
            "what a lower layer set)",
            example={"not_learning": "checkpoint_stop", "diverging": "stop"},
        ),
        Field(
            key="budget",
            type="number",
            above=0,
            maximum=MAX_MONEY,
            description="money; over_budget once spent reaches it",
            example=250.0,
        ),
        Field(
            key="deadline",
            type="time",
            description="past_deadline at it, late when the ETA passes it",
            example="2026-12-07T09:00:00Z",
        ),
        Field(key="dry_run", type="boolean", description="record what would be done, do nothing"),
        Field(
            key="metric",
            type="string",
            min_length=1,
            max_length=LIMITS.max_metric_name_length,
            printable=True,
            description="the metric health follows (default: loss)",
            example="eval_loss",
        ),
        Field(key="mode", type="string", choices=("min", "max"), description="min: lower is better (the default)"),
        Field(
            key="notify",
            type="array",
            items=Field(
                key="",
                type="string",
                min_length=1,
                max_length=2048,
                what="a target URL",
                example="https://hooks.example.com/stepwatch",
            ),
            max_items=MAX_TARGETS,
            description="more notification targets (webhook or Apprise URLs) for this job or namespace",
            what="a list of target URLs",
        ),
        Field(
            key="max_at_risk",
            type="number",
            above=0,
            maximum=MAX_MONEY,
            description="money of work the owner accepts to lose at a failure: checkpoint advice keeps under it",
        ),
        Field(key="auto_checkpoint", type="boolean", description="send a checkpoint command when one is due"),
        Field(
            key="checkpoint_cost_s",
            type="number",
            above=0,
            maximum=MAX_DURATION,
            description=f"seconds a checkpoint takes (default {DEFAULT_CHECKPOINT_COST_S:g}), for the Young/Daly "
            "interval",
        ),
        Field(
            key="mtbf_hours",
            type="number",
            above=0,
            maximum=MAX_DURATION,
            description=f"mean time between failures of the job's hardware in hours (default {DEFAULT_MTBF_HOURS:g})",
        ),
    ),
    description="One layer of policy (job over namespace over server, key by key); see docs/policies.md",
    closed=True,
)
"""A policy layer, declared once: :func:`parse_policy` reads it, OpenAPI shows it."""


class PolicyError(ValueError):
    """A policy that cannot be used; ``field`` names the culprit (``on.stalled``, ``budget``...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Policy:
    """One layer of policy, or the effective one once layers are merged (``None``: not said here)."""

    on: dict[str, str] = field(default_factory=dict)
    budget: float | None = None
    deadline: float | None = None
    dry_run: bool | None = None
    metric: str | None = None
    mode: str | None = None
    notify: tuple[str, ...] = ()
    max_at_risk: float | None = None
    """Money of work the owner accepts to lose at a failure: checkpoint advice keeps under it."""
    auto_checkpoint: bool | None = None
    """Send a checkpoint command when the advice says one is due."""
    checkpoint_cost_s: float | None = None
    """How long a checkpoint takes (default 60 s), for the Young/Daly interval."""
    mtbf_hours: float | None = None
    """Mean time between failures of the job's hardware (default 24 h), for the Young/Daly interval."""
    origin: dict[str, str] = field(default_factory=dict, compare=False)
    """Which layer set each action under ``on`` (``job``, ``namespace``, ``server``)."""

    def over(self, base: Policy, layer: str) -> Policy:
        """This layer laid over ``base``: what this one says wins."""
        return Policy(
            on={**base.on, **self.on},
            budget=_first(self.budget, base.budget),
            deadline=_first(self.deadline, base.deadline),
            dry_run=_first(self.dry_run, base.dry_run),
            metric=self.metric or base.metric,
            mode=self.mode or base.mode,
            notify=tuple(dict.fromkeys((*base.notify, *self.notify))),
            max_at_risk=_first(self.max_at_risk, base.max_at_risk),
            auto_checkpoint=_first(self.auto_checkpoint, base.auto_checkpoint),
            checkpoint_cost_s=_first(self.checkpoint_cost_s, base.checkpoint_cost_s),
            mtbf_hours=_first(self.mtbf_hours, base.mtbf_hours),
            origin={**base.origin, **dict.fromkeys(self.on, layer)},
        )

    def action(self, trigger: str) -> str:
        """What to do on a trigger (``none`` when nothing is set)."""
        return self.on.get(trigger, "none")

    @property
    def is_dry_run(self) -> bool:
        """Whether actions are only recorded."""
        return bool(self.dry_run)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (only what is said)."""
        out: dict[str, Any] = {}
        if self.on:
            out["on"] = dict(sorted(self.on.items(), key=lambda kv: TRIGGERS.index(kv[0])))
        for key in (
            "budget",
            "deadline",
            "dry_run",
            "metric",
            "mode",
            "max_at_risk",
            "auto_checkpoint",
            "checkpoint_cost_s",
            "mtbf_hours",
        ):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.notify:
            out["notify"] = list(self.notify)
        return out

    def with_origin(self, layer: str) -> Policy:
        """The same layer, its actions marked as set by ``layer``."""
        return replace(self, origin=dict.fromkeys(self.on, layer))


def parse_policy(data: object) -> Policy:
    """Validate a policy object (one layer) against :data:`POLICY`; :class:`PolicyError` names the field."""
    try:
        said = POLICY.read(data)
    except BodyError as exc:
        raise PolicyError(exc.field or "policy", exc.message) from None
    on = said.pop("on") or {}
    notify = said.pop("notify") or ()
    return Policy(on={t: a for t, a in on.items() if a is not None}, notify=tuple(notify), **said)


def _first(value: Any, fallback: Any) -> Any:
    return value if value is not None else fallback


def merge_layer(stands: Mapping[str, Any] | None, patch: Mapping[str, Any]) -> dict[str, Any]:
    """``patch`` laid into the layer that ``stands`` (both JSON objects), as a JSON merge patch: a key given
    replaces that key (trigger by trigger under ``on``), ``null`` removes it, a key not named stays.

    Neither is validated here: check ``patch`` with :func:`parse_policy` first (it reads ``null`` as not
    given), then the result (a layer that was valid stays valid: each key is checked on its own)."""
    merged = dict(stands or {})
    for key, value in patch.items():
        if key == "on" and isinstance(value, Mapping):
            on = dict(merged.get("on") or {})
            for trigger, action in value.items():
                if action is None:
                    on.pop(trigger, None)
                else:
                    on[trigger] = action
            if on:
                merged["on"] = on
            else:
                merged.pop("on", None)
        elif value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged
