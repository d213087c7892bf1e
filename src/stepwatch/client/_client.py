""":class:`Client` and :class:`AsyncClient`: the operations of ``_ops`` driven over httpx, blocking or awaited.

Each API method is declared once, in ``_ops``; ``sync_op``/``async_op`` turn it into a method of
each class with the same signature and docstring. What is left here is I/O only: sending a request
(retrying it when ``Retry`` says so), reading the live stream, and sleeping.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from . import _access, _ops
from ._core import (
    DEFAULT_SERVER,
    Config,
    Operation,
    Request,
    Response,
    check_version,
    read_json,
    retry_after,
    server_url,
)
from ._errors import RequestTimeout, ServerUnreachable, StepwatchError, WaitTimeout
from ._job import Job
from ._live import JobUpdate, Resync, Update, WatchSession
from ._wait import Until, Waiter

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_SERVER", "AsyncClient", "Client", "server_url"]

P = ParamSpec("P")
T = TypeVar("T")


def sync_op(op: Callable[Concatenate[Config, P], Operation[T]]) -> Callable[Concatenate[Client, P], T]:
    """The blocking method of an operation."""

    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(self._config, *args, **kwargs))

    functools.update_wrapper(method, op)
    return method


def async_op(op: Callable[Concatenate[Config, P], Operation[T]]) -> Callable[Concatenate[AsyncClient, P], Awaitable[T]]:
    """The awaitable method of an operation."""

    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(self._config, *args, **kwargs))

    functools.update_wrapper(method, op)
    return method


def _translate(exc: Exception, config: Config, what: str = "") -> StepwatchError:
    """An httpx error as one of the tree's."""
    import httpx

    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return RequestTimeout(f"the stepwatch server at {config.url} did not answer {what}in time ({detail})")
    return ServerUnreachable(f"no stepwatch server answers at {config.url} ({detail})")


def _response(r: httpx.Response) -> Response:
    return Response(r.status_code, r.headers, r.content)


def _timeout(config: Config, request: Request) -> httpx.Timeout:
    import httpx

    if request.timeout is None:
        return httpx.Timeout(config.timeout)
    return httpx.Timeout(config.timeout, read=request.timeout)


def _namespace_of_watch(config: Config, name: str | None, namespace: str | None) -> str | None:
    # a job's name alone means the client's namespace; no name means every namespace unless one is given
    return namespace or (config.namespace if name else None)


class _Base:
    """What both clients hold: the configuration."""

    _config: Config

    def __init__(
        self,
        url: str | None,
        token: str | None,
        namespace: str | None,
        timeout: float,
        retries: int,
        check_version: bool,
    ) -> None:
        self._config = Config.resolve(url, token, namespace, timeout, retries, check_version)

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._config.url

    @property
    def token(self) -> str | None:
        """The API token this client sends (``None``: none)."""
        return self._config.token

    @property
    def namespace(self) -> str:
        """The namespace of calls that name a job without one."""
        return self._config.namespace

    @property
    def server_version(self) -> str | None:
        """The server's stepwatch version, once a call has asked."""
        return self._config.server_version

    def _session(
        self,
        name: str | None,
        namespace: str | None,
        last_event_id: int | None,
        reconnect: bool,
        timeout: float | None,
        announce: bool = False,
    ) -> WatchSession:
        return WatchSession(
            name,
            _namespace_of_watch(self._config, name, namespace),
            last_event_id=last_event_id,
            reconnect=reconnect,
            deadline=time.monotonic() + timeout if timeout is not None else None,
            announce=announce,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._config.url} namespace={self._config.namespace}>"


class Client(_Base):
    """A stepwatch server seen from code, blocking. Every method raises a :class:`StepwatchError` subclass.

    ``url``: the argument, ``STEPWATCH_SERVER``, ``STEPWATCH_URL``, else ``http://127.0.0.1:8642``.
    ``token``: sent as ``Authorization: Bearer`` (default ``STEPWATCH_API_TOKEN``). ``namespace``: of
    calls that name a job without one (default ``STEPWATCH_NAMESPACE``, else ``default``). ``timeout``:
    seconds per request. ``retries``: tries again of idempotent requests. ``check_version``: ask the
    server's API version before the first call (:class:`IncompatibleServer` when it differs).
    ``transport``: an ``httpx.BaseTransport`` instead of the network (tests).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        namespace: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        check_version: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import httpx

        super().__init__(url, token, namespace, timeout, retries, check_version)
        self._http = httpx.Client(
            base_url=self._config.url, headers=self._config.headers(), timeout=timeout, transport=transport
        )

    def close(self) -> None:
        """Release the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ driving

    def _run(self, op: Operation[T], check: bool = True) -> T:
        if check and self._config.check_version and not self._config.version_checked:
            self._drive(check_version(self._config))
        return self._drive(op)

    def _drive(self, op: Operation[T]) -> T:
        try:
            request = next(op)
            while True:
                try:
                    response = self._send(request)
                except StepwatchError as exc:
                    request = op.throw(exc)
                else:
                    request = op.send(response)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def _send(self, request: Request) -> Response:
        import httpx

        attempt = 0
        while True:
            try:
                r = self._http.request(
                    request.method,
                    request.path,
                    params=request.params,
                    json=request.json,
                    headers=request.headers,
                    timeout=_timeout(self._config, request),
                )
            except httpx.TransportError as exc:
                error = _translate(exc, self._config)
                delay = self._config.retry.delay(request, attempt, None, None)
                if delay is None:
                    raise error from None
            else:
                response = _response(r)
                if response.status < 400:
                    return response
                delay = self._config.retry.delay(request, attempt, response.status, retry_after(response.headers))
                if delay is None:
                    return response
            time.sleep(delay)
            attempt += 1

    # ------------------------------------------------------------------------------ the API calls

    ping = sync_op(check_version)
    jobs = sync_op(_ops.jobs)
    job = sync_op(_ops.job)
    history = sync_op(_ops.history)
    events = sync_op(_ops.events)
    register = sync_op(_ops.register)
    command = sync_op(_ops.command)
    stop = sync_op(_ops.stop)
    checkpoint = sync_op(_ops.checkpoint)
    pending_commands = sync_op(_ops.pending_commands)
    set_state = sync_op(_ops.set_state)
    policy = sync_op(_ops.policy)
    namespace_policy = sync_op(_ops.namespace_policy)
    set_policy = sync_op(_ops.set_policy)
    costs = sync_op(_ops.costs)
    whoami = sync_op(_access.whoami)
    tokens = sync_op(_access.tokens)
    create_token = sync_op(_access.create_token)
    revoke_token = sync_op(_access.revoke_token)
    audit = sync_op(_access.audit)

    # ---------------------------------------------------------------------------------------- live

    def watch(
        self,
        name: str | None = None,
        namespace: str | None = None,
        *,
        last_event_id: int | None = None,
        reconnect: bool = True,
        timeout: float | None = None,
    ) -> Iterator[Update]:
        """Live updates of one job (``name``) or of all (of ``namespace``, or everywhere), as they happen.

        Yields :class:`JobUpdate` (progress, state, health, cost), :class:`PointsUpdate` (new metric
        points), :class:`EventUpdate` (commands, health changes, policy actions) and :class:`Resync`
        (updates were missed: read the state again). A dropped connection is reopened by itself,
        resuming from the last update's id: nothing is handed out twice, nothing is skipped silently.
        ``reconnect=False`` raises :class:`ServerUnreachable` instead. ``timeout``: stop after so many
        seconds. ``last_event_id``: resume an earlier watch (``update.id``).
        """
        return self._watch(self._session(name, namespace, last_event_id, reconnect, timeout))

    def _watch(self, session: WatchSession) -> Iterator[Update]:
        import httpx

        if self._config.check_version and not self._config.version_checked:
            self._drive(check_version(self._config))
        while not session.expired():
            request = session.request()
            try:
                with self._http.stream(
                    "GET",
                    request.path,
                    params=request.params,
                    headers=request.headers,
                    timeout=_timeout(self._config, request),
                ) as r:
                    if r.status_code >= 400:
                        r.read()
                        read_json(_response(r))
                    yield from session.opened()
                    for line in r.iter_lines():
                        yield from session.line(line)
                        if session.expired():
                            return
                error: StepwatchError = ServerUnreachable(f"the live stream from {self._config.url} ended")
            except (httpx.TransportError, httpx.StreamError) as exc:
                if session.expired():
                    return
                error = _translate(exc, self._config, "on the live stream ")
            except StepwatchError as exc:
                error = exc
            time.sleep(session.dropped(error))

    def wait(
        self, name: str, namespace: str | None = None, *, until: Until = None, timeout: float | None = None
    ) -> Job:
        """Block until the job meets ``until`` (default: it has ended), or it ends; returns the job as it is then.

        ``until``: a state (``"running"``), several, ``"ended"``, or a predicate on the :class:`Job`.
        Follows the live stream (no polling); :class:`WaitTimeout` after ``timeout`` seconds.
        """
        waiter = Waiter(until)
        for update in self._watch(self._session(name, namespace, None, True, timeout, announce=True)):
            if isinstance(update, Resync):  # (re)connected or missed updates: read the job itself
                if waiter.offer(self.job(name, namespace)):
                    return _found(waiter)
            elif isinstance(update, JobUpdate) and update.name == name and waiter.offer(update.job):
                return _found(waiter)
        raise _timed_out(name, namespace or self.namespace, waiter, timeout)


class AsyncClient(_Base):
    """The same API as :class:`Client`, awaited: ``jobs = await client.jobs()``, ``async for u in client.watch()``.

    Built on ``httpx.AsyncClient``; works under asyncio and trio. Same arguments as :class:`Client`
    (``transport``: an ``httpx.AsyncBaseTransport``).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        namespace: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        check_version: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import httpx

        super().__init__(url, token, namespace, timeout, retries, check_version)
        self._http = httpx.AsyncClient(
            base_url=self._config.url, headers=self._config.headers(), timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        """Release the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------------ driving

    async def _run(self, op: Operation[T], check: bool = True) -> T:
        if check and self._config.check_version and not self._config.version_checked:
            await self._drive(check_version(self._config))
        return await self._drive(op)

    async def _drive(self, op: Operation[T]) -> T:
        try:
            request = next(op)
            while True:
                try:
                    response = await self._send(request)
                except StepwatchError as exc:
                    request = op.throw(exc)
                else:
                    request = op.send(response)
        except StopIteration as stop:
            result: T = stop.value
            return result

    async def _send(self, request: Request) -> Response:
        import anyio
        import httpx

        attempt = 0
        while True:
            try:
                r = await self._http.request(
                    request.method,
                    request.path,
                    params=request.params,
                    json=request.json,
                    headers=request.headers,
                    timeout=_timeout(self._config, request),
                )
            except httpx.TransportError as exc:
                error = _translate(exc, self._config)
                delay = self._config.retry.delay(request, attempt, None, None)
                if delay is None:
                    raise error from None
            else:
                response = _response(r)
                if response.status < 400:
                    return response
                delay = self._config.retry.delay(request, attempt, response.status, retry_after(response.headers))
                if delay is None:
                    return response
            await anyio.sleep(delay)
            attempt += 1

    # ------------------------------------------------------------------------------ the API calls

    ping = async_op(check_version)
    jobs = async_op(_ops.jobs)
    job = async_op(_ops.job)
    history = async_op(_ops.history)
    events = async_op(_ops.events)
    register = async_op(_ops.register)
    command = async_op(_ops.command)
    stop = async_op(_ops.stop)
    checkpoint = async_op(_ops.checkpoint)
    pending_commands = async_op(_ops.pending_commands)
    set_state = async_op(_ops.set_state)
    policy = async_op(_ops.policy)
    namespace_policy = async_op(_ops.namespace_policy)
    set_policy = async_op(_ops.set_policy)
    costs = async_op(_ops.costs)
    whoami = async_op(_access.whoami)
    tokens = async_op(_access.tokens)
    create_token = async_op(_access.create_token)
    revoke_token = async_op(_access.revoke_token)
    audit = async_op(_access.audit)

    # ---------------------------------------------------------------------------------------- live

    def watch(
        self,
        name: str | None = None,
        namespace: str | None = None,
        *,
        last_event_id: int | None = None,
        reconnect: bool = True,
        timeout: float | None = None,
    ) -> AsyncIterator[Update]:
        """Live updates, as :meth:`Client.watch`: ``async for update in client.watch("llama"): ...``."""
        return self._watch(self._session(name, namespace, last_event_id, reconnect, timeout))

    async def _watch(self, session: WatchSession) -> AsyncIterator[Update]:
        import anyio
        import httpx

        if self._config.check_version and not self._config.version_checked:
            await self._drive(check_version(self._config))
        while not session.expired():
            request = session.request()
            try:
                async with self._http.stream(
                    "GET",
                    request.path,
                    params=request.params,
                    headers=request.headers,
                    timeout=_timeout(self._config, request),
                ) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        read_json(_response(r))
                    for update in session.opened():
                        yield update
                    async for line in r.aiter_lines():
                        for update in session.line(line):
                            yield update
                        if session.expired():
                            return
                error: StepwatchError = ServerUnreachable(f"the live stream from {self._config.url} ended")
            except (httpx.TransportError, httpx.StreamError) as exc:
                if session.expired():
                    return
                error = _translate(exc, self._config, "on the live stream ")
            except StepwatchError as exc:
                error = exc
            await anyio.sleep(session.dropped(error))

    async def wait(
        self, name: str, namespace: str | None = None, *, until: Until = None, timeout: float | None = None
    ) -> Job:
        """As :meth:`Client.wait`, awaited."""
        waiter = Waiter(until)
        async for update in self._watch(self._session(name, namespace, None, True, timeout, announce=True)):
            if isinstance(update, Resync):
                if waiter.offer(await self.job(name, namespace)):
                    return _found(waiter)
            elif isinstance(update, JobUpdate) and update.name == name and waiter.offer(update.job):
                return _found(waiter)
        raise _timed_out(name, namespace or self.namespace, waiter, timeout)


def _found(waiter: Waiter) -> Job:
    assert waiter.job is not None
    return waiter.job


def _timed_out(name: str, namespace: str, waiter: Waiter, timeout: float | None) -> WaitTimeout:
    seen = f"; last seen {waiter.job.state}" if waiter.job is not None else ""
    within = f" within {timeout:g} s" if timeout is not None else ""
    return WaitTimeout(f"waited{within} for {namespace}/{name} {waiter.describe}{seen}", waiter.job)
