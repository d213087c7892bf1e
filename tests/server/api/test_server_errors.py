"""An unexpected error in a route: a 500 in the one error shape, logged, and with every security header
(Starlette writes 500s in its outermost middleware; the guard that adds the headers sits outside it)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from stepwatch.server.api.guard import SECURITY_HEADERS
from stepwatch.server.store import MetricLimitError, Store, StoreError


def _assert_error_with_security_headers(answer: Any, code: int) -> None:
    assert answer.status_code == code, answer.text
    body = answer.json()
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == code
    for name, value in SECURITY_HEADERS:
        assert answer.headers[name.decode()] == value.decode(), name


def test_a_route_that_raises_is_a_500_with_the_error_shape_and_every_security_header(
    app: Starlette, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(request: Request) -> Response:
        raise RuntimeError("a bug")

    app.add_route("/boom", boom)
    with caplog.at_level(logging.ERROR, logger="stepwatch.server"):
        answer = client.get("/boom")
    _assert_error_with_security_headers(answer, 500)
    assert answer.json()["reason"] == "InternalError" and "RuntimeError" in answer.json()["message"]
    assert "a bug" not in answer.text  # the message names the kind of error, the log keeps the details
    assert any("unexpected error on GET /boom" in r.getMessage() for r in caplog.records)


def test_a_store_that_fails_unexpectedly_is_a_500_with_every_security_header(
    api: Any, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.register("train")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("inside the store")

    monkeypatch.setattr(store, "jobs", broken)
    answer = api.client.get("/api/v1/jobs")
    _assert_error_with_security_headers(answer, 500)
    # The server goes on answering, with the headers, once the fault is gone.
    monkeypatch.undo()
    again = api.client.get("/api/v1/jobs")
    assert again.status_code == 200 and again.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    ("error", "code", "field"),
    [
        (StoreError("the database cannot be written: disk full"), 503, None),
        (MetricLimitError("over 2", job_id=1), 422, "metrics"),
    ],
)
def test_a_store_error_that_reaches_the_edge_is_mapped_there(
    app: Starlette, client: Any, error: StoreError, code: int, field: str | None
) -> None:
    """A store call made outside ``blocking`` (which maps its own) still answers 503 / 422, not a 500."""

    async def fails(request: Request) -> Response:
        raise error

    app.add_route("/store-fails", fails)
    answer = client.get("/store-fails")
    _assert_error_with_security_headers(answer, code)
    assert answer.json()["message"].endswith(str(error))
    assert answer.json().get("details", {}).get("field") == field
    assert (answer.headers.get("retry-after") == "5") == (code == 503)


def test_the_errors_starlette_raises_itself_carry_them_too(client: Any) -> None:
    _assert_error_with_security_headers(client.get("/no/such/route"), 404)
    _assert_error_with_security_headers(client.delete("/api/v1/jobs"), 405)
