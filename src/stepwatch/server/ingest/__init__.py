"""Ingest: a report's one trip on the server (:mod:`.service`): write → estimates → health → policies → publish.

The write goes with the others that arrived meanwhile in one transaction (:mod:`.writer`, group commit); the
ETA is estimated from the recent progress samples of live jobs kept in memory (:mod:`.recent_progress`);
health is :mod:`.health_monitor`'s, which keeps the rules of :mod:`..analysis.health` per live job and sweeps
them for stalls; what the live stream gets is :mod:`..live.publish`'s.

It uses the floors below it: :mod:`..analysis`, :mod:`..store`, :mod:`..views`, :mod:`..live` and
:mod:`..policies`, and reads the app's collaborators through :class:`.service.Collaborators`; the routes
(:mod:`..api.routes`) and the Kubernetes runner call it. Nothing is imported here.
"""
