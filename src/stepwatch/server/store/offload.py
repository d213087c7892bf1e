"""How a store call leaves the event loop: the :data:`Offload` every async caller of the store is handed.

An offload runs ``fn(*args, **kwargs)`` in a worker thread and awaits its result; the server's is
``services.blocking`` (a bounded pool, a store failure answered 503). Named once here, at the lowest floor
whose code is handed one, so the retention task, the policies, the health monitor and the authenticator
all mean the same thing by it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Offload"]

Offload = Callable[..., Awaitable[Any]]
