"""The stepwatch SDK: read, watch and act on training jobs from code and notebooks.

``pip install 'stepwatch[client]'``

::

    from stepwatch.client import Client

    client = Client()                                   # STEPWATCH_SERVER, else http://127.0.0.1:8642
    for job in client.jobs(state="running", health=["stalled", "not_learning"]):
        print(job.key, job.progress.percent, job.health.state, job.cost.wasted)
    for update in client.watch("llama-sft"):            # live, resumes by itself after a drop
        ...
    client.wait("llama-sft", timeout=3600)              # until it ends
    client.stop("llama-sft", reason="plateau")          # checkpoint, then stop

:class:`AsyncClient` has the same methods, awaited. Errors: :class:`StepwatchError` and its tree
(see ``stepwatch.client._errors``). Recipes (early stop, deadline alerts, GPUs about to be freed) are in
:mod:`stepwatch.client.recipes`; Optuna pruning in :mod:`stepwatch.client.optuna`; live notebook
display in :mod:`stepwatch.client.notebook`.

Importing this module does not import httpx (the first client does): scripts that only name the
types stay quick to start.
"""

from ._access import ApiToken, AuditEntry
from ._client import DEFAULT_SERVER, AsyncClient, Client, server_url
from ._core import Retry
from ._errors import (
    ApiError,
    AuthError,
    Conflict,
    Forbidden,
    IncompatibleServer,
    InvalidRequest,
    InvalidResponse,
    NotFound,
    RateLimited,
    RequestTimeout,
    ServerError,
    ServerUnreachable,
    StepwatchError,
    Unauthorized,
    WaitTimeout,
)
from ._job import Cost, Eta, Health, HealthSpan, Job, JobList, Progress, Rank, Resources, Times, TrainerStatus
from ._live import EventUpdate, JobUpdate, PointsUpdate, Resync, Update
from ._models import (
    CommandSent,
    Costs,
    CostTotals,
    Event,
    History,
    HistoryRow,
    JobPolicy,
    MetricPoint,
    MetricSeries,
    NamespacePolicy,
    Policy,
)
from ._verdict import StallPlace, Straggler

__all__ = [
    "DEFAULT_SERVER",
    "ApiError",
    "ApiToken",
    "AsyncClient",
    "AuditEntry",
    "AuthError",
    "Client",
    "CommandSent",
    "Conflict",
    "Cost",
    "CostTotals",
    "Costs",
    "Eta",
    "Event",
    "EventUpdate",
    "Forbidden",
    "Health",
    "HealthSpan",
    "History",
    "HistoryRow",
    "IncompatibleServer",
    "InvalidRequest",
    "InvalidResponse",
    "Job",
    "JobList",
    "JobPolicy",
    "JobUpdate",
    "MetricPoint",
    "MetricSeries",
    "NamespacePolicy",
    "NotFound",
    "PointsUpdate",
    "Policy",
    "Progress",
    "Rank",
    "RateLimited",
    "RequestTimeout",
    "Resources",
    "Resync",
    "Retry",
    "ServerError",
    "ServerUnreachable",
    "StallPlace",
    "StepwatchError",
    "Straggler",
    "Times",
    "TrainerStatus",
    "Unauthorized",
    "Update",
    "WaitTimeout",
    "server_url",
]
