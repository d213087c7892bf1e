"""Test helpers for code that reports to stepwatch: a loopback report sink, an in-memory transport, a clock.

:class:`ReportSink` is a real HTTP server on 127.0.0.1 that speaks both report endpoints (native and
Kubeflow ``trainerStatus``), validates what arrives with :mod:`stepwatch.protocol`, records it, and can
be told to misbehave: go down and come back, answer 403/429/500, hang, and hand out commands::

    from stepwatch.testing import ReportSink

    with ReportSink() as sink:
        run = stepwatch.init(job="t", url=sink.url, interval=0.05)
        run.step(loss=1.0)
        run.finish()
        assert sink.reports[-1].state == "finished"

:class:`MemoryTransport` answers the sender in memory, for unit tests that need no socket.
:class:`WebhookReceiver` records the server's notifications (signed webhooks) for tests of policies.
:class:`FakeClock` is a clock that moves only when told, for ``create_app(clock=...)``.
:func:`wait_for` waits for a condition another thread or process brings about (polling, with a ceiling
and a message that says what did not come), the one polling helper of stepwatch's own tests.
:func:`poll_progression` and :func:`read_termination_message` do what OpenShift AI's progression
controller does with a training pod: poll the status rank 0 serves, read its termination message.
:mod:`stepwatch.testing.server` (with the server extra; not imported here) runs a real stepwatch server
in a thread: :class:`~stepwatch.testing.server.LocalServer`, :class:`~stepwatch.testing.server.ServerThread`.
:mod:`stepwatch.testing.plugin` offers all of them as pytest fixtures (``stepwatch_sink``...), loaded by
pytest itself once stepwatch is installed (docs/testing.md).

The names are imported on first use (PEP 562): the pytest plugin imports this package in every test run
of every project that has stepwatch installed, and a socket server's imports are no cost to put there.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._clock import FakeClock
    from ._memory import MemoryTransport
    from ._progression import poll_progression, read_termination_message
    from ._sink import Received, ReportSink
    from ._wait import wait_for
    from .webhooks import WebhookReceived, WebhookReceiver, WebhookReply

__all__ = [
    "FakeClock",
    "MemoryTransport",
    "Received",
    "ReportSink",
    "WebhookReceived",
    "WebhookReceiver",
    "WebhookReply",
    "poll_progression",
    "read_termination_message",
    "wait_for",
]

_HOMES = {
    "FakeClock": "._clock",
    "MemoryTransport": "._memory",
    "poll_progression": "._progression",
    "read_termination_message": "._progression",
    "Received": "._sink",
    "ReportSink": "._sink",
    "WebhookReceived": ".webhooks",
    "WebhookReceiver": ".webhooks",
    "WebhookReply": ".webhooks",
    "wait_for": "._wait",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
