"""Auto-instrumentation: the import hook, its two ways in (``stepwatch run``'s sitecustomize, the .pth),
and a Transformers script with no stepwatch import that reports under ``stepwatch run``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.cli.run import _SITE_DIR, _add_autoinstrumentation
from stepwatch.integrations import _auto

HERE = Path(__file__).parent
PTH = _SITE_DIR / "stepwatch-autoinstrument.pth"


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The hook watching a made-up framework ``fakefw_<n>``, whose integration records its installs."""
    name = f"fakefw_{abs(hash(tmp_path)) % 10**8}"
    calls: dict[str, Any] = {"installs": 0, "raise": None, "name": name}

    def install() -> bool:
        calls["installs"] += 1
        if calls["raise"] is not None:
            raise calls["raise"]
        return True

    integration = types.ModuleType(f"stepwatch.integrations.{name}")
    integration.install = install  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, f"stepwatch.integrations.{name}", integration)
    monkeypatch.setattr(_auto, "TRIGGERS", {name: name, f"{name}_missing": "no_such_integration"})
    monkeypatch.setattr(_auto, "_installed", {})
    monkeypatch.setattr(_auto, "_seen", set())
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{name}.py").write_text("LOADED = True\n")
    (tmp_path / f"{name}_missing.py").write_text("")
    assert _auto.activate(force=True)
    yield calls
    _auto.deactivate()
    for module in (name, f"{name}_missing"):
        sys.modules.pop(module, None)


def test_hook_installs_once_after_the_framework_ran(hook: dict[str, Any]) -> None:
    import importlib
    import importlib.machinery

    module = importlib.import_module(hook["name"])
    assert module.LOADED
    assert hook["installs"] == 1
    # the module sees its real loader: the hook left no trace on it
    assert type(module.__loader__) is importlib.machinery.SourceFileLoader
    assert type(module.__spec__.loader) is importlib.machinery.SourceFileLoader
    sys.modules.pop(hook["name"])
    importlib.import_module(hook["name"])  # imported again (a reload): installed already
    assert hook["installs"] == 1
    assert _auto.activate(force=True)  # idempotent: one finder
    assert sum(isinstance(f, _auto._Finder) for f in sys.meta_path) == 1


def test_two_namespaces_of_one_framework_are_both_patched(
    hook: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib

    other = f"{hook['name']}_legacy"  # as pytorch_lightning is to lightning: the same integration
    (tmp_path / f"{other}.py").write_text("")
    monkeypatch.setitem(_auto._pending, other, hook["name"])
    importlib.import_module(hook["name"])
    importlib.import_module(other)
    sys.modules.pop(other, None)
    assert hook["installs"] == 2  # install() is idempotent: it patches whatever is loaded each time


def test_a_failing_or_missing_integration_is_logged_at_debug_and_the_import_goes_on(
    hook: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    import importlib

    caplog.set_level(logging.DEBUG, "stepwatch")
    hook["raise"] = RuntimeError("cannot patch")
    assert importlib.import_module(hook["name"]).LOADED
    importlib.import_module(hook["name"] + "_missing")  # no stepwatch.integrations.no_such_integration
    messages = [r.getMessage() for r in caplog.records if r.name == "stepwatch"]
    assert any("cannot patch" in m for m in messages)
    assert any("no_such_integration" in m for m in messages)
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "stepwatch")


def test_the_frameworks_own_import_error_is_its_own(hook: dict[str, Any], tmp_path: Path) -> None:
    import importlib

    (tmp_path / f"{hook['name']}.py").write_text("raise ValueError('broken framework')\n")
    with pytest.raises(ValueError, match="broken framework"):
        importlib.import_module(hook["name"])
    assert hook["installs"] == 0


def test_a_framework_imported_before_activation_is_instrumented_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    integration = types.ModuleType("stepwatch.integrations.early")
    integration.install = lambda: calls.append(1) or True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "stepwatch.integrations.early", integration)
    monkeypatch.setitem(sys.modules, "early_fw", types.ModuleType("early_fw"))
    monkeypatch.setattr(_auto, "TRIGGERS", {"early_fw": "early"})
    monkeypatch.setattr(_auto, "_installed", {})
    monkeypatch.setattr(_auto, "_seen", set())
    try:
        assert _auto.activate(force=True)
        assert calls == [1]
    finally:
        _auto.deactivate()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"STEPWATCH_URL": "http://127.0.0.1:8642"}, True),
        ({"KUBEFLOW_TRAINER_SERVER_URL": "https://trainer/apis/..."}, True),  # a Kubeflow TrainJob's pod
        ({"STEPWATCH_URL": "http://x", "STEPWATCH_AUTOINSTRUMENT": "0"}, False),
        ({"STEPWATCH_URL": "http://x", "STEPWATCH_AUTOINSTRUMENT": "off"}, False),
        ({"STEPWATCH_URL": "http://x", "STEPWATCH_AUTOINSTRUMENT": "1"}, True),
        ({"STEPWATCH_URL": "http://x", "STEPWATCH_DISABLED": "true"}, False),
        # OpenShift AI's progression needs no endpoint: a progression port, or a TrainJob's pod (docs/openshift-ai.md)
        ({"STEPWATCH_METRICS_PORT": "28080"}, True),
        ({"STEPWATCH_METRICS_PORT": "off"}, False),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "PET_NODE_RANK": "1"}, True),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "JOB_COMPLETION_INDEX": "0", "HOSTNAME": "ft-node-0-0"}, True),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "1", "STEPWATCH_METRICS_PORT": "off"}, False),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "1", "STEPWATCH_AUTOINSTRUMENT": "0"}, False),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, False),  # a pod, not a TrainJob's
        ({"PET_NNODES": "1"}, False),  # torchrun's variables outside Kubernetes
    ],
)
def test_enabled_by_the_environment(env: dict[str, str], expected: bool) -> None:
    assert _auto.enabled(env) is expected


def test_the_setting_is_declared_for_stepwatch_config() -> None:
    from stepwatch._settings import SETTINGS, resolve

    setting = next(s for s in SETTINGS if s.name == "autoinstrument")
    assert setting.env == ("STEPWATCH_AUTOINSTRUMENT",)
    assert resolve({}, environ={"STEPWATCH_AUTOINSTRUMENT": "0"}).autoinstrument is False
    assert resolve({}, environ={}).autoinstrument is True


def _python(code: str, env: dict[str, str], cwd: Path | None = None) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


PROBE = (
    "import sys; m = sys.modules.get('stepwatch.integrations._auto'); "
    "print(m is not None and m.active(), 'stepwatch' in sys.modules)"
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "False False"),  # inert: not even `import stepwatch`
        ({"STEPWATCH_URL": "http://127.0.0.1:1"}, "True True"),
        ({"KUBEFLOW_TRAINER_SERVER_URL": "https://x/status"}, "True True"),
        ({"STEPWATCH_URL": "http://127.0.0.1:1", "STEPWATCH_AUTOINSTRUMENT": "0"}, "False False"),
        ({"STEPWATCH_METRICS_PORT": "127.0.0.1:0"}, "True True"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "1", "PET_NODE_RANK": "0"}, "True True"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "1", "STEPWATCH_AUTOINSTRUMENT": "0"}, "False False"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "False False"),  # any other pod: not even `import stepwatch`
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "JOB_COMPLETION_INDEX": "0"}, "False True"),  # enabled() decides
    ],
)
def test_the_pth_line_as_site_processes_it(tmp_path: Path, env: dict[str, str], expected: str) -> None:
    (tmp_path / PTH.name).write_text(PTH.read_text())
    code = f"import site; site.addsitedir({str(tmp_path)!r}); " + PROBE
    assert _python(code, env) == expected


def test_the_pth_is_one_import_line_that_never_raises(tmp_path: Path) -> None:
    lines = [line for line in PTH.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("import ")  # site executes only such lines
    # with reporting asked for but no stepwatch importable (-S: no site-packages), it does nothing
    done = subprocess.run(
        [sys.executable, "-S", "-c", f"exec({lines[0]!r}); print('ok')"],
        env={"STEPWATCH_URL": "http://127.0.0.1:1", "PATH": os.environ.get("PATH", "")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.stdout.strip(), done.stderr) == ("ok", "")


def test_sitecustomize_activates_and_chains_to_the_one_it_shadows(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.OTHER_SITECUSTOMIZE = True\n")
    env = {"PYTHONPATH": os.pathsep.join([str(_SITE_DIR), str(other)]), "STEPWATCH_URL": "http://127.0.0.1:1"}
    probe = PROBE + "; import builtins; print(getattr(builtins, 'OTHER_SITECUSTOMIZE', False))"
    assert _python(probe, env).split() == ["True", "True", "True"]
    assert _python(probe, {**env, "STEPWATCH_AUTOINSTRUMENT": "0"}).split() == ["False", "False", "True"]

    (other / "sitecustomize.py").write_text("raise RuntimeError('their bug')\n")
    done = subprocess.run(
        [sys.executable, "-c", "print('ran')"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "ran"  # reported the way site reports it, never raised
    assert "their bug" in done.stderr


def test_stepwatch_run_puts_the_hook_first_on_pythonpath() -> None:
    env = {"PYTHONPATH": "/a" + os.pathsep + str(_SITE_DIR)}
    _add_autoinstrumentation(env)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(_SITE_DIR), "/a"]
    off = {"STEPWATCH_AUTOINSTRUMENT": "0"}
    _add_autoinstrumentation(off)
    assert "PYTHONPATH" not in off


def test_zero_code_transformers_script_under_stepwatch_run(live_server: str, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the zero-code Transformers test needs PyTorch")
    pytest.importorskip("transformers", reason="the zero-code Transformers test needs transformers")
    script = tmp_path / "finetune.py"
    script.write_text((HERE / "hf_tiny.py").read_text())  # no `import stepwatch` anywhere in it
    assert "import stepwatch" not in script.read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_"))}
    env["STEPWATCH_INTERVAL"] = "0.2"
    name = f"zero-code-{os.getpid()}"
    command = [sys.executable, "-m", "stepwatch", "run", "--server", live_server, "--name", name]
    command += ["--", sys.executable, str(script), str(tmp_path / "out"), "12"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    base = f"{live_server}/api/v1/namespaces/default/jobs/{name}"
    job = httpx.get(base, timeout=10).json()
    assert job["state"] == "finished"
    assert (job["progress"]["step"], job["progress"]["total_steps"], job["progress"]["percent"]) == (12, 12, 100.0)
    assert {"loss", "eval_loss", "learning_rate"} <= set(job["metrics"])
    assert job["params"]["per_device_train_batch_size"] == 4
    history = httpx.get(base + "/history", params={"metrics": "loss", "max_points": "1000"}, timeout=10).json()
    assert sum(w["count"] for w in history["metrics"]["loss"]) == 12
