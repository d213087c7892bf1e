#!/usr/bin/env bash
# Set up (if needed) and run every check: lint, types, dependency directions, the test suite, and the
# report core's tests again in a bare environment with no extras (no NumPy, no torch).
#   bash scripts/test.sh          the default tier of the suite: the tests a person waits for (minutes)
#   bash scripts/test.sh --full   every tier: also slow, frameworks, perf, bench, browser, reliability, postgres (CI)
# Other arguments go to pytest (`bash scripts/test.sh -x -k stall`); tests/conftest.py defines the tiers.
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
# Debian packages some tests drive for real; as root they are installed when missing, else those tests skip
install_if_missing() {  # COMMAND PACKAGE WHAT-NEEDS-IT
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ]; then
    echo "== installing $2 for $3"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null) \
      || echo "($2 could not be installed: $3 will skip)"
  else
    echo "($1 is missing and this is not root: $3 will skip; apt-get install $2)"
  fi
}
# the dashboard's browser tests drive Debian's Chromium (Playwright's own browser download cannot work here)
install_if_missing chromium chromium "the browser tests"
# `kubectl stepwatch` is run by a real kubectl in tests/cli/test_cli_kubectl.py (no cluster needed)
install_if_missing kubectl kubectl "the tests through kubectl"
# a real Prometheus scrapes a real server in tests/server/api/test_prometheus.py (with promtool)
install_if_missing promtool prometheus "the real Prometheus test"
# OpenShift AI's controller reads progress with Go's encoding/json: tests/test_progression_format.py holds our port to it
install_if_missing go golang-go "the Go decoding conformance test"
# Lint, types and the dependency directions.
checks() {
  echo "== ruff"
  .venv/bin/ruff check src tests benchmarks examples
  .venv/bin/ruff format --check src tests benchmarks examples
  echo "== mypy"
  .venv/bin/mypy
  echo "== dependency directions"
  if [ -f ../shared/tools/check_layers.py ]; then python3 ../shared/tools/check_layers.py .; else echo "(../shared/tools/check_layers.py not here; skipped)"; fi
}
# The report core's tests again in a bare environment with no extras (no NumPy, no torch, no server).
bare_tests() {
  if [ ! -x .venv-bare/bin/python ]; then python3 -m venv .venv-bare; fi
  .venv-bare/bin/python -m pip install --quiet --disable-pip-version-check . pytest
  .venv-bare/bin/python -m pytest -q -p no:cacheprovider tests/test_run.py tests/test_window.py tests/test_sender.py \
    tests/test_config.py tests/test_protocol.py tests/test_progression_format.py tests/test_progression_endpoint.py \
    tests/test_progression_lifecycle.py
}
# The default tier runs on every core (pytest-xdist; a test file per worker, so that its module fixtures stay
# whole), with the bare report core's tests beside it (their output follows the suite's). --full (CI) and a run
# that picks its own -n run in one process, one step after the other, as the slow tiers' timings were measured.
parallel=(-n auto --dist loadfile)
for arg in "$@"; do
  case "$arg" in --full | -n | -n* | --numprocesses*) parallel=() ;; esac
done
# pytest caches its rewritten test modules as bytecode: a second run collects ~7 s sooner
run_suite() { env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest -q ${parallel[@]+"${parallel[@]}"} "$@"; }
if [ ${#parallel[@]} -eq 0 ]; then
  checks
  echo "== tests"
  run_suite "$@"  # --full: tests/conftest.py
  echo "== report core without extras"
  bare_tests
  exit 0
fi
checks_log=$(mktemp)
bare_log=$(mktemp)
trap 'rm -f "$checks_log" "$bare_log"' EXIT
checks >"$checks_log" 2>&1 &
checks_pid=$!
bare_tests >"$bare_log" 2>&1 &
bare_pid=$!
echo "== tests (lint, types, the dependency directions and the report core without extras run beside them)"
suite=0
run_suite "$@" || suite=$?
checked=0
wait "$checks_pid" || checked=$?
bare=0
wait "$bare_pid" || bare=$?
cat "$checks_log"
echo "== report core without extras"
cat "$bare_log"
for status in "$suite" "$checked" "$bare"; do
  if [ "$status" -ne 0 ]; then exit "$status"; fi
done
