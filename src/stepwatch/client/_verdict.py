"""The pieces of a health verdict by where each rank stands (issue 29), typed: a stall whose report core
read where its ranks stand (:class:`StallPlace`), and a straggler (:class:`Straggler`).

Read from ``health.evidence`` of a job view (the server's analysis writes them: ``analysis/stall.py`` and
``analysis/straggler.py``; docs/health.md explains each field). The raw mapping stays on
:attr:`Health.evidence`; these say the same, typed, for programs that act on the rank or the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._parse import as_list, opt_float, opt_int, opt_str, sub, to_float

__all__ = ["StallPlace", "Straggler"]


@dataclass(frozen=True)
class StallPlace:
    """Where a stalled rank stands, as its report core read it: ``rank`` (the one holding the others) at
    ``step``; ``kind`` (``hang``: in its own code, a lock or its loader; ``busy``: in a training step;
    ``patient``: in a save or an evaluation); ``activity`` (``waiting``, ``communicating``, ``loading_data``,
    ``checkpointing``, ...); ``detail`` the library call that decided it; ``frames`` the innermost frames of
    the user's own code, ``"function (file:line)"``; ``place`` all of it in words; ``holding`` the ranks that
    stand there and ``waiting`` those that wait for them (in a collective)."""

    rank: int | None = None
    step: int | None = None
    kind: str = ""
    activity: str = ""
    detail: str = ""
    place: str = ""
    frames: tuple[str, ...] = ()
    holding: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()

    @classmethod
    def from_evidence(cls, evidence: Mapping[str, Any], where: str = "health.evidence") -> StallPlace | None:
        """The place of a stall's evidence; ``None`` for evidence of another kind (no ``kind``)."""
        kind = opt_str(evidence, "kind", where)
        if not kind:
            return None
        frames = evidence.get("frames")
        return cls(
            rank=opt_int(evidence, "rank", where),
            step=opt_int(evidence, "step", where),
            kind=kind,
            activity=opt_str(evidence, "activity", where) or "",
            detail=opt_str(evidence, "detail", where) or "",
            place=opt_str(evidence, "place", where) or "",
            frames=tuple(_frame(f) for f in as_list(frames, f"{where}.frames")) if frames is not None else (),
            holding=_ranks(evidence, "holding", where),
            waiting=_ranks(evidence, "waiting", where),
        )


@dataclass(frozen=True)
class Straggler:
    """A rank persistently slower than the median rank: ``rank`` on ``host``, ``ratio`` times slower,
    ``speedup_without`` how many times faster the job would run without it (the elastic hint, ``hint`` in
    words), and where its time goes against the median rank's (``activity_shares``,
    ``median_activity_shares``: activity -> share of its time, 0..1)."""

    rank: int | None = None
    host: str = ""
    ratio: float | None = None
    speedup_without: float | None = None
    hint: str = ""
    activity_shares: Mapping[str, float] = field(default_factory=dict)
    median_activity_shares: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_evidence(cls, evidence: Mapping[str, Any], where: str = "health.evidence") -> Straggler | None:
        """The straggler of a ``straggling`` verdict's evidence (``metric: "rank_pace"``); ``None`` otherwise."""
        if evidence.get("metric") != "rank_pace":
            return None
        return cls(
            rank=opt_int(evidence, "rank", where),
            host=opt_str(evidence, "host", where) or "",
            ratio=opt_float(evidence, "ratio", where),
            speedup_without=opt_float(evidence, "speedup_without", where),
            hint=opt_str(evidence, "hint", where) or "",
            activity_shares=_shares(evidence, "activity_shares", where),
            median_activity_shares=_shares(evidence, "median_activity_shares", where),
        )


def _frame(frame: object) -> str:
    # the wire's own text, "fn (file:line)"; an object of its fields reads the same
    if isinstance(frame, Mapping):
        return f"{frame.get('function')} ({frame.get('file')}:{frame.get('line')})"
    return str(frame)


def _ranks(evidence: Mapping[str, Any], key: str, where: str) -> tuple[int, ...]:
    value = evidence.get(key)
    if value is None:
        return ()
    found = as_list(value, f"{where}.{key}")
    return tuple(opt_int({key: r}, key, where) or 0 for r in found)


def _shares(evidence: Mapping[str, Any], key: str, where: str) -> dict[str, float]:
    found = sub(evidence, key, where)
    return {str(k): v for k, raw in found.items() if (v := to_float(raw, f"{where}.{key}", str(k))) is not None}
