"""Storage of the server: the interface and its embedded SQLite implementation.

The PostgreSQL store is :class:`.postgres.PostgresStore`, imported from its module when a server is given a
``postgresql://`` URL (psycopg is the ``postgres`` extra).
"""

from .access import ROLES, ApiToken, AuditEntry
from .base import (
    HEALTH_STATES,
    JOB_STATES,
    SORT_KEYS,
    ChangeListener,
    Compaction,
    Event,
    IngestResult,
    Job,
    JobFilter,
    JobState,
    MetricLimitError,
    PendingReport,
    ProgressSample,
    RankState,
    SeriesColumns,
    SeriesPoint,
    Store,
    StoreError,
)
from .sqlite import SQLiteStore

__all__ = [
    "HEALTH_STATES",
    "JOB_STATES",
    "ROLES",
    "SORT_KEYS",
    "ApiToken",
    "AuditEntry",
    "ChangeListener",
    "Compaction",
    "Event",
    "IngestResult",
    "Job",
    "JobFilter",
    "JobState",
    "MetricLimitError",
    "PendingReport",
    "ProgressSample",
    "RankState",
    "SQLiteStore",
    "SeriesColumns",
    "SeriesPoint",
    "Store",
    "StoreError",
]
