"""The client without I/O: requests to make, answers to read, when to retry. Both clients drive it.

Every API call is an *operation*: a generator that yields :class:`Request` objects and receives a
:class:`Response` for each, then returns its result. :class:`~stepwatch.client.Client` drives an
operation with blocking httpx calls and :class:`~stepwatch.client.AsyncClient` with awaited ones; the
requests, the parsing, the errors and the retry decisions are written once, here and in ``_ops``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..protocol import API_VERSION, Backoff, parse_retry_after
from ._errors import ApiError, IncompatibleServer, InvalidResponse, error_for

__all__ = [
    "DEFAULT_SERVER",
    "Config",
    "Operation",
    "Request",
    "Response",
    "Retry",
    "check_version",
    "read_json",
    "server_url",
]

T = TypeVar("T")

DEFAULT_SERVER = "http://127.0.0.1:8642"
USER_AGENT = "stepwatch-client"


def server_url(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The server to talk to: the argument, ``STEPWATCH_SERVER``, ``STEPWATCH_URL``, then the local default.

    An address without a scheme is read as ``http://`` (``127.0.0.1:8642``, as ``curl`` reads it).
    """
    env = os.environ if environ is None else environ
    url = (explicit or env.get("STEPWATCH_SERVER") or env.get("STEPWATCH_URL") or DEFAULT_SERVER).strip()
    if "://" not in url:
        url = f"http://{url}"
    if "/apis/trainer.kubeflow.org/" in url:
        url = url.split("/apis/trainer.kubeflow.org/")[0]
    return url.rstrip("/")


@dataclass(frozen=True)
class Request:
    """One HTTP request of an operation; ``idempotent`` ones may be retried."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] | None = None
    idempotent: bool = True
    timeout: float | None = None
    """Overrides the client's timeout for this request."""


@dataclass(frozen=True)
class Response:
    """What the server answered: status, headers (lower-case names) and body."""

    status: int
    headers: Mapping[str, str]
    content: bytes


Operation = Generator[Request, Response, T]
"""An API call: yields requests, receives their responses, returns its result."""


@dataclass(frozen=True)
class Retry:
    """When and how long to wait before trying an idempotent request again.

    Retried: no answer (refused, reset, timed out), 429, 502, 503 and 504, at most ``attempts - 1``
    times, waiting ``backoff * 2**n`` seconds (between half of that and all of it, at most
    ``max_delay``) or what the server's ``Retry-After`` says (at most ``max_delay`` too). Requests that
    change something (commands, registrations) are never retried: a command the server did get would
    be queued twice. ``rand`` is the jitter's random source (a float in ``[0, 1)``).
    """

    attempts: int = 3
    backoff: float = 0.25
    max_delay: float = 5.0
    statuses: frozenset[int] = frozenset({429, 502, 503, 504})
    rand: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def delay(self, request: Request, attempt: int, status: int | None, retry_after: float | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or ``None``: give up (``status`` ``None``: no answer)."""
        if not request.idempotent or attempt + 1 >= self.attempts:
            return None
        if status is not None and status not in self.statuses:
            return None
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        return Backoff(self.backoff, self.max_delay, jitter="equal").delay(attempt + 1, self.rand)


@dataclass
class Config:
    """What both clients share: the server, the token, the default namespace, timeouts and retries."""

    url: str
    token: str | None = None
    namespace: str = "default"
    timeout: float = 10.0
    retry: Retry = field(default_factory=Retry)
    check_version: bool = True
    version_checked: bool = False
    server_version: str | None = None

    @classmethod
    def resolve(
        cls,
        url: str | None,
        token: str | None,
        namespace: str | None,
        timeout: float,
        retries: int,
        check_version: bool,
        environ: Mapping[str, str] | None = None,
    ) -> Config:
        """Arguments first, then the environment (``STEPWATCH_SERVER``/``STEPWATCH_URL``, ``STEPWATCH_API_TOKEN``,
        ``STEPWATCH_NAMESPACE``), then defaults. A job's write token (``STEPWATCH_TOKEN``) is not used to read."""
        env = os.environ if environ is None else environ
        return cls(
            url=server_url(url, env),
            token=token or env.get("STEPWATCH_API_TOKEN") or None,
            namespace=namespace or env.get("STEPWATCH_NAMESPACE") or "default",
            timeout=timeout,
            retry=Retry(attempts=max(retries, 0) + 1),
            check_version=check_version,
        )

    def headers(self) -> dict[str, str]:
        """The headers of every request."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def ns(self, namespace: str | None) -> str:
        """The namespace of a call: its argument, else the client's."""
        return namespace or self.namespace


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date), ``None`` when absent or unreadable."""
    return parse_retry_after(headers.get("retry-after"))


def _loads(content: bytes) -> Any:
    try:
        import orjson  # the server extra has it: 3-4x faster on big lists
    except ImportError:
        return json.loads(content)
    return orjson.loads(content)


def read_json(response: Response, what: str = "answer") -> Any:
    """The body of a successful answer as JSON, or the error of an unsuccessful one."""
    if response.status >= 400:
        try:
            body = _loads(response.content) if response.content else None
        except ValueError:
            body = None
        raise error_for(response.status, body, retry_after(response.headers))
    try:
        return _loads(response.content)
    except ValueError:
        shown = response.content[:80].decode("utf-8", "replace")
        raise InvalidResponse(
            f"the server's {what} is not JSON (status {response.status}): {shown!r}; is this a stepwatch server?"
        ) from None


def _short(exc: Exception) -> str:
    """An error's gist for a one-line message: the status, or the first words of what came back."""
    if isinstance(exc, ApiError):
        return f"HTTP {exc.status}"
    return "something that is not JSON"


def _base_hint(url: str) -> str:
    """``--server`` takes the server's base URL: say which one when the user gave an API path."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.path.rstrip("/") in ("", "/"):
        return ""
    return f" (give the server's base URL, e.g. {parts.scheme}://{parts.netloc}, without {parts.path})"


def check_version(config: Config, /) -> Operation[dict[str, Any]]:
    """Ask the server what it speaks; :class:`IncompatibleServer` unless it is this client's API version."""
    try:
        response = yield Request("GET", "/api/v1/version")
        found = read_json(response, "version")
    except (ApiError, InvalidResponse) as exc:
        raise IncompatibleServer(
            f"{config.url} is not a stepwatch server: GET /api/v1/version answered {_short(exc)}"
            f"{_base_hint(config.url)}"
        ) from None
    if not isinstance(found, dict):
        raise IncompatibleServer(f"{config.url} answered GET /api/v1/version with {type(found).__name__}")
    api = found.get("api_version")
    version = found.get("version")
    if api != API_VERSION:
        raise IncompatibleServer(
            f"the server at {config.url} (stepwatch {version}) speaks API {api!r}; this client speaks "
            f"{API_VERSION!r}: install a stepwatch client of the server's version",
            server_version=str(version) if version is not None else None,
            api_version=str(api) if api is not None else None,
        )
    config.version_checked = True
    config.server_version = str(version) if version is not None else None
    return found
