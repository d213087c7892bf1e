"""The :class:`Notifier`: queues in the server's event loop, one worker task per target, never in the way of ingest."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import httpx

from ._allow import TargetRefused, TargetRules
from ._delivery import (
    USER_AGENT,
    RetryPolicy,
    build_apprise,
    check_target,
    new_delivery_id,
    post_webhook,
    send_apprise,
    webhook_body,
)
from ._message import Notification, NotifyTarget

__all__ = ["Notifier", "NotifyStats"]

_log = logging.getLogger("stepwatch.server.notify")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]


@dataclass(frozen=True)
class NotifyStats:
    """Counters since the notifier was made (a snapshot; for logs and Prometheus).

    ``queued``: accepted for a target; ``delivered``; ``failed``: given up after its attempts;
    ``dropped``: pushed out of a full queue, refused after shutdown began, or still queued when the
    shutdown's drain timed out; ``deduplicated``: the same key again within the window; ``retried``:
    extra attempts; ``pending``: waiting or being delivered now.
    """

    queued: int = 0
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    deduplicated: int = 0
    retried: int = 0
    pending: int = 0

    def __add__(self, other: NotifyStats) -> NotifyStats:
        return NotifyStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


class _Counts:
    __slots__ = ("deduplicated", "delivered", "dropped", "failed", "queued", "retried")

    def __init__(self) -> None:
        self.queued = self.delivered = self.failed = self.dropped = self.deduplicated = self.retried = 0


@dataclass
class _Item:
    notification: Notification
    accepted_at: float


class _Channel:
    """One target's queue, de-duplication memory, rate bucket, counters and worker."""

    def __init__(self, target: NotifyTarget, burst: float, now: float, sender: Any = None) -> None:
        self.target = target
        self.queue: deque[_Item] = deque()
        self.seen: OrderedDict[str, float] = OrderedDict()
        self.tokens = burst
        self.refilled_at = now
        self.counts = _Counts()
        self.sender = sender  # the Apprise object of an Apprise target, built once
        self.wake: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None
        self.busy = False
        self.logged_at: float | None = None
        self.unlogged = 0

    def stats(self) -> NotifyStats:
        c = self.counts
        pending = len(self.queue) + (1 if self.busy else 0)
        return NotifyStats(c.queued, c.delivered, c.failed, c.dropped, c.deduplicated, c.retried, pending)


class Notifier:
    """Sends notifications from the server's event loop without ever slowing it down.

    :meth:`notify` only appends to a bounded queue per target and returns (microseconds); a worker task
    per target delivers, retries and waits. The same ``key`` to the same target within
    ``dedup_window_s`` is sent once; each target gets at most ``burst`` messages at once and
    ``per_minute`` a minute after that (the rest wait in its queue, whose oldest entry makes room when
    ``queue_size`` is reached). Failures are counted and logged (at most one warning a minute per
    target), never raised.

    Use it in the app's lifespan: ``await notifier.start()`` ... ``await notifier.aclose()`` (or
    ``async with``). ``targets`` are the defaults of :meth:`notify`; they are checked here, so an
    unknown Apprise URL or a missing Apprise fails at start-up (``ValueError``, ``ImportError`` with
    ``pip install 'stepwatch[notify]'``). Targets given to :meth:`notify` itself are checked at their
    first delivery (a problem is then logged and counted as failed).

    ``transport`` (an ``httpx.AsyncBaseTransport``), ``clock`` (Unix time: de-duplication, rate,
    signature timestamps), ``sleep`` (waits between attempts) and ``rng`` (jitter) are seams for tests.
    ``rules``: where targets other than ``targets`` (those of policies) may point, checked at each
    delivery (:class:`TargetRules`); a refused one is counted as failed, never retried.
    """

    def __init__(
        self,
        targets: Iterable[NotifyTarget] = (),
        *,
        retry: RetryPolicy | None = None,
        queue_size: int = 1000,
        dedup_window_s: float = 1800.0,
        per_minute: float = 30.0,
        burst: int = 10,
        max_targets: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        rules: TargetRules | None = None,
    ) -> None:
        if queue_size < 1 or burst < 1 or max_targets < 1:
            raise ValueError("queue_size, burst and max_targets are at least 1")
        if per_minute <= 0 or dedup_window_s < 0:
            raise ValueError("per_minute is positive and dedup_window_s not negative")
        self.retry = retry or RetryPolicy()
        self.queue_size = queue_size
        self.dedup_window_s = dedup_window_s
        self.per_minute = per_minute
        self.burst = burst
        self.max_targets = max_targets
        self._transport = transport
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.rules = rules
        """Where targets other than the defaults may point (checked at each delivery); ``None``: anywhere."""
        self._channels: dict[NotifyTarget, _Channel] = {}
        self._refused = 0  # notifications dropped before reaching a channel
        self._client: httpx.AsyncClient | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._closing = False
        self._closed = False
        now = clock()
        defaults = []
        for target in targets:
            if target not in self._channels:
                self._channels[target] = _Channel(target, burst, now, check_target(target))
                defaults.append(target)
        self.targets: tuple[NotifyTarget, ...] = tuple(defaults)
        """The default targets of :meth:`notify`."""
        for target in self.targets:
            if target.is_webhook and not target.secret:
                _log.warning("webhook %s is not signed (no STEPWATCH_NOTIFY_SECRET)", target.redacted)

    # --- the hot side: called at ingest ---------------------------------------------------------------

    def notify(self, notification: Notification, targets: Sequence[NotifyTarget] | None = None) -> None:
        """Queue ``notification`` for ``targets`` (default: the notifier's) and return at once.

        Never blocks and never raises. Safe to call from another thread (it is then handed to the loop).
        """
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            try:
                loop.call_soon_threadsafe(self._enqueue, notification, targets)
            except RuntimeError:  # the loop is closed: the server is gone
                self._refused += 1
            return
        self._enqueue(notification, targets)

    def _enqueue(self, notification: Notification, targets: Sequence[NotifyTarget] | None) -> None:
        try:
            chosen = self.targets if targets is None else targets
            if self._closing:
                self._refused += len(chosen)
                return
            now = self._clock()
            key = notification.key
            for target in chosen:
                channel = self._channels.get(target)
                if channel is None:
                    channel = self._add_channel(target, now)
                    if channel is None:
                        continue
                if self._seen_recently(channel, key, now):
                    channel.counts.deduplicated += 1
                    continue
                if len(channel.queue) >= self.queue_size:
                    channel.queue.popleft()
                    channel.counts.dropped += 1
                channel.queue.append(_Item(notification, now))
                channel.counts.queued += 1
                if channel.wake is not None:
                    channel.wake.set()
        except Exception:  # a caller's mistake must not cost the report that triggered it
            self._refused += 1
            _log.exception("a notification could not be queued")

    def _add_channel(self, target: NotifyTarget, now: float) -> _Channel | None:
        if len(self._channels) >= self.max_targets:
            self._refused += 1
            if self._refused == 1 or self._refused % 1000 == 0:
                _log.warning("more than %d notification targets: %s is not served", self.max_targets, target.redacted)
            return None
        channel = self._channels[target] = _Channel(target, self.burst, now)
        if self._loop is not None:
            self._start_worker(channel)
        return channel

    def _seen_recently(self, channel: _Channel, key: str, now: float) -> bool:
        seen = channel.seen
        while seen:
            oldest, at = next(iter(seen.items()))
            if now - at < self.dedup_window_s:
                break
            del seen[oldest]
        if key in seen:
            return True
        seen[key] = now
        if len(seen) > 10 * self.queue_size:  # bounded even when every key is new
            seen.popitem(last=False)
        return False

    # --- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start delivering (in the running loop): one worker task per target."""
        if self._loop is not None:
            return
        if self._closed:
            raise RuntimeError("a closed Notifier cannot start again")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._client = httpx.AsyncClient(
            transport=self._transport,
            timeout=self.retry.timeout_s,
            follow_redirects=False,
            headers={"User-Agent": USER_AGENT},
        )
        for channel in self._channels.values():
            self._start_worker(channel)

    def _start_worker(self, channel: _Channel) -> None:
        channel.wake = asyncio.Event()
        if channel.queue:
            channel.wake.set()
        channel.task = asyncio.get_running_loop().create_task(
            self._work(channel), name=f"stepwatch-notify {channel.target.redacted}"
        )
        channel.task.add_done_callback(_worker_ended)

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty and nothing is being delivered; whether that happened in time."""
        deadline = time.monotonic() + timeout_s
        while any(c.queue or c.busy for c in self._channels.values()):
            if self._loop is None or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Stop: refuse new notifications, deliver what is queued within ``timeout_s``, drop (and count) the rest."""
        if self._closed:
            return
        self._closing = True
        drained = await self.drain(timeout_s) if self._loop is not None else False
        left = 0
        for channel in self._channels.values():  # counted before the workers are cancelled (that ends "busy")
            unsent = len(channel.queue) + (1 if channel.busy else 0)
            channel.counts.dropped += unsent
            left += unsent
            channel.queue.clear()
        tasks = [c.task for c in self._channels.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if left and self._loop is None:
            _log.warning("%d notification(s) not sent: the notifier was never started", left)
        elif left and not drained:
            _log.warning("%d notification(s) not sent: the shutdown's %.1f s were up", left, timeout_s)
        if self._client is not None:
            await self._client.aclose()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._closed = True

    async def __aenter__(self) -> Notifier:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- counters -------------------------------------------------------------------------------------

    @property
    def stats(self) -> NotifyStats:
        """All targets together (see :class:`NotifyStats`)."""
        total = NotifyStats(dropped=self._refused)
        for channel in tuple(self._channels.values()):  # a snapshot: /metrics may read from another thread
            total = total + channel.stats()
        return total

    def stats_by_target(self) -> dict[str, NotifyStats]:
        """Per target, keyed by its redacted form (no credentials), for a Prometheus label."""
        by: dict[str, NotifyStats] = {}
        for channel in tuple(self._channels.values()):
            name = channel.target.redacted
            by[name] = by[name] + channel.stats() if name in by else channel.stats()
        return by

    # --- the worker side ------------------------------------------------------------------------------

    async def _work(self, channel: _Channel) -> None:
        assert channel.wake is not None
        while True:
            if not channel.queue:
                channel.wake.clear()
                await channel.wake.wait()
                continue
            await self._take_token(channel)
            if not channel.queue:  # emptied while waiting (shutdown)
                continue
            item = channel.queue.popleft()
            channel.busy = True
            try:
                delivered, attempts, reason = await self._deliver(channel, item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must not end the worker
                delivered, attempts, reason = False, 1, f"{type(exc).__name__}: {exc}"
                _log.debug("notification delivery crashed", exc_info=True)
            finally:
                channel.busy = False
            channel.counts.retried += max(0, attempts - 1)
            if delivered:
                channel.counts.delivered += 1
                _log.debug("notification %s sent to %s", item.notification.key, channel.target.redacted)
            else:
                channel.counts.failed += 1
                self._log_failure(channel, item.notification, attempts, reason)

    async def _take_token(self, channel: _Channel) -> None:
        per_s = self.per_minute / 60.0
        while True:
            now = self._clock()
            channel.tokens = min(self.burst, channel.tokens + max(0.0, now - channel.refilled_at) * per_s)
            channel.refilled_at = now
            if channel.tokens >= 1:
                channel.tokens -= 1
                return
            await self._sleep(min(1.0, (1 - channel.tokens) / per_s))

    async def _deliver(self, channel: _Channel, item: _Item) -> tuple[bool, int, str]:
        address = None
        if self.rules is not None and channel.target not in self.targets:
            try:
                address = await self.rules.resolve(channel.target.url)
            except TargetRefused as exc:
                return False, 1, str(exc)
        if channel.target.is_webhook:
            return await self._deliver_webhook(channel.target, item, address)
        return await self._deliver_apprise(channel, item.notification)

    async def _deliver_webhook(
        self, target: NotifyTarget, item: _Item, address: str | None = None
    ) -> tuple[bool, int, str]:
        assert self._client is not None
        delivery_id = new_delivery_id()
        body = webhook_body(item.notification, delivery_id, item.accepted_at)
        policy = self.retry
        for attempt in range(1, policy.attempts + 1):
            result = await post_webhook(
                self._client, target, item.notification.kind, body, delivery_id, self._clock(), address
            )
            if result.ok:
                return True, attempt, ""
            if not result.retry or attempt == policy.attempts:
                return False, attempt, result.reason
            wait = policy.backoff(attempt, self._rng)
            if result.wait_s is not None:
                wait = min(result.wait_s, policy.max_retry_after_s)
            await self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _deliver_apprise(self, channel: _Channel, notification: Notification) -> tuple[bool, int, str]:
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="stepwatch-notify")
        if channel.sender is None:
            try:
                channel.sender = await loop.run_in_executor(self._executor, build_apprise, channel.target)
            except (ImportError, ValueError) as exc:
                return False, 1, str(exc)
        policy = self.retry
        reason = ""
        for attempt in range(1, policy.apprise_attempts + 1):
            try:
                sent = await asyncio.wait_for(
                    loop.run_in_executor(self._executor, send_apprise, channel.sender, notification),
                    policy.apprise_timeout_s,
                )
                reason = "Apprise reported a failure (its log says why)"
            except asyncio.TimeoutError:
                sent, reason = False, f"Apprise did not finish within {policy.apprise_timeout_s:g} s"
            except Exception as exc:
                sent, reason = False, f"{type(exc).__name__}: {exc}"
            if sent:
                return True, attempt, ""
            if attempt < policy.apprise_attempts:
                await self._sleep(policy.backoff(attempt, self._rng))
        return False, policy.apprise_attempts, reason

    def _log_failure(self, channel: _Channel, notification: Notification, attempts: int, reason: str) -> None:
        now = self._clock()
        if channel.logged_at is not None and now - channel.logged_at < 60.0:
            channel.unlogged += 1
            _log.debug("notification %s to %s failed: %s", notification.key, channel.target.redacted, reason)
            return
        more = f" ({channel.unlogged} more failed since the last warning)" if channel.unlogged else ""
        _log.warning(
            "notification %s to %s failed after %d attempt(s): %s%s",
            notification.key,
            channel.target.redacted,
            attempts,
            reason,
            more,
        )
        channel.logged_at = now
        channel.unlogged = 0


def _worker_ended(task: asyncio.Task[None]) -> None:
    """A worker ends only when cancelled; anything else is a bug, said once in the log."""
    if not task.cancelled() and task.exception() is not None:
        _log.error("notification worker %s stopped", task.get_name(), exc_info=task.exception())
