"""How a store call leaves the event loop: :func:`blocking`, and the :data:`Offload` type of every async caller
of the store that is handed one.

An offload runs ``fn(*args, **kwargs)`` in a worker thread and awaits its result; the server's is
:func:`blocking` (a bounded pool of :data:`STORE_THREADS`). A store failure raises as it is: under a route the
app's exception handler answers it (503, or 422 for the limit on metric names), and background tasks catch
and log it. Named once here, at the lowest floor whose code is handed one, so the ingest service, the
retention task, the policies, the health monitor and the authenticator all mean the same thing by it.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

__all__ = ["STORE_THREADS", "Offload", "blocking"]

T = TypeVar("T")

Offload = Callable[..., Awaitable[Any]]

STORE_THREADS = 4
"""Worker threads for store calls: SQLite hands the GIL back on every row, so more threads only
trade it back and forth (measured: the default 40 threads cost 4x the CPU per report of 4)."""
_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a store call in a worker thread of this event loop's bounded pool, and await its result."""
    loop = asyncio.get_running_loop()
    limiter = _LIMITERS.get(loop)
    if limiter is None:
        limiter = _LIMITERS[loop] = anyio.CapacityLimiter(STORE_THREADS)
    call = functools.partial(fn, *args, **kwargs)
    return await anyio.to_thread.run_sync(call, limiter=limiter)
