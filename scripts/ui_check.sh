#!/usr/bin/env bash
# The MLflow UI checked in a real browser (docs/tracking.md). Needs Chromium:
#
#   apt-get update && apt-get install -y chromium      # Debian / Ubuntu
#   bash scripts/ui_check.sh [SCREENSHOT_DIR]
#
# 1. a 2x2 sweep on the mini proxy (fiddler, tide x 10GB, 18GB; one prompt, 8 tokens; the
#    mini proxy is built first when HARNESS_CACHE has none) into a temporary SQLite store;
# 2. `mlflow ui` on that store, on a free port of 127.0.0.1;
# 3. scripts/ui_check.py drives headless Chromium through the experiment page, the runs
#    table and the chart view, checks what they show (one `ok:`/`FAILED:` line each) and
#    saves screenshots into SCREENSHOT_DIR (default: a new temporary folder), printed last;
# 4. the server is stopped by its process id, the store and sweep are removed.
#
# Exit status: 0 all checks passed, 1 a check failed, 2 no Chromium or the setup failed.
# CHROMIUM=/path/to/chrome picks another browser; HARNESS_CACHE is used when set.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PYTHON="${PYTHON:-python}"
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}"
if [ -z "$CHROMIUM" ]; then
  echo "error: Chromium not found; install it with: apt-get update && apt-get install -y chromium" >&2
  exit 2
fi

WORK="$(mktemp -d /tmp/ui-check.XXXXXX)"
OUT="${1:-$(mktemp -d /tmp/ui-check-screenshots.XXXXXX)}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
STORE="sqlite:///$WORK/mlflow.db"
export HARNESS_CACHE="${HARNESS_CACHE:-$WORK/cache}"
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true
SERVER_PID=""

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill "$SERVER_PID" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -9 "$SERVER_PID" 2>/dev/null
  fi
  wait "$SERVER_PID" 2>/dev/null
  echo "mlflow ui (pid $SERVER_PID) stopped"
  SERVER_PID=""
}
cleanup() { stop_server; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== mini sweep into $STORE"
# the mini proxy, charged as LLaDA2.0-mini: its systems differ (tiny is charged as itself)
if ! "$PYTHON" -m harness -m model=mini decode.gen_length=8 decode.block_length=8 decode.steps=4 \
    limit_prompts=1 show_text=false system=fiddler,tide budget=10GB,18GB \
    "tracking.uri=$STORE" "hydra.sweep.dir=$WORK/sweep" > "$WORK/sweep.log" 2>&1; then
  tail -20 "$WORK/sweep.log" >&2
  echo "error: the sweep failed (log above)" >&2
  exit 2
fi
grep -E "^(\[ok\]|\[failed\]|compare the runs)" "$WORK/sweep.log"

PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"
echo "== mlflow ui on $URL"
# from the work dir: the server's default experiment would otherwise put ./mlruns in the repo
(cd "$WORK" && exec "$PYTHON" -m mlflow ui --backend-store-uri "$STORE" --default-artifact-root "$WORK/mlartifacts" \
  --host 127.0.0.1 --port "$PORT" --workers 1 > "$WORK/ui.log" 2>&1) &
SERVER_PID=$!
for _ in $(seq 300); do
  curl -fs "$URL/health" > /dev/null 2>&1 && break
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    tail -20 "$WORK/ui.log" >&2
    echo "error: mlflow ui exited (log above)" >&2
    exit 2
  fi
  sleep 1
done
if ! curl -fs "$URL/health" > /dev/null 2>&1; then
  echo "error: mlflow ui did not answer on $URL within 300 s" >&2
  exit 2
fi
echo "mlflow ui (pid $SERVER_PID) answers"

echo "== headless Chromium ($("$CHROMIUM" --version 2>/dev/null | head -1))"
"$PYTHON" "$REPO/scripts/ui_check.py" --url "$URL" --out "$OUT" --chromium "$CHROMIUM" \
  --experiment llada2-mini --swept system,budget
STATUS=$?
stop_server
exit "$STATUS"
