#!/usr/bin/env bash
# Set up (if needed) and run the demo: three real training runs reporting live through stepwatch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py
