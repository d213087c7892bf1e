"""The embedded database's files are its owner's alone: the directory 0700 when stepwatch makes it,
the database 0600 (SQLite gives its ``-wal`` and ``-shm`` files the database's own mode).

Without authentication every job is readable by whoever can read this file, so on a shared host it
must not be readable by the other users (SQLite would create it 0644 under the usual umask). Files
made by an earlier version are tightened at the next start when this user owns them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "prepare_database_path"]

DIR_MODE = 0o700
FILE_MODE = 0o600
_SUFFIXES = ("", "-wal", "-shm")


def prepare_database_path(path: str) -> None:
    """Make the database's directory (0700) and file (0600) if missing; tighten existing ones this user owns.
    ``OSError`` when the directory cannot be made."""
    target = Path(path)
    folder = target.parent
    if not folder.exists():
        folder.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        folder.chmod(DIR_MODE)  # mkdir's mode passes through the umask; this one is exact
    try:
        os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    except FileExistsError:
        pass
    except OSError:
        return  # not creatable here (a read-only place, a directory): opening it says why
    for suffix in _SUFFIXES:
        _tighten(Path(f"{path}{suffix}"))


def _tighten(file: Path) -> None:
    try:
        status = file.stat()
        if status.st_uid == os.getuid() and status.st_mode & 0o077 and file.is_file():
            file.chmod(FILE_MODE)
    except OSError:
        pass
