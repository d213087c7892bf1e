"""Kubeflow Trainer's ``trainerStatus`` (KEP-2779), as upstream's status server reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ._checks import (
    _array,
    _check_optional_int,
    _check_str,
    _object,
    _required,
)
from ._errors import ProtocolError, _prefix
from ._limits import LIMITS
from ._values import parse_rfc3339, validate_metric_name

__all__ = ["INT32_MAX", "KubeflowMetric", "TrainerStatus"]


INT32_MAX: Final = 2**31 - 1
"""Upstream's ``estimatedRemainingSeconds`` and ``progressPercentage`` are ``int32``: larger is invalid."""


@dataclass(frozen=True)
class KubeflowMetric:
    """One upstream metric: a name and a string value, each 1..64 characters."""

    name: str
    value: str

    def __post_init__(self) -> None:
        validate_metric_name(self.name)
        _check_str(self.value, "value", LIMITS.max_metric_value_length)


@dataclass(frozen=True)
class TrainerStatus:
    """The upstream ``trainerStatus``: each POST replaces the whole status of the TrainJob."""

    progress_percentage: int | None = None
    estimated_remaining_seconds: int | None = None
    metrics: tuple[KubeflowMetric, ...] = ()
    last_updated_time: str | None = None

    def __post_init__(self) -> None:
        _check_optional_int(self.progress_percentage, "progressPercentage", minimum=0, maximum=100)
        _check_optional_int(self.estimated_remaining_seconds, "estimatedRemainingSeconds", minimum=0, maximum=INT32_MAX)
        if len(self.metrics) > LIMITS.max_metrics_per_report:
            raise ProtocolError("metrics", f"at most {LIMITS.max_metrics_per_report} metrics, got {len(self.metrics)}")
        if self.last_updated_time is not None:
            parse_rfc3339(self.last_updated_time, "lastUpdatedTime")

    def to_body(self) -> dict[str, Any]:
        """The request body ``{"trainerStatus": {...}}``, without the fields that are unknown."""
        status: dict[str, Any] = {}
        if self.progress_percentage is not None:
            status["progressPercentage"] = self.progress_percentage
        if self.estimated_remaining_seconds is not None:
            status["estimatedRemainingSeconds"] = self.estimated_remaining_seconds
        if self.metrics:
            status["metrics"] = [{"name": m.name, "value": m.value} for m in self.metrics]
        if self.last_updated_time is not None:
            status["lastUpdatedTime"] = self.last_updated_time
        return {"trainerStatus": status}

    @classmethod
    def from_request(cls, data: object) -> TrainerStatus | None:
        """Validate and read the body of a POST to the status endpoint as upstream's status server does
        (``UpdateTrainJobStatusRequest`` and the TrainJob CRD's markers): ``None`` for a request without
        a status (``{}``, ``"trainerStatus": null``: upstream answers 200 and changes nothing); a status
        must carry its ``lastUpdatedTime``."""
        outer = _object(data, "")
        if outer.get("trainerStatus") is None:
            return None
        status = _object(outer["trainerStatus"], "trainerStatus")
        if status.get("lastUpdatedTime") is None:
            raise ProtocolError("trainerStatus.lastUpdatedTime", "is required when trainerStatus is present")
        return cls.from_body(outer)

    @classmethod
    def from_body(cls, data: object) -> TrainerStatus:
        """Validate and read a body ``{"trainerStatus": {...}}`` (``lastUpdatedTime`` may be left out)."""
        outer = _object(data, "")
        status = _object(_required(outer, "trainerStatus"), "trainerStatus")
        with _prefix("trainerStatus"):
            listed = status.get("metrics")  # null is no metrics, as upstream's decoder reads it
            metrics = _array([] if listed is None else listed, "metrics", LIMITS.max_metrics_per_report)
            parsed = []
            for i, m in enumerate(metrics):
                obj = _object(m, f"metrics[{i}]")
                with _prefix(f"metrics[{i}]"):
                    parsed.append(KubeflowMetric(name=_required(obj, "name"), value=_required(obj, "value")))
            return cls(
                progress_percentage=status.get("progressPercentage"),
                estimated_remaining_seconds=status.get("estimatedRemainingSeconds"),
                metrics=tuple(parsed),
                last_updated_time=status.get("lastUpdatedTime"),
            )
