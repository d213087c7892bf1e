#!/usr/bin/env bash
# From a fresh clone to your own job's progress in the dashboard, following the README's "Install" section:
# counts the commands and times each. Usage: bash benchmarks/fresh_clone.sh [REPO] [PORT]
# (REPO: what to clone, default this checkout; PORT: where the background server listens, default 18700).
# Everything goes under a temporary directory (clone, venv, STEPWATCH_HOME), removed at the end.
set -euo pipefail
REPO=${1:-$(cd "$(dirname "$0")/.." && pwd)}
PORT=${2:-18700}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export STEPWATCH_HOME="$WORK/home"
URL="http://127.0.0.1:$PORT"
t0=$(date +%s.%N)
rows=()
mark() { rows+=("$(printf '| %s | %s | %.1f |' "$1" "$2" "$(echo "$(date +%s.%N) - $t0" | bc)")"); }

git clone -q "$REPO" "$WORK/stepwatch" && cd "$WORK/stepwatch"
mark 1 "git clone"
python3 -m venv .venv && .venv/bin/pip install -q '.[server]' 2>/dev/null && source .venv/bin/activate
mark 2 "python3 -m venv .venv && .venv/bin/pip install '.[server]' && source .venv/bin/activate"
cat > train.py <<'PY'
import time, stepwatch
run = stepwatch.init(total_steps=300)
for step in range(300):
    run.step(loss=1.0 / (step + 1))
    time.sleep(0.05)
run.finish()
PY
stepwatch run --server "$URL" -- python train.py > "$WORK/run.log" 2>&1 &
until curl -sf "$URL/api/v1/namespaces/default/jobs/train" | grep -q '"step": *[1-9]'; do sleep 0.2; done
page=$(curl -s -o /dev/null -w '%{http_code}' "$URL/")
mark 3 "stepwatch run -- python train.py  (job reporting; dashboard $URL/ answers $page)"
wait
stepwatch server stop > /dev/null
mark 4 "stepwatch server stop"
echo "| # | command | seconds since the clone began |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
