"""Storage of the server: the interface and its embedded SQLite implementation."""

from .base import (
    JOB_STATES,
    SORT_KEYS,
    Event,
    IngestResult,
    Job,
    JobFilter,
    JobState,
    ProgressSample,
    SeriesPoint,
    Store,
    StoreError,
)
from .sqlite import SQLiteStore

__all__ = [
    "JOB_STATES",
    "SORT_KEYS",
    "Event",
    "IngestResult",
    "Job",
    "JobFilter",
    "JobState",
    "ProgressSample",
    "SQLiteStore",
    "SeriesPoint",
    "Store",
    "StoreError",
]
