"""The native report of one rank, what it carries besides its windows and progress (GPU readings), and the
server's answer with the commands pending for the job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._checks import (
    _RUN_ID_RE,
    ParamValue,
    _array,
    _check_int,
    _check_number,
    _check_params,
    _check_run_id,
    _check_str,
    _decode_param,
    _object,
    _plain_number,
    _required,
)
from ._errors import ProtocolError, _prefix, _show
from ._limits import LIMITS
from ._progress import Identity, Progress
from ._vocabulary import ACTIVITIES, API_VERSION, COMMAND_KINDS, REPORT_STATES, CommandKind, ReportState
from ._where import Where, _check_activity_shares
from ._window import MetricWindow, _windows

__all__ = ["Command", "GpuReading", "Report", "ReportResponse"]


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
            "metrics": _windows(metrics),
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
        if not _plain_report(report):
            report.__post_init__()  # it words the first error
        return report


def _plain_report(report: Report) -> bool:
    """Whether a report read by :meth:`Report.from_dict` is in the report core's shape, which ``__post_init__``
    takes (its windows, identity and progress were checked as they were read): a run id of up to 64 letters,
    digits, ``.``, ``_`` and ``-``, a plain ``seq`` and ``sent_at``, a known state, a short reason, distinct
    metric names, and no acknowledgements, hyperparameters or activity shares (checked by ``__post_init__``
    whenever they come). ``False`` for anything else: ``__post_init__`` then checks it all, in its order."""
    run_id, seq, reason, metrics = report.run_id, report.seq, report.reason, report.metrics
    return (
        type(run_id) is str
        and 0 < len(run_id) <= LIMITS.max_run_id_length
        and _RUN_ID_RE.fullmatch(run_id) is not None
        and type(seq) is int
        and 0 <= seq <= LIMITS.max_integer
        and _plain_number(report.sent_at)
        and report.state in REPORT_STATES
        and type(reason) is str
        and len(reason) <= LIMITS.max_reason_length
        and not report.acks
        and report.params is None
        and report.activity_shares is None
        and len({w.name for w in metrics}) == len(metrics)
    )


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
