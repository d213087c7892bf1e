"""Where each rank stands, and the stall rules that read it (issue 29).

A report core that can sample its main thread's stack sends, while a rank's step has stood longer than
usual, a reading of where it stands (``Report.where``: an activity, the library call that decided it, the
innermost frames of the user's own code) and, with each report, the shares of its interval spent in each
activity (``Report.activity_shares``). :class:`RankPlaces` keeps the newest reading of every rank and
what the rules need beside it (a long memory of step times for their tail, the longest save or
evaluation each rank finished), and says how long each standing rank may stand:

- **patient** (``checkpointing``, ``evaluating``): a save or an evaluation is no stall up to
  ``max(patient_floor_s, patient_factor x the longest one the rank finished)`` plus one tail step time;
- **hang** (``waiting``, ``other`` — the user's own code —, ``loading_data``), and a rank waiting in a
  collective (``communicating``) while another rank stands elsewhere: ``max(hang_floor_s, hang_steps x
  p99 step time - hang_margin_s)``, so that with a sweep every few seconds the hang is flagged within
  ``max(45 s, 3 x p99)`` of its start;
- **busy** (``computing``, every rank in a collective, or no reading yet): a slow step is no stall; only
  ``max(busy_floor_s, busy_steps x p99 step time)``.

The p99 is learnt from the tail of up to ``tail_memory`` step times (interpolated between the nearest
ranks: with fewer than 100 it lies between the two longest), never from the first few alone.

A rank that has never sent a reading nor shares cannot be read (an upstream Kubeflow client, an old
report core): :meth:`RankPlaces.sampling` is false and the tracker keeps its earlier rules for it.

Pure and bounded: a few numbers and one small reading per rank; standard library only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "BUSY",
    "HANG",
    "PATIENT",
    "Allowance",
    "RankPlaces",
    "Reading",
    "StallKnobs",
    "Standing",
    "duration",
    "judge",
    "place_words",
    "rank_list",
    "straggler_words",
    "waiting_words",
]

PATIENT = ("checkpointing", "evaluating")
"""Activities a rank may stand in for long: a save or an evaluation is no stall."""
HANG = ("waiting", "other", "loading_data")
"""Activities where a long stand is a hang: the user's own code, a lock or a sleep, a data loader."""
BUSY = ("computing",)
"""Activities where a long stand is a slow step (a single slow step is no stall)."""

_ACTIVITY_WORDS = {
    "computing": "computing",
    "communicating": "in a collective",
    "loading_data": "loading data",
    "checkpointing": "saving a checkpoint",
    "evaluating": "evaluating",
    "waiting": "waiting",
    "other": "in its own code",
}


@dataclass(frozen=True, slots=True)
class StallKnobs:
    """The limits of the rules above (seconds, or multiples of a rank's p99 step time)."""

    patient_floor_s: float = 1800.0
    """A save or an evaluation may last this long (30 min) before its rank is stalled..."""
    patient_factor: float = 4.0
    """...or this many times the longest one the rank finished, when that is longer."""
    hang_floor_s: float = 35.0
    """A rank standing in its own code, a lock or its data loader is hung after this long at least:
    with a report every 2 s and a sweep and a scan every 5 s it is flagged within 45 s."""
    hang_steps: float = 3.0
    """...or after this many of its p99 step times (less ``hang_margin_s``), when that is longer."""
    hang_margin_s: float = 10.0
    """Taken off ``hang_steps x p99`` so that the scan, the sweep and the report that carries the
    reading (step times are measured between reports) still flag the hang within 3 x p99."""
    busy_floor_s: float = 120.0
    """A rank computing (or with no reading yet) may stand this long at least: a slow step is no stall."""
    busy_steps: float = 6.0
    """...or this many of its p99 step times, when that is longer."""
    tail_memory: int = 512
    """Step times kept per rank for the p99 (the tail of enough steps, not of the first few)."""
    fresh_s: float = 30.0
    """A reading older than this (or of an earlier step) no longer says where the rank stands."""


DEFAULT_KNOBS = StallKnobs()

SHARES_SMOOTHING = 0.1
"""Weight of a report's activity shares in a rank's smoothed shares when its time is not known."""
SHARES_SMOOTHING_S = 30.0
"""The time constant of a rank's smoothed activity shares (seconds): a report ``dt`` after the previous
one weighs ``1 - exp(-dt / 30 s)`` (0.06 at 2 s, 0.28 at 10 s)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """The newest reading of where a rank stands (plain values: this module knows no wire types)."""

    t: float
    """Server arrival time of the report that carried it."""
    step: int | None
    activity: str
    stood: float
    """Seconds its step had stood when it was read (the reporter's monotonic clock: a duration only)."""
    detail: str = ""
    frames: tuple[str, ...] = ()
    """``"function (file:line)"``, innermost first."""

    def standing(self, now: float) -> float:
        """How long the rank's step has stood at server time ``now``, by this reading."""
        return self.stood + max(0.0, now - self.t)


@dataclass(frozen=True, slots=True)
class Allowance:
    """How long a standing rank may stand, and why."""

    kind: str
    """``patient``, ``hang`` or ``busy``."""
    limit: float
    p99: float | None
    reading: Reading | None


class _Place:
    __slots__ = (
        "busy",
        "host",
        "longest",
        "patient_since",
        "reading",
        "resumed",
        "sampling",
        "shares",
        "shares_t",
        "smooth",
        "tail",
        "tail_p99",
    )

    def __init__(self, memory: int) -> None:
        self.sampling = False
        self.reading: Reading | None = None
        self.tail: deque[float] = deque(maxlen=memory)
        self.tail_p99: float | None = None  # the p99 of tail once read (None: not since the tail last changed)
        self.longest = 0.0  # the longest save or evaluation the rank finished (seconds)
        self.patient_since: float | None = None  # server time its current save or evaluation began
        self.resumed: float | None = None  # server time a save or an evaluation ended within its current stand
        self.shares: dict[str, float] | None = None  # its newest activity shares
        self.smooth: dict[str, float] = {}  # its activity shares, smoothed over its recent reports
        self.busy: float | None = None  # smoothed share of its time not waiting for others (not in a collective)
        self.host = ""
        self.shares_t: float | None = None  # server time of its newest shares


class RankPlaces:
    """Per job: where each rank stands, and how long it may (see the module docstring)."""

    def __init__(self, knobs: StallKnobs | None = None, max_ranks: int = 65_536) -> None:
        self.knobs = knobs or DEFAULT_KNOBS
        self.max_ranks = max_ranks
        self._places: dict[int, _Place] = {}

    def _place(self, rank: int) -> _Place | None:
        place = self._places.get(rank)
        if place is None and len(self._places) < self.max_ranks:
            place = self._places[rank] = _Place(self.knobs.tail_memory)
        return place

    # ------------------------------------------------------------------------------------------
    # Observations

    def observe(
        self,
        t: float,
        rank: int,
        step: int | None,
        activity: str,
        stood: float,
        detail: str = "",
        frames: Iterable[str] = (),
    ) -> None:
        """A rank's reading of where it stands, in a report that arrived at ``t``."""
        place = self._place(rank)
        if place is None or not math.isfinite(stood):
            return
        place.sampling = True
        if activity in PATIENT:
            if place.patient_since is None:
                place.patient_since = t - max(0.0, stood)  # counted from its step's stand: never too late
        else:
            self._patient_ended(place, t)
        place.reading = Reading(t, step, activity, max(0.0, stood), detail, tuple(frames))

    def observe_shares(self, rank: int, shares: Mapping[str, float], host: str = "", t: float | None = None) -> None:
        """A rank's activity shares of its newest report interval (a report core that samples) at server
        time ``t``, and the host it runs on. Smoothed over the last ``SHARES_SMOOTHING_S`` (a straggler is
        one persistently slower), whatever the rank's report interval."""
        place = self._place(rank)
        if place is None:
            return
        a = SHARES_SMOOTHING
        if t is not None and place.shares_t is not None and t > place.shares_t:
            a = 1.0 - math.exp(-(t - place.shares_t) / SHARES_SMOOTHING_S)
        if t is not None:
            place.shares_t = t
        place.sampling = True
        if host:
            place.host = host
        new = {k: float(v) for k, v in shares.items() if math.isfinite(v)}
        place.shares = new
        total = sum(new.values())
        if total <= 0:
            return
        for key in sorted(set(place.smooth) | set(new)):  # sorted: the same order of keys in every process
            place.smooth[key] = (1 - a) * place.smooth.get(key, new.get(key, 0.0) / total) + a * new.get(
                key, 0.0
            ) / total
        busy = 1.0 - place.smooth.get("communicating", 0.0) - place.smooth.get("waiting", 0.0)
        place.busy = max(busy, 0.0)

    def moved(self, t: float, rank: int, step_time: float | None) -> None:
        """A rank's step moved at ``t`` (``step_time``: seconds per step since its last move, ``None``
        when not known): its reading is over, a save or an evaluation it stood in is finished."""
        place = self._places.get(rank)
        if place is None:
            place = self._place(rank)
            if place is None:
                return
        self._patient_ended(place, t)
        place.reading = None
        place.resumed = None
        if step_time is not None and step_time >= 0 and math.isfinite(step_time):
            place.tail.append(step_time)
            place.tail_p99 = None

    def restart(self, rank: int) -> None:
        """A rank's step went back (a resume from a checkpoint): its step times are learnt afresh."""
        place = self._places.get(rank)
        if place is not None:
            place.tail.clear()
            place.tail_p99 = None
            place.reading = None
            place.patient_since = None
            place.resumed = None

    def _patient_ended(self, place: _Place, t: float) -> None:
        if place.patient_since is not None:
            place.longest = max(place.longest, t - place.patient_since)
            place.patient_since = None
            place.resumed = t

    # ------------------------------------------------------------------------------------------
    # Reading

    def sampling(self, rank: int) -> bool:
        """Whether this rank's reports can say where it stands (it sent a reading or shares)."""
        place = self._places.get(rank)
        return place is not None and place.sampling

    def any_sampling(self) -> bool:
        """Whether some rank of the job can say where it stands."""
        return any(p.sampling for p in self._places.values())

    def reading(self, rank: int, now: float, step: int | None) -> Reading | None:
        """The rank's reading when it is fresh (of its current step, not older than ``fresh_s``)."""
        place = self._places.get(rank)
        if place is None or place.reading is None:
            return None
        r = place.reading
        if r.step != step or now - r.t > self.knobs.fresh_s:
            return None
        return r

    def shares(self, rank: int) -> dict[str, float] | None:
        """The rank's activity shares, smoothed over its recent reports (``None``: none received)."""
        place = self._places.get(rank)
        return None if place is None or not place.smooth else dict(place.smooth)

    def busy(self, rank: int) -> float | None:
        """The smoothed share of the rank's time it does its own work (not in a collective, not waiting):
        in synchronous data parallelism every rank steps at the same rate, and a slow rank shows as the
        others waiting for it in the collectives."""
        place = self._places.get(rank)
        return None if place is None else place.busy

    def host(self, rank: int) -> str:
        """The host the rank reported from (empty when not known)."""
        place = self._places.get(rank)
        return "" if place is None else place.host

    def p99(self, rank: int) -> float | None:
        """The rank's p99 step time, interpolated between the two nearest ranks (as numpy's quantile)."""
        place = self._places.get(rank)
        if place is None or not place.tail:
            return None
        if place.tail_p99 is not None:
            return place.tail_p99  # read at every verdict while the rank stands; its tail changes when it steps
        ordered = sorted(place.tail)
        at = 0.99 * (len(ordered) - 1)  # interpolated, as numpy's default: with fewer than 100 step times
        low = math.floor(at)  # the longest alone would make one freak step the whole allowance
        high = min(low + 1, len(ordered) - 1)
        place.tail_p99 = ordered[low] + (ordered[high] - ordered[low]) * (at - low)
        return place.tail_p99

    def resumed(self, rank: int) -> float | None:
        """When a save or an evaluation ended within the rank's current stand (server time; ``None``: none
        did): what the rank does after it (the rest of its step) is counted from there, not from the
        start of its stand (a step that saves, then sleeps half a second, is no hang of the whole save)."""
        place = self._places.get(rank)
        return None if place is None else place.resumed

    def longest_patient(self, rank: int) -> float:
        """The longest save or evaluation the rank finished (seconds; 0 when none)."""
        place = self._places.get(rank)
        return 0.0 if place is None else place.longest

    def allowance(self, rank: int, now: float, step: int | None, elsewhere: str | None) -> Allowance:
        """How long the rank may stand at ``now``; ``elsewhere``: the kind of the place another standing
        rank of the job stands in (``patient``, ``hang``; ``None`` when none stands outside a collective)."""
        k = self.knobs
        p99 = self.p99(rank)
        tail = p99 or 0.0
        reading = self.reading(rank, now, step)
        activity = reading.activity if reading is not None else None
        kind = "busy"
        if activity in PATIENT:
            kind = "patient"
        elif activity in HANG:
            kind = "hang"
        elif activity == "communicating" and elsewhere is not None:
            kind = elsewhere  # it waits for a rank that saves (patient) or hangs (hang)
        if kind == "patient":
            longest = max((p.longest for p in self._places.values()), default=0.0)
            limit = max(k.patient_floor_s, k.patient_factor * longest) + tail
        elif kind == "hang":
            limit = max(k.hang_floor_s, k.hang_steps * tail - k.hang_margin_s)
        else:
            limit = max(k.busy_floor_s, k.busy_steps * tail)
        return Allowance(kind, limit, p99, reading)


def kind_of(activity: str | None) -> str | None:
    """The kind of place an activity is (``patient``, ``hang``), ``None`` for a collective or compute."""
    if activity in PATIENT:
        return "patient"
    if activity in HANG:
        return "hang"
    return None


def place_words(reading: Reading | None) -> str:
    """Where a rank stands, in words: 'in wait_for_lock (hung_rank.py:31), waiting (threading.Lock.acquire)'."""
    if reading is None:
        return ""
    what = _ACTIVITY_WORDS.get(reading.activity, reading.activity)
    if reading.frames and reading.activity == "other":
        words = f"in {reading.frames[0]}"
    elif reading.frames:
        words = f"in {reading.frames[0]}, {what}"
    else:
        words = what
    if reading.detail:
        words += f" ({reading.detail})"
    return words


def waiting_words(readings: Mapping[int, Reading | None]) -> str:
    """'rank 0 waits for it in torch.distributed.all_reduce', 'ranks 0, 2 and 3 wait for it in ...'."""
    by_place: dict[str, list[int]] = {}
    for rank, reading in sorted(readings.items()):
        if reading is None:
            where = ""
        elif reading.detail:
            where = f" in {reading.detail}"
        elif reading.frames:
            where = f" in {reading.frames[0]}"
        else:
            where = f" {_ACTIVITY_WORDS.get(reading.activity, reading.activity)}"
        by_place.setdefault(where, []).append(rank)
    parts = []
    for where, ranks in by_place.items():
        verb = "waits" if len(ranks) == 1 else "wait"
        parts.append(f"{rank_list(ranks)} {verb} for it{where}")
    return "; ".join(parts)


def rank_list(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0 and 2', 'ranks 0, 2 and 3', 'ranks 0, 1, 2 and 13 more'."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    shown = [str(r) for r in ordered[:4]]
    if len(ordered) > 4:
        return f"ranks {', '.join(shown[:3])} and {len(ordered) - 3} more"
    return f"ranks {', '.join(shown[:-1])} and {shown[-1]}"


def duration(seconds: float) -> str:
    """A duration for a sentence: '45 s', '3 min 20 s', '2 h 10 min'."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def straggler_words(slow: Mapping[str, float] | None, typical: Mapping[str, float] | None) -> str:
    """Where a slow rank's extra time goes, from its activity shares against the median rank's:
    'its extra time goes to loading data (62% of its time against 8%)'."""
    if not slow or not typical:
        return ""
    gains = {a: slow.get(a, 0.0) - typical.get(a, 0.0) for a in set(slow) | set(typical)}
    activity, gain = max(gains.items(), key=lambda item: (item[1], item[0]))
    if gain <= 0.05:
        return ""
    what = _ACTIVITY_WORDS.get(activity, activity)
    return (
        f"its extra time goes to {what} ({slow.get(activity, 0.0):.0%} of its time against "
        f"{typical.get(activity, 0.0):.0%} for the median rank)"
    )


@dataclass(frozen=True, slots=True)
class Standing:
    """A rank whose step stands while its reports arrive, as the tracker knows it."""

    rank: int
    step: int
    since: float
    """Server time its step last moved (or its announced evaluation ended)."""
    moved: bool
    """Its step moved in this segment (before that, the start-up allowance holds)."""
    eval_since: float | None = None
    """Server time of the start of the evaluation its reports announce (``progress.phase``)."""
    idle: bool = False
    """Its GPUs idle (while the others' may be busy)."""


_Judged = tuple[Standing, Allowance, float]
"""A standing rank, its allowance and how long it has stood."""


def judge(
    places: RankPlaces,
    standing: Iterable[Standing],
    now: float,
    *,
    startup_s: float,
    eval_limit: float,
    ranks: int,
) -> tuple[float, dict[str, object]] | None:
    """The stall of a job whose ranks can say where they stand: ``(since, evidence)`` when a rank
    stood past its allowance, ``None`` otherwise. ``ranks``: how many ranks the job has.

    The ranks named are the ones **holding** the others: those standing outside a collective (a hang
    before a save, the lowest step, idle GPUs, the first to stand); the ranks in a collective wait for
    them, and the evidence says where each stands, in words."""
    found = list(standing)
    if not found:
        return None
    fresh = {s.rank: places.reading(s.rank, now, s.step) for s in found}
    kinds = {s.rank: kind_of(r.activity if r is not None else None) for s, r in zip(found, fresh.values())}
    judged: list[_Judged] = []
    late = False
    for s in found:
        others = [k for rank, k in kinds.items() if rank != s.rank and k is not None]
        elsewhere = "hang" if "hang" in others else ("patient" if others else None)
        allowed = places.allowance(s.rank, now, s.step, elsewhere)
        reading = allowed.reading
        stood = max(now - s.since, reading.standing(now) if reading is not None else 0.0)
        resumed = places.resumed(s.rank)
        if resumed is not None and allowed.kind != "patient":
            stood = now - max(resumed, s.since)  # the save or evaluation it stood in is over: counted from its end
        limit = allowed.limit
        if s.eval_since is not None:  # an evaluation its reports announce: counted from its start
            stood, limit = now - s.eval_since, max(limit, eval_limit)
        elif not s.moved and allowed.kind != "patient":
            limit = max(limit, startup_s)  # loading, compiling, restoring before the first step
        judged.append((s, Allowance(allowed.kind, limit, allowed.p99, reading), stood))
        late = late or stood > limit
    if not late:
        return None

    def in_collective(item: _Judged) -> bool:
        reading = item[1].reading
        return reading is not None and reading.activity == "communicating"

    holders = [item for item in judged if not in_collective(item)]
    waiters = [item for item in judged if in_collective(item)]
    order = {"hang": 0, "busy": 1, "patient": 2}
    pick = holders or judged
    s, allowed, stood = min(pick, key=lambda i: (order[i[1].kind], i[0].step, not i[0].idle, i[0].since, i[0].rank))
    named = [i for i in pick if i[1].kind == allowed.kind and i[0].step == s.step] if holders else pick
    return s.since, _evidence(
        places, (s, allowed, stood), named, waiters if holders else [], ranks - len(judged), ranks, now
    )


def _evidence(
    places: RankPlaces,
    chosen: _Judged,
    named: list[_Judged],
    waiters: list[_Judged],
    behind: int,
    ranks: int,
    now: float,
) -> dict[str, object]:
    """The evidence of a stall judged by :func:`judge`, with its sentence."""
    s, allowed, stood = chosen
    reading = allowed.reading
    who = f"rank {s.rank}" if ranks > 1 else "the step"
    message = f"{who} has stood {duration(stood)} after step {s.step:,}"
    place = place_words(reading)
    if place:
        message += f" {place}"
    if allowed.kind == "patient":
        longest = places.longest_patient(s.rank)
        message += f", longer than a save or an evaluation may last ({duration(allowed.limit)}"
        message += f": 4x its longest finished, {duration(longest)})" if longest else ")"
    elif allowed.kind == "busy" and allowed.p99 is not None:
        message += f", {stood / allowed.p99:.0f}x its p99 step time ({allowed.p99:.3g} s"
        message += f"; allowed {duration(allowed.limit)})"
    elif allowed.kind == "busy":
        message += f" (allowed {duration(allowed.limit)})"
    if len(named) > 1:
        also = [i[0].rank for i in named if i[0].rank != s.rank]
        message += f"; {rank_list(also)} stand{'s' if len(also) == 1 else ''} there too"
    if waiters:
        message += "; " + waiting_words({i[0].rank: i[1].reading for i in waiters})
    if ranks > 1 and behind > 0:
        message += f"; {behind} of the other {ranks - 1} ranks move on"
    evidence: dict[str, object] = {
        "metric": "step",
        "window": {"seconds": round(allowed.limit, 1)},
        "threshold": round(allowed.limit, 1),
        "observed": round(stood, 1),
        "since": s.since,
        "message": message,
        "rank": s.rank,
        "step": s.step,
        "step_time": allowed.p99,
        "kind": allowed.kind,
        "holding": sorted(i[0].rank for i in named),
        "waiting": sorted(i[0].rank for i in waiters),
    }
    if reading is not None:
        evidence.update(activity=reading.activity, place=place, frames=list(reading.frames))
        if reading.detail:
            evidence["detail"] = reading.detail
    if s.eval_since is not None:
        evidence.update(phase="eval", eval_seconds=round(now - s.eval_since, 1))
    return evidence
