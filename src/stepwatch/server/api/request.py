"""What every route needs: the app's services (:mod:`..services`), bounded body reading, token checks, names."""

from __future__ import annotations

import asyncio
import hmac
import re
import types
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive

from ...protocol import LIMITS, BodyTooLarge, ProtocolError, decode_body, is_valid_name
from ..services import Services
from ..store import Job, Store
from ..store.offload import blocking
from .auth import Authenticator, Identity, forbidden, hash_token
from .errors import ApiError

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is in the server extra
    orjson = None  # type: ignore[assignment]

_DIGIT_RUNS = bytes(48 if 48 <= c <= 57 else 46 if c == 46 else 32 for c in range(256))
"""A translation of a body that keeps its shape of digits: each digit ``0``, each ``.`` itself, the rest a space."""
_LONG_RUN = b"0" * 19
"""19 digits in a row, in :data:`_DIGIT_RUNS`' translation: a run that does not follow a ``.`` is an integer,
or a number's integer part or exponent, that may reach beyond 64 bits (the digits of a fraction may not)."""
_DOT = ord(".")
_DIGITS = re.compile(b"0+")

__all__ = [
    "authenticator",
    "authorize",
    "bearer_of",
    "bearer_token",
    "decode_json",
    "fast_json_loads",
    "hash_token",
    "identify",
    "read_body",
    "read_json",
    "receive_body",
    "require",
    "require_job",
    "require_writer",
    "services",
    "writer_of",
]


def services(request: Request) -> Services:
    """The services of the app serving this request."""
    found: Services = request.app.state.services
    return found


def authenticator(request: Request) -> Authenticator:
    """Who requests to the app serving this one come from (its settings' authentication): kept beside the
    services, not in them, as it is the API's own collaborator."""
    found: Authenticator = request.app.state.auth
    return found


async def read_json(request: Request, limit: int = LIMITS.max_body_bytes) -> Any:
    """The request body as JSON, read at most ``limit`` bytes far (413 beyond, 422 when malformed)."""
    return decode_json(await read_body(request, limit))


async def read_body(request: Request, limit: int = LIMITS.max_body_bytes) -> bytes:
    """The request body, read at most ``limit`` bytes far (413 beyond; 408 when it comes too slowly)."""
    timeout: float = request.app.state.settings.body_timeout_s
    return await receive_body(request.receive, request.headers.get("content-length"), timeout, limit)


async def receive_body(
    receive: Receive, declared: str | None, timeout: float, limit: int = LIMITS.max_body_bytes
) -> bytes:
    """What :func:`read_body` reads, from an ASGI ``receive`` and the request's ``Content-Length`` (``declared``):
    the routes served without a ``Request`` (:mod:`.direct`) read their bodies with it."""
    if declared is not None:
        try:
            too_big = int(declared) > limit
        except ValueError:
            raise ApiError(400, f"Content-Length is not a number: {declared[:40]!r}") from None
        if too_big:
            raise ApiError(413, f"body is {declared} bytes; the limit is {limit} bytes (64 KiB)")
    message, rest = _at_once(receive)
    if message is not None and message["type"] == "http.request" and not message.get("more_body", False):
        whole = message.get("body", b"")
        if len(whole) <= limit:
            return bytes(whole)  # the whole body was there (a report's is): no timer to set and cancel
    body = bytearray()
    try:
        # a client sending a byte now and then must not hold a request for good; asyncio's own timeout
        # (Python 3.11+, the server runs on asyncio) costs a third of anyio's cancel scope, every request
        if _asyncio_timeout is not None:
            async with _asyncio_timeout(timeout):
                return await _read_into(body, receive, limit, message, rest)
        else:  # pragma: no cover - Python 3.10
            with anyio.fail_after(timeout):
                return await _read_into(body, receive, limit, message, rest)
    except TimeoutError:
        text = f"the body did not arrive within {timeout:g} s ({len(body)} bytes came)"
        raise ApiError(408, text, headers={"Connection": "close"}) from None


async def _read_into(
    body: bytearray, receive: Receive, limit: int, message: Message | None, rest: Awaitable[Message] | None
) -> bytes:
    """The body's messages, as Starlette's ``Request.stream`` reads them (a disconnect: ``ClientDisconnect``),
    without its generator, gathered in ``body``; the first is ``message``, or what ``rest`` gives."""
    while True:
        if message is None:
            message = await (rest if rest is not None else receive())
            rest = None
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                body += chunk
                if len(body) > limit:
                    raise ApiError(413, f"body is over the limit of {limit} bytes (64 KiB)")
            if not message.get("more_body", False):
                return bytes(body)
        elif kind == "http.disconnect":
            raise ClientDisconnect()
        message = None


def _at_once(receive: Receive) -> tuple[Message | None, Awaitable[Message] | None]:
    """Call ``receive``: its message when it gives one without waiting (a body that came with its headers),
    else ``None`` and what finishes the call when awaited (under the body's timeout).

    The coroutine is stepped once by hand; if it waits, :class:`_Resumed` hands what it waits on to the
    task and goes on with it, as ``await`` would have (a cancellation, the timeout's, reaches it too).
    A timer set and cancelled for every request cost more than the rest of reading a report's body.
    """
    call = receive()
    if type(call) is not types.CoroutineType:
        return None, call
    try:
        waiting = call.send(None)
    except StopIteration as done:
        message: Message = done.value
        return message, None
    return None, _Resumed(call, waiting)


class _Resumed:
    """The rest of a coroutine stepped once by hand, which yielded ``waiting``: awaiting this yields
    ``waiting`` to the task, and each later step's, and sends (or throws) what the task gives back into
    the coroutine, until it returns (``yield from`` done by hand, as its first step was)."""

    __slots__ = ("_call", "_waiting")

    def __init__(self, call: Coroutine[Any, Any, Message], waiting: Any) -> None:
        self._call, self._waiting = call, waiting

    def __await__(self) -> Generator[Any, Any, Message]:
        call, waiting = self._call, self._waiting
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # a cancellation (the timeout's) or a close: the coroutine's to handle
                try:
                    waiting = call.throw(exc)
                except StopIteration as done:
                    thrown: Message = done.value
                    return thrown
                continue
            try:
                waiting = call.send(sent)
            except StopIteration as done:
                result: Message = done.value
                return result


_asyncio_timeout = getattr(asyncio, "timeout", None)


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
    if orjson is None or _long_integer(body):
        raise ValueError("left to the standard parser")
    return orjson.loads(body)


def _long_integer(body: bytes) -> bool:
    """Whether ``body`` has a run of 19 digits or more that is not a fraction's: an integer orjson may read
    as a float (beyond 64 bits). A fraction's digits are read alike by both parsers, however many (a
    learning rate of 3e-4 is written ``0.00030000000000000003``, and every report has one or two).

    A translation, then a search for 19 digits: each run found is a long integer unless a ``.`` comes
    before it (the digits of a fraction), and the search goes on past the run's end. Searching for the
    19 digits alone, rather than for them after a space, takes a fraction of the time: a space is in
    every other byte of the translated body, the 19th digit rarely (1.0 µs against 3.3 on a report of
    5 metric windows). Linear in the body, runs of any length included.
    """
    shape = body.translate(_DIGIT_RUNS)
    at = shape.find(_LONG_RUN)
    while at >= 0:
        if at == 0 or shape[at - 1] != _DOT:  # the first of a run, so after a space or a dot
            return True
        at = shape.find(_LONG_RUN, _DIGITS.match(shape, at).end())  # type: ignore[union-attr]  # a run is there
    return False


def _valid_name(value: str) -> bool:
    """:func:`is_valid_name`, remembered for the names found valid (every report of a job checks the same two)."""
    if value in _VALID_NAMES:
        return True
    if not is_valid_name(value):
        return False
    if len(_VALID_NAMES) >= 16384:  # bounded: forgetting only costs a check
        _VALID_NAMES.clear()
    _VALID_NAMES.add(value)
    return True


_VALID_NAMES: set[str] = set()


def check_name(value: str, what: str) -> str:
    """A job or namespace name from a path: 404 when it cannot exist."""
    if not _valid_name(value):
        raise ApiError(
            404,
            f"no {what} named {value[:80]!r}: names are Kubernetes names (lowercase letters, digits and '-', "
            "at most 63)",
        )
    return value


async def require_job(request: Request, namespace: str, name: str) -> Job:
    """The latest attempt of the job named in the path, or 404."""
    job = await _find_job(services(request).store, namespace, name)
    if job is None:
        raise _job_not_found(namespace, name)
    return job


def bearer_token(request: Request) -> str | None:
    """The request's bearer token (``Authorization: Bearer <token>``, the scheme in any case, spaces around
    it as upstream Kubeflow's ``extractRawToken`` allows), or ``None``."""
    return bearer_of(request.headers.get("authorization"))


def bearer_of(header: str | None) -> str | None:
    """The bearer token of an ``Authorization`` header's value (see :func:`bearer_token`), or ``None``."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def authorize(request: Request, job: Job) -> None:
    """403 unless the request carries the job's own write token."""
    await _authorize(services(request).store, job, bearer_token(request))


async def _authorize(store: Store, job: Job, token: str | None) -> None:
    if token is None:
        raise ApiError(403, f"a bearer token is required to write to job {job.key}")
    expected = store.cached_token_hash(job.id)
    if expected is None:
        expected = await blocking(store.token_hash, job.id)
    if not hmac.compare_digest(hash_token(token), expected):
        raise ApiError(403, f"this token cannot write to job {job.key}")


async def _find_job(store: Store, namespace: str, name: str) -> Job | None:
    check_name(namespace, "namespace")
    check_name(name, "job")
    return await _lookup(store, namespace, name)


async def _lookup(store: Store, namespace: str, name: str) -> Job | None:
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
    hide = authenticator(request).enabled if hide_missing is None else hide_missing
    return await writer_of(services(request).store, namespace, name, bearer_token(request), hide=hide)


async def writer_of(store: Store, namespace: str, name: str, token: str | None, *, hide: bool) -> Job:
    """What :func:`require_writer` decides, from the request's bearer token (``None``: none): the routes served
    without a ``Request`` (:mod:`.direct`) check their writers with it."""
    job = None
    if not hide:
        job = await _find_job(store, namespace, name)  # 404 for an impossible name
        if job is None:
            raise _job_not_found(namespace, name)
    elif _valid_name(namespace) and _valid_name(name):
        job = await _lookup(store, namespace, name)
    if token is None:
        raise ApiError(403, f"a bearer token is required to write to job {namespace[:63]}/{name[:63]}")
    if job is None:
        raise ApiError(403, f"this token cannot write to job {namespace[:63]}/{name[:63]}")  # as for a wrong token
    await _authorize(store, job, token)
    return job


async def identify(request: Request, *, cookie: bool = False) -> Identity:
    """The identity of the request (401 when the server needs one and it has none)."""
    svc = services(request)
    return await authenticator(request).identify(request, svc.store, svc.clock(), offload=blocking, cookie=cookie)


async def require(request: Request, role: str, namespace: str | None = None, *, cookie: bool = False) -> Identity:
    """The request's identity when it has ``role`` in ``namespace`` (``None``: in every namespace); 401
    or 403 otherwise. Call it before looking anything up, so that a refusal says nothing of what exists."""
    svc, auth = services(request), authenticator(request)
    if not auth.enabled:
        return await auth.identify(request, svc.store, 0.0, offload=blocking)
    identity = await auth.identify(request, svc.store, svc.clock(), offload=blocking, cookie=cookie)
    if not identity.allows(role, namespace):
        raise forbidden(identity, role, namespace)
    return identity
