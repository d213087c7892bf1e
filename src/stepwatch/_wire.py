"""The two wire modes of the sender: native stepwatch reports, and upstream Kubeflow ``trainerStatus``.

A mode turns what the sender collected (closed metric windows and a :class:`Snapshot` of progress)
into request bodies, and learns from the answers. The sender owns timing and retries; a mode owns
what is sent:

* :class:`NativeWire` keeps one report in flight, retried unchanged (same ``seq``, so the server
  stores it once), while newer windows merge into the next report: memory stays bounded however
  long the server is away. It sends hyperparameters once and acknowledges commands.
* :class:`KubeflowWire` sends the whole status each time (upstream replaces it on every POST): the
  latest value of every metric, progress % and the remaining seconds at the recent rate, with the
  current step, total steps and epoch as metrics, also in the final report.
* :class:`NullWire` sends nothing: a run with no endpoint whose sender only feeds OpenShift AI's
  progression status (:mod:`stepwatch._progression`), which rank 0 serves itself.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .protocol import (
    LIMITS,
    Command,
    GpuReading,
    Identity,
    KubeflowMetric,
    MetricWindow,
    ParamValue,
    Progress,
    ProtocolError,
    Report,
    ReportResponse,
    ReportState,
    TrainerStatus,
    Where,
    decode_body,
    encode_body,
    format_rfc3339,
)

__all__ = ["KubeflowWire", "NativeWire", "NullWire", "Snapshot", "Wire"]


@dataclass(frozen=True)
class Snapshot:
    """The state of a run as the sender saw it at one moment."""

    wall_time: float
    progress: Progress
    state: ReportState = "running"
    reason: str = ""
    params: Mapping[str, ParamValue] | None = None
    """Params given since the last snapshot (``Run.update(params=...)``)."""
    gpus: tuple[GpuReading, ...] = ()
    """This process's GPUs, read (NVML) when the snapshot was taken, in the sender thread."""
    where: Where | None = None
    """Where the rank stands, while its step has stood longer than usual (:mod:`stepwatch._where`)."""
    activity_shares: Mapping[str, float] | None = None
    """The share of each activity among the stack samples of the interval since the last snapshot."""


class Wire(Protocol):
    """What the sender needs from a mode."""

    url: str

    def collect(self, windows: list[MetricWindow], snapshot: Snapshot) -> None:
        """Take newly closed windows and the latest snapshot."""

    def pending(self) -> bytes | None:
        """The body to send now, or ``None`` when there is nothing to send."""

    def accepted(self, body: bytes) -> list[Command]:
        """The server accepted the pending body (its answer's body is given); returns new commands."""

    def rejected(self) -> None:
        """The server refused the pending body for good (4xx other than auth and rate limits)."""


class NativeWire:
    """Reports to a stepwatch server: windows, progress, params once, acks; commands come back."""

    def __init__(
        self,
        url: str,
        run_id: str,
        identity: Identity,
        params: Mapping[str, ParamValue] | None,
        *,
        max_body: int = LIMITS.max_body_bytes,
    ) -> None:
        self.url = url
        self._run_id = run_id
        self._identity = identity
        self._params = dict(params) if params else None
        self._max_body = max_body
        self._seq = itertools.count()
        self._windows: dict[str, MetricWindow] = {}
        self._snapshot: Snapshot | None = None
        self._fresh = False
        self._inflight: deque[tuple[bytes, tuple[str, ...], dict[str, ParamValue] | None]] = deque()
        self._acks: list[str] = []
        self._seen: deque[str] = deque(maxlen=LIMITS.max_acks)

    def collect(self, windows: list[MetricWindow], snapshot: Snapshot) -> None:
        """Merge new windows into the next report (older unsent windows merge, never pile up)."""
        for window in windows:
            older = self._windows.get(window.name)
            self._windows[window.name] = older.merge(window) if older else window
        self._snapshot = snapshot
        if snapshot.params:
            self._params = {**(self._params or {}), **snapshot.params}
        self._fresh = True

    def pending(self) -> bytes | None:
        """The report in flight, else a new one built from what was collected since."""
        if not self._inflight and self._fresh and self._snapshot is not None:
            self._build(self._snapshot)
        return self._inflight[0][0] if self._inflight else None

    def _build(self, snapshot: Snapshot) -> None:
        windows = list(self._windows.values())
        self._windows = {}
        self._fresh = False
        acks = tuple(self._acks[: LIMITS.max_acks])
        # room for the stack reading in the first part: 8 frames of the longest function and file, escaped
        extra = _WHERE_RESERVE if snapshot.where is not None or snapshot.activity_shares else 0
        for part, (chunk, with_params) in enumerate(self._chunks(windows, extra)):
            report = Report(
                run_id=self._run_id,
                seq=next(self._seq),
                sent_at=snapshot.wall_time,
                identity=self._identity,
                progress=dataclasses.replace(snapshot.progress, eta_seconds=None),  # the server's own ETA rules
                metrics=tuple(chunk),
                params=self._params if with_params else None,
                acks=acks if part == 0 else (),
                state=snapshot.state,
                reason=snapshot.reason[: LIMITS.max_reason_length],
                gpus=snapshot.gpus if part == 0 else (),
                where=snapshot.where if part == 0 else None,
                activity_shares=snapshot.activity_shares if part == 0 else None,
            )
            sent = self._params if with_params else None
            self._inflight.append((encode_body(report.to_dict()), acks if part == 0 else (), sent))

    def _chunks(self, windows: list[MetricWindow], extra: int = 0) -> list[tuple[list[MetricWindow], bool]]:
        """Split windows so that every body fits the size limit (params travel in the first part)."""
        parts: list[tuple[list[MetricWindow], bool]] = []
        todo: list[tuple[list[MetricWindow], bool]] = [(windows, self._params is not None)]
        while todo:
            chunk, with_params = todo.pop(0)
            size = _estimate(chunk, self._params if with_params else None) + extra
            if size <= self._max_body - 1024 or len(chunk) <= 1:
                parts.append((chunk, with_params))
                continue
            half = len(chunk) // 2
            todo[:0] = [(chunk[:half], with_params), (chunk[half:], False)]
        return parts

    def accepted(self, body: bytes) -> list[Command]:
        """Pop the report in flight; read the commands of the answer and queue their acks."""
        _, acks, sent = self._inflight.popleft()
        if sent is not None and self._params is sent:  # params given meanwhile are a new dict: kept
            self._params = None
        if acks:
            self._acks = [a for a in self._acks if a not in acks]
        try:
            response = ReportResponse.from_dict(decode_body(body)) if body else None
        except ProtocolError:
            return []
        new = []
        for command in response.commands if response else ():
            if command.id not in self._seen:
                self._seen.append(command.id)
                self._acks.append(command.id)
                new.append(command)
            elif command.id not in self._acks and len(self._acks) < LIMITS.max_acks:
                self._acks.append(command.id)  # the server did not see our ack yet: send it again
                self._fresh = True
        if new:
            self._fresh = True
        return new

    def rejected(self) -> None:
        """Drop the report in flight (the server will never accept it)."""
        self._inflight.popleft()


_WHERE_RESERVE = 8 * 1024
"""Bytes kept free in a report for ``where`` (8 frames of at most 128 + 256 characters) and ``activity_shares``."""


def _estimate(windows: list[MetricWindow], params: Mapping[str, Any] | None) -> int:
    size = 600 + sum(160 + len(w.name.encode()) for w in windows)
    if params:
        size += len(encode_body(params))
    return size


class KubeflowWire:
    """Sends KEP-2779 ``trainerStatus`` to an upstream Kubeflow Trainer endpoint."""

    def __init__(self, url: str, max_metrics: int = LIMITS.max_metrics_per_report) -> None:
        self.url = url
        self._latest: dict[str, float] = {}
        self._max_metrics = max_metrics - 4  # room for the progress metrics below
        self._body: bytes | None = None

    def collect(self, windows: list[MetricWindow], snapshot: Snapshot) -> None:
        """Remember the last value of every metric and build the status to send."""
        for window in windows:
            if window.name in self._latest or len(self._latest) < self._max_metrics:
                self._latest[window.name] = window.last
        self._body = encode_body(self.status(snapshot).to_body())

    def status(self, snapshot: Snapshot) -> TrainerStatus:
        """The upstream status of a snapshot."""
        p = snapshot.progress
        metrics: list[KubeflowMetric] = []
        if p.step is not None:
            metrics.append(KubeflowMetric("current_step", str(p.step)))
        if p.total_steps is not None:
            metrics.append(KubeflowMetric("total_steps", str(p.total_steps)))
        if p.epoch is not None:
            metrics.append(KubeflowMetric("current_epoch", _format(p.epoch)))
        if p.total_epochs is not None:
            metrics.append(KubeflowMetric("total_epochs", _format(p.total_epochs)))
        taken = {m.name for m in metrics}
        metrics.extend(KubeflowMetric(k, _format(v)) for k, v in self._latest.items() if k not in taken)
        percent: int | None = None
        remaining: int | None = None
        # an ended run keeps its real progress (one that exits at step 199 of 400 ended at 49 %)
        if p.step is not None and p.total_steps:
            percent = min(100, max(0, int(100 * p.step / p.total_steps)))
        elif p.epoch is not None and p.total_epochs:
            percent = min(100, max(0, int(100 * p.epoch / p.total_epochs)))
        elif snapshot.state == "finished":
            percent = 100
        if snapshot.state == "finished":
            remaining = 0
        if remaining is None and p.eta_seconds is not None:
            remaining = max(0, round(p.eta_seconds))
        return TrainerStatus(
            progress_percentage=percent,
            estimated_remaining_seconds=remaining,
            metrics=tuple(metrics),
            last_updated_time=format_rfc3339(snapshot.wall_time),
        )

    def pending(self) -> bytes | None:
        """The latest status, until it has been delivered."""
        return self._body

    def accepted(self, body: bytes) -> list[Command]:
        """Delivered; upstream has no commands."""
        self._body = None
        return []

    def rejected(self) -> None:
        """Refused for good: wait for the next status."""
        self._body = None


def _format(value: float) -> str:
    """A metric value as an upstream string (at most 64 characters; non-finite as NaN, Inf, -Inf)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))[: LIMITS.max_metric_value_length]


class NullWire:
    """No endpoint: nothing to send (the sender collects for the progression status rank 0 serves)."""

    url = ""

    def collect(self, windows: list[MetricWindow], snapshot: Snapshot) -> None:
        """Nothing to keep."""

    def pending(self) -> bytes | None:
        """Never anything to send."""
        return None

    def accepted(self, body: bytes) -> list[Command]:
        """Never called: nothing is sent."""
        return []

    def rejected(self) -> None:
        """Never called: nothing is sent."""
