"""Typed views of what the server says besides jobs (``_job``): policies, commands, history, events, costs.

Every model keeps what it was read from where it is useful (``raw``); a malformed answer is an
:class:`InvalidResponse` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..protocol import Command, ProtocolError
from ._errors import InvalidResponse
from ._parse import as_dict, as_list, opt_bool, opt_float, opt_int, opt_str, req_str, sub

__all__ = [
    "CommandSent",
    "CostTotals",
    "Costs",
    "Event",
    "History",
    "HistoryRow",
    "JobPolicy",
    "MetricPoint",
    "MetricSeries",
    "NamespacePolicy",
    "Policy",
    "command_from",
]


@dataclass(frozen=True)
class Policy:
    """A policy layer: on which trigger which action, a budget, a deadline... (see docs/policies.md).

    Only what is set is sent: ``Policy(on={"not_learning": "checkpoint_stop"}, budget=250)``.
    """

    on: Mapping[str, str] = field(default_factory=dict)
    """Trigger -> action: ``stalled``, ``not_learning``, ``diverging``, ``over_budget``, ``past_deadline``,
    ``late``, ``finished``, ``failed`` -> ``notify``, ``checkpoint_stop``, ``stop`` or ``none``."""
    budget: float | None = None
    deadline: float | str | None = None
    """Unix seconds, or RFC 3339 with a zone."""
    dry_run: bool | None = None
    metric: str | None = None
    mode: str | None = None
    notify: Sequence[str] = ()
    max_at_risk: float | None = None
    auto_checkpoint: bool | None = None
    checkpoint_cost_s: float | None = None
    mtbf_hours: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (only what is set)."""
        out: dict[str, Any] = {}
        if self.on:
            out["on"] = dict(self.on)
        for key in self.__dataclass_fields__:
            if key in ("on", "notify"):
                continue
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.notify:
            out["notify"] = list(self.notify)
        return out

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "policy") -> Policy:
        """Read a policy layer."""
        on = sub(obj, "on", where)
        for trigger, action in on.items():
            if not isinstance(action, str):
                raise InvalidResponse(f"the server's answer is malformed: {where}.on.{trigger} should be an action")
        notify = as_list(obj.get("notify") or [], f"{where}.notify")
        deadline = obj.get("deadline")
        return cls(
            on=dict(on),
            budget=opt_float(obj, "budget", where),
            deadline=deadline if isinstance(deadline, (str, int, float)) else None,
            dry_run=opt_bool(obj, "dry_run", where),
            metric=opt_str(obj, "metric", where),
            mode=opt_str(obj, "mode", where),
            notify=tuple(str(t) for t in notify),
            max_at_risk=opt_float(obj, "max_at_risk", where),
            auto_checkpoint=opt_bool(obj, "auto_checkpoint", where),
            checkpoint_cost_s=opt_float(obj, "checkpoint_cost_s", where),
            mtbf_hours=opt_float(obj, "mtbf_hours", where),
        )


@dataclass(frozen=True)
class JobPolicy:
    """A job's policy: its own layer, the effective policy (all layers), who set each action, what it did."""

    own: Policy
    effective: Policy
    set_by: Mapping[str, str]
    fired: Mapping[str, Any]
    """Trigger -> what the policy did (``action``, ``reason``, ``t``, ``dry_run``, ``saved``)."""
    checkpoint: Mapping[str, Any] | None
    """The checkpoint advice (when the next checkpoint is due), when the policy asks for one."""
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "policy") -> JobPolicy:
        """Read the policy view of a job."""
        checkpoint = obj.get("checkpoint")
        return cls(
            own=Policy.from_dict(sub(obj, "job", where), f"{where}.job"),
            effective=Policy.from_dict(sub(obj, "effective", where), f"{where}.effective"),
            set_by=dict(sub(obj, "set_by", where)),
            fired=dict(sub(obj, "fired", where)),
            checkpoint=as_dict(checkpoint, f"{where}.checkpoint") if checkpoint is not None else None,
            raw=obj,
        )


@dataclass(frozen=True)
class NamespacePolicy:
    """A namespace's policy layer, the server's under it, and the two laid over each other."""

    namespace: str
    own: Policy
    server: Policy
    effective: Policy
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "policy") -> NamespacePolicy:
        """Read the policy view of a namespace."""
        return cls(
            namespace=req_str(obj, "namespace", where),
            own=Policy.from_dict(sub(obj, "policy", where), f"{where}.policy"),
            server=Policy.from_dict(sub(obj, "server", where), f"{where}.server"),
            effective=Policy.from_dict(sub(obj, "effective", where), f"{where}.effective"),
            raw=obj,
        )


def command_from(obj: object, where: str = "command") -> Command:
    """A command object of the API, checked by the protocol."""
    try:
        return Command.from_dict(obj, where)
    except ProtocolError as exc:
        raise InvalidResponse(f"the server's answer is malformed: {exc}") from None


@dataclass(frozen=True)
class CommandSent:
    """What :meth:`Client.stop` and :meth:`Client.checkpoint` queued: one command, or a checkpoint then a stop."""

    namespace: str
    name: str
    commands: tuple[Command, ...]

    @property
    def id(self) -> str:
        """The id of the last command queued (the stop, for a checkpoint-then-stop)."""
        return self.commands[-1].id

    @property
    def reason(self) -> str:
        """Why, as the job and its events will show it."""
        return self.commands[-1].reason


# --------------------------------------------------------------------------------------- history


@dataclass(frozen=True)
class MetricPoint:
    """One point of a downsampled series: the window (or windows) it stands for, ``last`` its value."""

    step: int | None
    t: float | None
    last: float | None
    min: float | None
    max: float | None
    mean: float | None
    count: int
    nonfinite: int
    first_step: int | None = None
    windows: int = 1

    @classmethod
    def from_dict(cls, obj: Any, where: str = "point") -> MetricPoint:
        """Read a point (of a history read, or of the live stream: the same object)."""
        p = as_dict(obj, where)
        return cls(
            step=opt_int(p, "step", where),
            t=opt_float(p, "t", where),
            last=opt_float(p, "last", where),
            min=opt_float(p, "min", where),
            max=opt_float(p, "max", where),
            mean=opt_float(p, "mean", where),
            count=opt_int(p, "count", where) or 0,
            nonfinite=opt_int(p, "nonfinite", where) or 0,
            first_step=opt_int(p, "first_step", where),
            windows=opt_int(p, "windows", where) or 1,
        )


@dataclass(frozen=True)
class MetricSeries:
    """A metric's downsampled history: minima, maxima and NaN windows survive the downsampling."""

    name: str
    points: tuple[MetricPoint, ...]

    def __iter__(self) -> Iterator[MetricPoint]:
        return iter(self.points)

    def __len__(self) -> int:
        return len(self.points)

    @property
    def steps(self) -> list[int | None]:
        """The step of each point."""
        return [p.step for p in self.points]

    @property
    def values(self) -> list[float | None]:
        """The last value of each point (what a chart draws)."""
        return [p.last for p in self.points]

    @property
    def last(self) -> float | None:
        """The latest value, ``None`` for an empty series."""
        return self.points[-1].last if self.points else None

    @classmethod
    def from_list(cls, name: str, items: Sequence[Any]) -> MetricSeries:
        """Read the points of one metric."""
        return cls(name, tuple(MetricPoint.from_dict(item, f"metrics.{name}[{i}]") for i, item in enumerate(items)))


@dataclass(frozen=True)
class HistoryRow:
    """One row of :meth:`History.rows`: a metric at a step."""

    metric: str
    step: int | None
    t: float | None
    value: float | None
    min: float | None
    max: float | None
    mean: float | None
    count: int
    nonfinite: int


@dataclass(frozen=True)
class History:
    """A job's metric history: ``history["loss"]`` is a :class:`MetricSeries`; :meth:`rows` and
    :meth:`to_pandas` flatten it."""

    namespace: str
    name: str
    attempt: int
    series: Mapping[str, MetricSeries]

    def __getitem__(self, metric: str) -> MetricSeries:
        return self.series[metric]

    def __iter__(self) -> Iterator[str]:
        return iter(self.series)

    def __len__(self) -> int:
        return len(self.series)

    def __contains__(self, metric: object) -> bool:
        return metric in self.series

    def rows(self) -> list[HistoryRow]:
        """Every point of every metric, metric by metric, in step order (long format)."""
        return [
            HistoryRow(name, p.step, p.t, p.last, p.min, p.max, p.mean, p.count, p.nonfinite)
            for name, s in self.series.items()
            for p in s.points
        ]

    def wide(self) -> list[dict[str, Any]]:
        """One dict per step: ``{"step": 10, "loss": 0.5, "eval_loss": 0.7}`` (a metric absent at a step is absent)."""
        by_step: dict[int | None, dict[str, Any]] = {}
        for name, s in self.series.items():
            for p in s.points:
                by_step.setdefault(p.step, {"step": p.step})[name] = p.last
        return [by_step[k] for k in sorted(by_step, key=lambda s: -1 if s is None else s)]

    def to_pandas(self, wide: bool = False) -> Any:
        """The rows as a DataFrame (needs pandas); ``wide``: indexed by step, a column per metric."""
        pd = _pandas()
        if wide:
            return pd.DataFrame(self.wide()).set_index("step")
        return pd.DataFrame(self.rows(), columns=[f.name for f in fields(HistoryRow)])

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> History:
        """Read a history answer."""
        metrics = sub(obj, "metrics", "history")
        return cls(
            namespace=req_str(obj, "namespace", "history"),
            name=req_str(obj, "name", "history"),
            attempt=opt_int(obj, "attempt", "history") or 1,
            series={n: MetricSeries.from_list(n, as_list(v, f"history.metrics.{n}")) for n, v in metrics.items()},
        )


# ---------------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Event:
    """Something that happened to a job: registered, started, a command, a health change, a policy action..."""

    id: int | None
    namespace: str
    name: str
    t: float | None
    kind: str
    message: str
    data: Mapping[str, Any]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The JSON object of the API."""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "event") -> Event:
        """Read an event (of the events list, or of the live stream)."""
        data = obj.get("data")
        return cls(
            id=opt_int(obj, "id", where),
            namespace=req_str(obj, "namespace", where),
            name=req_str(obj, "name", where),
            t=opt_float(obj, "t", where),
            kind=req_str(obj, "kind", where),
            message=opt_str(obj, "message", where) or "",
            data=as_dict(data, f"{where}.data") if isinstance(data, dict) else {},
            raw=obj,
        )


# ----------------------------------------------------------------------------------------- costs


@dataclass(frozen=True)
class CostTotals:
    """Sums over jobs: GPUs in use, the rate of the live ones, spent, projected, wasted, saved."""

    jobs: int
    priced_jobs: int
    gpus_in_use: float
    rate_per_hour: float | None
    spent: float | None
    projected: float | None
    wasted: float | None
    saved: float | None

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str) -> CostTotals:
        """Read one total of ``GET /api/v1/costs``."""
        return cls(
            jobs=opt_int(obj, "jobs", where) or 0,
            priced_jobs=opt_int(obj, "priced_jobs", where) or 0,
            gpus_in_use=opt_float(obj, "gpus_in_use", where) or 0.0,
            rate_per_hour=opt_float(obj, "rate_per_hour", where),
            spent=opt_float(obj, "spent", where),
            projected=opt_float(obj, "projected", where),
            wasted=opt_float(obj, "wasted", where),
            saved=opt_float(obj, "saved", where),
        )


@dataclass(frozen=True)
class Costs:
    """Money of the jobs live now (or ended after ``since``): overall and per namespace."""

    currency: str
    since: float | None
    truncated: bool
    total: CostTotals
    namespaces: Mapping[str, CostTotals]

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Costs:
        """Read ``GET /api/v1/costs``."""
        return cls(
            currency=opt_str(obj, "currency", "costs") or "USD",
            since=opt_float(obj, "since", "costs"),
            truncated=bool(opt_bool(obj, "truncated", "costs")),
            total=CostTotals.from_dict(sub(obj, "total", "costs"), "costs.total"),
            namespaces={
                ns: CostTotals.from_dict(as_dict(t, f"costs.namespaces.{ns}"), f"costs.namespaces.{ns}")
                for ns, t in sub(obj, "namespaces", "costs").items()
            },
        )


def _pandas() -> Any:
    import importlib

    try:
        return importlib.import_module("pandas")
    except ImportError:
        raise ImportError("this needs pandas: pip install pandas") from None
