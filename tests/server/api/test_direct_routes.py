"""The report endpoint served directly (``server/api/direct.py``) answers every request as Starlette's stack
answers it: the same status, the same headers in the same order (the security headers included), the same
body, the same exception raised on to the server. Each scenario runs twice, on two fresh apps: once as the
app serves it, once with the direct routes switched off (``DirectRoutes.find`` finds nothing, so every
request crosses Starlette's middleware and router as before), and the two transcripts are compared.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.exceptions import HTTPException

import stepwatch.server.api.routes.ingest as ingest_routes
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.api.direct import DirectRoutes, first_headers, send_json
from stepwatch.server.api.guard import SECURITY_HEADERS
from stepwatch.server.api.responses import FastJSONResponse
from stepwatch.server.store import StoreError

REPORTS = "/api/v1/namespaces/default/jobs/{}/reports"
WINDOW = {"last": 0.5, "min": 0.25, "max": 0.75, "mean": 0.5, "count": 2, "nonfinite": 0, "first_step": 1}


def report_body(seq: int, metrics: Sequence[str] = ("loss",), **more: Any) -> bytes:
    body = {
        "api_version": "v1",
        "run_id": "run-1",
        "seq": seq,
        "sent_at": 1_700_000_000.0 + seq,
        "identity": {"rank": 0, "world_size": 1, "local_rank": 0, "host": "node", "pid": 7},
        "progress": {"step": 10 * (seq + 1), "total_steps": 1000},
        "metrics": [{"name": m, **WINDOW, "last_step": 10 * (seq + 1)} for m in metrics],
        **more,
    }
    return json.dumps(body).encode()


SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http", "query_string": b""}
SCOPE.update(client=("127.0.0.1", 50000), server=("127.0.0.1", 8080))


@dataclass
class Exchange:
    """What one request got: its answer's messages, and the exception the app raised on, if any."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    raised: str | None = None


class Driver:
    """An app driven through its ASGI callable, its lifespan started; requests as a server would send them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.tokens: dict[str, str] = {}

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | Sequence[bytes] = b"",
        headers: Sequence[tuple[bytes, bytes]] | None = None,
        *,
        token: str | None = None,
        then: str = "wait",
        root_path: str = "",
    ) -> Exchange:
        chunks = [body] if isinstance(body, bytes) else list(body)
        if headers is None:
            headers = [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json")]
            if isinstance(body, bytes):
                headers.append((b"content-length", str(len(body)).encode()))
        if token is not None:
            headers = [*headers, (b"authorization", f"Bearer {token}".encode())]
        scope = {**SCOPE, "method": method, "path": path, "raw_path": path.encode(), "root_path": root_path}
        scope["headers"] = list(headers)
        pending = list(chunks)
        out = Exchange()

        async def receive() -> dict[str, Any]:
            if pending:
                chunk = pending.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(pending) or then != "wait"}
            if then == "disconnect":
                return {"type": "http.disconnect"}
            await asyncio.sleep(3600)  # a client that sends no more (stall), or waits for the answer
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out.status, out.headers = message["status"], list(message.get("headers", []))
            else:
                out.body += message.get("body", b"")

        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # what the server (uvicorn) would log
            out.raised = type(exc).__name__
        return out

    async def register(self, name: str) -> str:
        answer = await self.request("POST", "/api/v1/namespaces/default/jobs", json.dumps({"name": name}).encode())
        assert answer.status == 201, answer.body
        token: str = json.loads(answer.body)["token"]
        self.tokens[name] = token
        return token


Scenario = Callable[[Driver], Awaitable[list[Exchange]]]


def transcript(tmp_path: Path, scenario: Scenario, *, direct: bool, **settings: Any) -> list[Exchange]:
    """The exchanges of ``scenario`` on a fresh app, with its direct routes on or off."""
    found = DirectRoutes.find
    if not direct:
        DirectRoutes.find = lambda self, scope: None  # type: ignore[method-assign]
    try:
        return asyncio.run(_run(tmp_path / ("direct" if direct else "starlette"), scenario, settings))
    finally:
        DirectRoutes.find = found  # type: ignore[method-assign]


async def _run(where: Path, scenario: Scenario, settings: dict[str, Any]) -> list[Exchange]:
    where.mkdir()
    app = create_app(ServerSettings(db=str(where / "sw.db"), health_sweep_s=3600.0, **settings))
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    lifespan = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    life = asyncio.create_task(app(lifespan, inbox.get, outbox.put))
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        return await scenario(Driver(app))
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await life


_ID = re.compile(rb'"id":"[^"]*"')


def assert_same(tmp_path: Path, scenario: Scenario, **settings: Any) -> list[Exchange]:
    fast = transcript(tmp_path, scenario, direct=True, **settings)
    slow = transcript(tmp_path, scenario, direct=False, **settings)
    assert len(fast) == len(slow)
    for i, (a, b) in enumerate(zip(fast, slow)):
        # a command's id is random: the same length in both, replaced before the bodies are compared
        assert (a.status, a.headers, a.raised) == (b.status, b.headers, b.raised), i
        assert _ID.sub(b'"id":"-"', a.body) == _ID.sub(b'"id":"-"', b.body), i
    return fast


# ------------------------------------------------------------------------------------------- answers


async def _accepted(d: Driver) -> list[Exchange]:
    token = await d.register("a")
    out = [await d.request("POST", REPORTS.format("a"), report_body(0), token=token)]
    out.append(await d.request("POST", REPORTS.format("a"), report_body(0), token=token))  # a duplicate
    command = await d.request(
        "POST", "/api/v1/namespaces/default/jobs/a/commands", json.dumps({"kind": "checkpoint"}).encode()
    )
    assert command.status in (200, 201), command.body
    out.append(await d.request("POST", REPORTS.format("a"), report_body(1), token=token))  # hands the command over
    out.append(await d.request("POST", REPORTS.format("a"), report_body(2, ("loss", "lr")), token=token))
    # a body in several messages, and without a Content-Length
    body = report_body(3)
    out.append(await d.request("POST", REPORTS.format("a"), [body[:100], body[100:]], token=token))
    return out


def test_accepted_reports_are_answered_alike(tmp_path: Path) -> None:
    answers = assert_same(tmp_path, _accepted)
    assert [a.status for a in answers] == [200] * 5
    assert json.loads(answers[2].body)["commands"][0]["kind"] == "checkpoint"
    names = [name for name, _ in answers[0].headers]
    assert names == [b"content-length", b"content-type", *(name for name, _ in SECURITY_HEADERS)]


async def _refused(d: Driver) -> list[Exchange]:
    token = await d.register("a")
    path = REPORTS.format("a")
    return [
        await d.request("POST", path, report_body(0)),  # no token
        await d.request("POST", path, report_body(0), token="not-its-token"),
        await d.request("POST", path, report_body(0), token=" "),
        await d.request("POST", REPORTS.format("nobody"), report_body(0), token=token),
        await d.request("POST", REPORTS.format("Not_A_Name"), report_body(0), token=token),
        await d.request("POST", path, b"{}", [(b"host", b"127.0.0.1"), (b"content-length", b"12x")], token=token),
        await d.request("POST", path, b"{}", [(b"host", b"127.0.0.1"), (b"content-length", b"70000")], token=token),
        await d.request("POST", path, [b"[" + b" " * 40_000, b" " * 40_000 + b"]"], token=token),
        await d.request("POST", path, b"{not json", token=token),
        await d.request("POST", path, b"[]", token=token),
        await d.request("POST", path, report_body(-1), token=token),
        await d.request("POST", path, report_body(0, ("loss", "loss")), token=token),
        await d.request("POST", path, report_body(0, state="exploded"), token=token),
        await d.request("POST", path, report_body(0), [(b"host", b"evil.example")], token=token),  # the guard
        await d.request("GET", path, token=token),  # Starlette's 405 either way
        await d.request("POST", path + "/", report_body(0), token=token),  # Starlette redirects it
        await d.request("POST", "/x" + path, report_body(0), token=token, root_path="/x"),
    ]


def test_refusals_are_answered_alike(tmp_path: Path) -> None:
    answers = assert_same(tmp_path, _refused)
    codes = [a.status for a in answers]
    assert codes == [403, 403, 403, 404, 404, 400, 413, 413, 422, 422, 422, 422, 422, 403, 405, 307, 200]


def test_with_authentication_on_a_missing_job_is_the_403_of_a_wrong_token_both_ways(tmp_path: Path) -> None:
    async def scenario(d: Driver) -> list[Exchange]:
        d.app.state.auth.mode = "none"  # registering needs an API token otherwise
        token = await d.register("a")
        d.app.state.auth.mode = "tokens"
        return [
            await d.request("POST", REPORTS.format("nobody"), report_body(0), token=token),
            await d.request("POST", REPORTS.format("Not_A_Name"), report_body(0)),
            await d.request("POST", REPORTS.format("a"), report_body(0), token=token),
        ]

    answers = assert_same(tmp_path, scenario)
    assert [a.status for a in answers] == [403, 403, 200]


def test_a_slow_body_is_a_408_that_closes_the_connection_both_ways(tmp_path: Path) -> None:
    async def scenario(d: Driver) -> list[Exchange]:
        token = await d.register("a")
        return [await d.request("POST", REPORTS.format("a"), [b'{"seq":'], token=token, then="stall")]

    (answer,) = assert_same(tmp_path, scenario, body_timeout_s=0.05)
    assert answer.status == 408 and (b"connection", b"close") in answer.headers


def test_a_client_gone_before_its_body_is_the_same_500_and_error_both_ways(tmp_path: Path) -> None:
    async def scenario(d: Driver) -> list[Exchange]:
        token = await d.register("a")
        return [await d.request("POST", REPORTS.format("a"), [b'{"seq":'], token=token, then="disconnect")]

    (answer,) = assert_same(tmp_path, scenario)
    assert answer.status == 500 and answer.raised == "ClientDisconnect"


def test_the_limit_on_metric_names_then_the_hold_back_are_answered_alike(tmp_path: Path) -> None:
    async def scenario(d: Driver) -> list[Exchange]:
        token = await d.register("a")
        path = REPORTS.format("a")
        return [
            await d.request("POST", path, report_body(0, ("a", "b", "c")), token=token),
            await d.request("POST", path, report_body(1, ("a",)), token=token),
        ]

    answers = assert_same(tmp_path, scenario, max_metric_names=2)
    assert [a.status for a in answers] == [422, 429]
    assert (b"retry-after", b"1") in answers[1].headers


@pytest.mark.parametrize(
    ("error", "status", "raised"),
    [(RuntimeError("a bug"), 500, "RuntimeError"), (StoreError("disk gone"), 503, None)],
)
def test_errors_of_the_ingest_service_are_answered_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, status: int, raised: str | None
) -> None:
    async def failing(*args: Any) -> Any:
        raise error

    monkeypatch.setattr(ingest_routes, "ingest_report", failing)

    async def scenario(d: Driver) -> list[Exchange]:
        token = await d.register("a")
        return [await d.request("POST", REPORTS.format("a"), report_body(0), token=token)]

    (answer,) = assert_same(tmp_path, scenario)
    assert (answer.status, answer.raised) == (status, raised)
    assert all(h in answer.headers for h in SECURITY_HEADERS)


# --------------------------------------------------------------------------------- served directly


def test_reports_do_not_cross_starlettes_stack_and_other_requests_do(tmp_path: Path) -> None:
    async def scenario(d: Driver) -> list[Exchange]:
        token = await d.register("a")
        guard = d.app.middleware_stack
        inner, crossed = guard.app, []

        async def counting(scope: Any, receive: Any, send: Any) -> None:
            crossed.append(scope["path"])
            await inner(scope, receive, send)

        guard.app = counting
        out = [await d.request("POST", REPORTS.format("a"), report_body(0), token=token)]
        out.append(await d.request("GET", "/api/v1/namespaces/default/jobs/a"))
        assert crossed == ["/api/v1/namespaces/default/jobs/a"]
        return out

    answers = asyncio.run(_run(tmp_path / "app", scenario, {}))
    assert [a.status for a in answers] == [200, 200]


def test_only_the_direct_routes_that_lead_the_app_are_served_directly() -> None:
    from starlette.routing import Route

    async def plain(request: Any) -> Any:
        raise AssertionError

    endpoint = ingest_routes.report
    handlers = {Exception: plain, KeyError: plain, HTTPException: plain}
    leading = DirectRoutes([Route("/r/{x}", endpoint, methods=["POST"]), Route("/p", plain)], handlers)
    scope = {"type": "http", "method": "POST", "path": "/r/1", "root_path": ""}
    found = leading.find(scope)
    assert found is not None and found[2] == {"x": "1"}
    assert leading.find({**scope, "method": "GET"}) is None
    assert leading.find({**scope, "root_path": "/r"}) is None
    behind = DirectRoutes([Route("/p", plain), Route("/r/{x}", endpoint, methods=["POST"])], handlers)
    assert behind.find(scope) is None
    without_500 = DirectRoutes([Route("/r/{x}", endpoint, methods=["POST"])], {KeyError: plain})
    assert without_500.find(scope) is None


def test_a_direct_answer_is_what_fast_json_response_sends() -> None:
    async def messages(content: Any, direct: bool) -> list[Any]:
        box: list[Any] = []

        async def into(message: Any) -> None:
            box.append(message)

        if direct:
            await send_json(into, content)
        else:
            await FastJSONResponse(content)({"type": "http"}, None, into)  # type: ignore[arg-type]
        return box

    for content in ({"accepted_seq": 3, "commands": []}, {"big": 2**70, "text": "é"}):
        assert asyncio.run(messages(content, True)) == asyncio.run(messages(content, False))


def test_first_headers_reads_as_starlette_does() -> None:
    from starlette.datastructures import Headers

    raw = [(b"authorization", b"Bearer one"), (b"content-length", b"3"), (b"authorization", b"Bearer two")]
    found = first_headers({"headers": raw}, frozenset({b"authorization", b"content-length", b"x-absent"}))
    starlette = Headers(raw=raw)
    assert found[b"authorization"].decode() == starlette["authorization"] == "Bearer one"
    assert found[b"content-length"].decode() == starlette["content-length"]
    assert b"x-absent" not in found
