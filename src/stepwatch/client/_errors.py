"""The client's one error tree.

::

    StepwatchError
     ├── ServerUnreachable      no answer (refused, timed out, DNS)
     └── ApiError               an answer with an error status (its Kubernetes Status body)
          ├── NotFound          404
          ├── Forbidden         401, 403
          └── Conflict          409
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "Conflict", "Forbidden", "NotFound", "ServerUnreachable", "StepwatchError"]


class StepwatchError(Exception):
    """Root of every error the client raises."""


class ServerUnreachable(StepwatchError):
    """The server did not answer."""


class ApiError(StepwatchError):
    """The server answered with an error status."""

    def __init__(self, status: int, message: str, field: str | None = None, body: Any = None) -> None:
        super().__init__(f"{message} ({status})")
        self.status = status
        self.message = message
        self.field = field
        self.body = body


class NotFound(ApiError):
    """404: no such job or route."""


class Forbidden(ApiError):
    """401/403: missing or wrong token."""


class Conflict(ApiError):
    """409: the request clashes with the job's state."""


def error_for(status: int, body: Any) -> ApiError:
    """The error of an answer, from its Status body when it has one."""
    message = f"HTTP {status}"
    field = None
    if isinstance(body, dict):
        message = str(body.get("message") or message)
        details = body.get("details")
        if isinstance(details, dict) and isinstance(details.get("field"), str):
            field = details["field"]
    cls = {404: NotFound, 401: Forbidden, 403: Forbidden, 409: Conflict}.get(status, ApiError)
    return cls(status, message, field, body)
