#!/usr/bin/env bash
# Set up (if needed) and run every check: lint, types, dependency directions, the test suite, and the
# report core's tests again in a bare environment with no extras (no NumPy, no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the store suite runs on PostgreSQL too: start the local cluster when it is installed but down
if command -v pg_isready >/dev/null 2>&1 && [ -d /etc/postgresql ] && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "== starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start \
    || echo "(PostgreSQL did not start: its tests will fail under CI and skip elsewhere)"
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
# the dashboard's browser tests drive Debian's Chromium (Playwright's own browser download cannot work here)
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing chromium for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "(chromium is missing and this is not root: the browser tests will skip; apt-get install chromium)"
  fi
fi
# `kubectl stepwatch` is run by a real kubectl in tests/test_cli_kubectl.py (Debian's package; no cluster needed)
if ! command -v kubectl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing kubectl for the kubectl plugin tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubectl >/dev/null) \
      || echo "(kubectl could not be installed: the tests through kubectl will skip)"
  else
    echo "(kubectl is missing and this is not root: the tests through kubectl will skip; apt-get install kubectl)"
  fi
fi
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
