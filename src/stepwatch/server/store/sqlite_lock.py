"""The lock between processes that write one SQLite file (the workers of one server, ``stepwatch db``).

SQLite's own lock makes a second writer retry on a busy timeout; this ``flock`` on a file beside the
database makes it wait in line instead, and lets a writer that must not wait find out at once.
"""

from __future__ import annotations

import fcntl
import os

from .base import StoreError

__all__ = ["FileLock", "WouldWait"]


class WouldWait(Exception):
    """A write that was asked not to wait found the lock taken."""


class FileLock:
    """An exclusive lock between processes (``flock`` on a file of its own); held at most for one write
    transaction, which SQLite's busy timeout bounds."""

    def __init__(self, path: str) -> None:
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the writers' lock {path}: {exc.strerror or exc}") from None
        self._held = False

    def acquire(self, wait: bool) -> bool:
        """Take the lock (``wait``: until it is free); whether it is held (it may be held already: taken
        for the next write by :meth:`.SQLiteStore.wait_writable`)."""
        if self._held:
            return True
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._held = True
        return True

    def release(self) -> None:
        """Let the next writer in (nothing when not held)."""
        if self._held:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the lock's file (the lock goes with it)."""
        os.close(self._fd)
