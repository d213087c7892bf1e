"""The instrumentation API: init, step, log, epoch, track, finish, shortcuts, configuration, ranks."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import stepwatch
from stepwatch import _run
from stepwatch.protocol import LIMITS, Report
from stepwatch.testing import MemoryTransport, ReportSink, wait_for


def _reports(transport: MemoryTransport) -> list[Report]:
    """The reports among the requests (a run without a token first tries to register itself)."""
    return [Report.from_dict(json.loads(r.body)) for r in transport.requests if r.url.endswith("/reports")]


def _count(reports: list[Report], name: str) -> int:
    return sum(m.count for r in reports for m in r.metrics if m.name == name)


# ------------------------------------------------------------------------------------------ no-op


def test_without_endpoint_is_a_noop_after_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stepwatch")
    _setup_say_again()
    run = stepwatch.init(job="quiet")
    run.step(loss=1.0)
    run.log(eval_loss=2.0)
    run.epoch(1)
    assert run.mode == "off"
    assert run.current_step == 1
    assert run.finish() is False
    stepwatch.init(job="quiet-again").finish()
    lines = [r.getMessage() for r in caplog.records if r.name == "stepwatch"]
    assert lines == ["stepwatch: no endpoint set (STEPWATCH_URL or KUBEFLOW_TRAINER_SERVER_URL); reporting is off"]


def test_without_endpoint_a_plain_script_says_so_on_stderr_at_once() -> None:
    """``python train.py`` configures no logging, where an info record shows nothing: the line goes to stderr,
    before the first step (the script blocks after init until the line has been read)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_"))}
    script = "import stepwatch, sys\nrun = stepwatch.init(total_steps=10)\nsys.stdin.readline()\nrun.finish()\n"
    process = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None and process.stdin is not None
        line = process.stderr.readline()  # while the script still waits: said at init, not at exit
        process.stdin.write("\n")
        process.stdin.flush()
        _, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert line == "stepwatch: no endpoint set (STEPWATCH_URL or KUBEFLOW_TRAINER_SERVER_URL); reporting is off\n"
    assert rest == ""  # once


def _setup_say_again() -> None:
    """As in a fresh process: the lines said once are said again."""
    from stepwatch import _setup

    _setup._said.clear()


def test_disabled_wins_over_an_endpoint(monkeypatch: pytest.MonkeyPatch, sink: ReportSink) -> None:
    monkeypatch.setenv("STEPWATCH_URL", sink.url)
    monkeypatch.setenv("STEPWATCH_DISABLED", "true")
    run = stepwatch.init(job="off")
    run.step(loss=1.0)
    assert run.mode == "off"
    assert run.finish() is False
    assert sink.received == []


def test_an_unusable_setting_switches_reporting_off_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sink: ReportSink
) -> None:
    monkeypatch.setenv("STEPWATCH_URL", sink.url)
    monkeypatch.setenv("STEPWATCH_INTERVAL", "soon")
    run = stepwatch.init(job="bad-setting")
    assert run.mode == "off"
    assert "STEPWATCH_INTERVAL: must be a positive number of seconds, got 'soon'" in caplog.text
    run.step(loss=1.0)  # still harmless


# ------------------------------------------------------------------------------------ the hot path


def test_step_counts_jumps_and_rejects_bad_steps(caplog: pytest.LogCaptureFixture) -> None:
    np = pytest.importorskip("numpy")
    transport = MemoryTransport()
    run = stepwatch.init(job="steps", url="http://sw.test", transport=transport, interval=60)
    run.step()
    run.step()
    assert run.current_step == 2
    run.step(10)
    run.step()
    assert run.current_step == 11
    run.step(np.int64(20))
    assert run.current_step == 20
    run.step(30.0)
    assert run.current_step == 30
    for bad in (-1, "x", 2.5, None.__class__):
        run.step(bad, loss=1.0)
    assert run.current_step == 30
    assert caplog.text.count("step must be an integer >= 0") == 1
    run.step(5)  # a job resumed from an earlier checkpoint may go back
    assert run.current_step == 5


def test_log_keeps_the_step_and_windows_carry_the_step_range() -> None:
    transport = MemoryTransport()
    run = stepwatch.init(job="windows", url="http://sw.test", transport=transport, interval=60)
    for _ in range(5):
        run.step(loss=1.0)
    run.log(eval_loss=0.5)
    assert run.current_step == 5
    assert run.finish() is True
    windows = {m.name: m for r in _reports(transport) for m in r.metrics}
    assert (windows["loss"].first_step, windows["loss"].last_step, windows["loss"].count) == (1, 5, 5)
    assert (windows["eval_loss"].first_step, windows["eval_loss"].last_step) == (5, 5)


def test_the_hot_path_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    run = stepwatch.init(job="broken", url="http://sw.test", transport=MemoryTransport(), interval=60)

    class Exploding:
        def append(self, item: object) -> None:
            raise RuntimeError("boom")

        def __len__(self) -> int:
            raise RuntimeError("boom")

    run._queue = Exploding()  # type: ignore[assignment]
    for _ in range(3):
        run.step(loss=1.0)
        run.log(acc=1.0)
    assert caplog.text.count("step() failed and was skipped") == 1
    assert caplog.text.count("log() failed and was skipped") == 1


def test_epoch_accepts_fractions_and_ignores_nonsense(caplog: pytest.LogCaptureFixture) -> None:
    transport = MemoryTransport()
    run = stepwatch.init(job="epochs", url="http://sw.test", transport=transport, interval=60, total_epochs=3)
    run.epoch(1.5)
    for bad in (-1, float("nan"), "two", True):
        run.epoch(bad)  # type: ignore[arg-type]
    run.step()
    run.finish()
    progress = _reports(transport)[-1].progress
    assert (progress.epoch, progress.total_epochs) == (1.5, 3)
    assert caplog.text.count("epoch must be a finite number >= 0") == 1


def test_track_counts_one_step_per_item_and_learns_the_total() -> None:
    transport = MemoryTransport()
    run = stepwatch.init(job="track", url="http://sw.test", transport=transport, interval=60, total_epochs=2)
    seen = []
    for epoch in range(2):
        run.epoch(epoch)
        seen.extend(run.track(range(7)))
    assert seen == list(range(7)) * 2
    assert run.current_step == 14
    assert run.total_steps == 14  # len(loader) x total_epochs
    run.finish()
    assert _reports(transport)[-1].progress.total_steps == 14


def test_track_of_an_iterator_without_length_leaves_the_total_unknown() -> None:
    run = stepwatch.init(job="gen", url="http://sw.test", transport=MemoryTransport(), interval=60)
    assert sum(run.track(x for x in range(5))) == 10
    assert (run.current_step, run.total_steps) == (5, None)


def test_update_sets_totals_later_and_ignores_invalid_values(caplog: pytest.LogCaptureFixture) -> None:
    transport = MemoryTransport()
    run = stepwatch.init(job="upd", url="http://sw.test", transport=transport, interval=60)
    run.update(total_steps=0, total_epochs=-1, batch_size=1.5)  # type: ignore[arg-type]
    run.update(total_steps=100, total_epochs=2, batch_size=32)
    run.step(10)
    run.finish()
    progress = _reports(transport)[-1].progress
    assert (progress.total_steps, progress.total_epochs, progress.samples) == (100, 2, 320)
    for what in ("total_steps must be", "total_epochs must be", "batch_size must be"):
        assert caplog.text.count(what) == 1


# -------------------------------------------------------------------------------------- lifecycle


@pytest.mark.parametrize(
    ("error", "state", "reason"),
    [
        (None, "finished", ""),
        (ValueError("bad batch"), "failed", "ValueError: bad batch"),
        (KeyboardInterrupt(), "stopped", "KeyboardInterrupt"),
        (SystemExit(0), "finished", ""),
        (SystemExit(3), "failed", "SystemExit: 3"),
    ],
)
def test_context_manager_final_state(error: BaseException | None, state: str, reason: str) -> None:
    transport = MemoryTransport()
    with pytest.raises(type(error)) if error else _nothing():
        with stepwatch.init(job="ctx", url="http://sw.test", transport=transport, interval=60) as run:
            run.step(loss=1.0)
            if error:
                raise error
    final = _reports(transport)[-1]
    assert (final.state, final.reason) == (state, reason)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_finish_twice_and_an_unknown_state(caplog: pytest.LogCaptureFixture) -> None:
    transport = MemoryTransport()
    run = stepwatch.init(job="twice", url="http://sw.test", transport=transport, interval=60)
    assert run.finish("exploded") is True  # type: ignore[arg-type]
    assert run.finish() is False
    assert _reports(transport)[-1].state == "failed"
    assert "is not finished/failed/stopped" in caplog.text


def test_module_shortcuts_start_a_run_from_the_environment(monkeypatch: pytest.MonkeyPatch, sink: ReportSink) -> None:
    monkeypatch.setenv("STEPWATCH_URL", sink.url)
    monkeypatch.setenv("STEPWATCH_JOB", "from-env")
    monkeypatch.setenv("STEPWATCH_NAMESPACE", "team-a")
    assert stepwatch.current() is None
    stepwatch.step(loss=3.0)
    stepwatch.log(eval_loss=1.0)
    stepwatch.epoch(1)
    run = stepwatch.current()
    assert run is not None and (run.namespace, run.job) == ("team-a", "from-env")
    assert list(stepwatch.track([1, 2])) == [1, 2]
    assert stepwatch.finish() is True
    assert stepwatch.current() is None
    assert sink.final() is not None and sink.final().progress.step == 3  # type: ignore[union-attr]
    assert sink.registrations == ["team-a/from-env"]
    assert sink.received[0].path == "/api/v1/namespaces/team-a/jobs"
    assert all(r.path == "/api/v1/namespaces/team-a/jobs/from-env/reports" for r in sink.received[1:])


def test_a_second_init_finishes_the_first() -> None:
    first_transport = MemoryTransport()
    first = stepwatch.init(job="one", url="http://sw.test", transport=first_transport, interval=60)
    second = stepwatch.init(job="two", url="http://sw.test", transport=MemoryTransport(), interval=60)
    assert stepwatch.current() is second
    assert first.run_id != second.run_id
    assert _reports(first_transport)[-1].state == "finished"


# ---------------------------------------------------------------------------------- configuration


def test_names_are_made_kubernetes_names(caplog: pytest.LogCaptureFixture) -> None:
    run = stepwatch.init(job="My_Job v2", namespace="Team A", url="http://sw.test", transport=MemoryTransport())
    assert (run.job, run.namespace) == ("my-job-v2", "team-a")
    assert run.url == "http://sw.test/api/v1/namespaces/team-a/jobs/my-job-v2/reports"
    assert "job name 'My_Job v2' is not a Kubernetes name; using 'my-job-v2'" in caplog.text


def test_default_job_name_comes_from_the_script(tmp_path: Path, sink: ReportSink) -> None:
    script = tmp_path / "Train_ResNet.py"
    script.write_text("import stepwatch\nrun = stepwatch.init(interval=60)\nprint(run.job)\nrun.finish()\n")
    out = subprocess.run(
        [sys.executable, str(script)],
        env={"STEPWATCH_URL": sink.url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "train-resnet"


def test_params_are_flattened_cleaned_and_sent_once() -> None:
    np = pytest.importorskip("numpy")
    transport = MemoryTransport()
    params = {
        "lr": 3e-4,
        "optim": {"name": "adamw", "betas": (0.9, 0.95)},
        "np": np.float32(0.5),
        "inf": float("inf"),
        "long": "x" * 1000,
        "none": None,
        **{f"p{i}": i for i in range(200)},
    }
    run = stepwatch.init(job="params", url="http://sw.test", transport=transport, interval=0.01, params=params)
    run.step(loss=1.0)
    assert transport_wait(transport, 2)
    run.finish()
    reports = _reports(transport)
    sent = reports[0].params
    assert sent is not None
    assert sent["lr"] == 3e-4 and sent["optim.name"] == "adamw" and sent["optim.betas"] == "(0.9, 0.95)"
    assert sent["np"] == 0.5 and sent["inf"] == "inf" and sent["none"] is None
    assert len(sent["long"]) == LIMITS.max_param_value_length and sent["long"].endswith("\u2026")
    assert len(sent) == LIMITS.max_params
    assert all(r.params is None for r in reports[1:])


def test_params_given_later_go_with_the_next_report_and_add_to_the_first() -> None:
    transport = MemoryTransport()
    run = stepwatch.init(job="late-params", url="http://sw.test", transport=transport, interval=0.01, params={"a": 1})
    run.step(loss=1.0)
    assert transport_wait(transport, 2)
    run.update(params={"trainer": {"max_epochs": 3}, "b": "x"})
    run.update(params={"b": "y"})  # two updates before a report: the later value wins
    run.update(params={"bad": object()})  # not a param value: sent as its text, never raised
    run.step(loss=0.5)
    run.finish()
    sent = [r.params for r in _reports(transport) if r.params is not None]
    assert sent[0] == {"a": 1}
    later = {k: v for p in sent[1:] for k, v in p.items()}
    assert later["trainer.max_epochs"] == 3 and later["b"] == "y" and "bad" in later
    assert len(sent) <= 3  # params travel once each, not with every report


def transport_wait(transport: MemoryTransport, n: int, timeout: float = 5.0) -> bool:
    return wait_for(lambda: len(transport.requests) >= n, timeout, f"{n} requests")


@pytest.mark.parametrize(
    ("env", "argument", "mode", "url"),
    [
        ({"STEPWATCH_URL": "http://a.test/"}, None, "native", "http://a.test/api/v1/namespaces/default/jobs/j/reports"),
        (
            {"STEPWATCH_URL": "http://a.test"},
            "http://b.test",
            "native",
            "http://b.test/api/v1/namespaces/default/jobs/j/reports",
        ),
        (
            {"KUBEFLOW_TRAINER_SERVER_URL": "https://kf.test/status"},
            None,
            "kubeflow",
            "https://kf.test/status",
        ),
        (
            {"STEPWATCH_URL": "http://a.test", "KUBEFLOW_TRAINER_SERVER_URL": "https://kf.test/status"},
            None,
            "native",
            "http://a.test/api/v1/namespaces/default/jobs/j/reports",
        ),
        (
            {"STEPWATCH_URL": "https://x.test/apis/trainer.kubeflow.org/v1alpha1/namespaces/n/trainjobs/t/status"},
            None,
            "kubeflow",
            "https://x.test/apis/trainer.kubeflow.org/v1alpha1/namespaces/n/trainjobs/t/status",
        ),
    ],
)
def test_endpoint_precedence_and_wire_mode(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argument: str | None, mode: str, url: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run = stepwatch.init(job="j", url=argument, transport=MemoryTransport(), interval=1)
    assert (run.mode, run.url) == (mode, url)
    assert run._sender is not None
    assert run._sender.interval == (LIMITS.min_kubeflow_interval_s if mode == "kubeflow" else 1)


def test_upstream_token_file_and_ca_are_used_when_stepwatch_has_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://kf.test/status")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    transport = MemoryTransport()
    run = stepwatch.init(job="kf", transport=transport)
    run.step(loss=1.0)
    run.finish()
    assert transport.requests[-1].headers["Authorization"] == "Bearer sa-token"
    assert all(r.url == "http://kf.test/status" for r in transport.requests)  # no registration upstream


# ------------------------------------------------------------------------------------------- ranks


def test_other_ranks_send_heartbeats_without_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    transport = MemoryTransport()
    run = stepwatch.init(job="ddp", url="http://sw.test", transport=transport, interval=0.5)
    assert run._sender is not None
    assert run._sender.interval == 0.5 * LIMITS.heartbeat_interval_factor
    for _ in range(10):
        run.step(loss=1.0)
    run.finish()
    reports = _reports(transport)
    assert reports and all(not r.metrics for r in reports)
    assert (reports[-1].identity.rank, reports[-1].identity.world_size, reports[-1].identity.local_rank) == (1, 2, 1)
    assert reports[-1].progress.step == 10


def test_only_rank_zero_reports_to_kubeflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://kf.test/status")
    run = stepwatch.init(job="kf", transport=MemoryTransport())
    assert run.mode == "off"


# ----------------------------------------------------------------------------------------- tensors


def test_tensors_are_read_in_the_sender_thread_not_in_the_training_loop() -> None:
    torch = pytest.importorskip("torch")
    touched: list[str] = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            touched.append(threading.current_thread().name)
            return super().__torch_function__(func, types, args, kwargs or {})

    transport = MemoryTransport()
    run = stepwatch.init(job="tensors", url="http://sw.test", transport=transport, interval=60)
    losses = [torch.tensor(float(i)).as_subclass(Watched) for i in range(50)]
    touched.clear()
    for loss in losses:
        run.step(loss=loss)
    assert touched == []  # the hot path kept references and did nothing else
    run.finish()
    assert touched and set(touched) == {"stepwatch-sender"}
    window = next(m for r in _reports(transport) for m in r.metrics if m.name == "loss")
    assert (window.count, window.min, window.max, window.last) == (50, 0.0, 49.0, 49.0)


def test_a_cpu_scalar_tensor_is_read_at_once_and_no_tensor_keeps_its_autograd_graph() -> None:
    """A one-element tensor in host memory becomes a float on the hot path (no device to wait for, and
    no small tensors left alive across the step to fragment the heap); any other tensor is kept by
    reference without its graph (a ``meta`` tensor stands in for a GPU one: it is not in host memory)."""
    torch = pytest.importorskip("torch")
    weight = torch.ones(3, requires_grad=True)
    run = stepwatch.init(job="settle", url="http://sw.test", transport=MemoryTransport(), interval=60)
    cpu_loss = (weight * 2).sum()
    device_loss = torch.ones(1, device="meta", requires_grad=True) * 2
    vector = weight * 3
    run.step(loss=cpu_loss, far=device_loss, vec=vector, plain=1.5)
    queued = run._queue[-1]
    assert type(queued["loss"]) is float and queued["loss"] == 6.0
    assert isinstance(queued["far"], torch.Tensor) and queued["far"].device.type == "meta"
    assert queued["far"].grad_fn is None and not queued["far"].requires_grad
    assert isinstance(queued["vec"], torch.Tensor) and queued["vec"].grad_fn is None
    assert queued["plain"] == 1.5
    run.finish()


# ----------------------------------------------------------------------------------------- surface


def test_public_surface_is_sorted_and_complete() -> None:
    assert stepwatch.__all__ == sorted(stepwatch.__all__)
    public = {
        name for name, value in vars(stepwatch).items() if not name.startswith("_") and not isinstance(value, type(sys))
    }
    assert public | {"__version__"} == set(stepwatch.__all__)
    for name in stepwatch.__all__:
        if name != "__version__":
            assert getattr(stepwatch, name).__doc__, f"{name} has no docstring"


def test_import_loads_no_third_party_module() -> None:
    code = (
        "import sys, json; import stepwatch; "
        "base = set(sys.stdlib_module_names) | {'stepwatch', '__main__', '_distutils_hack', 'sitecustomize'}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] not in base)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_starting_a_run_loads_no_third_party_module(sink: ReportSink) -> None:
    code = (
        "import sys, json, stepwatch; "
        f"run = stepwatch.init(job='t', url={sink.url!r}, interval=0.05); run.step(loss=1.0); run.finish(); "
        "base = set(sys.stdlib_module_names) | {'stepwatch', '__main__', '_distutils_hack', 'sitecustomize'}; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] not in base)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert sink.final() is not None


def test_repr_says_what_the_run_is() -> None:
    run = stepwatch.init(job="shown", url="http://sw.test", transport=MemoryTransport(), interval=60)
    run.step()
    assert repr(run) == "<stepwatch.Run default/shown mode=native rank=0 step=1>"
    assert _run._current is run


@pytest.mark.parametrize("ending", ["finish()", "with run:", "finish('failed')"])
def test_a_run_asked_to_stop_ends_stopped(ending: str) -> None:
    """Issue 19: once the server asked to stop, a run that ends "finished" ends "stopped" with the stop's
    reason, whether the loop obeyed it or ran to its end; a failure stays a failure."""
    from stepwatch.protocol import Command

    transport = MemoryTransport()
    run = stepwatch.init(job="asked", url="http://sw.test", transport=transport, interval=60)
    run.step(loss=1.0)
    run._on_command(Command(id="c1", kind="stop", reason="plateau"))  # as the sender hands it over
    run._on_command(Command(id="c2", kind="checkpoint", reason="nightly"))  # a later command's reason is not the stop's
    if ending == "with run:":
        with run:
            run.step(loss=0.9)
    elif ending == "finish()":
        assert run.finish() is True
    else:
        run.finish("failed", "CUDA out of memory")
    final = _reports(transport)[-1]
    expected = ("failed", "CUDA out of memory") if ending == "finish('failed')" else ("stopped", "plateau")
    assert (final.state, final.reason) == expected


def _wait_for(transport: MemoryTransport, found: Callable[[list[Report]], bool], timeout: float = 10.0) -> bool:
    """Wait until the reports sent so far satisfy ``found``."""
    return wait_for(lambda: found(_reports(transport)), timeout, "reports that satisfy the condition")


def test_evaluating_is_sent_as_the_phase_with_its_seconds_and_training_is_the_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = MemoryTransport()
    run = stepwatch.init(job="evals", url="http://sw.test", transport=transport, interval=0.01)
    run.step(loss=1.0)
    assert _wait_for(transport, lambda reports: any(r.progress.step == 1 for r in reports))
    assert run.phase == "train" and all(r.progress.phase is None for r in _reports(transport))
    with run.evaluating() as same:
        assert same is run and run.phase == "eval"
        with stepwatch.evaluating():  # nested (the module shortcut, on the current run): still one evaluation
            assert run.phase == "eval"
        assert run.phase == "eval"
        assert _wait_for(
            transport, lambda reports: sum(r.progress.phase == "eval" for r in reports) >= 3
        )  # reported while it lasts, with the seconds since it began growing
        seconds = [r.progress.phase_seconds for r in _reports(transport) if r.progress.phase == "eval"]
        assert all(s is not None and s >= 0 for s in seconds) and seconds == sorted(seconds)  # type: ignore[type-var]
    assert run.phase == "train"
    run.set_phase("testing")  # type: ignore[arg-type]  # not a phase: ignored with one warning, never raised
    run.set_phase(["eval"])  # type: ignore[arg-type]
    assert run.phase == "train" and "phase must be 'train' or 'eval'" in caplog.text
    run.step(loss=0.5)
    run.finish()
    last = _reports(transport)[-1]
    assert last.progress.phase is None and last.progress.phase_seconds is None
    assert "phase" not in json.loads(transport.requests[-1].body)["progress"]  # training adds nothing to a report
