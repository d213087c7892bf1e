"""What every route needs: the app's services, bounded body reading, token checks, names."""

from __future__ import annotations

import asyncio
import functools
import hmac
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request

from ...protocol import LIMITS, BodyTooLarge, ProtocolError, decode_body, is_valid_name
from ..analysis.cost import PriceList
from ..auth import Authenticator, Identity, forbidden, hash_token
from ..errors import ApiError
from ..estimates import RecentProgress
from ..health import HealthMonitor
from ..live import Broadcaster
from ..policies import PolicyBook, PolicyEngine
from ..store import Job, MetricLimitError, Store, StoreError
from ..views import CompactViews
from ..writer import ReportWriter

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is in the server extra
    orjson = None  # type: ignore[assignment]

_LONG_DIGITS = re.compile(rb"[0-9]{19}")
"""A run of 19 digits: a number orjson might not read exactly (it turns integers beyond 64 bits into floats)."""

__all__ = [
    "Services",
    "authorize",
    "bearer_token",
    "blocking",
    "decode_json",
    "fast_json_loads",
    "hash_token",
    "identify",
    "read_body",
    "read_json",
    "require",
    "require_job",
    "require_writer",
    "services",
]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Services:
    """The app's collaborators, kept in ``app.state.services``."""

    store: Store
    live: Broadcaster
    clock: Callable[[], float] = time.time
    stats: dict[str, int] = field(
        default_factory=lambda: {"reports": 0, "duplicates": 0, "statuses": 0, "over_limit": 0}
    )
    """Answers counted by kind (``/healthz``); ``over_limit``: reports refused for the limit on metric names."""
    over_limit_until: dict[int, float] = field(default_factory=dict)
    """Jobs whose last report was refused for the limit on metric names, and until when their next ones
    are answered 429 before their bodies are read (a client that floods refused reports costs little)."""
    progress: RecentProgress = field(default_factory=RecentProgress)
    """Recent progress samples of live jobs, for their ETA."""
    views: CompactViews = field(default_factory=CompactViews)
    """Compact job views for lists, kept per version of each job."""
    health: HealthMonitor = field(default_factory=HealthMonitor)
    """Health trackers of live jobs, fed at ingest and swept for stalls."""
    prices: PriceList = field(default_factory=PriceList)
    """Default prices of a GPU hour, for jobs registered without one."""
    auth: Authenticator = field(default_factory=Authenticator)
    """Who requests come from (no authentication by default)."""
    policies: PolicyEngine = field(init=False)
    """The policy layers and the actions they take."""
    writer: ReportWriter = field(init=False)
    """Writes native reports in batches (group commit)."""

    def __post_init__(self) -> None:
        write_now = at_once(self.store.ingest_reports_nowait)  # on the loop when the store need not wait
        self.writer = ReportWriter(self.store.ingest_reports, blocking, write_now=write_now)
        self.policies = PolicyEngine(PolicyBook(), self.store, self.live, blocking)
        self.health.metric_of = self.policies.book.metric_of
        self.store.follow_changes(self.forget)

    def forget(self, job_ids: frozenset[int] | None) -> None:
        """Drop what is kept in memory about jobs another process wrote (``None``: about every job): their
        health trackers and progress samples are rebuilt from the store at their next report, as after a
        restart. Called in whatever thread heard of the change (dict operations, atomic under the GIL)."""
        if job_ids is None:
            self.health.forget_all()
            self.progress.clear()
            return
        for job_id in job_ids:
            self.health.forget(job_id)
            self.progress.forget(job_id)


def services(request: Request) -> Services:
    """The services of the app serving this request."""
    found: Services = request.app.state.services
    return found


STORE_THREADS = 4
"""Worker threads for store calls: SQLite hands the GIL back on every row, so more threads only
trade it back and forth (measured: the default 40 threads cost 4x the CPU per report of 4)."""
_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a store call in a worker thread; a store failure becomes 503 (the server stays up)."""
    loop = asyncio.get_running_loop()
    limiter = _LIMITERS.get(loop)
    if limiter is None:
        limiter = _LIMITERS[loop] = anyio.CapacityLimiter(STORE_THREADS)
    call = functools.partial(fn, *args, **kwargs)
    try:
        return await anyio.to_thread.run_sync(call, limiter=limiter)
    except StoreError as exc:
        raise _unavailable(exc) from None


def at_once(fn: Callable[[T], R]) -> Callable[[T], R]:
    """A store call made on the event loop (one that never waits), with ``blocking``'s 503 on failure."""

    def call(arg: T) -> R:
        try:
            return fn(arg)
        except StoreError as exc:
            raise _unavailable(exc) from None

    return call


def _unavailable(exc: StoreError) -> ApiError:
    if isinstance(exc, MetricLimitError):  # the caller's fault, not the store's
        return ApiError(422, str(exc), "metrics")
    return ApiError(503, f"storage unavailable: {exc}", headers={"Retry-After": "5"})


async def read_json(request: Request, limit: int = LIMITS.max_body_bytes) -> Any:
    """The request body as JSON, read at most ``limit`` bytes far (413 beyond, 422 when malformed)."""
    return decode_json(await read_body(request, limit))


async def read_body(request: Request, limit: int = LIMITS.max_body_bytes) -> bytes:
    """The request body, read at most ``limit`` bytes far (413 beyond; 408 when it comes too slowly)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            too_big = int(declared) > limit
        except ValueError:
            raise ApiError(400, f"Content-Length is not a number: {declared[:40]!r}") from None
        if too_big:
            raise ApiError(413, f"body is {declared} bytes; the limit is {limit} bytes (64 KiB)")
    body = bytearray()
    timeout = request.app.state.settings.body_timeout_s
    try:
        with anyio.fail_after(timeout):  # a client sending a byte now and then must not hold a request for good
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise ApiError(413, f"body is over the limit of {limit} bytes (64 KiB)")
    except TimeoutError:
        message = f"the body did not arrive within {timeout:g} s ({len(body)} bytes came)"
        raise ApiError(408, message, headers={"Connection": "close"}) from None
    return bytes(body)


def decode_json(body: bytes) -> Any:
    """A body read by :func:`read_body` as JSON (413 over the limit, 422 when malformed)."""
    try:
        return decode_body(body, fast_json_loads)
    except BodyTooLarge as exc:
        raise ApiError(413, exc.message) from None
    except ProtocolError as exc:
        raise ApiError(422, exc.message, exc.field or None) from None


def fast_json_loads(body: bytes) -> Any:
    """orjson's reading of a body, for ``decode_body`` to try first (~3x faster than the standard parser).

    Refuses (``ValueError``) what orjson would read differently from the standard parser, integers
    beyond 64 bits (it makes them floats), and whatever orjson itself refuses (bare ``NaN`` tokens,
    bad JSON): ``decode_body`` then reads the body the standard way. Without orjson, it refuses all.
    """
    if orjson is None or _LONG_DIGITS.search(body):
        raise ValueError("left to the standard parser")
    return orjson.loads(body)


def check_name(value: str, what: str) -> str:
    """A job or namespace name from a path: 404 when it cannot exist."""
    if not is_valid_name(value):
        raise ApiError(
            404,
            f"no {what} named {value[:80]!r}: names are Kubernetes names (lowercase letters, digits and '-', "
            "at most 63)",
        )
    return value


async def require_job(request: Request, namespace: str, name: str) -> Job:
    """The latest attempt of the job named in the path, or 404."""
    job = await _find_job(request, namespace, name)
    if job is None:
        raise _job_not_found(namespace, name)
    return job


def bearer_token(request: Request) -> str | None:
    """The request's bearer token (``Authorization: Bearer <token>``, the scheme in any case, spaces around
    it as upstream Kubeflow's ``extractRawToken`` allows), or ``None``."""
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def authorize(request: Request, job: Job) -> None:
    """403 unless the request carries the job's own write token."""
    token = bearer_token(request)
    if token is None:
        raise ApiError(403, f"a bearer token is required to write to job {job.key}")
    store = services(request).store
    expected = store.cached_token_hash(job.id)
    if expected is None:
        expected = await blocking(store.token_hash, job.id)
    if not hmac.compare_digest(hash_token(token), expected):
        raise ApiError(403, f"this token cannot write to job {job.key}")


async def _find_job(request: Request, namespace: str, name: str) -> Job | None:
    check_name(namespace, "namespace")
    check_name(name, "job")
    store = services(request).store
    return store.cached_job(namespace, name) or await blocking(store.job, namespace, name)


def _job_not_found(namespace: str, name: str) -> ApiError:
    return ApiError(
        404,
        f"job {namespace}/{name} not found; register it first (POST /api/v1/namespaces/"
        f"{namespace}/jobs) or start it with `stepwatch run`",
    )


async def require_writer(request: Request, namespace: str, name: str, *, hide_missing: bool | None = None) -> Job:
    """The job of the path when the request carries its own write token; 403 otherwise.

    A job that does not exist gets the very 403 that a wrong token gets (its words depend on the request
    only), so a caller without the job's token learns nothing of which jobs exist: always when
    ``hide_missing`` (the Kubeflow endpoint, whose upstream authorises before it looks the job up), and by
    default when authentication is on. Without authentication anyone may list the jobs, so a missing one
    is a helpful 404 there.
    """
    hide = services(request).auth.enabled if hide_missing is None else hide_missing
    job = None
    if not hide or (is_valid_name(namespace) and is_valid_name(name)):
        job = await _find_job(request, namespace, name)  # 404 for an impossible name when not hiding
    if job is None and not hide:
        raise _job_not_found(namespace, name)
    key = f"{namespace[:63]}/{name[:63]}"
    if bearer_token(request) is None:
        raise ApiError(403, f"a bearer token is required to write to job {key}")
    if job is None:
        raise ApiError(403, f"this token cannot write to job {key}")  # as for a wrong token
    await authorize(request, job)
    return job


async def identify(request: Request, *, cookie: bool = False) -> Identity:
    """The identity of the request (401 when the server needs one and it has none)."""
    svc = services(request)
    return await svc.auth.identify(request, svc.store, svc.clock(), cookie=cookie)


async def require(request: Request, role: str, namespace: str | None = None, *, cookie: bool = False) -> Identity:
    """The request's identity when it has ``role`` in ``namespace`` (``None``: in every namespace); 401
    or 403 otherwise. Call it before looking anything up, so that a refusal says nothing of what exists."""
    svc = services(request)
    if not svc.auth.enabled:
        return await svc.auth.identify(request, svc.store, 0.0)
    identity = await svc.auth.identify(request, svc.store, svc.clock(), cookie=cookie)
    if not identity.allows(role, namespace):
        raise forbidden(identity, role, namespace)
    return identity
