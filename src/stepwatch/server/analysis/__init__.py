"""Analysis of job history: pure functions, and the one stateful monitor of live jobs' health.

Pure (no I/O, no state, standard library only): the ETA from a robust recent rate (:mod:`.eta`), history
downsampled for a chart (:mod:`.downsample`), health verdicts (:mod:`.health`, with :mod:`.health_params`,
:mod:`.plateau`, :mod:`.signals`), checkpoint advice (:mod:`.checkpoint`) and cost (:mod:`.cost`). They take
what the store returns and give the values the routes and policies show; they use no other server package.

Stateful: :mod:`.health_monitor` keeps a health tracker per live job, fed at ingest and swept for stalls,
and publishes what changed; it alone uses other server packages (:mod:`..store`, :mod:`..live`,
:mod:`..ingest.publish`).
"""

from .downsample import Columns, Point, WindowLike, downsample, downsample_columns
from .eta import DEFAULT_PARAMS, Estimate, EtaParams, Method, estimate_eta, lifetime_average_eta

__all__ = [
    "DEFAULT_PARAMS",
    "Columns",
    "Estimate",
    "EtaParams",
    "Method",
    "Point",
    "WindowLike",
    "downsample",
    "downsample_columns",
    "estimate_eta",
    "lifetime_average_eta",
]
