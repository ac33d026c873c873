#!/usr/bin/env bash
# make bench's two parts on an older commit and on this checkout, against one cpu-tiny server
# (run from the repository root after `make setup vllm-env model`):
#   git worktree add /tmp/old ace8187 && ln -s "$PWD/.venv" "$PWD/var" /tmp/old/
#   OLD=/tmp/old bash docs/bench/redesign-bench-pair.sh      # JSON and logs in var/bench/pair
# Each tree runs its own code (PYTHONPATH) on a database of its own. ORDER (default
# "old new") is the order of the scheduler runs, each of REPEAT rounds (default 1) over
# STRATEGIES (default make bench's): "old new new old" interleaves two runs of each, so that a
# drift of the machine's load falls on both; `nightdesk bench combine` then pools each side's
# files. TRACKER=0 skips the tracker bench (run once per side, after the scheduler runs).
set -u
OLD=${OLD:?set OLD to a worktree of the older commit}
NEW=$PWD
STRATEGIES=${STRATEGIES:-fixed-3,fixed-8,fixed-all,fixed-all:tail=on,adaptive,flood}
S="--tickers 24 --scale 0.005 --output-scale 0.02 --strategies $STRATEGIES --repeat ${REPEAT:-1}"
OUTD=${OUTD:-$NEW/var/bench/pair}; mkdir -p "$OUTD"
export NIGHTDESK_CONFIG=deploy/cpu-tiny.toml NIGHTDESK_HOME=var
PYTHONPATH=$NEW .venv/bin/nightdesk server start --profile cpu-tiny || exit 1
trap 'cd "$NEW"; PYTHONPATH=$NEW .venv/bin/nightdesk server stop --profile cpu-tiny' EXIT
i=0
for side in ${ORDER:-old new}; do
  i=$((i + 1)); tree=$NEW; [ "$side" = old ] && tree=$OLD
  echo "$(date -u +%T) run $i: $side ($(uptime | sed 's/.*load/load/'))" | tee -a "$OUTD/order.log"
  rm -f "/tmp/bench-$side-$i.db"
  (cd "$tree" && PYTHONPATH=$tree NIGHTDESK_DATABASE_URL="sqlite:////tmp/bench-$side-$i.db" \
    .venv/bin/nightdesk bench schedulers $S --json-out "$OUTD/schedulers-$side-$i.json") \
    > "$OUTD/$side-$i.log" 2>&1
  echo "$(date -u +%T) run $i ended, status $? ($(uptime | sed 's/.*load/load/'))" | tee -a "$OUTD/order.log"
done
if [ "${TRACKER:-1}" != 0 ]; then
  # The tracker bench: a command of the package before the redesign, a module of tests/ after.
  tracker() { local tree=$1; shift
              if [ -f "$tree/tests/bench/tracker.py" ]; then .venv/bin/python -m tests.bench.tracker "$@"
              else .venv/bin/nightdesk bench tracker "$@"; fi; }
  (cd "$OLD" && PYTHONPATH=$OLD tracker "$OLD" --json-out "$OUTD/tracker-old.json") > "$OUTD/tr-old.log" 2>&1
  (cd "$NEW" && PYTHONPATH=$NEW tracker "$NEW" --json-out "$OUTD/tracker-new.json") > "$OUTD/tr-new.log" 2>&1
fi
grep -hE "^  (met|MISSED)" "$OUTD"/old-*.log "$OUTD"/new-*.log
