"""Where a rank stands (issue 29): the stack reader on real stacks, the sampler, and the reports that carry it.

Every stack here is real: a thread really blocked in time.sleep, a lock, torch.save into a slow file,
a DataLoader whose worker deadlocks, a gloo all_reduce whose peer never comes. Nothing patches
``sys._current_frames``. The scenario tests at the end run the scripts of tests/where_trainees through
``stepwatch run`` against a real server and read what it received.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import stepwatch
from stepwatch._where import MAX_DEPTH, StackReader, WhereSampler
from stepwatch.protocol import LIMITS, Frame, Report, Where, decode_body, encode_body
from stepwatch.testing import ReportSink

HERE = Path(__file__).parent
TRAINEES = HERE / "where_trainees"
THIS_FILE = os.path.relpath(__file__) if os.path.abspath(__file__).startswith(os.getcwd() + os.sep) else __file__


def line_of(path: Path, text: str) -> int:
    """The line number of the first line of ``path`` that contains ``text``."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def standing(target: Callable[[], object], settle: float = 0.3) -> Iterator[threading.Thread]:
    """A daemon thread that runs ``target`` (which blocks); yields it once it has had time to block."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    time.sleep(settle)
    yield thread


def read(thread: threading.Thread, reader: StackReader | None = None) -> Where:
    ident = thread.ident
    assert ident is not None
    frame = sys._current_frames()[ident]
    return (reader or StackReader()).read(frame, stood=12.5)


# ------------------------------------------------------------------------------------ waiting


def test_a_sleep_and_locks_read_waiting_with_the_call_and_the_users_function() -> None:
    lock = threading.Lock()
    lock.acquire()
    event = threading.Event()
    jobs: queue.Queue[int] = queue.Queue()

    def wait_for_lock() -> None:
        lock.acquire()

    def enter_lock() -> None:
        with lock:
            pass

    def nap() -> None:
        time.sleep(30)

    def wait_for_event() -> None:
        event.wait()

    def wait_for_job() -> None:
        jobs.get()

    expected = {
        wait_for_lock: "lock.acquire",
        enter_lock: "lock.__enter__",
        nap: "time.sleep",
        wait_for_event: "threading.Event.wait",
        wait_for_job: "queue.Queue.get",
    }
    reader = StackReader()
    for target, call in expected.items():
        for thread in standing(target):
            where = read(thread, reader)
            assert (where.activity, where.detail) == ("waiting", call), target.__name__
            innermost = where.frames[0]
            assert innermost.function.endswith(target.__name__)
            assert innermost.file == THIS_FILE
            assert innermost.line > 0
    lock.release()
    event.set()
    jobs.put(1)


@pytest.mark.parametrize("name", ["evaluate", "eval_epoch", "validate", "validation_loop", "run_eval"])
def test_a_users_evaluation_reads_evaluating_without_the_hook(name: str) -> None:
    release = threading.Event()
    code = compile(f"def {name}(done):\n    done.wait()\n", str(HERE / "where_user_code.py"), "exec")
    namespace: dict[str, object] = {}
    exec(code, namespace)
    evaluation = namespace[name]
    assert isinstance(evaluation, types.FunctionType)
    for thread in standing(lambda: evaluation(release)):
        where = read(thread)
        assert where.activity == "evaluating"
        assert where.detail == name
        assert where.frames[0].function == name
    release.set()


def test_a_plain_name_is_not_an_evaluation() -> None:
    release = threading.Event()

    def retrieval() -> None:  # ends like "eval" but is no evaluation
        release.wait()

    for thread in standing(retrieval):
        assert read(thread).activity == "waiting"
    release.set()


def test_a_fetch_under_run_track_reads_loading_data() -> None:
    run = stepwatch.init(job="t", disabled=True)
    release = threading.Event()

    def batches() -> Iterator[int]:
        yield 1
        release.wait()  # the next batch never comes
        yield 2

    def loop() -> None:
        for _ in run.track(batches()):
            pass

    for thread in standing(loop):
        where = read(thread)
        assert (where.activity, where.detail) == ("loading_data", "stepwatch.Run.track")
        functions = [f.function.rpartition(".")[2] for f in where.frames]
        assert functions[:2] == ["batches", "loop"]
    release.set()
    run.finish()


# ------------------------------------------------------------------------------------ torch


def test_torch_save_into_a_slow_file_reads_checkpointing() -> None:
    torch = pytest.importorskip("torch")
    release = threading.Event()

    class SlowFile:
        def __init__(self) -> None:
            self.size = 0

        def write(self, chunk: bytes) -> int:
            release.wait()  # a network file system on a bad day
            self.size += len(chunk)
            return len(chunk)

        def flush(self) -> None:
            pass

    def save_checkpoint() -> None:
        torch.save(torch.nn.Linear(4, 4).state_dict(), SlowFile())

    for thread in standing(save_checkpoint, settle=1.0):
        where = read(thread)
        assert (where.activity, where.detail) == ("checkpointing", "torch.save")
        functions = [f.function for f in where.frames]
        assert functions[0].endswith("SlowFile.write") and functions[1].endswith("save_checkpoint")
        assert where.frames[0].line == line_of(Path(__file__), "release.wait()  # a network file system")
    release.set()
    thread.join(10)


def test_a_dataloader_whose_worker_deadlocks_reads_loading_data() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    class Deadlocks(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            lock = threading.Lock()
            with lock:
                lock.acquire(timeout=20)  # in the worker: the loop waits for it
            return i

    errors: list[BaseException] = []

    def next_batch() -> None:
        try:
            next(iter(DataLoader(Deadlocks(), batch_size=None, num_workers=1, timeout=15)))
        except BaseException as exc:  # the loader's timeout ends the thread
            errors.append(exc)

    for thread in standing(next_batch, settle=2.0):
        where = read(thread)
        assert where.activity == "loading_data"
        assert where.detail.startswith("torch.utils.data.DataLoader.")
        assert where.frames[0].function.endswith("next_batch")
    assert torch is not None


GLOO_RANK = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import torch, torch.distributed as dist
    from stepwatch._where import StackReader
    rank, store, call = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    if rank == 1:  # joins, then never takes part in the collective
        time.sleep(60)
    def sync_gradients():
        if call == "all_reduce":
            dist.all_reduce(torch.ones(4))
        else:
            dist.barrier()
    thread = threading.Thread(target=sync_gradients, daemon=True)
    thread.start()
    time.sleep(1.0)
    where = StackReader().read(sys._current_frames()[thread.ident], stood=1.0)
    print(json.dumps(where.to_dict()), flush=True)
    os._exit(0)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("call", ["all_reduce", "barrier"])
def test_a_gloo_collective_whose_peer_never_comes_reads_communicating(call: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(GLOO_RANK)
    store = str(tmp_path / "store")
    peer = subprocess.Popen([sys.executable, str(script), "1", store, call], stdout=subprocess.DEVNULL)
    try:
        done = subprocess.run(
            [sys.executable, str(script), "0", store, call], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
    finally:
        peer.kill()
        peer.wait(10)
    assert done.returncode == 0, done.stderr
    where = Where.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))
    assert (where.activity, where.detail) == ("communicating", f"torch.distributed.{call}")
    assert str(where.frames[0]).startswith("sync_gradients (rank.py:")


# ------------------------------------------------------------------------------ what leaves


def test_frames_are_bounded_innermost_first_and_long_names_cut() -> None:
    release = threading.Event()

    def down(n: int) -> None:
        if n:
            down(n - 1)  # recursion here
        else:
            release.wait()  # the innermost frame

    for thread in standing(lambda: down(MAX_DEPTH + 50)):
        where = read(thread)
        assert len(where.frames) == LIMITS.max_where_frames
        assert all(f.function.endswith("down") for f in where.frames)
        assert where.frames[0].line == line_of(Path(__file__), "release.wait()  # the innermost frame")
        assert where.frames[1].line == line_of(Path(__file__), "down(n - 1)  # recursion here")
    release.set()

    long_name = "f" * 300
    namespace: dict[str, object] = {}
    exec(compile(f"def {long_name}(done):\n    done.wait()\n", str(HERE / "where_user_code.py"), "exec"), namespace)
    release = threading.Event()
    for thread in standing(lambda: namespace[long_name](release)):  # type: ignore[operator]
        where = read(thread)
        assert where.frames[0].function == "f" * LIMITS.max_frame_function_length
    release.set()


def test_only_function_file_and_line_leave_the_process() -> None:
    secret = "hunter2-in-a-local"  # noqa: F841  (a local that must never leave)
    lock = threading.Lock()
    lock.acquire()

    def wait_for_lock(token: str = "an-argument") -> None:
        lock.acquire()

    for thread in standing(wait_for_lock):
        where = read(thread)
    lock.release()
    body = encode_body(Report(run_id="r", seq=0, sent_at=0.0, where=where).to_dict())
    sent = decode_body(body)["where"]
    assert set(sent) == {"activity", "stood_seconds", "detail", "frames", "samples"}
    assert all(set(frame) == {"function", "file", "line"} for frame in sent["frames"])
    assert b"hunter2" not in body and b"an-argument" not in body
    assert Report.from_dict(decode_body(body)).where == where


def test_paths_are_relative_to_the_working_directory_only_under_it(tmp_path: Path) -> None:
    lock = threading.Lock()
    lock.acquire()

    def wait_for_lock() -> None:
        lock.acquire()

    for thread in standing(wait_for_lock):
        inside = read(thread, StackReader(cwd=str(HERE)))
        outside = read(thread, StackReader(cwd=str(tmp_path)))
    lock.release()
    assert inside.frames[0].file == "test_where.py"
    assert outside.frames[0].file == os.path.abspath(__file__)


# ----------------------------------------------------------------------------------- sampler


class Loop:
    """A real thread with a step counter: steps every ``step_s`` until told to stand in ``wait_for_lock``."""

    def __init__(self) -> None:
        self.step = 0
        self.stand = threading.Event()
        self.lock = threading.Lock()
        self.lock.acquire()
        self.done = False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.done:
            if self.stand.is_set():
                self.wait_for_lock()
            self.step += 1
            time.sleep(0.002)

    def wait_for_lock(self) -> None:
        self.lock.acquire()


def test_the_sampler_reads_only_once_a_step_has_stood_longer_than_usual() -> None:
    loop = Loop()
    sampler = WhereSampler(lambda: loop.step, lambda: loop.thread.ident, period=1.0)
    now = 100.0
    for _ in range(10):  # 1 s ticks (the clock is the sender's, given): the loop steps in between
        time.sleep(0.01)
        assert not sampler.tick(now)
        now += 1.0
    assert sampler.reading() is None
    assert sampler.threshold() == 5.0  # ms steps: the floor
    loop.stand.set()
    time.sleep(0.05)
    began, stood = [], []
    for i in range(8):
        began.append(sampler.tick(now + i))
        reading = sampler.reading()
        stood.append(reading.stood_seconds if reading else None)
    first = began.index(True)
    assert began.count(True) == 1  # said once
    assert stood[first] is not None and 5.0 <= stood[first] < 6.0  # the floor: 5 s (it last moved at a tick)
    assert stood[:first] == [None] * first
    where = sampler.reading()
    assert where is not None and where.activity == "waiting" and where.detail == "self.lock.acquire"
    assert where.frames[0].function == "Loop.wait_for_lock"
    assert where.samples == 8 - first and where.stood_seconds >= 7.0
    shares = sampler.take_shares()
    assert shares is not None and abs(sum(shares.values()) - 1.0) < 0.01
    assert sampler.take_shares() is None  # reset by each report
    loop.done = True
    loop.lock.release()
    time.sleep(0.05)
    sampler.tick(now + 20)
    assert sampler.reading() is None  # the step moved: nothing stands


def test_the_threshold_learns_the_usual_step_time() -> None:
    step = [0]
    sampler = WhereSampler(lambda: step[0], threading.get_ident, period=1.0, shares=False)
    for second in range(0, 40, 4):  # a step every 4 s: usual 4 s, threshold 12 s
        step[0] += 1
        sampler.tick(float(second))
        sampler.tick(float(second) + 1)
    assert sampler.threshold() == pytest.approx(12.0)


def test_a_failing_sampler_switches_itself_off_with_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> int:
        raise RuntimeError("no counter")

    sampler = WhereSampler(broken, threading.get_ident)
    with caplog.at_level(logging.INFO, logger="stepwatch"):
        assert not sampler.tick(1.0)
        assert not sampler.tick(5.0)
    assert not sampler.enabled
    assert [r.getMessage() for r in caplog.records if "where the rank stands" in r.getMessage()] == [
        "stepwatch: reading where the rank stands failed (RuntimeError('no counter')); switched off"
    ]


# ------------------------------------------------------------------------ through the sender


def wait_for_lock(lock: threading.Lock, seconds: float) -> None:
    """Stands in its own function, as a hung rank does."""
    lock.acquire(timeout=seconds)


def stand_after_steps(run: stepwatch.Run, seconds: float) -> None:
    for _ in range(20):
        run.step(loss=1.0)
        time.sleep(0.02)
    lock = threading.Lock()
    lock.acquire()
    wait_for_lock(lock, seconds)
    run.step(loss=1.0)


def test_a_heartbeating_rank_says_at_once_where_it_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with ReportSink() as sink:
        run = stepwatch.init(job="t", url=sink.url, interval=1.0)  # rank 1: a heartbeat every 5 s
        began = time.monotonic()
        stand_after_steps(run, 8.0)
        run.finish()
    assert all(r.identity.rank == 1 for r in sink.reports)
    readings = [(r.sent_at, r.where) for r in sink.reports if r.where is not None]
    assert readings, "no report carried where the rank stood"
    where = readings[0][1]
    assert where.activity == "waiting" and where.detail == "lock.acquire"
    assert (
        str(where.frames[0])
        == f"wait_for_lock ({THIS_FILE}:{line_of(Path(__file__), 'lock.acquire(timeout=seconds)')})"
    )
    assert str(where.frames[1]).startswith("stand_after_steps (")
    # standing began ~0.4 s in and is read after the 5 s floor; sent at once (not at the next 5 s heartbeat)
    # and then at rank 0's pace: several readings while it stood, each with more samples
    assert len(readings) >= 2 and readings[-1][1].samples > readings[0][1].samples
    assert readings[0][0] - sink.reports[0].sent_at < 8.0
    assert sink.reports[-1].where is None  # the final report: the step moved on
    assert time.monotonic() - began < 30


def test_where_off_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPWATCH_WHERE", "off")
    with ReportSink() as sink:
        run = stepwatch.init(job="t", url=sink.url, interval=0.5)
        assert run._sender is not None and run._sender.where is None  # no sampler at all
        for _ in range(100):  # 2 s: with the sampler on, its 1 Hz reads would give these reports shares
            run.step(loss=1.0)
            time.sleep(0.02)
        run.finish()
    assert len(sink.reports) >= 3 and all(r.where is None and r.activity_shares is None for r in sink.reports)


def test_reports_carry_the_shares_of_each_interval() -> None:
    with ReportSink() as sink:
        run = stepwatch.init(job="t", url=sink.url, interval=1.0, where=True)
        for _ in range(150):
            run.step(loss=1.0)
            time.sleep(0.02)
        run.finish()
    shares = [r.activity_shares for r in sink.reports if r.activity_shares]
    assert shares, "no report carried activity shares"
    assert all(abs(sum(s.values()) - 1.0) < 0.01 for s in shares)
    assert any("waiting" in s for s in shares)  # the loop sleeps most of its time


def test_a_frame_renders_as_function_file_line() -> None:
    assert str(Frame("wait_for_lock", "hung_rank.py", 31)) == "wait_for_lock (hung_rank.py:31)"


# ---------------------------------------------------------------- frameworks not installed here


@pytest.mark.parametrize(
    ("module", "qualname", "activity", "detail"),
    [
        ("transformers.trainer", "Trainer._save_checkpoint", "checkpointing", "transformers.Trainer._save_checkpoint"),
        ("transformers.trainer", "Trainer.evaluation_loop", "evaluating", "transformers.Trainer.evaluation_loop"),
        ("lightning.pytorch.trainer.trainer", "Trainer.save_checkpoint", "checkpointing", None),
        ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop.run", "evaluating", None),
        ("keras.src.trainers.trainer", "Trainer.evaluate", "evaluating", None),
        ("deepspeed.runtime.engine", "DeepSpeedEngine.save_checkpoint", "checkpointing", None),
        ("deepspeed.comm.comm", "all_reduce", "communicating", "deepspeed.comm.comm.all_reduce"),
        ("accelerate.accelerator", "Accelerator.save_state", "checkpointing", None),
        ("accelerate.utils.operations", "gather", "communicating", None),
        ("safetensors.torch", "save_file", "checkpointing", "safetensors.torch.save_file"),
        ("torch.distributed.checkpoint.state_dict_saver", "save", "checkpointing", None),
        ("torch.distributed.distributed_c10d", "barrier", "communicating", "torch.distributed.barrier"),
        ("torch.serialization", "load", "checkpointing", "torch.load"),
        ("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter._try_get_data", "loading_data", None),
        ("torch.optim.adamw", "AdamW.step", "computing", None),
        ("jax._src.api", "block_until_ready", "computing", None),
        ("threading", "Condition.wait", "waiting", "threading.Condition.wait"),
        ("json.decoder", "JSONDecoder.decode", None, ""),
    ],
)
def test_the_frameworks_save_evaluate_and_communicate_paths_are_known(
    module: str, qualname: str, activity: str | None, detail: str | None
) -> None:
    """The table of framework paths, by the module and function names those frameworks use (transformers,
    Lightning, Keras, DeepSpeed, Accelerate, safetensors and JAX are not installed here: their names,
    not their stacks)."""
    from stepwatch._where import _library_activity

    found = _library_activity(module, qualname.rpartition(".")[2], qualname)
    assert found[0] == activity
    if detail is not None:
        assert found[1] == detail


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_fork_leaves_the_parents_sampler_reading_and_the_child_silent() -> None:
    with ReportSink() as sink:
        run = stepwatch.init(job="t", url=sink.url, interval=0.5)
        assert run._sender is not None and run._sender.where is not None
        sampler = run._sender.where
        for _ in range(50):
            run.step(loss=1.0)
            time.sleep(0.02)
        pid = os.fork()
        if pid == 0:  # the child: no sender thread, nothing reported, steps are harmless
            code = 0 if run._sender is None else 3
            try:
                for _ in range(100):
                    run.step(loss=1.0)
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        reads = sampler.reads
        for _ in range(75):
            run.step(loss=1.0)
            time.sleep(0.02)
        run.finish()
    assert os.waitstatus_to_exitcode(status) == 0
    assert sampler.enabled and sampler.reads > reads  # the parent's sampler went on reading
    assert {r.identity.pid for r in sink.reports} == {os.getpid()}  # the child reported nothing
