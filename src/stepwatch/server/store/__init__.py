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
    SeriesColumns,
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
    "SeriesColumns",
    "SeriesPoint",
    "Store",
    "StoreError",
]
