#!/usr/bin/env bash
# Set up (if needed) and run every check: lint, types, dependency directions, the test suite, and the
# report core's tests again in a bare environment with no extras (no NumPy, no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/ruff format --check src tests benchmarks examples
echo "== mypy"
.venv/bin/mypy
echo "== dependency directions"
if [ -f ../shared/tools/check_layers.py ]; then python3 ../shared/tools/check_layers.py .; else echo "(../shared/tools/check_layers.py not here; skipped)"; fi
echo "== tests"
.venv/bin/python -m pytest -q "$@"
echo "== report core without extras"
if [ ! -x .venv-bare/bin/python ]; then python3 -m venv .venv-bare; fi
.venv-bare/bin/python -m pip install --quiet --disable-pip-version-check . pytest
.venv-bare/bin/python -m pytest -q -p no:cacheprovider tests/test_run.py tests/test_window.py tests/test_sender.py \
  tests/test_config.py tests/test_protocol.py
