"""Notifications from the server: signed webhooks, and chat or e-mail through Apprise.

::

    from stepwatch.server.notify import Notification, Notifier, parse_targets

    notifier = Notifier(parse_targets(settings.notify, settings.notify_secret))
    await notifier.start()                      # in the app's lifespan
    notifier.notify(Notification(kind="health", namespace="team-a", job="llama-ft", attempt=1,
                                 title="team-a/llama-ft is not learning",
                                 message="Loss has not improved by 1% over the last 2,000 steps.",
                                 key=f"{job_id}:health:not_learning",
                                 data={"state": "running", "health": "not_learning"}))
    await notifier.aclose(timeout_s=5)          # at shutdown: drains what is queued

:meth:`Notifier.notify` never blocks and never raises; delivery happens in worker tasks (Apprise calls in
worker threads), failures are counted in :attr:`Notifier.stats` and logged. A webhook receiver checks
``X-Stepwatch-Signature`` with :func:`verify_signature`. See docs/notifications.md.

Errors: a bad configuration fails where it is read (``ValueError`` from :func:`parse_targets` and
:class:`Notifier`, ``ImportError`` naming ``pip install 'stepwatch[notify]'`` when an Apprise URL is
configured without Apprise); after that nothing is raised.
"""

from ._allow import TargetRefused, TargetRules, parse_allow_list
from ._delivery import DELIVERY_HEADER, EVENT_HEADER, RetryPolicy, check_target
from ._message import KINDS, Notification, NotifyTarget, parse_targets
from ._notifier import Notifier, NotifyStats
from ._signing import SIGNATURE_HEADER, sign, signature_header, verify_signature

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "KINDS",
    "SIGNATURE_HEADER",
    "Notification",
    "Notifier",
    "NotifyStats",
    "NotifyTarget",
    "RetryPolicy",
    "TargetRefused",
    "TargetRules",
    "check_target",
    "parse_allow_list",
    "parse_targets",
    "sign",
    "signature_header",
    "verify_signature",
]
