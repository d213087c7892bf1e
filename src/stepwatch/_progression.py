"""OpenShift AI's progression, training side: the status rank 0 serves, and its termination message.

Red Hat OpenShift AI 3.4's controller polls ``GET http://<rank-0 pod IP>:28080/metrics`` and, when the
job has ended, reads the termination message of the container ``node`` (the format and how Go reads
it: :mod:`stepwatch.protocol.progression`). A :class:`Progression` is one run's side of that: the sender
thread hands it what it collected every interval (the closed metric windows and a snapshot of progress
with the recent rate), it keeps the latest value of every metric, builds the status and publishes it,
pre-encoded, to the :class:`~stepwatch._status_server.StatusServer`. With the final snapshot (the run
ended: finished, failed or stopped) it publishes the final status, writes it as the termination message
before the sender goes near the network, and from then on changes nothing (a step counted after the end
does not move what is served). When the sender thread is held up (in a request to a server that does
not answer), the thread that ends the run hands it the final snapshot itself: a slow server cannot
lose the message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ._status_server import StatusServer, serve
from .protocol import LIMITS, MetricWindow
from .protocol.progression import MAX_TERMINATION_MESSAGE, ProgressionStatus, build_status, encode_served

if TYPE_CHECKING:
    from ._wire import Snapshot

__all__ = ["Progression"]

_log = logging.getLogger("stepwatch")

THROUGHPUT: Final = "throughput_samples_sec"
"""The name Red Hat's callback serves the throughput under (the dashboard shows "Throughput samples sec")."""
_LOGGED_THROUGHPUT: Final = "train_samples_per_second"
"""What transformers' Trainer logs at the end; Red Hat's callback serves it as :data:`THROUGHPUT`."""


class Progression:
    """One run's OpenShift AI progression: the latest status on the server, and the termination message.

    :meth:`collect` runs in the sender thread, and at the end possibly in the thread that ends the run
    (one lock between them, never taken by the training loop); nothing here raises.
    """

    def __init__(self, server: StatusServer, termination_log: str | None) -> None:
        self.server = server
        self.termination_log = termination_log
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._ended = False
        self._aside = False
        self.status: ProgressionStatus | None = None
        """The status served last."""

    @classmethod
    def start(cls, address: tuple[str, int], termination_log: str | None) -> Progression:
        """Listen on ``address`` (or join this process's server there); ``OSError`` when it is taken."""
        return cls(serve(address), termination_log)

    @property
    def address(self) -> tuple[str, int]:
        """Where the status is served (the real port when port 0 was asked for)."""
        return self.server.address

    def collect(self, windows: list[MetricWindow], snapshot: Snapshot) -> None:
        """Fold new windows in and publish the status of ``snapshot``; at the end, write the message too."""
        with self._lock:
            if not (self._ended or self._aside):
                self._collect(windows, snapshot)

    @property
    def ended(self) -> bool:
        """Whether the final status is out (served, and written when there is a file to write)."""
        return self._ended

    def _collect(self, windows: list[MetricWindow], snapshot: Snapshot) -> None:
        try:
            for window in windows:
                if window.name in self._latest or len(self._latest) < LIMITS.max_metrics_per_report:
                    self._latest[window.name] = window.last
            status = self._status(snapshot)
            self.status = status
            self.server.publish(encode_served(status))
            if snapshot.state != "running":
                self._ended = True
                self._write_termination_message(status)
        except Exception as exc:  # what is served stays as it was; training goes on
            _log.warning("stepwatch: the progression status could not be updated (%r)", exc)

    def _status(self, snapshot: Snapshot) -> ProgressionStatus:
        p = snapshot.progress
        state = snapshot.state
        eta = p.eta_seconds
        if p.step is not None and p.total_steps and p.step >= p.total_steps:
            eta = 0.0  # at its total, nothing remains, rate or no rate (as Red Hat's callback says)
        elif eta is not None:
            # never 0 while steps remain: the controller takes a status with 0 s remaining as final, and
            # would then never read the termination message of a job whose last poll rounded 0.4 s down
            eta = max(eta, 1.0)
        return build_status(
            step=p.step,
            total_steps=p.total_steps,
            epoch=p.epoch,
            total_epochs=p.total_epochs,
            eta_seconds=eta,
            metrics=_served_metrics(self._latest, p.samples_per_second),
            ended=None if state == "running" else state,
        )

    def _write_termination_message(self, status: ProgressionStatus) -> None:
        path = self.termination_log
        if path is None:
            return
        try:
            with open(path, "wb") as out:
                out.write(encode_served(status, max_bytes=MAX_TERMINATION_MESSAGE))
        except Exception as exc:
            _log.warning("stepwatch: could not write the termination message to %s (%r)", path, exc)

    def stand_aside(self) -> None:
        """Serve nothing more and write no termination message (another reporter does both): close the port."""
        self._aside = True
        try:
            self.server.close()
        except Exception:
            pass


def _served_metrics(latest: Mapping[str, float], samples_per_second: float | None) -> dict[str, Any]:
    """The latest value of every metric, with the throughput under Red Hat's name.

    A logged ``train_samples_per_second`` (transformers' figure for the whole run) is served as
    ``throughput_samples_sec``, as Red Hat's callback does; without one, the recent samples per second
    measured by the reporter (known when the run has a batch size).
    """
    metrics: dict[str, Any] = dict(latest)
    logged = metrics.pop(_LOGGED_THROUGHPUT, None)
    if logged is not None:
        metrics[THROUGHPUT] = logged
    elif samples_per_second is not None and THROUGHPUT not in metrics:
        metrics[THROUGHPUT] = samples_per_second
    return metrics
