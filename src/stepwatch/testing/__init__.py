"""Test helpers for code that reports to stepwatch: a loopback report sink and an in-memory transport.

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
:mod:`stepwatch.testing.server` (with the server extra; not imported here) runs a real stepwatch server
in a thread: :class:`~stepwatch.testing.server.LocalServer`, :class:`~stepwatch.testing.server.ServerThread`.
"""

from ._memory import MemoryTransport
from ._sink import Received, ReportSink
from .webhooks import WebhookReceived, WebhookReceiver, WebhookReply

__all__ = ["MemoryTransport", "Received", "ReportSink", "WebhookReceived", "WebhookReceiver", "WebhookReply"]
