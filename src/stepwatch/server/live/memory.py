"""Giving freed memory back to the system.

CPython frees a closed stream's buffers (its queue, its connection's, uvicorn's) into glibc's malloc,
which keeps the pages for later instead of returning them: after thousands of streams come and go
the process stays at its peak size. ``malloc_trim(0)`` hands back every free page of every arena.
It runs in a thread of its own (ctypes releases the GIL for the call), at most once at a time, and
only where glibc is the C library; elsewhere it does nothing.

Here in :mod:`..live` because closed streams are what it cleans up after (the broadcaster calls it), and
nothing above the live floor is needed for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading
from collections.abc import Callable

__all__ = ["release_memory", "release_memory_soon"]

_log = logging.getLogger("stepwatch.server")
_running = threading.Lock()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None
    return trim


def release_memory() -> bool:
    """Return free heap pages to the system now; ``True`` when something was released."""
    trim = _malloc_trim()
    if trim is None or not _running.acquire(blocking=False):
        return False
    try:
        return bool(trim(0))
    except Exception:  # never let housekeeping hurt a request
        _log.debug("malloc_trim failed", exc_info=True)
        return False
    finally:
        _running.release()


def release_memory_soon() -> None:
    """:func:`release_memory` in a daemon thread (the event loop does not wait for it)."""
    try:
        threading.Thread(target=release_memory, name="stepwatch-trim", daemon=True).start()
    except RuntimeError:  # no thread to spare: the memory stays with the process until next time
        pass
