"""Moved to :mod:`..live.memory` (the live stream gives memory back after streams close; it sits floors
below the serving process). Kept only for ``live/broadcaster.py``'s import until it names the new place."""

from ..live.memory import release_memory, release_memory_soon

__all__ = ["release_memory", "release_memory_soon"]
