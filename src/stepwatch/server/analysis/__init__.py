"""Pure analysis of job history for the server: ETA from a robust recent rate, downsampled history.

Nothing here does I/O or keeps state: the functions take what the store returns and give values the
routes and policies show. Standard library only.
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
