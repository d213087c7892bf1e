"""OpenShift AI progression with real training processes and no stepwatch server anywhere.

Each test runs a training loop written the way the README's tour writes it (``stepwatch.init(total_steps=...)``,
``run.step(loss=...)``, ``run.finish()``) as a subprocess, polls it during training the way Red Hat's
controller does (``GET /metrics``, 2 s timeout, 200 only, the body read with the port of its Go decoding),
and at the end reads its termination message the way the controller reads the container's
(``tests/progression_trainee.py``). The address comes from the one line the run says on stderr
(``127.0.0.1:0``: a free port). Cases ``A1``..``A14``: ``../shared/reference/rhoai-progression.md``.
Standard library only: this file runs in the bare environment too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from progression_trainee import Trainee, environment, free_port, listens, python, trainee
from stepwatch.testing import poll_progression, read_termination_message

TOTAL = 200
HALF = 100

LOOP = textwrap.dedent(
    """
    import math, os, sys, time
    import stepwatch

    mode = sys.argv[1]

    def train_step(step):
        time.sleep(0.01)
        return math.nan if 60 <= step < 90 else 1.0 / (step + 1)  # a stretch of NaN losses

    if mode == "with":
        with stepwatch.init(total_steps=200) as run:
            for step in range(200):
                run.step(loss=train_step(step))
        sys.exit(0)

    run = stepwatch.init(total_steps=200)
    for step in range(200):
        loss = train_step(step)
        run.step(loss=loss)
        if run.current_step == 100:
            if mode == "break":
                break
            if mode == "crash":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            if mode == "sigterm":
                print("half", flush=True)
                time.sleep(60)
    if mode != "exit":
        run.finish()
    """
)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Trainee]]:
    """Start a script (its code) with these arguments; every one started is killed at the end if alive."""
    with ExitStack() as stack:

        def run(code: str, *args: str) -> Trainee:
            script = tmp_path / "train.py"
            script.write_text(code)
            return stack.enter_context(trainee(python(script, *args), tmp_path))

        yield run


# ----------------------------------------------------------------------------- polled while it trains


def test_a_plain_loop_with_no_server_is_read_by_the_controller_at_every_poll_and_at_the_end(
    start: Callable[..., Trainee], tmp_path: Path
) -> None:
    """A1, A2, A13: every poll is 200 and parses as Go parses it (NaN losses included, as null); the status
    moves with the loop; the termination message is the final status: 100 %, remaining 0, the last loss."""
    job = start(LOOP, "finish")
    assert job.poll_until_exit() == 0
    assert not job.failures
    polls = job.polls
    # the listener opens a moment before init publishes the run's first status: a poll in that moment (a
    # loaded machine) reads {} (nothing: no step, no total, as Go reads an empty object); none after it does
    while polls and polls[0].total_steps is None:
        polls.pop(0)
    assert len(polls) >= 10
    steps = [p.current_step for p in polls]
    # a poll that comes before the first step has no step yet; none after it lacks one
    while steps and steps[0] is None:
        steps.pop(0)
    moved = [step for step in steps if step is not None]
    assert moved == steps, steps
    assert moved == sorted(moved) and len(set(moved)) >= 5  # it moved, never backwards
    assert all(p.total_steps == TOTAL for p in polls)
    assert all(p.progress_percentage == (p.current_step or 0) * 100 // TOTAL for p in polls)
    losses = [p.train_metrics.get("loss") for p in polls if p.train_metrics]
    assert None in losses, "a NaN loss is served as null"
    assert any(isinstance(v, float) for v in losses)
    assert any(p.estimated_remaining_seconds for p in polls)  # an ETA while it trains
    message = job.termination_message()
    assert (message.progress_percentage, message.estimated_remaining_seconds) == (100, 0)
    assert (message.current_step, message.total_steps) == (TOTAL, TOTAL)
    assert message.train_metrics == {"loss": pytest.approx(1 / TOTAL)}


@pytest.mark.parametrize(("mode", "code", "percent"), [("with", 0, 100), ("exit", 0, 100), ("break", 0, 50)])
def test_every_ending_writes_the_termination_message(
    start: Callable[..., Trainee], tmp_path: Path, mode: str, code: int, percent: int
) -> None:
    """``with run:``, the end of the script without ``finish()`` (at exit), and an early end (A5: a ``break``
    at 50 % keeps its real step and percentage; the controller then says "complete (early stopped)")."""
    job = start(LOOP, mode)
    assert job.poll_until_exit() == code
    message = job.termination_message()
    assert (message.progress_percentage, message.estimated_remaining_seconds) == (percent, 0)
    assert message.current_step == TOTAL * percent // 100


def test_a_crash_writes_its_real_percentage(start: Callable[..., Trainee], tmp_path: Path) -> None:
    """A14, a deliberate difference: Red Hat's callback writes nothing on a crash; the run writes where it
    stood, so that the controller says "failed at 50%" (docs/kubernetes.md)."""
    job = start(LOOP, "crash")
    assert job.poll_until_exit() == 1
    message = job.termination_message()
    assert (message.progress_percentage, message.current_step, message.estimated_remaining_seconds) == (50, HALF, 0)


def test_sigterm_writes_the_termination_message(start: Callable[..., Trainee], tmp_path: Path) -> None:
    """The kubelet's SIGTERM (a TrainJob suspended or deleted): the final status is written, then the process
    dies of the signal as it would have."""
    job = start(LOOP, "sigterm")
    assert job.stdout.get(timeout=60) == "half\n"
    time.sleep(0.3)  # a cycle, so that the served status has caught up with the loop
    assert job.poll_once() is not None
    job.process.send_signal(signal.SIGTERM)
    assert job.process.wait(timeout=30) == -signal.SIGTERM
    message = job.termination_message()
    assert (message.progress_percentage, message.current_step, message.estimated_remaining_seconds) == (50, HALF, 0)


# ------------------------------------------------------------------------------------ a busy loop


BUSY = textwrap.dedent(
    """
    import sys, time
    import stepwatch

    run = stepwatch.init(total_steps=1000)
    for _ in range(10):
        run.step(loss=0.5)
    time.sleep(0.5)
    print("busy", flush=True)
    end = time.monotonic() + float(sys.argv[1])
    x = 0
    while time.monotonic() < end:  # pure Python on the main thread: the GIL is always wanted
        for i in range(10000):
            x += i * i % 7
    run.step(loss=0.25)
    run.finish()
    """
)


def test_the_status_is_answered_within_two_seconds_while_the_loop_is_cpu_bound(start: Callable[..., Trainee]) -> None:
    """The controller's 2 s timeout, against a main thread that runs pure Python without a pause: the
    server thread gets the GIL at each switch interval, and a GET needs little of it."""
    job = start(BUSY, "6")
    assert job.stdout.get(timeout=60) == "busy\n"
    times = []
    for _ in range(15):
        began = time.monotonic()
        status = poll_progression(job.address)
        times.append(time.monotonic() - began)
        assert status.current_step == 10
        time.sleep(0.2)
    assert job.process.poll() is None, "the busy stretch outlasted the polls"
    assert max(times) < 2.0, times
    assert job.process.wait(timeout=60) == 0


# ---------------------------------------------------------------------------------- ranks and forks


NODE = textwrap.dedent(
    """
    import time
    import stepwatch

    run = stepwatch.init(total_steps=100)
    for _ in range(100):
        run.step(loss=1.0)
        time.sleep(0.02)
    run.finish()
    """
)


def test_only_the_first_node_of_a_trainjoblistens(tmp_path: Path) -> None:
    """A11 (two nodes): both pods of a two-node TrainJob (torch plugin's variables, one process per node)
    would serve on their port; only node 0 (global rank 0) listens, node 1 never does."""
    ports = [free_port(), free_port()]
    processes = []
    for node, port in enumerate(ports):
        env = environment(
            tmp_path,
            KUBERNETES_SERVICE_HOST="10.0.0.1",
            PET_NNODES="2",
            PET_NODE_RANK=str(node),
            JOB_COMPLETION_INDEX=str(node),
            STEPWATCH_METRICS_PORT=f"127.0.0.1:{port}",
            STEPWATCH_TERMINATION_LOG=str(tmp_path / f"termination-log-{node}"),
        )
        script = tmp_path / "node.py"
        script.write_text(NODE)
        processes.append(
            subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    try:
        seen = [False, False]
        while processes[0].poll() is None:
            seen = [seen[i] or listens(port) for i, port in enumerate(ports)]
            time.sleep(0.1)
        assert [p.wait(timeout=60) for p in processes] == [0, 0]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert seen == [True, False]
    assert read_termination_message(tmp_path / "termination-log-0").progress_percentage == 100
    assert not (tmp_path / "termination-log-1").exists()


FORK = textwrap.dedent(
    """
    import os, time
    import stepwatch

    run = stepwatch.init(total_steps=10)
    run.step(loss=1.0)
    time.sleep(0.3)
    child = os.fork()  # a DataLoader worker
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    run.finish()
    """
)


def test_a_forked_worker_does_not_keep_the_port_after_its_parent_is_gone(start: Callable[..., Trainee]) -> None:
    job = start(FORK)
    child = int(job.stdout.get(timeout=60))
    try:
        assert job.process.wait(timeout=30) == 0
        port = job.address[1]
        assert not listens(port)
        with socket.socket() as sock:  # free for the next one (a restarted process, Red Hat's callback)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
        os.kill(child, 0)  # the worker still lives
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
