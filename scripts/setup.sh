#!/usr/bin/env bash
# Create .venv (if needed) and install stepwatch with its development tools, NumPy and a CPU PyTorch.
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
# torch is pinned: 2.13.0 is the CPU build that installs quickly here; an unpinned torch pulls gigabytes.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]" "torch==2.13.0"
echo "setup: $(.venv/bin/python -c 'import stepwatch, torch; print("stepwatch", stepwatch.__version__, "torch", torch.__version__)')"
