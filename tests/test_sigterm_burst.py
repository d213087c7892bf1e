"""A burst of SIGTERMs against a real reporting process (issue 21, item 12): a second SIGTERM that
arrives while the first one's handler is in the final flush must not enter the handler again and wait
on a lock the interrupted code holds. Each round: a real training script reports to a real loopback
sink, which answers slowly (the final flush takes a while), and gets a burst of SIGTERMs; it must end,
killed by the signal as without stepwatch, having delivered its final report exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepwatch.testing import ReportSink

pytestmark = pytest.mark.slow

ROUNDS = 20

_SCRIPT = """
import os, signal, sys, time
import stepwatch

run = stepwatch.init(job="burst", interval=0.05)
i = 0
while sys.argv[1] == "loop" or i < 30:
    i += 1
    time.sleep(0.002)
    run.step(loss=1.0 / i)
# "held": the state a SIGTERM can land in by chance, made certain: the main thread holds the lock of the
# event the final flush ends with (as inside Event.wait, between taking its lock and waiting on it)
with run._sender._done._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    server = ReportSink().start()
    try:
        yield server
    finally:
        server.delay = 0
        server.stop()


def _burst(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """SIGTERMs every half millisecond until the process ends (or ``seconds`` pass): some land while
    the first handler flushes, some while it unwinds from its waits."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        time.sleep(0.0005)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_a_burst_of_sigterms_ends_the_process_with_one_final_report(
    sink: ReportSink, tmp_path: Path, round_: int
) -> None:
    script, env = _prepare(tmp_path, sink)
    proc = subprocess.Popen([sys.executable, str(script), "loop"], env=env, stdout=subprocess.DEVNULL)
    try:
        assert sink.wait_for(lambda s: any(r.metrics for r in s.reports), 20), "the loop never reported"
        sink.delay = 0.05 + 0.01 * (round_ % 5)  # the final flush now takes a while: SIGTERMs land inside it
        _burst(proc, 3.0)
        try:
            code = proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail("the process hung after a burst of SIGTERMs (deadlock in the handler)")
    finally:
        proc.kill()
        proc.wait()
    assert code == -signal.SIGTERM  # killed by the signal, as without stepwatch
    _delivered_once(sink)


def test_a_sigterm_while_the_main_thread_holds_the_flushs_lock_still_ends_the_process(
    sink: ReportSink, tmp_path: Path
) -> None:
    """Before the fix the handler waited on that lock in the thread that held it: a hang, every time."""
    script, env = _prepare(tmp_path, sink)
    proc = subprocess.Popen([sys.executable, str(script), "held"], env=env, stdout=subprocess.DEVNULL)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail("the SIGTERM handler waited on a lock the interrupted code holds")
    finally:
        proc.kill()
        proc.wait()
    assert code == -signal.SIGTERM
    _delivered_once(sink)


def _prepare(tmp_path: Path, sink: ReportSink) -> tuple[Path, dict[str, str]]:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_"))}
    env.update({"STEPWATCH_URL": sink.url, "STEPWATCH_FLUSH_TIMEOUT": "5", "STEPWATCH_HANDLE_SIGTERM": "1"})
    return script, env


def _delivered_once(sink: ReportSink) -> None:
    finals = {(r.run_id, r.seq) for r in sink.reports if r.state == "stopped"}
    assert len(finals) == 1, f"final reports: {sorted(finals)}"
    assert all(r.reason == "SIGTERM" for r in sink.reports if r.state == "stopped")
