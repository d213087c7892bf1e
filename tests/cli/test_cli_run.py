"""The local runner and the demo, end to end: real server, real subprocesses, real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stepwatch.cli.run import job_name_for

ROOT = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A real `stepwatch server` in a subprocess."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "server", "--port", str(port), "--db", str(tmp_path / "sw.db")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(url + "/healthz", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(10)


def job(url: str, name: str) -> dict:
    return httpx.get(f"{url}/api/v1/namespaces/default/jobs/{name}", timeout=5).json()


def stepwatch_run(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepwatch", "run", "--server", url, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "STEPWATCH_INTERVAL": "0.1"},
    )


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "train.py", "--lr", "1"], "train"),
        (["torchrun", "--nproc-per-node", "2", "scripts/Fine_Tune.py"], "fine-tune"),
        (["python", "-m", "pkg.trainer"], "trainer"),
        (["./run-experiment"], "run-experiment"),
    ],
)
def test_job_names_come_from_the_script(command: list[str], name: str) -> None:
    assert job_name_for(command) == name


def test_an_instrumented_script_reports_and_its_outcome_is_recorded(server: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import stepwatch, time\n"
        "run = stepwatch.init(total_steps=50)\n"
        "for i in range(50):\n"
        "    run.step(loss=1 / (i + 1))\n"
        "    time.sleep(0.01)\n"
        "print('trained')\n"
    )
    done = stepwatch_run(server, "--", sys.executable, str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained\n"  # output passes through unchanged
    assert "job default/train (attempt 1)" in done.stderr
    found = job(server, "train")
    assert (found["state"], found["progress"]["step"], found["exit_code"]) == ("finished", 50, 0)
    assert found["source"] == "runner"


def test_a_failing_command_is_failed_with_its_exit_code(server: str) -> None:
    done = stepwatch_run(server, "--name", "boom", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    found = job(server, "boom")
    assert (found["state"], found["exit_code"], found["reason"]) == ("failed", 3, "exit code 3")


def test_a_command_that_cannot_start(server: str) -> None:
    done = stepwatch_run(server, "--name", "nope", "--", "/nonexistent/program")
    assert done.returncode == 127
    assert "cannot start '/nonexistent/program'" in done.stderr
    assert job(server, "nope")["state"] == "failed"


def test_stop_is_enforced_after_the_grace_period(server: str) -> None:
    """A script that ignores the stop command is terminated once its grace period is over."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "run", "--server", server, "--name", "stubborn", "--grace", "1", "--",
         sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    for _ in range(100):
        if job(server, "stubborn").get("state") == "running":
            break
        time.sleep(0.1)
    began = time.monotonic()
    answer = httpx.post(
        f"{server}/api/v1/namespaces/default/jobs/stubborn/commands", json={"kind": "stop", "reason": "plateau"}
    )
    assert answer.status_code == 201
    _, err = process.communicate(timeout=30)
    assert time.monotonic() - began < 15
    assert "stop requested (plateau)" in err and "grace period over" in err
    found = job(server, "stubborn")
    assert (found["state"], found["reason"]) == ("stopped", "plateau")


IGNORING_SIGINT = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh"]
"""A prefix that starts a command with SIGINT ignored, as nohup or `&` without job control do."""


@pytest.mark.parametrize("started", ["from a terminal", "in the background"])
def test_ctrl_c_is_forwarded_and_the_job_is_stopped(server: str, started: str) -> None:
    # in the background (nohup, `&` without job control) a process starts with SIGINT ignored, and its
    # children inherit that: the runner must still get its forwarded interrupt to the command
    process = subprocess.Popen(
        [*(IGNORING_SIGINT if started == "in the background" else []),
         sys.executable, "-m", "stepwatch", "run", "--server", server, "--name", "interrupted", "--",
         sys.executable, "-c", "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.1)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    # Ctrl-C once the child runs its loop (during its interpreter's start-up Python itself exits 1)
    assert process.stdout.readline().strip() == "ready"
    for _ in range(100):
        if job(server, "interrupted").get("state") == "running":
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    assert process.wait(20) == 130  # the child died of SIGINT: 128 + 2
    assert job(server, "interrupted")["state"] == "stopped"


def test_a_running_name_is_refused_clearly(server: str) -> None:
    httpx.post(f"{server}/api/v1/namespaces/default/jobs", json={"name": "taken"})
    done = stepwatch_run(server, "--name", "taken", "--", sys.executable, "-c", "pass")
    assert done.returncode == 1
    assert "cannot register default/taken" in done.stderr and "pending" in done.stderr


def test_without_a_command_it_says_how() -> None:
    done = subprocess.run([sys.executable, "-m", "stepwatch", "run"], capture_output=True, text=True)
    assert done.returncode == 2 and "give the command after --" in done.stderr


@pytest.mark.slow
def test_the_demo_runs_four_jobs_and_ends_everything(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "stepwatch", "demo", "--port", str(port), "--duration", "15", "--steps", "500",
         "--step-delay", "0.01", "--db", str(tmp_path / "demo.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"server at http://127.0.0.1:{port}" in done.stdout
    assert "ends everything it started 15 s after its start" in done.stdout  # says how long the dashboard stays
    assert f"stepwatch watch fraud-converges --server http://127.0.0.1:{port}" in done.stdout
    for name in ("fraud-converges", "fraud-diverges", "fraud-plateau", "fraud-hangs"):
        assert name in done.stdout
    with pytest.raises(httpx.TransportError):  # the server it started is gone
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    from stepwatch.server.store import SQLiteStore

    store = SQLiteStore(tmp_path / "demo.db")
    try:
        jobs = {name: store.job("default", name) for name in ("fraud-converges", "fraud-diverges", "fraud-hangs")}
        plateau = store.job("default", "fraud-plateau")
    finally:
        store.close()
    converged, diverged, hung = jobs["fraud-converges"], jobs["fraud-diverges"], jobs["fraud-hangs"]
    assert converged is not None and converged.state == "finished" and converged.step == 500
    assert converged.health == "healthy" and converged.gpus == 8 and converged.gpu_hour_cost == 4.0
    assert diverged is not None and diverged.nonfinite_total > 0 and diverged.health == "diverging"
    assert plateau is not None and plateau.policy == {"on": {"not_learning": "checkpoint_stop"}}
    assert hung is not None and hung.state == "stopped" and hung.step is not None and hung.step <= 60  # 10 %


@pytest.mark.slow
def test_a_demo_run_that_fails_says_why_and_the_demo_exits_1(tmp_path: Path) -> None:
    """A negative step delay is refused by every run (the demo hands it over as given): each run fails at once."""
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "stepwatch", "demo", "--port", str(port), "--duration", "12", "--steps", "50",
         "--step-delay", "-1", "--db", str(tmp_path / "demo.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    for name in ("fraud-converges", "fraud-diverges", "fraud-plateau", "fraud-hangs"):
        said = f"stepwatch demo: {name} failed: python -m stepwatch.cli.demo_training: error: argument --step-delay: "
        assert said + "must be >= 0, got -1.0 (log: " in done.stderr
    assert "Traceback" not in done.stderr


def test_a_crash_shows_the_exception_in_describe_and_watch(server: str, tmp_path: Path) -> None:
    script = tmp_path / "oom.py"
    script.write_text(
        "import stepwatch\n"
        "run = stepwatch.init(total_steps=100)\n"
        "for step in range(5):\n"
        "    run.step(loss=1.0)\n"
        "raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    )
    done = stepwatch_run(server, "--", sys.executable, str(script))
    assert done.returncode == 1
    reason = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    found = job(server, "oom")
    assert (found["state"], found["reason"], found["exit_code"]) == ("failed", reason, 1)
    cli = [sys.executable, "-m", "stepwatch"]
    watched = subprocess.run([*cli, "watch", "oom", "--server", server], capture_output=True, text=True, timeout=60)
    assert watched.returncode == 1
    assert watched.stdout.startswith(f"default/oom failed: {reason} (exit code 1")  # not only "exit code 1"
    described = subprocess.run(
        [*cli, "describe", "oom", "--server", server], capture_output=True, text=True, timeout=60
    )
    assert f"State:       failed ({reason})" in described.stdout


def test_a_budget_without_gpus_says_the_cost_is_unknown(server: str) -> None:
    done = stepwatch_run(server, "--name", "nobudget", "--budget", "200", "--", sys.executable, "-c", "pass")
    assert done.returncode == 0
    assert "the cost of default/nobudget is unknown, so --budget 200 can never be reached: give --gpus N" in done.stderr
    done = stepwatch_run(
        server, "--name", "budget", "--budget", "200", "--gpus", "2", "--gpu-hour-cost", "3", "--",
        sys.executable, "-c", "pass",
    )  # fmt: skip
    assert done.returncode == 0 and "is unknown" not in done.stderr


@pytest.mark.slow
def test_the_background_server_runs_on_and_server_stop_ends_it(tmp_path: Path) -> None:
    """`stepwatch run` at a local URL nobody answers starts a server that outlives the job; `server stop` ends it."""
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "STEPWATCH_HOME": str(tmp_path / "home"), "STEPWATCH_INTERVAL": "0.1"}
    cli = [sys.executable, "-m", "stepwatch"]
    try:
        done = subprocess.run(
            [*cli, "run", "--server", url, "--name", "first", "--", sys.executable, "-c", "pass"],
            capture_output=True, text=True, timeout=90, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"started a background server at {url}" in done.stderr and "`stepwatch server stop`" in done.stderr
        assert job(url, "first")["state"] == "finished"  # it outlived the job
        pid_files = list((tmp_path / "home").glob("server-*.pid"))
        assert len(pid_files) == 1
    finally:
        stopped = subprocess.run([*cli, "server", "stop"], capture_output=True, text=True, timeout=60, env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith(f"stopped the background server at {url} (pid ")
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/healthz", timeout=2)
    assert not list((tmp_path / "home").glob("server-*.pid"))
    again = subprocess.run([*cli, "server", "stop"], capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.startswith("stepwatch server stop: no background server (one `stepwatch run` started")


def test_a_port_already_in_use_is_said_clearly(server: str, tmp_path: Path) -> None:
    port = server.rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "-m", "stepwatch", "server", "--port", port, "--db", str(tmp_path / "other.db")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unusable_database_url_is_said_clearly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stepwatch", "server", "--database-url", "mysql://x/y"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "unsupported database URL 'mysql://x/y'" in done.stderr


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_several_processes_on_sqlite_are_refused_with_the_way_to_them(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--workers` was removed: one process serves SQLite, several are PostgreSQL replicas (on any database)."""
    from stepwatch.cli import main

    args = ["server", "--db", str(tmp_path / "sw.db"), "--port", "0"]
    if how == "flag":
        args += ["--workers", "2"]
    else:
        monkeypatch.setenv("STEPWATCH_SERVER_WORKERS", "2")
    assert main(args) == 2
    named = "--workers" if how == "flag" else "STEPWATCH_SERVER_WORKERS"
    assert capsys.readouterr().err == (
        f"stepwatch server: {named}: one process serves SQLite; for several, run replicas on PostgreSQL "
        "(docs/server.md)\n"
    )
    assert not (tmp_path / "sw.db").exists()


def test_a_policy_checkpoints_and_stops_a_diverging_job(server: str, tmp_path: Path) -> None:
    """`stepwatch run --on diverging=checkpoint_stop`: the NaN loss makes the server queue a checkpoint and a stop;
    the script saves and exits by itself, within the grace period, and everything is on the job's timeline."""
    script = tmp_path / "blowup.py"
    checkpoint = tmp_path / "ckpt.txt"
    script.write_text(
        "import math, stepwatch, sys, time\n"
        "run = stepwatch.init(total_steps=10_000)\n"
        "for step in range(1, 10_001):\n"
        "    run.step(loss=1.0 / step if step < 30 else math.nan)\n"
        "    if run.should_checkpoint:\n"
        f"        open({str(checkpoint)!r}, 'w').write(str(step)); run.checkpoint_done()\n"
        "    if run.should_stop:\n"
        "        print('stopping at', step, 'because', run.command_reason, flush=True); break\n"
        "    time.sleep(0.01)\n"
        "run.finish('stopped', run.command_reason)\n"
    )
    done = stepwatch_run(
        server, "--name", "blowup", "--grace", "30", "--on", "diverging=checkpoint_stop", "--",
        sys.executable, str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "stopping at" in done.stdout and "policy: " in done.stdout
    assert checkpoint.exists() and int(checkpoint.read_text()) >= 30
    found = job(server, "blowup")
    assert found["state"] == "stopped" and found["health"]["state"] == "diverging"
    assert found["policy"]["fired"]["diverging"]["action"] == "checkpoint_stop"
    events = httpx.get(f"{server}/api/v1/namespaces/default/jobs/blowup/events", timeout=5).json()["items"]
    kinds = [e["kind"] for e in events]
    assert kinds.index("health") < kinds.index("policy") < kinds.index("command") < kinds.index("stopped")
    assert "grace period over" not in done.stderr  # it stopped by itself


@pytest.mark.slow
def test_a_job_that_ignores_sigterm_is_killed_after_kill_after(server: str) -> None:
    """The runner gets SIGTERM (a service manager, a cluster stopping it); the job ignores it: the runner
    SIGKILLs the job's group --kill-after seconds later instead of waiting for it without limit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "run", "--server", server, "--name", "deaf", "--kill-after", "1", "--",
         sys.executable, "-c",
         "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "while True: time.sleep(0.1)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here on
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the runner waited for a job that ignores SIGTERM without limit")
    assert process.returncode == 137  # 128 + SIGKILL: the job was killed
    assert "1 s after SIGTERM; killing its process group" in err
    assert "killed by SIGKILL" in err or "stopped (terminated (SIGTERM)" in err, err  # not "Ctrl-C": it was a SIGTERM


def test_a_plain_script_that_fails_says_why_and_its_stderr_still_passes(server: str, tmp_path: Path) -> None:
    """No stepwatch in the script, so nobody reports its exception: the runner reads it from the stderr it passes."""
    script = tmp_path / "tour.py"
    script.write_text("import sys\nprint('epoch 1', file=sys.stderr)\nimport torch_is_not_installed_here\n")
    done = stepwatch_run(server, "--", sys.executable, str(script))
    assert done.returncode == 1
    assert "epoch 1\nTraceback (most recent call last):" in done.stderr  # passed through unchanged
    reason = "ModuleNotFoundError: No module named 'torch_is_not_installed_here'"
    found = job(server, "tour")
    assert (found["state"], found["reason"], found["exit_code"]) == ("failed", reason, 1)
    assert done.stderr.rstrip().endswith(f"stepwatch: job default/tour failed ({reason})")


def test_a_failing_command_without_words_keeps_its_exit_code(server: str) -> None:
    done = stepwatch_run(server, "--name", "mute", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    assert job(server, "mute")["reason"] == "exit code 3"


@pytest.mark.slow
def test_a_torchrun_rank_that_raises_is_named_with_its_exception(server: str, tmp_path: Path) -> None:
    """A real 2-process torchrun job (gloo, CPU): rank 0 raises, rank 1 then fails in its all_reduce."""
    pytest.importorskip("torch")
    script = tmp_path / "ddp_oom.py"
    script.write_text(
        "import time\n"
        "import torch\n"
        "import torch.distributed as dist\n"
        "import stepwatch\n"
        "dist.init_process_group('gloo')\n"
        "run = stepwatch.init(total_steps=100)\n"
        "model = torch.nn.Linear(4, 1)\n"
        "for step in range(30):\n"
        "    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
        "    loss.backward()\n"
        "    for p in model.parameters():\n"
        "        dist.all_reduce(p.grad)\n"
        "    run.step(loss=loss.item())\n"
        "    time.sleep(0.05)\n"
        "    if dist.get_rank() == 0 and step == 10:\n"
        "        raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    done = stepwatch_run(server, "--name", "ddp", "--", *torchrun, str(script), timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    reason = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (rank 0)"
    found = job(server, "ddp")
    assert (found["state"], found["reason"]) == ("failed", reason), done.stderr[-3000:]
    described = subprocess.run(
        [sys.executable, "-m", "stepwatch", "describe", "ddp", "--server", server],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reason in described.stdout


def test_policy_set_adds_to_what_was_set_at_start_and_shows_it(server: str) -> None:
    """`stepwatch policy set` merges: the triggers, budget and deadline given to `stepwatch run` stay."""
    done = stepwatch_run(
        server, "--name", "keep", "--on", "not_learning=checkpoint_stop", "--on", "diverging=stop",
        "--budget", "250", "--deadline", "2030-01-01T00:00:00Z", "--gpus", "1", "--gpu-hour-cost", "2",
        "--", sys.executable, "-c", "pass",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cli = [sys.executable, "-m", "stepwatch", "policy", "set", "keep", "--server", server]
    added = subprocess.run([*cli, "--on", "stalled=notify"], capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    for line in ("on not_learning   checkpoint_stop", "on diverging      stop", "on stalled        notify"):
        assert line in added.stdout
    assert "budget            250.0" in added.stdout and "deadline          2030-01-01 00:00:00 UTC" in added.stdout
    replaced = subprocess.run([*cli, "--replace", "--budget", "9"], capture_output=True, text=True, timeout=60)
    assert replaced.returncode == 0, replaced.stderr
    assert 'policy of default/keep: {"budget": 9.0}' in replaced.stdout and "on diverging" not in replaced.stdout
