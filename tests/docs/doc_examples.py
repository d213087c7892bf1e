"""The examples of README.md and docs/*.md: found, sorted into those that run here and those that cannot.

An example is a fenced block whose language is ``python``, ``bash``, ``sh``, ``shell`` or ``console``
(``yaml``, ``json``, ``text`` blocks are shapes and outputs, not commands). Each one runs unless it is
marked, or an automatic rule below says why it cannot run on a laptop with no cluster:

- **Marked** by an HTML comment on the line before the block (invisible on GitHub)::

      <!-- docs-test: skip (needs a GPU) -->
      <!-- docs-test: run -->            (run it although a rule would skip it)

  or by ``skip`` in the info string (````` ```bash skip `````).
- **Automatic rules** (:data:`RULES`): a Kubernetes cluster (``kubectl``, ``oc``, pods' paths), a
  GPU, software to install (``pip install``, ``apt-get``), a framework that is not installed here, a
  command that runs until it is stopped (``stepwatch server``, ``demo``, ``top``, ``--watch``, a
  launcher), or a fragment with placeholders (``...``, ``train_step()``, ``python train.py`` with no
  ``train.py``).

What runs, runs as written against a test server (:mod:`tests.docs.test_examples`); a rule never
applies to a block marked ``run``.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT", "RULES", "Example", "examples", "skip_reason"]

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell", "console": "shell"}
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")
_MARK = re.compile(r"<!--\s*docs-test:\s*(?P<verdict>skip|run)\b\s*(?:\((?P<reason>[^)]*)\))?\s*-->")


@dataclass(frozen=True)
class Example:
    """One fenced block of a document: where it is, its language (``python`` or ``shell``), its code, its mark."""

    path: str
    line: int
    language: str
    code: str
    mark: str = ""
    """``run``, ``skip``, or empty."""
    mark_reason: str = ""
    block: str = ""
    """The whole block a shell command comes from (some rules look at it: a benchmark's setup, an install)."""
    earlier: frozenset[str] = frozenset()
    """The names the python blocks above it in its document define (a python block may use them)."""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def examples(root: Path = ROOT) -> list[Example]:
    """Every python and shell block of README.md and docs/*.md, in document order."""
    found: list[Example] = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        lines = doc.read_text(encoding="utf-8").splitlines()
        defined: set[str] = set()
        i = 0
        while i < len(lines):
            opened = _FENCE.match(lines[i])
            if not opened:
                i += 1
                continue
            fence, indent = opened["fence"], len(opened["indent"])
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(fence[0] * len(fence)):
                end += 1
            info = opened["info"].split()
            language = LANGUAGES.get(info[0].lower()) if info else None
            if language is not None:
                body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1 : end]]
                mark, reason = _mark_of(lines, i, info)
                where = str(doc.relative_to(root))
                if language == "python":
                    code = "\n".join(body) + "\n"
                    found.append(Example(where, i + 1, language, code, mark, reason, earlier=frozenset(defined)))
                    defined |= _names(code)[0]
                else:
                    found.extend(
                        Example(where, i + 2 + offset, language, code, mark, reason, "\n".join(body))
                        for offset, code in _commands(body)
                    )
            i = end + 1
    return found


_ASSIGNMENT = re.compile(
    r"^(export\s+)?[A-Za-z_][A-Za-z0-9_]*=\S*(\s+#.*)?$|^(export\s+)?[A-Za-z_]\w*='[^']*'(\s+#.*)?$"
)


def _commands(body: list[str]) -> list[tuple[int, str]]:
    """A shell block as its commands, each an example of its own (line offset, code): a command with its
    continuation lines, after the block's variable assignments above it (``S=http://...`` then ``curl $S``).
    A block of assignments alone (settings to give the server) is one example."""
    commands: list[tuple[int, str]] = []
    assignments: list[str] = []
    i = 0
    while i < len(body):
        start = i
        line = body[i]
        while line.rstrip().endswith("\\") and i + 1 < len(body):
            i += 1
            line = line + "\n" + body[i]
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if _ASSIGNMENT.match(stripped):
            assignments.append(stripped)
            continue
        commands.append((start, "\n".join([*assignments, line]) + "\n"))
    if not commands and assignments:
        commands.append((0, "\n".join(assignments) + "\n"))
    return commands


def _mark_of(lines: list[str], at: int, info: list[str]) -> tuple[str, str]:
    if "skip" in (word.lower() for word in info[1:]):
        return "skip", "marked skip"
    before = at - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    marked = _MARK.search(lines[before]) if before >= 0 else None
    if marked:
        return marked["verdict"], (marked["reason"] or "").strip()
    return "", ""


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


_FRAMEWORKS = (
    "transformers", "lightning", "pytorch_lightning", "keras", "jax", "flax", "deepspeed", "tensorflow",
    "optuna", "xgboost", "lightgbm", "accelerate", "pandas", "kubeflow", "torch", "numpy", "apprise", "tqdm",
)  # fmt: skip

RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("needs a Kubernetes cluster", re.compile(
        r"(^|[\s;|&(`])(kubectl|oc|helm|kind|minikube)\s|/var/run/secrets/|\bdeploy/")),
    ("needs a GPU", re.compile(r"\bcuda\b|nvidia-smi|\bdevice=\"cuda|--gpus-per|\bnvidia\b", re.I)),
    ("installs software", re.compile(
        r"\bpip3? install\b|\bapt(-get)? install\b|\buv pip\b|python[\d.]* -m venv\b|\bgit clone\b")),
    ("runs until stopped (a server, a full-screen view, a follower)", re.compile(
        r"(^|[\s;|&(])stepwatch (server\b(?!\s+stop)|demo\b|top\b)|\s--watch\b|\s--follow\b|\bstepwatch watch\b"
        r"|\buvicorn\b|scripts/(demo|test)\.sh|\bprometheus\b|^\s*watch\s|\.watch\(|\blive\(|\bwait\(|serve_forever\("
        r"|\bcurl\s+-\w*N", re.M)),
    ("runs the test suite (this runner is part of it)", re.compile(r"\bpytest\b")),
    ("a multi-process launcher (torchrun, accelerate launch, deepspeed, srun)", re.compile(
        r"\btorchrun\b|accelerate launch|\bdeepspeed\b|\bsrun\b|\bmpirun\b")),
    ("a fragment: placeholders (..., train_step(), loader, your script)", re.compile(
        r"^\s*\.\.\.\s*$|\.\.\.\)|\btrain_step\(|\bevaluate\(\)|\bin loader\b|\(loader\)|\btrain\.py\b|"
        r"train_with_hf_trainer\.py|<[A-Z_a-z -]+>|\bYOUR_|\bmy_", re.M)),
    ("benchmarks: minutes of measurement", re.compile(r"benchmarks/")),
    ("needs a PostgreSQL server", re.compile(r"postgresql://|\b(psql|createdb|dropdb|pg_ctl\w*)\b|STEPWATCH_DATABASE_URL")),
    ("needs a container engine and a registry", re.compile(r"(^|[\s;|&(])(docker|podman|buildah)\s")),
    ("needs a webhook receiver or chat service", re.compile(r"hooks\.example\.com|slack://|mailto://|hooks\.slack")),
)  # fmt: skip
"""Why a block cannot run here, first match wins (checked in order, on the block's code)."""


def _names(code: str) -> tuple[set[str], set[str]]:
    """The names a block binds anywhere (assignments, imports, definitions, arguments) and those it reads."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set(), {"<not Python: a signature or an output>"}
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, read


def _undefined(example: Example) -> set[str]:
    """Names ``example`` reads that neither it nor an earlier python block of its document defines."""
    bound, read = _names(example.code)
    return read - bound - example.earlier - set(dir(builtins)) - {"__file__", "__name__"}


_BLOCK_WIDE = ("installs software", "benchmarks: minutes of measurement", "needs a Kubernetes cluster")
"""Rules that skip every command of a block when one of its commands matches: the others prepare or use it."""


def skip_reason(example: Example) -> str | None:
    """Why ``example`` does not run here (``None``: it runs)."""
    if example.mark == "run":
        return None
    if example.mark == "skip":
        return f"marked: {example.mark_reason or 'skip'}"
    for reason, pattern in RULES:
        if pattern.search(example.code):
            return reason
    for reason, pattern in RULES:
        if reason in _BLOCK_WIDE and pattern.search(example.block):
            return f"{reason} (its block does)"
    if example.language == "python":
        undefined = sorted(_undefined(example))
        if undefined:
            return f"a synopsis: uses names it does not define ({', '.join(undefined[:4])})"
        imported = re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", example.code, re.M)
        absent = sorted({name for name in imported if name in _FRAMEWORKS and _missing(name)})
        if absent:
            return f"needs {', '.join(absent)} (not installed here)"
        heavy = sorted({name for name in imported if name in _FRAMEWORKS})
        if heavy:
            return f"trains with {', '.join(heavy)}: the integration tests run these loops"
    return None
