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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ...protocol import (
    POLICY_ACTIONS,
    POLICY_HEALTH_TRIGGERS,
    POLICY_NOTIFY_ONLY,
    POLICY_TRIGGERS,
    is_valid_metric_name,
)

__all__ = [
    "ACTIONS",
    "HEALTH_TRIGGERS",
    "NOTIFY_ONLY",
    "TRIGGERS",
    "Policy",
    "PolicyError",
    "parse_policy",
]

HEALTH_TRIGGERS = POLICY_HEALTH_TRIGGERS
NOTIFY_ONLY = POLICY_NOTIFY_ONLY
TRIGGERS = POLICY_TRIGGERS
ACTIONS = POLICY_ACTIONS
"""``checkpoint_stop`` queues a checkpoint then a stop command; ``stop`` a stop command. Every action
also notifies. The local runner ends a job that has not stopped by itself after its grace period."""

MAX_TARGETS = 8
_KEYS = (
    "on",
    "budget",
    "deadline",
    "dry_run",
    "metric",
    "mode",
    "notify",
    "max_at_risk",
    "auto_checkpoint",
    "checkpoint_cost_s",
    "mtbf_hours",
)
DEFAULT_CHECKPOINT_COST_S = 60.0
DEFAULT_MTBF_HOURS = 24.0


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
    """Validate a policy object (one layer); :class:`PolicyError` names the field."""
    if not isinstance(data, dict):
        raise PolicyError("policy", f"must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise PolicyError(str(unknown[0]), f"unknown key; a policy has {', '.join(_KEYS)}")
    return Policy(
        on=_on(data.get("on")),
        budget=_positive(data.get("budget"), "budget", "an amount of money"),
        deadline=_deadline(data.get("deadline")),
        dry_run=_bool(data.get("dry_run"), "dry_run"),
        metric=_metric(data.get("metric")),
        mode=_mode(data.get("mode")),
        notify=_targets(data.get("notify")),
        max_at_risk=_positive(data.get("max_at_risk"), "max_at_risk", "an amount of money"),
        auto_checkpoint=_bool(data.get("auto_checkpoint"), "auto_checkpoint"),
        checkpoint_cost_s=_positive(data.get("checkpoint_cost_s"), "checkpoint_cost_s", "seconds"),
        mtbf_hours=_positive(data.get("mtbf_hours"), "mtbf_hours", "hours"),
    )


def _on(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PolicyError("on", "must be an object of trigger: action")
    out = {}
    for trigger, action in value.items():
        where = f"on.{trigger}"
        if trigger not in TRIGGERS:
            raise PolicyError(where, f"unknown trigger; one of {', '.join(TRIGGERS)}")
        if action not in ACTIONS:
            raise PolicyError(where, f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        if trigger in NOTIFY_ONLY and action not in ("none", "notify"):
            raise PolicyError(where, f"{trigger} can only be notified (none or notify), not {action}")
        out[trigger] = action
    return out


def _first(value: Any, fallback: Any) -> Any:
    return value if value is not None else fallback


def _positive(value: object, name: str, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PolicyError(name, f"must be a positive finite number ({what}), got {value!r}")
    return float(value)


def _deadline(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise PolicyError("deadline", f"must be a time (Unix seconds or RFC 3339), got {value!r}")
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise PolicyError("deadline", f"not an RFC 3339 time: {value[:64]!r}") from None
        if when.tzinfo is None:
            raise PolicyError("deadline", f"give a time zone (Z or +01:00): {value[:64]!r}")
        return when.timestamp()
    raise PolicyError("deadline", f"must be a time (Unix seconds or RFC 3339), got {type(value).__name__}")


def _bool(value: object, name: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise PolicyError(name, f"must be true or false, got {value!r}")


def _metric(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not is_valid_metric_name(value):
        raise PolicyError("metric", "must be a metric name (1-64 printable characters)")
    return value


def _mode(value: object) -> str | None:
    if value is None or value in ("min", "max"):
        return value
    raise PolicyError("mode", f"must be min (lower is better) or max, got {value!r}")


def _targets(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and 0 < len(v) <= 2048 for v in value):
        raise PolicyError("notify", "must be a list of target URLs")
    if len(value) > MAX_TARGETS:
        raise PolicyError("notify", f"at most {MAX_TARGETS} targets, got {len(value)}")
    return tuple(value)
