"""The one error shape of the server: a Kubernetes ``Status`` object, for every error of every route.

Kubeflow Trainer's status endpoint answers errors this way, so upstream clients understand ours; the
native API uses the same shape so that one parser serves every client::

    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound",
     "message": "job default/x not found", "details": {"field": "..."}}
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..store.base import MetricLimitError, StoreError

__all__ = ["REASONS", "ApiError", "error_body", "error_response", "store_error"]

REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    409: "Conflict",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    431: "RequestHeaderFieldsTooLarge",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """An error answered to the client with its status code, a precise message and the field at fault."""

    def __init__(self, code: int, message: str, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}


def error_body(code: int, message: str, field: str | None = None) -> dict[str, Any]:
    """The JSON body of an error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": REASONS.get(code, "Unknown"),
        "message": message,
    }
    if field:
        body["details"] = {"field": field}
    return body


def error_response(
    code: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An error as a response."""
    return JSONResponse(error_body(code, message, field), status_code=code, headers=headers)


async def handle_api_error(request: Request, exc: Exception) -> JSONResponse:
    """Exception handler for :class:`ApiError`."""
    assert isinstance(exc, ApiError)
    return error_response(exc.code, exc.message, exc.field, exc.headers)


def store_error(exc: StoreError) -> ApiError:
    """A store failure as the client is answered: the limit on a job's metric names is the caller's fault
    (422, the field ``metrics``); anything else is the store's (503 with ``Retry-After``: the server stays
    up and the client retries)."""
    if isinstance(exc, MetricLimitError):
        return ApiError(422, str(exc), "metrics")
    return ApiError(503, f"storage unavailable: {exc}", headers={"Retry-After": "5"})


async def handle_store_error(request: Request, exc: Exception) -> JSONResponse:
    """Exception handler for :class:`~..store.base.StoreError`: errors are mapped to HTTP at the edge, so a
    store call made anywhere under a route answers as :func:`store_error` says."""
    assert isinstance(exc, StoreError)
    return await handle_api_error(request, store_error(exc))
