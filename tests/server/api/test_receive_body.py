"""How a request's body is read (``server/api/request.py``, ``receive_body``): a body already there is taken
without a timer; one that has to be waited for is waited for under the body's timeout, the first message
included (its call to ``receive`` is stepped by hand, then handed to the task), with every outcome of a
plain ``await``: the messages joined, a 408 when the client stops sending, a disconnect, a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from stepwatch.server.api.errors import ApiError
from stepwatch.server.api.request import receive_body

Receive = Callable[[], Awaitable[dict[str, Any]]]


def script(*steps: Any) -> tuple[Receive, list[str]]:
    """A ``receive`` that plays ``steps`` in turn: bytes (a part of the body; the last one ends it), a number
    (seconds to wait before the next), ``"never"`` (wait for good), ``"gone"`` (the client disconnects)."""
    pending = list(steps)
    seen: list[str] = []

    async def receive() -> dict[str, Any]:
        try:
            while pending and isinstance(pending[0], (int, float)):
                await asyncio.sleep(pending.pop(0))
            step = pending.pop(0)
            if step == "never":
                await asyncio.sleep(3600)
            if step == "gone":
                return {"type": "http.disconnect"}
            more = any(not isinstance(s, (int, float)) for s in pending)
            return {"type": "http.request", "body": step, "more_body": more}
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    return receive, seen


def read(receive: Receive, timeout: float = 5.0, declared: str | None = None) -> Any:
    async def go() -> Any:
        try:
            return await receive_body(receive, declared, timeout)
        except (ApiError, ClientDisconnect) as exc:
            return exc

    return asyncio.run(go())


@pytest.mark.parametrize(
    "steps",
    [
        (b'{"a": 1}',),
        (0.01, b'{"a": 1}'),
        (b'{"a"', 0.01, b": 1}"),
        (0.01, b'{"a"', 0.0, b": ", 0.01, b"1}"),
        (b"", 0.01, b'{"a": 1}'),
    ],
)
def test_a_body_is_read_whole_whether_it_came_at_once_or_had_to_be_waited_for(steps: tuple[Any, ...]) -> None:
    receive, _ = script(*steps)
    assert read(receive) == b'{"a": 1}'


@pytest.mark.parametrize(("steps", "came"), [(("never",), 0), ((b"abc", "never"), 3), ((0.01, b"ab", "never"), 2)])
def test_a_body_that_stops_coming_is_a_408_naming_what_came(steps: tuple[Any, ...], came: int) -> None:
    receive, seen = script(*steps)
    error = read(receive, timeout=0.1)
    assert isinstance(error, ApiError) and error.code == 408
    assert error.message == f"the body did not arrive within 0.1 s ({came} bytes came)"
    assert error.headers == {"Connection": "close"}
    assert seen == ["cancelled"]  # the waiting call was cancelled, not left behind


@pytest.mark.parametrize("steps", [("gone",), (0.01, "gone"), (b"ab", 0.01, "gone")])
def test_a_client_gone_while_its_body_comes_is_a_disconnect(steps: tuple[Any, ...]) -> None:
    receive, _ = script(*steps)
    assert isinstance(read(receive), ClientDisconnect)


def test_a_body_over_the_limit_is_a_413_at_once_or_in_parts() -> None:
    for steps in ((b"x" * 70_000,), (0.01, b"x" * 40_000, b"x" * 40_000)):
        receive, _ = script(*steps)
        error = read(receive)
        assert isinstance(error, ApiError) and error.code == 413


def test_a_cancelled_request_is_cancelled_not_a_408() -> None:
    receive, seen = script("never")

    async def go() -> None:
        task = asyncio.ensure_future(receive_body(receive, None, 5.0))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert seen == ["cancelled"]


def test_a_receive_that_is_no_coroutine_is_awaited_as_it_is() -> None:
    def receive() -> Awaitable[dict[str, Any]]:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_result, {"type": "http.request", "body": b"{}"})
        return future

    assert read(receive) == b"{}"
