"""Analysis of job history: pure functions, the lowest floor of the server.

Pure (no I/O, no state, standard library only): the ETA from a robust recent rate (:mod:`.eta`), history
downsampled for a chart (:mod:`.downsample`), health verdicts (:mod:`.health`, with :mod:`.health_params`,
:mod:`.plateau`, :mod:`.signals`), checkpoint advice (:mod:`.checkpoint`) and cost (:mod:`.cost`). They take
what the store returns and give the values the routes and policies show; they use no other server package.

The one stateful user of the health rules, the monitor that keeps a tracker per live job, feeds it at ingest,
sweeps it for stalls and publishes what changed, orchestrates store I/O and publishing: it is
:mod:`..ingest.health_monitor`, on the ingest floor.
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
