"""The client's one error tree: every failure of the SDK is one of these, never an httpx error.

::

    StepwatchError
     ├── ServerUnreachable          no answer: refused, reset, DNS, TLS
     │    └── RequestTimeout        no answer in time (connect, read or the whole request)
     ├── IncompatibleServer         the server speaks another API version
     ├── InvalidResponse            an answer that is not what the API says (not JSON, wrong shape)
     ├── WaitTimeout                wait() ran out of time (also a TimeoutError)
     └── ApiError                   an answer with an error status (its Kubernetes Status body)
          ├── InvalidRequest        400, 413, 422: the request was wrong (``field`` names where)
          ├── AuthError             the token
          │    ├── Unauthorized     401: missing or expired token
          │    └── Forbidden        403: this token may not do that
          ├── NotFound              404: no such job (or namespace, attempt, route)
          ├── Conflict              409: clashes with the job's state (it has ended, it is live)
          ├── RateLimited           429 (``retry_after`` in seconds when the server said it)
          └── ServerError           5xx (``retry_after`` likewise)

Idempotent calls (reads, policy PUTs) are retried on ``ServerUnreachable``, 429, 502, 503 and 504
before one of these is raised; commands and registrations are never retried, so they never act twice.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApiError",
    "AuthError",
    "Conflict",
    "Forbidden",
    "IncompatibleServer",
    "InvalidRequest",
    "InvalidResponse",
    "NotFound",
    "RateLimited",
    "RequestTimeout",
    "ServerError",
    "ServerUnreachable",
    "StepwatchError",
    "Unauthorized",
    "WaitTimeout",
    "error_for",
]


class StepwatchError(Exception):
    """Root of every error the client raises."""


class ServerUnreachable(StepwatchError):
    """The server did not answer (connection refused or reset, unknown host, TLS failure)."""


class RequestTimeout(ServerUnreachable):
    """The server did not answer in time."""


class IncompatibleServer(StepwatchError):
    """The server speaks an API version this client does not."""

    def __init__(self, message: str, server_version: str | None = None, api_version: str | None = None) -> None:
        super().__init__(message)
        self.server_version = server_version
        self.api_version = api_version


class InvalidResponse(StepwatchError):
    """The server's answer is not what the API describes (not JSON, a missing or mistyped field)."""


class WaitTimeout(StepwatchError, TimeoutError):
    """:meth:`Client.wait` gave up; ``job`` is the last state seen (``None`` if none was)."""

    def __init__(self, message: str, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class ApiError(StepwatchError):
    """The server answered with an error status; ``message`` and ``field`` come from its Status body."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{message} ({status})")
        self.status = status
        self.message = message
        self.field = field
        self.body = body
        self.retry_after = retry_after


class InvalidRequest(ApiError):
    """400, 413, 422: the request was wrong; ``field`` says where when the server said."""


class AuthError(ApiError):
    """401 or 403: the token."""


class Unauthorized(AuthError):
    """401: no token, or one that expired: get a new one."""


class Forbidden(AuthError):
    """403: the token does not allow this (a job's token writes only its own job)."""


class NotFound(ApiError):
    """404: no such job (or namespace, attempt, route)."""


class Conflict(ApiError):
    """409: the request clashes with the job's state (a stop for a job that has ended, a live name)."""


class RateLimited(ApiError):
    """429: too many requests; ``retry_after`` says when to come back, when the server said."""


class ServerError(ApiError):
    """5xx: the server failed (503: its storage is unavailable for now)."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
}


def error_for(status: int, body: Any, retry_after: float | None = None) -> ApiError:
    """The error of an answer, from its Status body when it has one."""
    message = f"HTTP {status}"
    field = None
    if isinstance(body, dict):
        message = str(body.get("message") or message)
        details = body.get("details")
        if isinstance(details, dict) and isinstance(details.get("field"), str):
            field = details["field"]
    if status == 401 and message == f"HTTP {status}":
        message = "the server wants a token, or a new one: this one is missing or expired"
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, message, field, body, retry_after)
