"""Running the Go programs that hold stepwatch's ports of Go behaviour to Go itself (``tests/go/*/main.go``).

OpenShift AI's controller is written in Go: where stepwatch claims to read what it reads as it reads it
(``encoding/json``, ``time.ParseDuration``, ``strconv.Atoi``), a test runs Go's own standard library on the
same inputs. Each program reads one JSON value a line and writes one JSON object a line. Go is installed in
CI (Debian's ``golang-go``, by scripts/test.sh); elsewhere these tests skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

__all__ = ["GO_PROGRAMS", "needs_go", "run_go"]

GO_PROGRAMS = Path(__file__).parent / "go"
needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed (apt-get install golang-go)")


def run_go(program: str, inputs: list[Any]) -> list[dict[str, Any]]:
    """The answers of ``tests/go/<program>`` to ``inputs``, one each, in order."""
    go = shutil.which("go") or "go"
    home = Path.home()
    env = {
        "GOCACHE": str(home / ".cache" / "go-build"),
        "GOFLAGS": "-mod=mod",
        "HOME": str(home),
        "PATH": f"{Path(go).parent}:/usr/bin:/bin",
    }
    lines = "".join(json.dumps(value) + "\n" for value in inputs)
    done = subprocess.run(
        [go, "run", "."], cwd=GO_PROGRAMS / program, input=lines, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(inputs), done.stderr
    return answers
