"""Ingest: a report's one trip on the server (:mod:`.service`): write → estimates → health → policies → publish.

The write goes with the others that arrived meanwhile in one transaction (:mod:`.writer`, group commit); the
ETA is estimated from the recent progress samples of live jobs kept in memory (:mod:`.recent_progress`);
health is :mod:`..analysis.health_monitor`'s; what the live stream gets is :mod:`..live.publish`'s.

It uses :mod:`..store`, :mod:`..analysis`, :mod:`..live`, :mod:`..views` and :mod:`..services` (the
policies through it); the routes (:mod:`..api.routes`) and the Kubernetes runner call it. Nothing is imported
here.
"""
