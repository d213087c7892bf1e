"""The docs run as written: every python and shell example of README.md and docs/*.md, against a test server.

Each example is one test (its id is ``FILE:LINE``). One that cannot run here is skipped with the reason
(a mark in the document, or a rule of :mod:`doc_examples`: a cluster, a GPU, an install, a command that
runs until stopped, a fragment with placeholders), so ``pytest -rs tests/docs`` lists every skip and
why, and the session ends with a count: examples run, skipped by reason. An example known to be wrong
in a document its owner has not corrected yet is a strict ``xfail`` naming what is wrong
(:data:`KNOWN_WRONG`): the day it is fixed the test says so.

What runs, runs as a user would: shell blocks with ``bash -e`` (``localhost:8642`` and
``127.0.0.1:8642`` pointed at the test server, ``stepwatch`` on ``PATH``, ``STEPWATCH_SERVER`` and
``STEPWATCH_URL`` set), the python blocks of one document one after the other in one interpreter (a
later block uses what an earlier one defined, as a reader does), in a scratch directory holding
``examples/``. The test server holds the jobs the documents talk about (``train``, ``llama-sft``,
``nlp/ft`` ...), running and reporting, so that ``stepwatch describe train`` has a job to describe.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from doc_examples import ROOT, Example, examples, skip_reason

from stepwatch.protocol import Identity, MetricWindow, Progress, Report

EXAMPLES = examples()
TIMEOUT_S = 30.0

SEEDED = (
    ("default", "train"),
    ("default", "llama-sft"),
    ("default", "fraud-hangs"),
    ("default", "fraud-diverges"),
    ("nlp", "train"),
    ("nlp", "ft"),
    ("nlp", "llama-sft"),
    ("nlp", "llama"),
    ("team-nlp", "llama-sft"),
    ("vision", "resnet50"),
)
"""The jobs the documents name, running on the test server before any example runs."""

KNOWN_WRONG: dict[str, str] = {}
"""Examples that do not work as written, in documents this change does not own: id -> what is wrong."""

RESULTS: Counter[str] = Counter()
_DB: dict[str, Path] = {}


@pytest.fixture(scope="module")
def doc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from stepwatch.server import ServerSettings, create_app
    from stepwatch.testing.server import ServerThread

    db = tmp_path_factory.mktemp("docs") / "stepwatch.db"
    with ServerThread(create_app(ServerSettings(db=str(db))), log_level="critical") as httpd:
        _DB[httpd.url] = db
        _seed(httpd.url)
        yield httpd.url


def _seed(url: str) -> None:
    """Register the jobs the documents name and give each a few reports (loss falling, 40 % done)."""
    import httpx

    with httpx.Client(base_url=url, timeout=10) as http:
        for namespace, name in SEEDED:
            answer = http.post(
                f"/api/v1/namespaces/{namespace}/jobs",
                json={"name": name, "total_steps": 1000, "gpus": 2, "gpu_hour_cost": 2.0},
            )
            answer.raise_for_status()
            token = answer.json()["token"]
            now = time.time()
            for seq, step in enumerate((100, 200, 300, 400), start=1):
                loss = 2.0 / seq
                report = Report(
                    run_id=f"{namespace}-{name}",
                    seq=seq,
                    sent_at=now - 40 + 10 * seq,
                    identity=Identity(rank=0, world_size=1, host="docs", pid=1),
                    progress=Progress(step=step, total_steps=1000),
                    metrics=(MetricWindow("loss", loss, loss, loss, loss, 1, 0, step, step),),
                )
                http.post(
                    f"/api/v1/namespaces/{namespace}/jobs/{name}/reports",
                    json=report.to_dict(),
                    headers={"Authorization": f"Bearer {token}"},
                ).raise_for_status()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory examples run in: ``examples/`` as in a checkout, nothing else of the repository."""
    where = tmp_path_factory.mktemp("docs-run")
    (where / "examples").symlink_to(ROOT / "examples")
    (where / "home").mkdir()
    (where / "tmp").mkdir()
    return where


def _env(url: str, scratch: Path) -> dict[str, str]:
    """What a user's shell would hold: the test server as the one to talk to, its database as the local one
    (``stepwatch db`` works on the database directly), ``stepwatch`` on ``PATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_SERVER_"))}
    env.update(
        STEPWATCH_SERVER=url,
        STEPWATCH_URL=url,
        HOME=str(scratch / "home"),  # `~/...` in an example stays in the scratch directory
        TMPDIR=str(scratch / "tmp"),
        STEPWATCH_HOME=str(scratch / "home"),
        STEPWATCH_DB=str(_DB[url]),
        STEPWATCH_INTERVAL="0.2",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p),
        COLUMNS="120",
    )
    return env


def _pointed(code: str, url: str) -> str:
    """The example with the documents' server address (``localhost:8642``) replaced by the test server's."""
    host = url.removeprefix("http://")
    return re.sub(r"(localhost|127\.0\.0\.1):8642", host, code)


_PYTHON_SESSION = """
import contextlib, io, json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for block in blocks:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block["code"], block["id"], "exec"), namespace)
        result = {"id": block["id"], "ok": True, "output": out.getvalue()[-2000:]}
    except BaseException:
        result = {"id": block["id"], "ok": False, "output": out.getvalue()[-1000:] + traceback.format_exc()[-3000:]}
    print("@@result " + json.dumps(result), flush=True)
"""


def _run_python(examples_: list[Example], url: str, scratch: Path) -> dict[str, dict[str, Any]]:
    """Run a document's runnable python blocks one after the other in one interpreter; their results."""
    blocks = [{"id": e.id, "code": _pointed(e.code, url)} for e in examples_]
    done = subprocess.run(
        [sys.executable, "-c", _PYTHON_SESSION],
        input=json.dumps(blocks),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * max(1, len(blocks)),
        cwd=scratch,
        env=_env(url, scratch),
    )
    results: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("@@result "):
            result = json.loads(line.removeprefix("@@result "))
            results[result["id"]] = result
    for block in blocks:  # one that never reported: the interpreter died in it
        results.setdefault(block["id"], {"ok": False, "output": done.stderr[-3000:]})
    return results


def _run_document(path: str, url: str, scratch: Path) -> dict[str, dict[str, Any]]:
    """A document's runnable examples in its order (a later one may use what an earlier one made)."""
    runnable = [e for e in EXAMPLES if e.path == path and skip_reason(e) is None]
    results = _run_python([e for e in runnable if e.language == "python"], url, scratch)
    for example in runnable:
        if example.language == "shell":
            try:
                results[example.id] = _run_shell(example, url, scratch)
            except subprocess.TimeoutExpired:
                results[example.id] = {"ok": False, "output": f"still running after {TIMEOUT_S:g} s"}
    return results


@pytest.fixture(scope="module")
def results(doc_server: str, scratch: Path) -> dict[str, dict[str, Any]]:
    """Every runnable example's result: the documents side by side (each in its own order), to keep the
    default tier quick; the tests below read them."""
    paths = sorted({e.path for e in EXAMPLES if skip_reason(e) is None})
    found: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for done in pool.map(lambda path: _run_document(path, doc_server, scratch), paths):
            found.update(done)
    return found


_CURL = 'curl() { command curl --fail-with-body --show-error "$@"; }\n'
"""curl as the documents use it, but failing on an HTTP error: a 404 or a 422 is not an example that works."""


def _run_shell(example: Example, url: str, scratch: Path) -> dict[str, Any]:
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", _CURL + _pointed(example.code, url)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=scratch,
        env=_env(url, scratch),
        stdin=subprocess.DEVNULL,
    )
    return {"ok": done.returncode == 0, "output": f"exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"}


def _param(example: Example) -> Any:
    marks = []
    if example.id in KNOWN_WRONG:
        marks.append(pytest.mark.xfail(reason=KNOWN_WRONG[example.id], strict=True))
    return pytest.param(example, id=example.id, marks=marks)


@pytest.mark.parametrize("example", [_param(e) for e in EXAMPLES])
def test_example_runs_as_written(example: Example, request: pytest.FixtureRequest) -> None:
    reason = skip_reason(example)
    if reason is not None:
        RESULTS[f"skipped: {reason}"] += 1
        pytest.skip(reason)
    RESULTS["run"] += 1
    result = request.getfixturevalue("results")[example.id]
    assert result["ok"], f"{example.id} does not run as written:\n{example.code}\n--- it said:\n{result['output']}"


def test_every_document_has_examples_and_most_run() -> None:
    """The runner finds the examples (a change of fence style would silently find none) and runs a good share."""
    assert len(EXAMPLES) >= 60
    assert {e.path for e in EXAMPLES} >= {"README.md", "docs/policies.md", "docs/reporting.md"}
    running = [e for e in EXAMPLES if skip_reason(e) is None]
    assert len(running) >= 25, [e.id for e in running]


def test_the_tour_example_trains_and_its_job_finishes(doc_server: str, scratch: Path) -> None:
    """README's ``stepwatch run -- python examples/tour.py``, shorter (the README's runs a minute): nothing but
    stepwatch installed, a real model, its job finished with a falling loss."""
    import httpx

    done = subprocess.run(
        ["stepwatch", "run", "--", "python", "examples/tour.py", "--steps", "300", "--step-delay", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=scratch,
        env=_env(doc_server, scratch),
    )
    assert done.returncode == 0, done.stderr
    assert "held-out accuracy 0.9" in done.stdout
    job = httpx.get(f"{doc_server}/api/v1/namespaces/default/jobs/tour", timeout=10).json()
    assert (job["state"], job["progress"]["step"]) == ("finished", 300)
    assert job["metrics"]["loss"] < 0.5  # from log 2 = 0.69 at the start


def pytest_sessionfinish_summary() -> str:
    """The line the session ends with (see conftest.py): examples run, skipped by reason."""
    skipped = {k.removeprefix("skipped: "): n for k, n in RESULTS.items() if k.startswith("skipped: ")}
    lines = [f"docs examples: {RESULTS['run']} run, {sum(skipped.values())} skipped"]
    lines += [f"  {n:3d} skipped: {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)
