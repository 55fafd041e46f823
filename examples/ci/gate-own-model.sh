#!/usr/bin/env bash
# The CI performance gate for your own model on a running Triton, as one script: the steps that
# examples/ci/github-actions.yml and examples/ci/gitlab-ci.yml run once Triton is started.
#
#   1. wait until the server is ready (GET /v2/health/ready);
#   2. load the model from the repository the server was started with (explicit model control:
#      POST /v2/repository/models/<model>/load reads the repository as it is now, so the model
#      measured is the one this commit holds), and wait until it is ready;
#   3. perfsweep gate --url: absolute goals, and, when a baseline result is there (the last
#      main-branch run's result.json), a regression check against it.
#
# Settings (environment variables; the first two are required):
#   TRITON_URL          the server's HTTP address, e.g. http://localhost:8000
#   MODEL               the model to gate
#   RATE_RPS            offered load, req/s (default 20)
#   P99_MS              fail when p99 > this, ms (default 100)
#   MIN_THROUGHPUT_RPS  fail when throughput < this, req/s (default 80 % of RATE_RPS)
#   MAX_ERROR_RATE      fail when the failed fraction > this (default 0)
#   BASELINE            a result.json to compare with (default baseline/result.json; skipped
#                       when the file does not exist, e.g. on the first run)
#   MAX_REGRESSION      tolerated worsening vs BASELINE, when significant (default 5%)
#   REPEATS             measurements (default 5; 3 or more for a regression to be decidable)
#   WARMUP_S, WINDOW_S, WINDOWS   per repeat: warm-up, window length, windows (default 2, 2, 2)
#   OUT_DIR             where result.json, junit.xml and summary.md go (default gate)
#   WAIT_S              how long to wait for the server and the model, s (default 300)
#   PERFSWEEP           the perfsweep command (default perfsweep)
#
# Exit status: perfsweep gate's (0 pass, 1 a criterion failed, 2 usage or input error, 3 the
# server failed); 3 as well when the server or the model is not ready within WAIT_S.
set -euo pipefail

: "${TRITON_URL:?set TRITON_URL to the Triton server's HTTP address, e.g. http://localhost:8000}"
: "${MODEL:?set MODEL to the name of the model to gate}"
RATE_RPS="${RATE_RPS:-20}"
P99_MS="${P99_MS:-100}"
MIN_THROUGHPUT_RPS="${MIN_THROUGHPUT_RPS:-$(awk -v r="$RATE_RPS" 'BEGIN { print r * 0.8 }')}"
MAX_ERROR_RATE="${MAX_ERROR_RATE:-0}"
BASELINE="${BASELINE:-baseline/result.json}"
MAX_REGRESSION="${MAX_REGRESSION:-5%}"
REPEATS="${REPEATS:-5}"
WARMUP_S="${WARMUP_S:-2}"
WINDOW_S="${WINDOW_S:-2}"
WINDOWS="${WINDOWS:-2}"
OUT_DIR="${OUT_DIR:-gate}"
WAIT_S="${WAIT_S:-300}"
PERFSWEEP="${PERFSWEEP:-perfsweep}"

case "$TRITON_URL" in
  http://* | https://*) base="${TRITON_URL%/}" ;;
  *) base="http://${TRITON_URL%/}" ;;
esac

# Poll a URL until it answers 200, at most WAIT_S seconds.
wait_for() {
  local url="$1" what="$2" deadline=$((SECONDS + WAIT_S))
  until curl --silent --fail --output /dev/null "$url"; do
    if ((SECONDS >= deadline)); then
      echo "gate-own-model: $what not ready after ${WAIT_S} s ($url); see the server's log" >&2
      exit 3
    fi
    sleep 1
  done
}

wait_for "$base/v2/health/ready" "the server"
echo "gate-own-model: the server at $base is ready; loading $MODEL"
if ! answer=$(curl --silent --show-error --request POST --data '{}' \
  --write-out '\n%{http_code}' "$base/v2/repository/models/$MODEL/load"); then
  echo "gate-own-model: the load request failed: $answer" >&2
  exit 3
fi
if [ "${answer##*$'\n'}" != "200" ]; then
  echo "gate-own-model: Triton refused to load $MODEL: ${answer%$'\n'*}" >&2
  echo "  start tritonserver with --model-control-mode=explicit and --model-repository" \
    "pointing at the repository that holds $MODEL" >&2
  exit 3
fi
wait_for "$base/v2/models/$MODEL/ready" "model $MODEL"

args=(
  --url "$base" --model "$MODEL"
  --rate-rps "$RATE_RPS" --p99-ms "$P99_MS" --min-throughput-rps "$MIN_THROUGHPUT_RPS"
  --max-error-rate "$MAX_ERROR_RATE"
  --repeats "$REPEATS" --warmup-s "$WARMUP_S" --window-s "$WINDOW_S" --windows "$WINDOWS"
  --junit "$OUT_DIR/junit.xml" --markdown "$OUT_DIR/summary.md" --output "$OUT_DIR/result.json"
)
if [ -f "$BASELINE" ]; then
  # Fails only when a change beyond MAX_REGRESSION is also statistically significant.
  args+=(--baseline "$BASELINE" --max-regression "$MAX_REGRESSION")
else
  echo "gate-own-model: no baseline at $BASELINE: absolute goals only"
fi
mkdir -p "$OUT_DIR"
exec "$PERFSWEEP" gate "${args[@]}"
