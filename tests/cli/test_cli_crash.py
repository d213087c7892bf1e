"""What ``stepwatch run`` keeps of a command's stderr to say why it crashed (:mod:`stepwatch.cli._crash`)."""

from __future__ import annotations

import io
import os

from stepwatch.cli._crash import LINE_CHARS, TAIL_LINES, Witness


def _witness(*chunks: bytes) -> Witness:
    witness = Witness(io.BytesIO())
    for chunk in chunks:
        witness.feed(chunk)
    witness.feed(b"\n")
    return witness


def test_the_exception_line_of_a_traceback_is_the_reason() -> None:
    witness = _witness(
        b'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n',
        b"    import torch\nModuleNotFoundError: No module named 'torch'\n",
    )
    assert witness.reason() == "ModuleNotFoundError: No module named 'torch'"


def test_a_progress_bar_counts_for_what_it_shows_last_and_colours_go() -> None:
    witness = _witness(b"\r 10%|#   |\r 50%|##  |\r\x1b[31m 99%|### |\x1b[0m\n")
    assert witness.tail == [" 99%|### |"]


def test_under_torchrun_the_first_rank_to_fail_is_named_not_torchrun_itself() -> None:
    witness = _witness(
        b"[rank0]: Traceback (most recent call last):\n[rank0]: RuntimeError: CUDA out of memory\n",
        b"[rank1]: RuntimeError: Connection closed by peer\n",
        b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
        b"============================================================\n",
    )
    assert witness.reason() == "RuntimeError: CUDA out of memory (rank 0)"
    assert witness.rank_of("RuntimeError: CUDA out of memory") == 0
    assert witness.rank_of("ValueError: something else entirely") is None


def test_without_an_exception_the_last_line_with_words_is_the_reason() -> None:
    assert _witness(b"error: dataset not found\n-----\n").reason() == "error: dataset not found"
    assert _witness(b"").reason() == ""


def test_memory_is_bounded() -> None:
    witness = _witness(b"x" * 100_000, b"\n", b"line\n" * 1000, b"y" * 100_000)
    assert len(witness.tail) == TAIL_LINES and all(len(line) <= LINE_CHARS for line in witness.tail)
    assert len(witness._partial) <= 4 * LINE_CHARS


def test_output_passes_through_byte_for_byte_from_a_pipe() -> None:
    out = io.BytesIO()
    witness = Witness(out)
    write_fd = witness.child_stderr()  # a pipe: BytesIO is no terminal
    writer = os.dup(write_fd)
    witness.started(write_fd)
    os.write(writer, b"caf\xc3\xa9 \r50%\nKeyError: 'x'\n")
    os.close(writer)
    witness.finish()
    assert out.getvalue() == b"caf\xc3\xa9 \r50%\nKeyError: 'x'\n"
    assert witness.reason() == "KeyError: 'x'"


def test_a_launcher_that_says_its_child_failed_is_not_the_reason() -> None:
    """``accelerate launch`` re-raises its child's failure as CalledProcessError: the child's exception is why."""
    witness = _witness(
        b"Traceback (most recent call last):\nValueError: environment variable RANK expected, but not set\n\n",
        b"Traceback (most recent call last):\n",
        b"subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 1.\n",
    )
    assert witness.reason() == "ValueError: environment variable RANK expected, but not set"
