"""Where a rank stands while its step stands: the activity read from its main thread's stack, and the
frames of its own code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._checks import (
    _array,
    _check_int,
    _check_number,
    _check_printable,
    _check_str,
    _object,
    _required,
)
from ._errors import ProtocolError, _prefix, _show
from ._limits import LIMITS
from ._vocabulary import ACTIVITIES

__all__ = ["Frame", "Where"]


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
