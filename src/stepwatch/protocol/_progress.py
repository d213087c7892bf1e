"""Who reports and where it stands: a rank's :class:`Identity` and :class:`Progress`, and their one-pass readers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ._checks import (
    _check_int,
    _check_optional_int,
    _check_optional_number,
    _check_str,
    _fields,
    _object,
    _plain_number,
)
from ._errors import ProtocolError, _prefix, _show
from ._limits import LIMITS
from ._vocabulary import PHASES

__all__ = ["Identity", "Progress"]


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


_PROGRESS_KINDS: Final = {
    "step": 0,
    "samples": 0,
    "total_steps": 1,
    "epoch": 2,
    "steps_per_second": 2,
    "samples_per_second": 2,
    "step_time": 2,
    "eta_seconds": 2,
    "phase_seconds": 2,
    "total_epochs": 3,
    "phase": 4,
}
"""What each field of a progress object is, for its one-pass reader: an integer from 0 (``0``) or from 1
(``1``), a number >= 0 (``2``), a number > 0 (``3``), a phase (``4``); any other key is not read."""
_NO_PROGRESS: Final = dict.fromkeys(_PROGRESS_FIELDS)


def _progress_at_once(cls: type[Progress], obj: dict[str, Any]) -> Progress | None:
    """A progress object of plain in-range integers and finite non-negative floats, built in one pass (as
    :func:`_window_at_once`); ``None`` for anything else, read field by field. Only the fields the object
    carries are looked at (a report core's carries 6 of the 11)."""
    top = LIMITS.max_integer
    values = _NO_PROGRESS.copy()
    for key, value in obj.items():
        kind = _PROGRESS_KINDS.get(key)
        if kind is None or value is None:
            continue
        if kind < 2:
            if not (type(value) is int and kind <= value <= top):
                return None
        elif kind == 2:
            if not _plain_number(value):
                return None
        elif kind == 3:
            if not (_plain_number(value) and value > 0):
                return None
        elif value not in PHASES:
            return None
        values[key] = value
    progress = object.__new__(cls)
    progress.__dict__.update(values)
    return progress
