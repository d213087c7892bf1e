"""The docs runner's session summary: how many examples ran, how many were skipped and why."""

from __future__ import annotations

import sys
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    module = sys.modules.get("test_examples")
    if module is None or not module.RESULTS:
        return
    terminalreporter.write_sep("-", "README.md and docs/*.md examples")
    terminalreporter.write_line(module.pytest_sessionfinish_summary())
