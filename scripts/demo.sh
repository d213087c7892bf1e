#!/usr/bin/env bash
# Set up (if needed) and run the demo: the embedded server and four real training runs
# (converging, diverging, plateau, hanging). Extra arguments go to `stepwatch demo` (--duration, --port...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m stepwatch demo "$@"
