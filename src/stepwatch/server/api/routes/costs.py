"""Money totals: per namespace and overall, of live jobs and of jobs that ran since a time."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...analysis.cost import Cost, CostTotals, totals
from ...store import Job, JobFilter
from ...store.offload import blocking
from ...views.figures import cost_of, remaining_seconds, saved_by_policy
from ..errors import ApiError
from ..request import check_name, identify, require, services

__all__ = ["routes"]

MAX_JOBS = 100_000
"""Jobs summed at most (the newest first); the answer says when there were more."""


async def costs(request: Request) -> JSONResponse:
    """``GET /api/v1/costs?namespace=&since=``: totals of the jobs live now or ended after ``since`` (Unix s)."""
    svc = services(request)
    q = request.query_params
    namespace = q.get("namespace") or None
    readable: tuple[str, ...] | None = None
    if namespace is not None:
        await require(request, "viewer", namespace)
        check_name(namespace, "namespace")
    else:
        readable = (await identify(request)).readable()
    since = _since(q.get("since"))
    jobs = await blocking(svc.store.jobs, JobFilter(namespace=namespace, namespaces=readable, limit=MAX_JOBS))
    now = svc.clock()
    chosen = [j for j in jobs if since is None or j.finished_at is None or j.finished_at >= since]
    by_namespace: dict[str, list[tuple[Job, Cost]]] = defaultdict(list)
    for job in chosen:
        by_namespace[job.namespace].append((job, cost_of(job, now, remaining_seconds(job, now))))
    everything = [pair for pairs in by_namespace.values() for pair in pairs]
    return JSONResponse(
        {
            "currency": "USD",
            "since": since,
            "truncated": len(jobs) >= MAX_JOBS,
            "total": _sums(everything),
            "namespaces": {ns: _sums(pairs) for ns, pairs in sorted(by_namespace.items())},
        }
    )


def _sums(pairs: list[tuple[Job, Cost]]) -> dict[str, Any]:
    t: CostTotals = totals(cost for _, cost in pairs)
    live = totals(cost for job, cost in pairs if job.finished_at is None)
    return {
        "jobs": t.jobs,
        "priced_jobs": t.priced,
        "gpus_in_use": sum(job.gpus for job, _ in pairs if job.finished_at is None),
        "rate_per_hour": live.rate_per_hour,
        "spent": t.spent,
        "projected": t.projected,
        "wasted": t.wasted,
        "saved": sum(saved_by_policy(job) or 0.0 for job, _ in pairs),
    }


def _since(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ApiError(400, f"since must be a time in Unix seconds, got {raw[:40]!r}", "since")
    return value


routes = [Route("/api/v1/costs", costs, methods=["GET"])]
