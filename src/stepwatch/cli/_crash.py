"""Why a command crashed, from what it wrote on stderr: ``stepwatch run``'s witness.

``stepwatch run`` passes the command's stderr through to its own, byte for byte and as it comes (a
pseudo-terminal when its own stderr is one, so progress bars and colours behave as without it), and
keeps, in bounded memory, what says why the command died:

- the last lines (at most :data:`TAIL_LINES`, each cut at :data:`LINE_CHARS`): a script that dies
  with ``ModuleNotFoundError`` says so on its last line;
- the first exception line of each rank under ``torchrun`` (``[rank0]: RuntimeError: ...``: the
  first rank to fail is the root cause, the others fail because it left), at most :data:`RANKS_KEPT`;
- the last exception line outside a rank's prefix.

:meth:`Witness.reason` turns that into one line for the job's reason; :meth:`Witness.rank_of` says which
rank wrote an exception the report core sent, so the reason can name it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections import deque
from typing import BinaryIO

__all__ = ["LINE_CHARS", "RANKS_KEPT", "TAIL_LINES", "Witness"]

TAIL_LINES = 20
LINE_CHARS = 512
RANKS_KEPT = 64
_CHUNK = 65536

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_RANK = re.compile(r"^\[(?:default)?rank(\d+)\]:\s?(.*)$")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)(?::\s.*)?$")
_NOT_A_CAUSE = ("ChildFailedError", "CalledProcessError")
"""Exceptions that only say that another process failed (torchrun's, ``accelerate launch``'s): never the
reason; the child's own exception, printed before them, is."""


class Witness:
    """Copies a command's stderr to ours from a thread, keeping the lines that say why it crashed."""

    def __init__(self, out: BinaryIO | None = None) -> None:
        self._out = out if out is not None else sys.stderr.buffer
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._ranks: dict[int, str] = {}
        self._last_exception = ""
        self._partial = b""
        self._read_fd: int | None = None
        self._thread: threading.Thread | None = None

    def child_stderr(self) -> int:
        """A file descriptor to give the command as its stderr (a pty when ours is a terminal, else a pipe).

        The caller closes it once the command has started (:meth:`started`)."""
        if _is_terminal(self._out):
            with contextlib.suppress(OSError):
                import pty

                read_fd, write_fd = pty.openpty()
                _raw_output(write_fd)
                _copy_window_size(self._out, write_fd)
                self._read_fd = read_fd
                return write_fd
        read_fd, write_fd = os.pipe()
        self._read_fd = read_fd
        return write_fd

    def started(self, write_fd: int) -> None:
        """The command holds its stderr: close our copy and copy what it writes, from a daemon thread."""
        os.close(write_fd)
        self._thread = threading.Thread(target=self._copy, name="stepwatch-stderr", daemon=True)
        self._thread.start()

    def finish(self, timeout: float = 2.0) -> None:
        """The command has ended: wait a little for the last of its output (a child it left may hold the pipe)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _copy(self) -> None:
        fd = self._read_fd
        assert fd is not None
        try:
            while True:
                try:
                    chunk = os.read(fd, _CHUNK)
                except OSError:  # EIO: the pty's last writer is gone
                    break
                if not chunk:
                    break
                try:
                    self._out.write(chunk)
                    self._out.flush()
                except (OSError, ValueError):
                    pass  # our stderr is gone: keep reading, so the command never blocks on a full pipe
                self.feed(chunk)
            if self._partial:
                self._line(self._partial)
                self._partial = b""
        finally:
            os.close(fd)

    def feed(self, chunk: bytes) -> None:
        """Take in output (split into lines; a line longer than :data:`LINE_CHARS` is cut)."""
        data = self._partial + chunk
        *lines, rest = data.split(b"\n")
        for line in lines:
            self._line(line)
        self._partial = rest[-4 * LINE_CHARS :]

    def _line(self, raw: bytes) -> None:
        # a progress bar redrawn in place (``\r``) counts for what stands last; a pty ends lines with \r\n
        text = raw.rstrip(b"\r").decode(errors="replace").rsplit("\r", 1)[-1]
        text = _ANSI.sub("", text).rstrip()[:LINE_CHARS]
        if not text.strip():
            return
        self._tail.append(text)
        ranked = _RANK.match(text)
        if ranked:
            rank, said = int(ranked.group(1)), ranked.group(2).strip()
            if _is_cause(said) and rank not in self._ranks and len(self._ranks) < RANKS_KEPT:
                self._ranks[rank] = said
        elif _is_cause(text.strip()):
            self._last_exception = text.strip()

    @property
    def tail(self) -> list[str]:
        """The last lines it wrote (at most :data:`TAIL_LINES`)."""
        return list(self._tail)

    def rank_of(self, exception: str) -> int | None:
        """The rank that wrote this exception line under ``torchrun`` (``None``: none, or not known)."""
        exception = exception.strip()
        for rank, said in self._ranks.items():
            if said == exception or (len(exception) >= 20 and said.startswith(exception[:200])):
                return rank
        return None

    def reason(self) -> str:
        """One line that says why the command died: the first rank's exception under ``torchrun`` (with the
        rank), else the last exception line, else the last line; empty when it wrote nothing."""
        if self._ranks:
            rank, said = next(iter(self._ranks.items()))
            return f"{said} (rank {rank})"
        if self._last_exception:
            return self._last_exception
        for line in reversed(self._tail):
            stripped = line.strip()
            if any(ch.isalnum() for ch in stripped):
                return _RANK.sub(r"\2", stripped)
        return ""


def _is_cause(text: str) -> bool:
    return bool(_EXCEPTION.match(text)) and not text.split(":", 1)[0].endswith(_NOT_A_CAUSE)


def _is_terminal(out: BinaryIO) -> bool:
    try:
        return os.isatty(out.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def _raw_output(fd: int) -> None:
    """Bytes pass as written: no ``\n`` to ``\r\n`` here (our own terminal does that once)."""
    try:
        import termios

        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    except (OSError, ImportError):
        pass


def _copy_window_size(out: BinaryIO, fd: int) -> None:
    """Give the pty our terminal's size, so that a progress bar fits it as it would without us."""
    try:
        import fcntl
        import termios

        size = fcntl.ioctl(out.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, size)
    except (OSError, ImportError, ValueError, AttributeError):
        pass
