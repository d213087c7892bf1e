"""The live stream: ``GET /api/v1/events``, server-sent events of job changes and new points (the broadcaster
behind it is :mod:`...live.broadcaster`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from ...live.broadcaster import TooManyStreams
from ...store import StoreError
from ..auth import Identity
from ..errors import ApiError
from ..request import check_name, identify, require, services

__all__ = ["routes"]


async def live_events(request: Request) -> StreamingResponse:
    """``GET /api/v1/events?namespace=&job=``: server-sent events of job changes and new points, of the
    namespaces the client may read. The dashboard's token cookie counts here (``EventSource`` sends no
    headers); a token revoked or expired while the stream is open ends it at its next message."""
    q = request.query_params
    namespace = q.get("namespace") or None
    job = q.get("job") or None
    if namespace is not None:
        identity = await require(request, "viewer", namespace, cookie=True)
        check_name(namespace, "namespace")
    else:
        identity = await identify(request, cookie=True)
    if job is not None:
        check_name(job, "job")
    last = request.headers.get("last-event-id") or q.get("last_event_id")
    last_id: int | None = None
    if last:
        try:
            last_id = int(last)
        except ValueError:
            raise ApiError(400, f"Last-Event-ID must be an event id (an integer), got {last[:40]!r}") from None
    readable = identity.readable()
    allowed = frozenset(readable) if readable is not None else None
    stream: AsyncIterator[str]
    try:
        stream = services(request).live.stream(namespace, job, last_id, allowed, _client(request, identity))
    except TooManyStreams as exc:
        raise ApiError(429, exc.message, headers={"Retry-After": str(exc.retry_after)}) from None
    if identity.token_id is not None:
        stream = _while_valid(request, stream)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


def _client(request: Request, identity: Identity) -> str:
    """Who a stream counts against: its token, its user behind a proxy, else (no auth) its address."""
    if identity.token_id is not None:
        return f"token:{identity.token_id}"
    if identity.who != "local":
        return identity.who
    return f"address:{request.client.host if request.client else ''}"


async def _while_valid(request: Request, stream: AsyncIterator[str]) -> AsyncIterator[str]:
    """The stream, ended as soon as the credentials that opened it are refused (a memory lookup per message
    while the token is valid). A store that cannot answer the check refuses nothing: the stream goes on, and
    the next message checks again."""
    try:
        async for chunk in stream:
            try:
                await identify(request, cookie=True)
            except ApiError:
                yield 'event: unauthorized\ndata: {"reason":"the token was revoked or expired"}\n\n'
                return
            except StoreError:
                pass  # an outage is not a revocation
            yield chunk
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


routes = [Route("/api/v1/events", live_events, methods=["GET"])]
