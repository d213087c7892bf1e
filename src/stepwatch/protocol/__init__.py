"""The wire format between a training process and the stepwatch server, and its limits.

This module is the one place the format is defined. It imports nothing of the project and nothing
outside the standard library, so the report core, the server and the client can all share it.

Two message families live here:

* the **native report** (``POST /api/v1/namespaces/{ns}/jobs/{name}/reports``): one rank's identity,
  progress, a window of metric aggregates since its previous report, hyperparameters (once), the
  acknowledgement of commands it has seen, and its lifecycle state; answered by a
  :class:`ReportResponse` that carries the commands pending for the job;
* the **Kubeflow Trainer** ``trainerStatus`` of KEP-2779
  (``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status``), so that
  upstream clients work unchanged.

Every ``from_dict`` validates completely and raises :class:`ProtocolError` whose ``field`` names the
JSON path of the first problem (``metrics[3].name``) and whose message says what was expected.
Non-finite floats are data (they mean divergence): on the wire they are the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``, so that every body is standard JSON.

Whoever sends also waits the same way before trying again: :class:`Backoff` and
:func:`parse_retry_after` serve the report core's sender, the SDK and the server's notifier, each
with its own numbers.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = [
    "ACTIVITIES",
    "API_VERSION",
    "COMMAND_KINDS",
    "ENDED_STATES",
    "INT32_MAX",
    "JOB_SORT_KEYS",
    "JOB_STATES",
    "LIMITS",
    "PHASES",
    "POLICY_ACTIONS",
    "POLICY_HEALTH_TRIGGERS",
    "POLICY_NOTIFY_ONLY",
    "POLICY_TRIGGERS",
    "REPORT_STATES",
    "Backoff",
    "BodyTooLarge",
    "Command",
    "Frame",
    "GpuReading",
    "Identity",
    "KubeflowMetric",
    "Limits",
    "MetricWindow",
    "Progress",
    "ProtocolError",
    "Report",
    "ReportResponse",
    "TrainerStatus",
    "Where",
    "decode_body",
    "decode_float",
    "encode_body",
    "encode_float",
    "ended_short_text",
    "format_rfc3339",
    "is_valid_metric_name",
    "is_valid_name",
    "jobs_path",
    "kubeflow_status_path",
    "parse_retry_after",
    "parse_rfc3339",
    "report_path",
    "sanitize_name",
    "shown_percent",
    "validate_metric_name",
    "validate_name",
    "validate_params",
]

API_VERSION: Final = "v1"

ReportState = Literal["running", "finished", "failed", "stopped"]
CommandKind = Literal["stop", "checkpoint"]
REPORT_STATES: Final[tuple[str, ...]] = ("running", "finished", "failed", "stopped")
JOB_STATES: Final[tuple[str, ...]] = ("pending", "running", "finished", "failed", "stopped")
"""A job's lifecycle, as the API shows it (``pending`` until its first report)."""
ENDED_STATES: Final[frozenset[str]] = frozenset({"finished", "failed", "stopped"})
"""The states a job ends in; its progress then stays its real step over its total."""
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


@dataclass(frozen=True)
class Limits:
    """The one table of limits: enforced by the server, respected by the report core."""

    max_body_bytes: int = 64 * 1024
    """Largest request body, native or Kubeflow (upstream answers 413 above it)."""
    max_name_length: int = 63
    """Job and namespace names: Kubernetes DNS-1123 labels, so they can be TrainJob names."""
    max_metric_name_length: int = 64
    """Metric names are 1..64 printable characters (``train/loss``, ``rewards/chosen``)."""
    max_metrics_per_report: int = 256
    """Distinct metrics in one report (native windows or Kubeflow metrics)."""
    max_metric_value_length: int = 64
    """Kubeflow metric values are strings of 1..64 characters."""
    max_params: int = 128
    """Hyperparameters sent once per run."""
    max_param_key_length: int = 64
    max_param_value_length: int = 256
    """Longer string values are cut by the report core (with an ellipsis) rather than rejected."""
    max_reason_length: int = 256
    max_run_id_length: int = 64
    max_host_length: int = 253
    max_acks: int = 64
    max_commands: int = 16
    max_gpus_per_report: int = 64
    """GPU readings one rank sends (the GPUs its process sees)."""
    max_world_size: int = 1 << 20
    max_depth: int = 64
    """Deepest nesting of objects and arrays in a body (a report nests 3 deep): a deeper one, though
    parsed, could exhaust the stack later in any code that walks or prints it (that was a 500)."""
    max_integer: int = 2**53 - 1
    """Largest integer anywhere in a message (steps, counts, seq): what JavaScript reads exactly, and far
    inside the 64-bit integers the stores keep (a larger one was a 500 from the database driver)."""
    default_interval_s: float = 2.0
    """How often the report core sends to a stepwatch server."""
    min_kubeflow_interval_s: float = 5.0
    """Never send to an upstream Kubeflow endpoint more often than this (upstream's own pace)."""
    heartbeat_interval_factor: int = 5
    """Ranks other than 0 heartbeat this many times less often than rank 0 reports."""
    max_where_frames: int = 8
    """Frames of the user's own code in one :class:`Where` reading (innermost first)."""
    max_frame_function_length: int = 128
    max_frame_file_length: int = 256
    max_where_detail_length: int = 128


LIMITS: Final = Limits()

_NAME_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RUN_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]+")
_RFC3339_RE: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


class ProtocolError(ValueError):
    """A message does not follow the wire format; ``field`` is the JSON path of the first problem."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class BodyTooLarge(ProtocolError):
    """The body is larger than :attr:`Limits.max_body_bytes`."""


# --------------------------------------------------------------------------------------------------
# Names, floats, times
# --------------------------------------------------------------------------------------------------


def is_valid_name(name: object) -> bool:
    """Whether ``name`` is a valid job or namespace name (a Kubernetes DNS-1123 label)."""
    return isinstance(name, str) and len(name) <= LIMITS.max_name_length and bool(_NAME_RE.fullmatch(name))


def validate_name(name: object, field: str = "name") -> str:
    """Return ``name`` if it is a valid job or namespace name, else raise :class:`ProtocolError`."""
    if not is_valid_name(name):
        raise ProtocolError(
            field,
            f"must be 1-{LIMITS.max_name_length} lowercase letters, digits or '-', starting and ending "
            f"with a letter or digit (a Kubernetes name), got {_show(name)}",
        )
    assert isinstance(name, str)
    return name


def sanitize_name(text: str, fallback: str = "job") -> str:
    """Turn free text (a script name, ``My_Run v2``) into a valid job name (``my-run-v2``)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[: LIMITS.max_name_length].strip("-")
    return name or fallback


def is_valid_metric_name(name: object) -> bool:
    """Whether ``name`` is 1..64 printable characters (no control characters)."""
    return isinstance(name, str) and 0 < len(name) <= LIMITS.max_metric_name_length and name.isprintable()


def validate_metric_name(name: object, field: str = "name") -> str:
    """Return ``name`` if it is a valid metric name, else raise :class:`ProtocolError`."""
    if not isinstance(name, str):
        raise ProtocolError(
            field,
            f"a metric name must be a string of 1-{LIMITS.max_metric_name_length} printable characters, "
            f"got {_show(name)}",
        )
    if not is_valid_metric_name(name):
        raise ProtocolError(
            field,
            f"a metric name must be 1-{LIMITS.max_metric_name_length} printable characters "
            f"(no control characters), got {_show(name)}",
        )
    assert isinstance(name, str)
    return name


_NONFINITE_IN: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def shown_percent(value: float, ended: bool = False) -> float:
    """A percentage as every reader shows it: one decimal rounded down, within 0..100, and 100 only for a job
    that reached its total and ``ended`` (a job at 99.99 % reads 99.9; one at its last step but still running
    reads 99.9 until it ends). Rounded at the sixth decimal first, so that a float a hair under a tenth
    (``29.999999999999996``, ``2.3 * 10``) is not cut to the tenth below. The one rule: the server's figures,
    the CLI and :func:`ended_short_text` use it, the dashboard has a tested copy."""
    if not math.isfinite(value):
        return 0.0
    tenths = math.floor(round(max(0.0, min(100.0, value)) * 10, 6))
    return 100.0 if ended and tenths >= 1000 else min(tenths, 999) / 10


def ended_short_text(state: str, percent: float | None) -> str | None:
    """``"ended at 49.7%"`` for a job that ended (finished, failed or stopped) short of its total, else ``None``.

    Every reader (the CLI, the SDK, the dashboard's copy of this rule) says it the same way: a script
    that exits at step 199 of 400 ended at 49.7 % (:func:`shown_percent`: rounded down, never to 100.0,
    the job did not reach its total), whether the runner records it finished or failed.
    """
    if state not in ENDED_STATES or percent is None or not math.isfinite(percent) or percent >= 100.0:
        return None
    return f"ended at {shown_percent(percent):.1f}%"


def encode_float(value: float) -> float | str:
    """A float as it travels: itself when finite, else ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def decode_float(value: object, field: str) -> float:
    """Read a wire float: a JSON number or one of the three non-finite strings."""
    if isinstance(value, bool):
        raise ProtocolError(field, f"must be a number, got {_show(value)}")
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer literal beyond the largest float (JSON allows 4300 digits)
            raise ProtocolError(field, "must be a number within the range of a 64-bit float") from None
    if isinstance(value, str) and value in _NONFINITE_IN:
        return _NONFINITE_IN[value]
    raise ProtocolError(field, f"must be a number or 'NaN', 'Infinity', '-Infinity', got {_show(value)}")


def format_rfc3339(timestamp: float) -> str:
    """A Unix time as RFC 3339 in UTC with second precision (``2026-12-02T15:04:05Z``)."""
    moment = _dt.datetime.fromtimestamp(timestamp, tz=_dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object, field: str = "time") -> float:
    """Parse an RFC 3339 time (``Z`` or an offset, optional fraction up to nanoseconds) into Unix time."""
    match = _RFC3339_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ProtocolError(
            field, f"must be an RFC 3339 time like 2026-12-02T15:04:05Z or ...05.123+02:00, got {_show(text)}"
        )
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    offset = _dt.timedelta(0)
    if not zulu:
        offset = _dt.timedelta(hours=int(off_h), minutes=int(off_m)) * (1 if sign == "+" else -1)
    try:
        moment = _dt.datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            min(int(second), 59),  # a leap second reads as :59
            int((fraction or "0").ljust(6, "0")[:6]),
            tzinfo=_dt.timezone(offset),
        )
    except ValueError as exc:
        raise ProtocolError(field, f"must be a valid RFC 3339 time ({exc}), got {_show(text)}") from None
    return moment.timestamp()


# --------------------------------------------------------------------------------------------------
# Native report
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricWindow:
    """Aggregates of one metric since the previous report.

    ``count`` counts every value logged, ``nonfinite`` those that were NaN or ±Inf; ``min``,
    ``max`` and ``mean`` are over the finite values only (``None`` when there were none), and
    ``last`` is the last value, finite or not. ``first_step``..``last_step`` is the step range.
    """

    name: str
    last: float
    min: float | None
    max: float | None
    mean: float | None
    count: int
    nonfinite: int
    first_step: int
    last_step: int

    def __post_init__(self) -> None:
        validate_metric_name(self.name)
        if not isinstance(self.last, (int, float)) or isinstance(self.last, bool):
            raise ProtocolError("last", f"must be a number, got {_show(self.last)}")
        for name in ("min", "max", "mean"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise ProtocolError(name, f"must be a number or null, got {_show(value)}")
        _check_int(self.count, "count", minimum=1)
        _check_int(self.nonfinite, "nonfinite", minimum=0)
        if self.nonfinite > self.count:
            raise ProtocolError("nonfinite", f"must be at most count ({self.count}), got {self.nonfinite}")
        _check_int(self.first_step, "first_step", minimum=0)
        _check_int(self.last_step, "last_step", minimum=0)
        if self.first_step > self.last_step:
            raise ProtocolError("last_step", f"must be >= first_step ({self.first_step}), got {self.last_step}")
        finite = (self.min, self.max, self.mean)
        if self.nonfinite == self.count:
            if any(v is not None for v in finite):
                raise ProtocolError("min", "min, max and mean must be null when every value is non-finite")
            return
        for name, value in zip(("min", "max", "mean"), finite):
            if value is None or not math.isfinite(value):
                raise ProtocolError(name, f"must be a finite number when some values are finite, got {value!r}")
        assert self.min is not None and self.max is not None and self.mean is not None
        if not self.min <= self.max:
            raise ProtocolError("max", f"must be >= min ({self.min!r}), got {self.max!r}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this window."""
        return {
            "name": self.name,
            "last": encode_float(self.last),
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "count": self.count,
            "nonfinite": self.nonfinite,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }

    @classmethod
    def from_dict(cls, data: object, field: str = "metric") -> MetricWindow:
        """Validate and read one window."""
        if type(data) is dict:
            fast = _window_at_once(cls, data)
            if fast is not None:
                return fast
        return cls._field_by_field(data, field)

    @classmethod
    def _field_by_field(cls, data: object, field: str = "metric") -> MetricWindow:
        """The reading every body gets that the one-pass reader does not take (the reference its
        tests compare it with): each field checked in turn, errors with their JSON path."""
        obj = _object(data, field)
        with _prefix(field):
            return cls(
                name=_required(obj, "name"),
                last=decode_float(_required(obj, "last"), "last"),
                min=_optional_float(obj, "min"),
                max=_optional_float(obj, "max"),
                mean=_optional_float(obj, "mean"),
                count=_required(obj, "count"),
                nonfinite=obj.get("nonfinite", 0),
                first_step=_required(obj, "first_step"),
                last_step=_required(obj, "last_step"),
            )

    def merge(self, newer: MetricWindow) -> MetricWindow:
        """One window covering this one and a newer one of the same metric."""
        if newer.name != self.name:
            raise ProtocolError("name", f"cannot merge a window of {newer.name!r} into one of {self.name!r}")
        finite_self = self.count - self.nonfinite
        finite_new = newer.count - newer.nonfinite
        finite = finite_self + finite_new
        if finite_self and finite_new:
            assert self.min is not None and self.max is not None and self.mean is not None
            assert newer.min is not None and newer.max is not None and newer.mean is not None
            lo: float | None = min(self.min, newer.min)
            hi: float | None = max(self.max, newer.max)
            # a weighted step from the older mean: no overflow near the largest floats
            step = self.mean + (newer.mean - self.mean) * (finite_new / finite)
            if not math.isfinite(step):  # means of opposite signs near the largest floats: weigh each
                step = self.mean * (finite_self / finite) + newer.mean * (finite_new / finite)
            mean: float | None = step
        else:
            source = self if finite_self else newer
            lo, hi, mean = source.min, source.max, source.mean
        return MetricWindow(
            name=self.name,
            last=newer.last,
            min=lo,
            max=hi,
            mean=mean,
            count=self.count + newer.count,
            nonfinite=self.nonfinite + newer.nonfinite,
            first_step=min(self.first_step, newer.first_step),
            last_step=max(self.last_step, newer.last_step),
        )


@dataclass(frozen=True)
class Identity:
    """Who reports: one rank of one process of one run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host: str = ""
    pid: int = 0

    def __post_init__(self) -> None:
        _check_int(self.world_size, "world_size", minimum=1, maximum=LIMITS.max_world_size)
        _check_int(self.rank, "rank", minimum=0, maximum=self.world_size - 1)
        _check_int(self.local_rank, "local_rank", minimum=0, maximum=LIMITS.max_world_size)
        _check_str(self.host, "host", LIMITS.max_host_length, allow_empty=True)
        _check_int(self.pid, "pid", minimum=0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this identity."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "host": self.host,
            "pid": self.pid,
        }

    @classmethod
    def from_dict(cls, data: object, field: str = "identity") -> Identity:
        """Validate and read an identity."""
        if type(data) is dict:
            fast = _identity_at_once(cls, data)
            if fast is not None:
                return fast
        obj = _object(data, field)
        with _prefix(field):
            return cls(
                rank=obj.get("rank", 0),
                world_size=obj.get("world_size", 1),
                local_rank=obj.get("local_rank", 0),
                host=obj.get("host", ""),
                pid=obj.get("pid", 0),
            )


@dataclass(frozen=True)
class Progress:
    """Where a rank is: step of total, epoch of total, samples, and its recent pace.

    ``steps_per_second`` and ``samples_per_second`` are the recent rate measured by the reporter;
    ``step_time`` the recent seconds per step (heartbeats use it for straggler detection);
    ``eta_seconds`` is set only by jobs that know their own remaining time. ``phase`` says what the
    rank is doing: ``"eval"`` while it evaluates (its step stands by design; the server then allows a
    longer standstill), ``"train"`` or absent otherwise; ``phase_seconds`` is how long it has been in
    that phase, by the reporter's own monotonic clock (a duration, never a time of day). Both are
    optional: a server that does not know them ignores them, a report without them is training.
    """

    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    total_epochs: float | None = None
    samples: int | None = None
    steps_per_second: float | None = None
    samples_per_second: float | None = None
    step_time: float | None = None
    eta_seconds: float | None = None
    phase: str | None = None
    phase_seconds: float | None = None

    def __post_init__(self) -> None:
        _check_optional_int(self.step, "step", minimum=0)
        if self.phase is not None and self.phase not in PHASES:
            raise ProtocolError("phase", f"must be one of {', '.join(PHASES)}, got {_show(self.phase)}")
        _check_optional_int(self.total_steps, "total_steps", minimum=1)
        _check_optional_int(self.samples, "samples", minimum=0)
        _check_optional_number(self.epoch, "epoch", minimum=0.0)
        _check_optional_number(self.total_epochs, "total_epochs", minimum=0.0, strict=True)
        for name in ("steps_per_second", "samples_per_second", "step_time", "eta_seconds", "phase_seconds"):
            _check_optional_number(getattr(self, name), name, minimum=0.0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this progress, without the fields that are unknown."""
        return {k: v for k, v in _fields(self).items() if v is not None}

    @property
    def evaluating(self) -> float | None:
        """Seconds this rank has been evaluating (0 when it did not say how long), ``None`` while it trains."""
        if self.phase != "eval":
            return None
        return self.phase_seconds if self.phase_seconds is not None else 0.0

    @classmethod
    def from_dict(cls, data: object, field: str = "progress") -> Progress:
        """Validate and read a progress object."""
        if type(data) is dict:
            fast = _progress_at_once(cls, data)
            if fast is not None:
                return fast
        obj = _object(data, field)
        with _prefix(field):
            return cls(**{k: obj.get(k) for k in _PROGRESS_FIELDS})


_PROGRESS_FIELDS: Final = (
    "step",
    "total_steps",
    "epoch",
    "total_epochs",
    "samples",
    "steps_per_second",
    "samples_per_second",
    "step_time",
    "eta_seconds",
    "phase",
    "phase_seconds",
)


@dataclass(frozen=True)
class Frame:
    """One frame of a rank's own code: the function and where it stands (``file`` relative to the
    working directory when it lies under it). Nothing else of a frame leaves the process: no locals,
    no arguments."""

    function: str
    file: str
    line: int

    def __post_init__(self) -> None:
        _check_printable(self.function, "function", LIMITS.max_frame_function_length)
        _check_printable(self.file, "file", LIMITS.max_frame_file_length)
        _check_int(self.line, "line", minimum=0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this frame."""
        return {"function": self.function, "file": self.file, "line": self.line}

    @classmethod
    def from_dict(cls, data: object, field: str = "frame") -> Frame:
        """Validate and read a frame."""
        obj = _object(data, field)
        with _prefix(field):
            return cls(function=_required(obj, "function"), file=_required(obj, "file"), line=_required(obj, "line"))

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True)
class Where:
    """Where a rank stands while its step has stood longer than usual, read from its main thread's stack.

    ``activity`` is one of :data:`ACTIVITIES`; ``detail`` the library call that decided it
    (``torch.distributed.all_reduce``, ``torch.save``), empty when none did; ``frames`` the innermost
    frames of the user's own code, innermost first; ``stood_seconds`` how long the rank's current
    step has stood, by the reporter's monotonic clock; ``samples`` how many stack samples were taken
    while it stood (the reading is the latest one).
    """

    activity: str
    stood_seconds: float
    detail: str = ""
    frames: tuple[Frame, ...] = ()
    samples: int = 1

    def __post_init__(self) -> None:
        if self.activity not in ACTIVITIES:
            raise ProtocolError("activity", f"must be one of {', '.join(ACTIVITIES)}, got {_show(self.activity)}")
        _check_number(self.stood_seconds, "stood_seconds", minimum=0.0)
        _check_str(self.detail, "detail", LIMITS.max_where_detail_length, allow_empty=True)
        if self.detail and not self.detail.isprintable():
            raise ProtocolError("detail", f"must be printable, got {_show(self.detail)}")
        if len(self.frames) > LIMITS.max_where_frames:
            raise ProtocolError("frames", f"at most {LIMITS.max_where_frames} frames, got {len(self.frames)}")
        _check_int(self.samples, "samples", minimum=1)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this reading, without an empty detail or frame list."""
        body: dict[str, Any] = {"activity": self.activity, "stood_seconds": self.stood_seconds, "samples": self.samples}
        if self.detail:
            body["detail"] = self.detail
        if self.frames:
            body["frames"] = [f.to_dict() for f in self.frames]
        return body

    @classmethod
    def from_dict(cls, data: object, field: str = "where") -> Where:
        """Validate and read a reading."""
        obj = _object(data, field)
        frames = _array(obj.get("frames", []), f"{field}.frames", LIMITS.max_where_frames)
        with _prefix(field):
            return cls(
                activity=_required(obj, "activity"),
                stood_seconds=_required(obj, "stood_seconds"),
                detail=obj.get("detail", ""),
                frames=tuple(Frame.from_dict(f, f"frames[{i}]") for i, f in enumerate(frames)),
                samples=obj.get("samples", 1),
            )


def _check_activity_shares(shares: Mapping[str, Any], field: str) -> None:
    for key, value in shares.items():
        if key not in ACTIVITIES:
            raise ProtocolError(field, f"keys must be one of {', '.join(ACTIVITIES)}, got {_show(key)}")
        _check_number(value, f"{field}.{key}", minimum=0.0)
        if value > 1.0:
            raise ProtocolError(f"{field}.{key}", f"must be a fraction <= 1, got {value!r}")


@dataclass(frozen=True)
class Command:
    """An order for the training process, pending until a report acknowledges its ``id``."""

    id: str
    kind: CommandKind
    reason: str = ""

    def __post_init__(self) -> None:
        _check_run_id(self.id, "id")
        if self.kind not in COMMAND_KINDS:
            raise ProtocolError("kind", f"must be one of {', '.join(COMMAND_KINDS)}, got {_show(self.kind)}")
        _check_str(self.reason, "reason", LIMITS.max_reason_length, allow_empty=True)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this command."""
        return {"id": self.id, "kind": self.kind, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: object, field: str = "command") -> Command:
        """Validate and read a command."""
        obj = _object(data, field)
        with _prefix(field):
            return cls(id=_required(obj, "id"), kind=_required(obj, "kind"), reason=obj.get("reason", ""))


ParamValue = str | int | float | bool | None


@dataclass(frozen=True)
class GpuReading:
    """One GPU as one rank's sender read it (NVML): utilisation and memory, for "running, GPUs idle"."""

    index: int
    utilization: float | None = None
    """Percent of the last sample period a kernel ran, 0..100 (``None``: not readable)."""
    memory_used: int | None = None
    """Bytes."""
    memory_total: int | None = None

    def __post_init__(self) -> None:
        _check_int(self.index, "index", minimum=0, maximum=LIMITS.max_gpus_per_report * 1024)
        if self.utilization is not None:
            _check_number(self.utilization, "utilization", minimum=0.0)
            if self.utilization > 100:
                raise ProtocolError("utilization", f"is a percentage, 0..100, got {_show(self.utilization)}")
        for name in ("memory_used", "memory_total"):
            value = getattr(self, name)
            if value is not None:
                _check_int(value, name, minimum=0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this reading."""
        out: dict[str, Any] = {"index": self.index}
        for name in ("utilization", "memory_used", "memory_total"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: object, field: str = "gpus") -> GpuReading:
        """Validate and read a GPU reading."""
        obj = _object(data, field)
        with _prefix(field):
            return cls(
                index=_required(obj, "index"),
                utilization=obj.get("utilization"),
                memory_used=obj.get("memory_used"),
                memory_total=obj.get("memory_total"),
            )


@dataclass(frozen=True)
class Report:
    """One report of one rank: the unit the report core sends and the server stores.

    ``run_id`` names one attempt of the job (a fresh id per ``stepwatch.init``); ``seq`` counts that
    rank's reports within the run, so a retried report is recognised and stored once. Reports from
    ranks other than 0 carry no metrics: they are heartbeats.
    """

    run_id: str
    seq: int
    sent_at: float
    identity: Identity = field(default_factory=Identity)
    progress: Progress = field(default_factory=Progress)
    metrics: tuple[MetricWindow, ...] = ()
    params: Mapping[str, ParamValue] | None = None
    acks: tuple[str, ...] = ()
    state: ReportState = "running"
    reason: str = ""
    gpus: tuple[GpuReading, ...] = ()
    """The GPUs this rank's process sees, read in the sender thread when NVML is available."""
    where: Where | None = None
    """Where the rank stands, sent only while its step has stood longer than usual."""
    activity_shares: Mapping[str, float] | None = None
    """Share of the report's interval the rank's main thread spent in each of :data:`ACTIVITIES`,
    from low-rate stack samples (for stragglers: where a slow rank's extra time goes)."""

    def __post_init__(self) -> None:
        _check_run_id(self.run_id, "run_id")
        if len(self.gpus) > LIMITS.max_gpus_per_report:
            raise ProtocolError("gpus", f"at most {LIMITS.max_gpus_per_report} GPUs per report, got {len(self.gpus)}")
        _check_int(self.seq, "seq", minimum=0)
        _check_number(self.sent_at, "sent_at", minimum=0.0)
        if self.state not in REPORT_STATES:
            raise ProtocolError("state", f"must be one of {', '.join(REPORT_STATES)}, got {_show(self.state)}")
        _check_str(self.reason, "reason", LIMITS.max_reason_length, allow_empty=True)
        if len(self.metrics) > LIMITS.max_metrics_per_report:
            raise ProtocolError(
                "metrics",
                f"at most {LIMITS.max_metrics_per_report} metrics per report, got {len(self.metrics)}",
            )
        seen: set[str] = set()
        for i, window in enumerate(self.metrics):
            if window.name in seen:
                raise ProtocolError(f"metrics[{i}].name", f"duplicate metric {window.name!r} in one report")
            seen.add(window.name)
        if len(self.acks) > LIMITS.max_acks:
            raise ProtocolError("acks", f"at most {LIMITS.max_acks} acknowledgements, got {len(self.acks)}")
        for i, ack in enumerate(self.acks):
            _check_run_id(ack, f"acks[{i}]")
        if self.params is not None:
            _check_params(self.params)
        if self.activity_shares is not None:
            _check_activity_shares(self.activity_shares, "activity_shares")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this report."""
        body: dict[str, Any] = {
            "api_version": API_VERSION,
            "run_id": self.run_id,
            "seq": self.seq,
            "sent_at": self.sent_at,
            "state": self.state,
            "identity": self.identity.to_dict(),
            "progress": self.progress.to_dict(),
            "metrics": [m.to_dict() for m in self.metrics],
        }
        if self.reason:
            body["reason"] = self.reason
        if self.params is not None:
            body["params"] = dict(self.params)
        if self.acks:
            body["acks"] = list(self.acks)
        if self.gpus:
            body["gpus"] = [g.to_dict() for g in self.gpus]
        if self.where is not None:
            body["where"] = self.where.to_dict()
        if self.activity_shares:
            body["activity_shares"] = dict(self.activity_shares)
        return body

    @classmethod
    def from_dict(cls, data: object) -> Report:
        """Validate and read a report."""
        obj = _object(data, "")
        version = obj.get("api_version", API_VERSION)
        if version != API_VERSION:
            raise ProtocolError("api_version", f"this server speaks {API_VERSION!r}, got {_show(version)}")
        metrics = _array(obj.get("metrics", []), "metrics", LIMITS.max_metrics_per_report)
        acks = _array(obj.get("acks", []), "acks", LIMITS.max_acks)
        gpus = _array(obj.get("gpus", []), "gpus", LIMITS.max_gpus_per_report)
        params = obj.get("params")
        if params is not None:
            params = {k: _decode_param(v, f"params.{k}") for k, v in _object(params, "params").items()}
        where = obj.get("where")
        shares = obj.get("activity_shares")
        if shares is not None:
            shares = _object(shares, "activity_shares")
            if len(shares) > len(ACTIVITIES):
                raise ProtocolError("activity_shares", f"at most {len(ACTIVITIES)} activities, got {len(shares)}")
        fields = {
            "run_id": _required(obj, "run_id"),
            "seq": _required(obj, "seq"),
            "sent_at": _required(obj, "sent_at"),
            "identity": Identity.from_dict(obj.get("identity", {})),
            "progress": Progress.from_dict(obj.get("progress", {})),
            "metrics": tuple([MetricWindow.from_dict(m, f"metrics[{i}]") for i, m in enumerate(metrics)]),
            "params": params,
            "acks": tuple(acks),
            "state": obj.get("state", "running"),
            "reason": obj.get("reason", ""),
            "gpus": tuple([GpuReading.from_dict(g, f"gpus[{i}]") for i, g in enumerate(gpus)]),
            "where": None if where is None else Where.from_dict(where),
            "activity_shares": shares,
        }
        # every field is given: what the frozen __init__ would do is set them one call each, then check
        report = object.__new__(cls)
        report.__dict__.update(fields)
        report.__post_init__()
        return report


@dataclass(frozen=True)
class ReportResponse:
    """The server's answer to a report: what it stored, and the commands pending for the job."""

    accepted_seq: int
    commands: tuple[Command, ...] = ()

    def __post_init__(self) -> None:
        _check_int(self.accepted_seq, "accepted_seq", minimum=0)
        if len(self.commands) > LIMITS.max_commands:
            raise ProtocolError("commands", f"at most {LIMITS.max_commands} commands, got {len(self.commands)}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this response."""
        return {"accepted_seq": self.accepted_seq, "commands": [c.to_dict() for c in self.commands]}

    @classmethod
    def from_dict(cls, data: object) -> ReportResponse:
        """Validate and read a response."""
        obj = _object(data, "")
        commands = _array(obj.get("commands", []), "commands", LIMITS.max_commands)
        return cls(
            accepted_seq=_required(obj, "accepted_seq"),
            commands=tuple(Command.from_dict(c, f"commands[{i}]") for i, c in enumerate(commands)),
        )


# --------------------------------------------------------------------------------------------------
# Kubeflow Trainer (KEP-2779)
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Bodies and paths
# --------------------------------------------------------------------------------------------------


def encode_body(obj: Mapping[str, Any]) -> bytes:
    """Compact standard JSON (no NaN tokens: non-finite values must already be encoded)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


def decode_body(body: bytes, fast_loads: Callable[[bytes], Any] | None = None) -> Any:
    """Parse a request body, enforcing the size limit; raises :class:`ProtocolError`.

    ``fast_loads`` (the server passes ``orjson.loads``) is tried first: a strict parser that accepts a
    subset of what the standard one does and reads it the same way. Whatever it refuses (``NaN``
    constants, integers beyond 64 bits, bad input) goes to the standard parser, which decides and
    words the error.
    """
    if len(body) > LIMITS.max_body_bytes:
        raise BodyTooLarge("", f"body is {len(body)} bytes; the limit is {LIMITS.max_body_bytes} bytes (64 KiB)")
    too_deep = f"body nests too deeply: at most {LIMITS.max_depth} levels of objects and arrays"
    data: Any = _UNPARSED
    if fast_loads is not None:
        try:
            data = fast_loads(body)
        except Exception:  # any refusal: the standard parser below decides
            data = _UNPARSED
    if data is _UNPARSED:
        try:
            data = json.loads(body, parse_constant=_NONFINITE_IN.__getitem__)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError("", f"body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ProtocolError("", too_deep) from None
    # only a body with more brackets than the limit can nest deeper than it: most are not walked at all
    if body.count(b"[") + body.count(b"{") > LIMITS.max_depth and _deeper_than(data, LIMITS.max_depth):
        raise ProtocolError("", too_deep)
    return data


_UNPARSED = object()
"""What ``decode_body`` holds before a parser has read the body (``None`` is a valid body)."""


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` deep (level by level, no recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))]
        if not level:
            return False
    return True


def jobs_path(namespace: str) -> str:
    """The URL path where jobs of a namespace are listed and registered."""
    return f"/api/{API_VERSION}/namespaces/{namespace}/jobs"


def report_path(namespace: str, job: str) -> str:
    """The URL path of the native report endpoint for a job."""
    return f"/api/{API_VERSION}/namespaces/{namespace}/jobs/{job}/reports"


def kubeflow_status_path(namespace: str, trainjob: str) -> str:
    """The URL path of the upstream Kubeflow Trainer status endpoint for a TrainJob."""
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{trainjob}/status"


# --------------------------------------------------------------------------------------------------
# Retries: the one backoff and Retry-After reading of the report core, the client and the notifier
# --------------------------------------------------------------------------------------------------

Jitter = Literal["full", "equal", "decorrelated", "none"]
_JITTERS: Final[tuple[str, ...]] = ("full", "equal", "decorrelated", "none")
_DELTA_SECONDS_RE: Final = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_ASCTIME_RE: Final = re.compile(r"[A-Za-z]{3} [A-Za-z]{3} [ \d]\d \d\d:\d\d:\d\d \d{4}")
"""The third HTTP-date form (``Sun Nov  6 08:49:37 1994``): the one that writes no zone."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: how long to wait before retry ``n`` (1 for the first).

    The wait grows as ``base * 2**(n - 1)``, at most ``cap``, and ``jitter`` spreads it so that many
    senders that failed together do not come back together:

    * ``"full"``: anywhere in ``[0, wait]`` (the widest spread; a retry may come at once);
    * ``"equal"``: in ``[wait / 2, wait]`` (spread, yet never sooner than half the wait);
    * ``"decorrelated"``: between ``base`` and three times the ``previous`` wait, at most ``cap``
      (each wait follows the last one rather than the count);
    * ``"none"``: exactly the wait.

    Each caller keeps its own numbers (``base``, ``cap``, how many attempts) and its own random source.
    """

    base: float
    cap: float
    jitter: Jitter = "full"

    def __post_init__(self) -> None:
        if not (0.0 <= self.base < math.inf and 0.0 <= self.cap < math.inf):
            raise ValueError(f"base and cap are seconds, 0 or more and finite, got {self.base!r} and {self.cap!r}")
        if self.jitter not in _JITTERS:
            raise ValueError(f"jitter must be one of {', '.join(_JITTERS)}, got {self.jitter!r}")

    def delay(self, retry: int, rand: Callable[[], float] = random.random, previous: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first); ``rand`` gives a float in ``[0, 1)``.

        ``previous`` (the wait before the last retry) is what ``"decorrelated"`` grows from; the other
        kinds ignore it.
        """
        if self.jitter == "decorrelated":
            last = self.base if previous is None else max(previous, self.base)
            return min(self.cap, self.base + (min(last * 3.0, self.cap) - self.base) * rand())
        wait = min(self.cap, self.base * 2.0 ** min(max(retry, 1) - 1, 62))  # 2**62: past any cap, no overflow
        if self.jitter == "full":
            return wait * rand()
        if self.jitter == "equal":
            return wait * (0.5 + 0.5 * rand())
        return wait


def parse_retry_after(value: str | None, *, now: float | None = None, cap: float = 86_400.0) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110), clamped to ``[0, cap]``.

    The header holds delta-seconds (``"120"``; a fraction such as ``"2.5"`` is read too) or an
    HTTP-date in any of its three forms (``"Fri, 15 Jan 2027 08:00:30 GMT"``, always GMT), counted
    from ``now`` (Unix time, the wall clock by default). A time already past reads 0; ``None`` when
    the header is absent or unreadable (garbage, ``NaN``, no such day, a zone nobody knows), so that
    the caller falls back on its backoff.
    """
    if not value:
        return None
    text = value.strip()
    if _DELTA_SECONDS_RE.fullmatch(text):
        return min(max(float(text), 0.0), cap)
    # Only a date needs the e-mail parser (RFC 9110's three date forms): imported when one comes, so
    # that importing the protocol (every report core, client and server) does not pay for it.
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # no zone the parser knew: only asctime's form is GMT without saying it
        if not _ASCTIME_RE.fullmatch(text):
            return None
        when = when.replace(tzinfo=_dt.timezone.utc)
    return min(max(when.timestamp() - (time.time() if now is None else now), 0.0), cap)


# --------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------


class _prefix:
    """Prefix the field of a ProtocolError raised inside the block with ``prefix.``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, ProtocolError) and self.prefix:
            exc.field = f"{self.prefix}.{exc.field}" if exc.field else self.prefix
            exc.args = (f"{exc.field}: {exc.message}",)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fields(obj: object) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}  # type: ignore[attr-defined]


def _object(data: object, field: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(field, f"must be a JSON object, got {type(data).__name__}")
    return data


_KNOWN_METRIC_NAMES: set[str] = set()
"""Metric names already found valid (a server reads the same few names in every report); bounded."""


def _window_at_once(cls: type[MetricWindow], obj: dict[str, Any]) -> MetricWindow | None:
    """The window of a JSON object in the shape the report core sends (finite floats, integer counts and
    steps, every field present), checked in one pass and built without ``__init__``; ``None`` for
    anything else, which :meth:`MetricWindow.from_dict` then reads field by field (so every error keeps
    its words and its field). It accepts exactly what ``__post_init__`` would, and builds the same
    window: a server reads five to fifty of these per report."""
    try:
        name, last, lo, hi, mean = obj["name"], obj["last"], obj["min"], obj["max"], obj["mean"]
        count, nonfinite, first_step, last_step = obj["count"], obj["nonfinite"], obj["first_step"], obj["last_step"]
    except KeyError:
        return None
    top = LIMITS.max_integer
    if not (
        type(name) is str
        and type(last) is float
        and type(lo) is float
        and type(hi) is float
        and type(mean) is float
        and type(count) is int
        and type(nonfinite) is int
        and type(first_step) is int
        and type(last_step) is int
        and 0 <= nonfinite < count <= top
        and 0 <= first_step <= last_step <= top
        and _isfinite(lo)
        and _isfinite(hi)
        and _isfinite(mean)
        and lo <= hi
    ):
        return None
    if name not in _KNOWN_METRIC_NAMES:
        if not is_valid_metric_name(name):
            return None
        if len(_KNOWN_METRIC_NAMES) >= 4096:
            _KNOWN_METRIC_NAMES.clear()
        _KNOWN_METRIC_NAMES.add(name)
    window = object.__new__(cls)
    window.__dict__.update(
        name=name,
        last=last,
        min=lo,
        max=hi,
        mean=mean,
        count=count,
        nonfinite=nonfinite,
        first_step=first_step,
        last_step=last_step,
    )
    return window


_isfinite = math.isfinite


def _identity_at_once(cls: type[Identity], obj: dict[str, Any]) -> Identity | None:
    """An identity of plain in-range integers and a short host, built in one pass (as
    :func:`_window_at_once`); ``None`` for anything else, read field by field."""
    rank, world_size, local_rank = obj.get("rank", 0), obj.get("world_size", 1), obj.get("local_rank", 0)
    host, pid = obj.get("host", ""), obj.get("pid", 0)
    most = LIMITS.max_world_size
    if not (
        type(rank) is int
        and type(world_size) is int
        and type(local_rank) is int
        and type(pid) is int
        and type(host) is str
        and 0 <= rank < world_size <= most
        and 0 <= local_rank <= most
        and 0 <= pid <= LIMITS.max_integer
        and len(host) <= LIMITS.max_host_length
    ):
        return None
    identity = object.__new__(cls)
    identity.__dict__.update(rank=rank, world_size=world_size, local_rank=local_rank, host=host, pid=pid)
    return identity


_PROGRESS_INTEGERS: Final = (("step", 0), ("total_steps", 1), ("samples", 0))
_PROGRESS_NUMBERS: Final = (
    "epoch",
    "steps_per_second",
    "samples_per_second",
    "step_time",
    "eta_seconds",
    "phase_seconds",
)


def _progress_at_once(cls: type[Progress], obj: dict[str, Any]) -> Progress | None:
    """A progress object of plain in-range integers and finite non-negative floats, built in one pass (as
    :func:`_window_at_once`); ``None`` for anything else, read field by field."""
    top = LIMITS.max_integer
    values = {k: obj.get(k) for k in _PROGRESS_FIELDS}
    for key, least in _PROGRESS_INTEGERS:
        value = values[key]
        if value is not None and not (type(value) is int and least <= value <= top):
            return None
    for key in _PROGRESS_NUMBERS:
        value = values[key]
        if value is not None and not _plain_number(value):
            return None
    total_epochs, phase = values["total_epochs"], values["phase"]
    if total_epochs is not None and not (_plain_number(total_epochs) and total_epochs > 0):
        return None
    if phase is not None and phase not in PHASES:
        return None
    progress = object.__new__(cls)
    progress.__dict__.update(values)
    return progress


def _plain_number(value: object) -> bool:
    """A finite float >= 0, or an integer from 0 to the largest exact one: a number ``_check_number``
    takes with ``minimum=0.0`` (and a few it would take, such as huge integers, left to it)."""
    if type(value) is float:
        return _isfinite(value) and value >= 0.0
    return type(value) is int and 0 <= value <= LIMITS.max_integer


def _array(data: object, field: str, limit: int) -> list[Any]:
    if not isinstance(data, list):
        raise ProtocolError(field, f"must be a JSON array, got {type(data).__name__}")
    if len(data) > limit:
        raise ProtocolError(field, f"at most {limit} items, got {len(data)}")
    return data


def _required(obj: Mapping[str, Any], key: str) -> Any:
    if key not in obj:
        raise ProtocolError(key, "is required")
    return obj[key]


def _optional_float(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    return None if value is None else decode_float(value, key)


def _check_int(value: object, field: str, minimum: int | None = None, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(field, f"must be an integer, got {_show(value)}")
    if maximum is None:
        maximum = LIMITS.max_integer
    if minimum is not None and value < minimum:
        raise ProtocolError(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ProtocolError(field, f"must be <= {maximum}, got {value}")


def _check_optional_int(value: object, field: str, minimum: int | None = None, maximum: int | None = None) -> None:
    if value is not None:
        _check_int(value, field, minimum, maximum)


def _check_optional_number(value: object, field: str, minimum: float, strict: bool = False) -> None:
    if value is not None:
        _check_number(value, field, minimum, strict)


def _check_number(value: object, field: str, minimum: float, strict: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ProtocolError(field, f"must be a number, got {_show(value)}")
    if not math.isfinite(decode_float(value, field)):
        raise ProtocolError(field, f"must be finite, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise ProtocolError(field, f"must be {'>' if strict else '>='} {minimum:g}, got {value!r}")


def _check_str(value: object, field: str, max_length: int, allow_empty: bool = False) -> None:
    if not isinstance(value, str):
        raise ProtocolError(field, f"must be a string, got {_show(value)}")
    if not value and not allow_empty:
        raise ProtocolError(field, "must not be empty")
    if len(value) > max_length:
        raise ProtocolError(field, f"must be at most {max_length} characters, got {len(value)}")


def _check_printable(value: object, field: str, max_length: int) -> None:
    _check_str(value, field, max_length)
    assert isinstance(value, str)
    if not value.isprintable():
        raise ProtocolError(field, f"must be printable, got {_show(value)}")


def _check_run_id(value: object, field: str) -> None:
    _check_str(value, field, LIMITS.max_run_id_length)
    assert isinstance(value, str)
    if not _RUN_ID_RE.fullmatch(value):
        raise ProtocolError(field, f"must use only letters, digits, '.', '_' and '-', got {_show(value)}")


def validate_params(params: object) -> dict[str, ParamValue]:
    """Return hyperparameters if they are a flat object of scalars within the limits, else raise."""
    if not isinstance(params, dict):
        raise ProtocolError("params", f"must be a JSON object, got {type(params).__name__}")
    _check_params(params)
    return params


def _check_params(params: Mapping[str, Any]) -> None:
    if len(params) > LIMITS.max_params:
        raise ProtocolError("params", f"at most {LIMITS.max_params} parameters, got {len(params)}")
    for key, value in params.items():
        if not isinstance(key, str) or not 0 < len(key) <= LIMITS.max_param_key_length or not key.isprintable():
            raise ProtocolError(
                "params", f"keys must be 1-{LIMITS.max_param_key_length} printable characters, got {_show(key)}"
            )
        if value is None or isinstance(value, (bool, int)):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ProtocolError(f"params.{key}", f"must be finite, got {value!r}")
        elif isinstance(value, str):
            _check_str(value, f"params.{key}", LIMITS.max_param_value_length, allow_empty=True)
        else:
            raise ProtocolError(f"params.{key}", f"must be a string, number, boolean or null, got {_show(value)}")


def _decode_param(value: object, field: str) -> ParamValue:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise ProtocolError(field, f"must be a string, number, boolean or null, got {type(value).__name__}")
