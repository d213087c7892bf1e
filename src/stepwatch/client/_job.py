"""A job as the API shows it: identity read at once, its parts (progress, ETA, health, cost...) at first access,
so that a list of 10,000 jobs costs little more than its JSON; ``raw`` is the JSON object (what
``stepwatch jobs -o json`` prints).

Lists come in the server's column form (one array per field, see :class:`Columns`): a job of a list reads
its fields from its place in the columns, and builds ``raw`` only when it is asked for."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ..protocol import ENDED_STATES, Command, ended_short_text, format_rfc3339
from ._errors import InvalidResponse
from ._html import HEALTH_COLOURS, MAX_ROWS, STATE_COLOURS, badge, duration, money, number, progress_bar
from ._models import JobPolicy, _pandas, command_from
from ._parse import as_dict, as_list, opt_float, opt_int, opt_str, req_int, req_str, sub, to_float
from ._verdict import StallPlace, Straggler

__all__ = [
    "END_STATES",
    "LOSS_KEYS",
    "Columns",
    "Cost",
    "Eta",
    "Health",
    "Job",
    "JobList",
    "Progress",
    "Rank",
    "Resources",
    "Times",
    "TrainerStatus",
    "job_html",
    "jobs_html",
]

END_STATES = frozenset({"finished", "failed", "stopped"})
"""States a job does not leave (a new attempt is a new job view)."""
LOSS_KEYS = ("loss", "train/loss", "train_loss")
"""Where the training loss is found: the first of these a job reports (as the CLI reads it)."""


@dataclass(frozen=True)
class Progress:
    """How far a job is: percent (from steps, else epochs, else what it reported), step x of y, epoch x of y."""

    percent: float | None = None
    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    total_epochs: float | None = None
    samples: int | None = None
    steps_per_second: float | None = None
    samples_per_second: float | None = None
    world_size: int | None = None

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "progress") -> Progress:
        """Read the ``progress`` object of a job view."""
        return cls(
            percent=opt_float(obj, "percent", where),
            step=opt_int(obj, "step", where),
            total_steps=opt_int(obj, "total_steps", where),
            epoch=opt_float(obj, "epoch", where),
            total_epochs=opt_float(obj, "total_epochs", where),
            samples=opt_int(obj, "samples", where),
            steps_per_second=opt_float(obj, "steps_per_second", where),
            samples_per_second=opt_float(obj, "samples_per_second", where),
            world_size=opt_int(obj, "world_size", where),
        )


@dataclass(frozen=True)
class Eta:
    """When a job should end: seconds left and the finish time (Unix s) as readers show them, where they come
    from, what the job itself last reported, and stepwatch's own estimate beside it."""

    remaining_seconds: float | None = None
    finish_time: float | None = None
    reported_seconds: float | None = None
    """The ETA the job last sent (its Kubeflow client's ``estimatedRemainingSeconds``, or its own), as sent."""
    source: str | None = None
    """``reported`` (the job's own ETA, counted down since it arrived), ``estimate`` (stepwatch's, from the
    recent rate) or ``final`` (0 once finished); ``None`` when no ETA is known."""
    estimate_seconds: float | None = None
    """stepwatch's own estimate, shown beside a reported ETA (``None`` when it has none)."""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "eta") -> Eta:
        """Read the ``eta`` object of a job view."""
        return cls(
            remaining_seconds=opt_float(obj, "remaining_seconds", where),
            finish_time=opt_float(obj, "finish_time", where),
            reported_seconds=opt_float(obj, "reported_seconds", where),
            source=opt_str(obj, "source", where),
            estimate_seconds=opt_float(obj, "estimate_seconds", where),
        )


@dataclass(frozen=True)
class Times:
    """A job's times (Unix seconds) and durations (seconds), as of when the server answered."""

    created: float | None = None
    started: float | None = None
    finished: float | None = None
    updated: float | None = None
    last_report: float | None = None
    elapsed_seconds: float | None = None
    report_age_seconds: float | None = None

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "times") -> Times:
        """Read the ``times`` object of a job view."""
        return cls(**{key: opt_float(obj, key, where) for key in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Health:
    """``healthy``, ``stalled``, ``not_learning``, ``diverging``, ``straggling`` or ``unknown``, since when, and why."""

    state: str = "unknown"
    since: float | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    place: StallPlace | None = None
    """Where the stalled rank stands (rank, kind, activity, frames, the ranks waiting for it), when its report
    core read it; ``None`` for other verdicts."""
    straggler: Straggler | None = None
    """The straggler of a ``straggling`` verdict (rank, host, ratio, speedup without it, activity shares)."""

    @property
    def rank(self) -> int | None:
        """The rank the verdict names (the one holding the others, the straggler), when it names one."""
        rank = self.evidence.get("rank")
        return rank if isinstance(rank, int) and not isinstance(rank, bool) else None

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong (``healthy``, or ``unknown`` for want of data)."""
        return self.state in ("healthy", "unknown")

    @property
    def message(self) -> str:
        """The evidence's one-line explanation, when it has one."""
        text = self.evidence.get("message")
        return text if isinstance(text, str) else ""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "health") -> Health:
        """Read the ``health`` object of a job view."""
        raw = obj.get("evidence")
        evidence = as_dict(raw, f"{where}.evidence") if raw is not None else {}
        return cls(
            state=opt_str(obj, "state", where) or "unknown",
            since=opt_float(obj, "since", where),
            evidence=evidence,
            place=StallPlace.from_evidence(evidence, f"{where}.evidence"),
            straggler=Straggler.from_evidence(evidence, f"{where}.evidence"),
        )


@dataclass(frozen=True)
class HealthSpan:
    """One verdict a job had, kept after it recovers or ends: its state, when it was recorded
    (``start``) and replaced (``end``: ``None`` while it stands), when the analysis says it began
    (``since``: for ``not_learning`` the last real improvement, before ``start``), how long it stood,
    what that time cost and how much of it was wasted (``None``: no price). ``covers`` is the time it covers on
    the job's health timeline (``(from, to)``: no overlap with the others, no gap, adding up to the job's elapsed
    time; a verdict that reaches back, like a plateau from its last real improvement, covers from its ``since``);
    ``seconds`` is its length. A time with no verdict is a span of state ``unknown``."""

    state: str
    start: float | None = None
    end: float | None = None
    since: float | None = None
    message: str = ""
    rank: int | None = None
    seconds: float | None = None
    cost: float | None = None
    wasted: float | None = None
    covers: tuple[float, float] | None = None

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "health_history[]") -> HealthSpan:
        """Read one item of a job's ``health_history`` (the API's ``from`` and ``to`` are ``start`` and ``end``)."""
        return cls(
            state=opt_str(obj, "state", where) or "unknown",
            start=opt_float(obj, "from", where),
            end=opt_float(obj, "to", where),
            since=opt_float(obj, "since", where),
            message=opt_str(obj, "message", where) or "",
            rank=opt_int(obj, "rank", where),
            seconds=opt_float(obj, "seconds", where),
            cost=opt_float(obj, "cost", where),
            wasted=opt_float(obj, "wasted", where),
            covers=_covers(obj, where),
        )


def _covers(obj: Mapping[str, Any], where: str) -> tuple[float, float] | None:
    start, end = opt_float(obj, "start", where), opt_float(obj, "end", where)
    return (start, end) if start is not None and end is not None else None


@dataclass(frozen=True)
class Cost:
    """What a job costs (``None``: unknown, not free): rate per hour, spent, projected at the ETA, wasted, saved."""

    currency: str = "USD"
    rate_per_hour: float | None = None
    spent: float | None = None
    projected: float | None = None
    wasted: float | None = None
    wasted_since: float | None = None
    saved: float | None = None
    """Money the job's policy saved by stopping it early."""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "cost") -> Cost:
        """Read the ``cost`` object of a job view."""
        return cls(
            currency=opt_str(obj, "currency", where) or "USD",
            **{key: opt_float(obj, key, where) for key in cls.__dataclass_fields__ if key != "currency"},
        )


@dataclass(frozen=True)
class Resources:
    """The GPUs a job holds and the price of a GPU hour."""

    gpus: float = 0.0
    gpu_type: str | None = None
    gpu_hour_cost: float = 0.0

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "resources") -> Resources:
        """Read the ``resources`` object of a job view."""
        return cls(
            gpus=opt_float(obj, "gpus", where) or 0.0,
            gpu_type=opt_str(obj, "gpu_type", where),
            gpu_hour_cost=opt_float(obj, "gpu_hour_cost", where) or 0.0,
        )


@dataclass(frozen=True)
class TrainerStatus:
    """A job's state in Kubeflow Trainer's shape (KEP-2779 ``trainerStatus``); :meth:`to_dict` is the wire form."""

    progress_percentage: int | None = None
    estimated_remaining_seconds: int | None = None
    metrics: tuple[tuple[str, str], ...] = ()
    """``(name, value)`` pairs, values as strings (upstream's shape)."""
    last_updated_time: str | None = None
    """RFC 3339."""

    def to_dict(self) -> dict[str, Any]:
        """``{"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}``."""
        out: dict[str, Any] = {"metrics": [{"name": n, "value": v} for n, v in self.metrics]}
        if self.progress_percentage is not None:
            out["progressPercentage"] = self.progress_percentage
        if self.estimated_remaining_seconds is not None:
            out["estimatedRemainingSeconds"] = self.estimated_remaining_seconds
        if self.last_updated_time is not None:
            out["lastUpdatedTime"] = self.last_updated_time
        return out

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "trainerStatus") -> TrainerStatus:
        """Read a ``trainerStatus`` object."""
        metrics = []
        for i, item in enumerate(as_list(obj.get("metrics") or [], f"{where}.metrics")):
            m = as_dict(item, f"{where}.metrics[{i}]")
            metrics.append((req_str(m, "name", f"{where}.metrics[{i}]"), req_str(m, "value", f"{where}.metrics[{i}]")))
        return cls(
            progress_percentage=opt_int(obj, "progressPercentage", where),
            estimated_remaining_seconds=opt_int(obj, "estimatedRemainingSeconds", where),
            metrics=tuple(metrics),
            last_updated_time=opt_str(obj, "lastUpdatedTime", where),
        )


@dataclass(frozen=True)
class Rank:
    """One rank of a distributed job, as its last heartbeat said."""

    rank: int
    step: int | None = None
    step_time: float | None = None
    host: str | None = None
    pid: int | None = None
    last_report_age_seconds: float | None = None

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str) -> Rank:
        """Read one item of a job's ``ranks``."""
        return cls(
            rank=req_int(obj, "rank", where),
            step=opt_int(obj, "step", where),
            step_time=opt_float(obj, "step_time", where),
            host=opt_str(obj, "host", where),
            pid=opt_int(obj, "pid", where),
            last_report_age_seconds=opt_float(obj, "last_report_age_seconds", where),
        )


class Columns:
    """A list in the server's column form (``?form=columns``): ``{name: [one value per job]}``.

    A name is a field of the job view, or ``field.subfield`` for the fields of its objects
    (``progress.percent``); the value of job ``i`` is the ``i``-th of each column. Columns this client does
    not know are kept (``raw`` has them), so a later server may add some.
    """

    __slots__ = ("_fields", "length")

    def __init__(self, raw: object, where: str = "jobs.columns") -> None:
        columns = as_dict(raw, where)
        length: int | None = None
        fields: dict[str, Any] = {}
        """A view's field: its column, or ``[(subfield, column), ...]`` for an object."""
        for name, values in columns.items():
            column = as_list(values, f"{where}.{name}")
            if length is None:
                length = len(column)
            elif len(column) != length:
                raise InvalidResponse(
                    f"the server's answer is malformed: {where}.{name} has {len(column)} values, "
                    f"the other columns {length}"
                )
            top, dot, key = name.partition(".")
            kept = fields.setdefault(top, _Group() if dot else column)
            if dot and isinstance(kept, _Group):
                kept.append((key, column))
            elif kept is not column:
                raise InvalidResponse(f"the server's answer is malformed: {where}.{name} clashes with another column")
        self._fields = fields
        self.length = length or 0

    def value(self, key: str, i: int) -> Any:
        """Field ``key`` of job ``i`` as the item form has it (an object for ``progress``...; ``None``: absent)."""
        found = self._fields.get(key)
        if found is None:
            return None
        if isinstance(found, _Group):
            return {sub_key: column[i] for sub_key, column in found}
        return found[i]

    def column(self, key: str) -> list[Any] | None:
        """A top-level field's column (``None``: absent, or an object's field)."""
        found = self._fields.get(key)
        return None if found is None or isinstance(found, _Group) else found

    def item(self, i: int) -> dict[str, Any]:
        """Job ``i`` as one JSON object, as the item form has it."""
        return {key: self.value(key, i) for key in self._fields}


class _Group(list[tuple[str, list[Any]]]):
    """The columns of one object of the view: ``(subfield, column)`` pairs."""


class Job:
    """One job (its latest attempt, unless asked for another), as the server showed it when it answered.

    Identity is read at once; ``progress``, ``eta``, ``health``, ``cost``... at first access. A job read
    with :meth:`Client.job` also has ``metric_names``, ``pending_commands``, ``policy``, ``ranks`` and
    ``health_history`` (``None`` in lists).
    """

    __slots__ = ("_at", "_columns", "_parts", "_raw", "attempt", "name", "namespace", "state")

    def __init__(self, raw: object, where: str = "job") -> None:
        obj = as_dict(raw, where)
        self._raw: dict[str, Any] | None = obj
        self._columns: Columns | None = None
        self._at = 0
        self.namespace: str = req_str(obj, "namespace", where)
        self.name: str = req_str(obj, "name", where)
        self.state: str = req_str(obj, "state", where)
        """``pending``, ``running``, ``finished``, ``failed`` or ``stopped``."""
        self.attempt: int = opt_int(obj, "attempt", where) or 1
        self._parts: dict[str, Any] = {}

    @classmethod
    def _listed(cls, columns: Columns, i: int, namespace: str, name: str, state: str, attempt: int) -> Job:
        """Job ``i`` of a list in column form (its identity already checked)."""
        job = cls.__new__(cls)
        job._raw, job._columns, job._at = None, columns, i
        job.namespace, job.name, job.state, job.attempt = namespace, name, state, attempt
        job._parts = {}
        return job

    @property
    def raw(self) -> dict[str, Any]:
        """The JSON object of the API."""
        if self._raw is None:
            assert self._columns is not None
            self._raw = self._columns.item(self._at)
        return self._raw

    def _get(self, key: str) -> Any:
        if self._raw is not None:
            return self._raw.get(key)
        assert self._columns is not None
        return self._columns.value(key, self._at)

    def _sub(self, key: str) -> Any:
        if self._raw is not None:
            return sub(self._raw, key, "job")
        assert self._columns is not None
        value = self._columns.value(key, self._at)
        return value if isinstance(value, dict) else sub({key: value}, key, "job")

    def _part(self, key: str, reader: Any) -> Any:
        found = self._parts.get(key)
        if found is None:
            found = self._parts[key] = reader(self._sub(key), key)
        return found

    def __reduce__(self) -> tuple[Any, ...]:
        return (Job, (self.raw,))  # a job of a list pickles alone, not with its list's columns

    # ------------------------------------------------------------------------------- the parts

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def ended(self) -> bool:
        """Whether it has finished, failed or stopped."""
        return self.state in END_STATES

    @property
    def ended_short(self) -> str | None:
        """``"ended at 49.8%"`` when it ended short of its total (a script that exited at step 199 of
        400, finished or not), else ``None``; its ``percent`` stays its real progress."""
        return ended_short_text(self.state, self.percent)

    @property
    def progress(self) -> Progress:
        """Percent, step x of y, epoch x of y, throughput."""
        found: Progress = self._part("progress", Progress.from_dict)
        return found

    @property
    def eta(self) -> Eta:
        """Seconds left and the finish time."""
        found: Eta = self._part("eta", Eta.from_dict)
        return found

    @property
    def times(self) -> Times:
        """When it was created, started, last reported, ended."""
        found: Times = self._part("times", Times.from_dict)
        return found

    @property
    def health(self) -> Health:
        """Its health with the evidence."""
        found: Health = self._part("health", Health.from_dict)
        return found

    @property
    def cost(self) -> Cost:
        """Spent, projected, wasted, saved."""
        found: Cost = self._part("cost", Cost.from_dict)
        return found

    @property
    def resources(self) -> Resources:
        """GPUs and the price of a GPU hour."""
        found: Resources = self._part("resources", Resources.from_dict)
        return found

    @property
    def metrics(self) -> dict[str, float]:
        """The last value of each metric (NaN and ±Inf as floats)."""
        found = self._parts.get("metrics")
        if found is None:
            raw = self._sub("metrics")
            found = self._parts["metrics"] = {k: to_float(v, "job.metrics", k) for k, v in raw.items()}
        return dict(found)

    @property
    def params(self) -> dict[str, Any]:
        """Hyperparameters (only in a job read on its own)."""
        return dict(self._sub("params"))

    @property
    def reason(self) -> str:
        """Why it ended (or was stopped), when it said."""
        return opt_str({"reason": self._get("reason")}, "reason", "job") or ""

    @property
    def exit_code(self) -> int | None:
        """The exit code of its process (jobs started with ``stepwatch run``)."""
        return opt_int({"exit_code": self._get("exit_code")}, "exit_code", "job")

    @property
    def source(self) -> str:
        """``native``, ``runner`` or ``kubeflow``."""
        return opt_str({"source": self._get("source")}, "source", "job") or "native"

    @property
    def loss(self) -> float | None:
        """The training loss (``loss``, ``train/loss`` or ``train_loss``), when it reports one."""
        metrics = self.metrics
        for key in LOSS_KEYS:
            if key in metrics:
                return metrics[key]
        return None

    @property
    def metric_means(self) -> dict[str, float]:
        """The mean of each metric's latest window (``{}`` from a server that does not send them)."""
        found = self._parts.get("metric_means")
        if found is None:
            raw = as_dict(self._get("metric_means") or {}, "job.metric_means")
            found = self._parts["metric_means"] = {k: to_float(v, "job.metric_means", k) for k, v in raw.items()}
        return dict(found)

    @property
    def loss_mean(self) -> float | None:
        """The training loss as lists show it: the mean of its latest window where the server sends one, else
        the last value (:attr:`loss`); smoother than one batch."""
        means = self.metric_means
        for key in LOSS_KEYS:
            if key in means:
                return means[key]
        return self.loss

    @property
    def percent(self) -> float | None:
        """Shortcut for ``progress.percent``."""
        return self.progress.percent

    @property
    def eta_seconds(self) -> float | None:
        """Shortcut for ``eta.remaining_seconds``."""
        return self.eta.remaining_seconds

    @property
    def trainer_status(self) -> TrainerStatus:
        """The same state in Kubeflow Trainer's ``trainerStatus`` shape (the server's, or built alike for lists)."""
        raw = self._get("trainerStatus")
        if raw is not None:
            return TrainerStatus.from_dict(as_dict(raw, "job.trainerStatus"))
        metrics = [(k, _metric_string(v)) for k, v in sorted(self.metrics.items())]
        if self.progress.step is not None:
            metrics.insert(0, ("current_step", str(self.progress.step)))
        remaining = self.eta.remaining_seconds
        last = self.times.last_report
        return TrainerStatus(
            progress_percentage=int(self.percent) if self.percent is not None else None,
            estimated_remaining_seconds=round(remaining) if remaining is not None else None,
            metrics=tuple(metrics[:256]),
            last_updated_time=format_rfc3339(last) if last is not None else None,
        )

    # ---------------------------------------------------------------- only in a job read on its own

    @property
    def metric_names(self) -> list[str] | None:
        """Every metric it has history for."""
        names = self._get("metric_names")
        return [str(n) for n in as_list(names, "job.metric_names")] if names is not None else None

    @property
    def pending_commands(self) -> list[Command] | None:
        """Commands it has not acknowledged yet."""
        items = self._get("pending_commands")
        if items is None:
            return None
        return [command_from(c, f"job.pending_commands[{i}]") for i, c in enumerate(as_list(items, "job"))]

    @property
    def policy(self) -> JobPolicy | None:
        """Its policy: own layer, effective policy, what it did."""
        found = self._get("policy")
        return JobPolicy.from_dict(as_dict(found, "job.policy"), "job.policy") if found is not None else None

    @property
    def health_history(self) -> list[HealthSpan] | None:
        """Every verdict it had, oldest first, with its span and cost (``None`` in lists)."""
        items = self._get("health_history")
        if items is None:
            return None
        where = "job.health_history"
        return [
            HealthSpan.from_dict(as_dict(s, f"{where}[{i}]"), f"{where}[{i}]")
            for i, s in enumerate(as_list(items, where))
        ]

    @property
    def ranks(self) -> list[Rank] | None:
        """Each rank's last heartbeat."""
        items = self._get("ranks")
        if items is None:
            return None
        return [Rank.from_dict(as_dict(r, f"job.ranks[{i}]"), f"job.ranks[{i}]") for i, r in enumerate(items)]

    # ------------------------------------------------------------------------------- display

    def __repr__(self) -> str:
        percent = self.percent
        shown = self.ended_short or (f"{percent:.1f}%" if percent is not None else "-")
        return f"<Job {self.key} #{self.attempt} {self.state} {self.health.state} {shown}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]

    def _repr_html_(self) -> str:
        return job_html(self)


class JobList(list[Job]):
    """Jobs as a list, with ``total`` (how many matched before the limit) and a notebook table."""

    total: int

    def __init__(self, jobs: Sequence[Job] = (), total: int | None = None) -> None:
        super().__init__(jobs)
        self.total = len(jobs) if total is None else total

    def _repr_html_(self) -> str:
        return jobs_html(self)

    def to_pandas(self) -> Any:
        """One row per job: identity, progress, ETA, health, cost and loss (needs pandas)."""
        pd = _pandas()
        return pd.DataFrame([_job_row(j) for j in self])


# ------------------------------------------------------------------------------------- notebook HTML


def job_html(job: Job) -> str:
    """One job: name, state, health (with its evidence), progress bar, step, epoch, ETA, metrics, cost."""
    p, health, cost = job.progress, job.health, job.cost
    colour = HEALTH_COLOURS.get(health.state, "#6e7781")
    epoch = "-" if p.epoch is None else (f"{p.epoch:g}/{p.total_epochs:g}" if p.total_epochs else f"{p.epoch:g}")
    metrics = "".join(
        f"<tr><td>{escape(name)}</td><td>{number(value)}</td></tr>" for name, value in sorted(job.metrics.items())[:32]
    )
    why = f"<div><i>{escape(health.message)}</i></div>" if health.message else ""
    reason = f"<div>reason: {escape(job.reason)}</div>" if job.reason else ""
    spans = job.health_history or []
    # every verdict it had, as the dashboard and describe show them (a job only ever healthy: nothing to add)
    if any(s.state not in ("healthy", "unknown") for s in spans):
        lines = "".join(
            f"<li>{badge(s.state, HEALTH_COLOURS.get(s.state, '#6e7781'))} for {duration(s.seconds)}"
            + (f", {money(s.wasted, cost.currency)} wasted" if s.wasted else "")
            + (" (still)" if s.end is None and job.state not in ENDED_STATES else "")
            + "</li>"
            for s in spans[-20:]
        )
        why += f'<div>health history:<ul style="margin:0">{lines}</ul></div>'
    return (
        '<div class="stepwatch-job" style="font-family:system-ui,sans-serif;line-height:1.5">'
        f"<div><b>{escape(job.namespace)}/{escape(job.name)}</b> #{job.attempt} "
        f"{badge(job.state, STATE_COLOURS.get(job.state, '#6e7781'))} {badge(health.state, colour)}</div>"
        f"{progress_bar(job.progress.percent, colour)}"
        + (f"<div>{escape(job.ended_short)}</div>" if job.ended_short else "")
        + f"<div>step {_step(job)} · epoch {escape(epoch)} · ETA {duration(job.eta.remaining_seconds)}"
        f" · loss {number(job.loss_mean)}</div>"
        f"<div>cost: spent {money(cost.spent, cost.currency)} · projected {money(cost.projected, cost.currency)}"
        f" · wasted {money(cost.wasted, cost.currency)}</div>"
        f"{why}{reason}" + (f'<table style="font-size:.9em">{metrics}</table>' if metrics else "") + "</div>"
    )


def jobs_html(jobs: Sequence[Job]) -> str:
    """A table of jobs with a progress bar each."""
    head = "".join(
        f"<th>{h}</th>" for h in ("job", "state", "health", "progress", "step", "ETA", "loss", "spent", "wasted")
    )
    rows = []
    for job in jobs[:MAX_ROWS]:
        colour = HEALTH_COLOURS.get(job.health.state, "#6e7781")
        rows.append(
            "<tr>"
            f"<td>{escape(job.namespace)}/{escape(job.name)}</td>"
            f"<td>{badge(job.state, STATE_COLOURS.get(job.state, '#6e7781'))}</td>"
            f'<td title="{escape(job.health.message)}">{badge(job.health.state, colour)}</td>'
            f"<td>{progress_bar(job.progress.percent, colour, '8em')}</td>"
            f"<td>{_step(job)}</td><td>{duration(job.eta.remaining_seconds)}</td><td>{number(job.loss_mean)}</td>"
            f"<td>{money(job.cost.spent, job.cost.currency)}</td><td>{money(job.cost.wasted, job.cost.currency)}</td>"
            "</tr>"
        )
    more = f"<p>and {len(jobs) - MAX_ROWS} more</p>" if len(jobs) > MAX_ROWS else ""
    return (
        '<table class="stepwatch-jobs" style="font-family:system-ui,sans-serif">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"
        if jobs
        else "<p>no jobs</p>"
    )


def _step(job: Job) -> str:
    p = job.progress
    if p.step is None:
        return "-"
    return f"{p.step}/{p.total_steps}" if p.total_steps else str(p.step)


def _job_row(job: Job) -> dict[str, Any]:
    p, c = job.progress, job.cost
    return {
        "namespace": job.namespace,
        "name": job.name,
        "attempt": job.attempt,
        "state": job.state,
        "health": job.health.state,
        "percent": p.percent,
        "step": p.step,
        "total_steps": p.total_steps,
        "epoch": p.epoch,
        "eta_seconds": job.eta.remaining_seconds,
        "loss": job.loss,
        "gpus": job.resources.gpus,
        "spent": c.spent,
        "projected": c.projected,
        "wasted": c.wasted,
    }


def _metric_string(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)[:64]
