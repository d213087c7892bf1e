"""How the docs runner reads the documents: blocks, commands, marks and the rules that skip (no server here)."""

from __future__ import annotations

from pathlib import Path

from doc_examples import examples, skip_reason

DOC = """# A page

```bash
S=http://127.0.0.1:8642       # assignments go with each command after them
curl -s $S/api/v1/jobs \\
    -H 'Accept: application/json'
# a comment is no command
stepwatch jobs
```

<!-- docs-test: skip (needs the lab's GPUs) -->
```python
import stepwatch
```

```python
run = stepwatch.init(total_steps=10)
loss = train_step()
```

```bash
kubectl get trainjobs
stepwatch jobs -n nlp
```

```yaml
not: an example
```
"""


def test_blocks_become_examples_commands_keep_their_assignments_and_marks_skip(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("no examples\n")
    (tmp_path / "docs" / "page.md").write_text(DOC)
    found = examples(tmp_path)
    assert [(e.line, e.language) for e in found] == [
        (5, "shell"), (8, "shell"), (12, "python"), (16, "python"), (22, "shell"), (23, "shell"),
    ]  # fmt: skip
    curl, jobs, marked, fragment, cluster, beside = found
    assignment = "S=http://127.0.0.1:8642       # assignments go with each command after them\n"
    assert curl.code == assignment + "curl -s $S/api/v1/jobs \\\n    -H 'Accept: application/json'\n"
    assert jobs.code == assignment + "stepwatch jobs\n"
    assert skip_reason(curl) is None and skip_reason(jobs) is None
    assert skip_reason(marked) == "marked: needs the lab's GPUs"
    assert skip_reason(fragment) is not None and "placeholders" in skip_reason(fragment)  # train_step()
    assert skip_reason(cluster) == "needs a Kubernetes cluster"
    assert skip_reason(beside) == "needs a Kubernetes cluster (its block does)"


def test_a_python_block_using_names_nobody_defined_is_a_synopsis(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "```python\nfrom math import sqrt\nx = 4\n```\n\n```python\nprint(sqrt(x))\n```\n\n```python\nprint(y)\n```\n"
    )
    defined, uses_earlier, undefined = examples(tmp_path)
    assert skip_reason(defined) is None and skip_reason(uses_earlier) is None  # the page defined them above
    assert skip_reason(undefined) == "a synopsis: uses names it does not define (y)"
