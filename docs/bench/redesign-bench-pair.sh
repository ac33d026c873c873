#!/usr/bin/env bash
# make bench's two parts on an older commit and on this checkout, back to back, against one
# cpu-tiny server (run from the repository root after `make setup vllm-env model`):
#   git worktree add /tmp/old ace8187 && ln -s "$PWD/.venv" "$PWD/var" /tmp/old/
#   OLD=/tmp/old bash docs/bench/redesign-bench-pair.sh      # JSON and logs in var/bench/pair
# Each tree runs its own code (PYTHONPATH) on a database of its own.
set -u
OLD=${OLD:?set OLD to a worktree of the older commit}
NEW=$PWD
S="--tickers 24 --scale 0.005 --output-scale 0.02 --strategies fixed-3,fixed-8,fixed-all,adaptive,flood"
OUTD=${OUTD:-$NEW/var/bench/pair}; mkdir -p "$OUTD"; rm -f /tmp/bench-old.db /tmp/bench-new.db
export NIGHTDESK_CONFIG=deploy/cpu-tiny.toml NIGHTDESK_HOME=var
PYTHONPATH=$NEW .venv/bin/nightdesk server start --profile cpu-tiny || exit 1
trap 'cd "$NEW"; PYTHONPATH=$NEW .venv/bin/nightdesk server stop --profile cpu-tiny' EXIT
(cd "$OLD" && PYTHONPATH=$OLD NIGHTDESK_DATABASE_URL=sqlite:////tmp/bench-old.db \
  .venv/bin/nightdesk bench schedulers $S --json-out "$OUTD/schedulers-old.json") > "$OUTD/old.log" 2>&1
(cd "$NEW" && PYTHONPATH=$NEW NIGHTDESK_DATABASE_URL=sqlite:////tmp/bench-new.db \
  .venv/bin/nightdesk bench schedulers $S --json-out "$OUTD/schedulers-new.json") > "$OUTD/new.log" 2>&1
# The tracker bench: a command of the package before the redesign, a module of tests/ after.
(cd "$OLD" && PYTHONPATH=$OLD .venv/bin/nightdesk bench tracker \
  --json-out "$OUTD/tracker-old.json") > "$OUTD/tr-old.log" 2>&1
(cd "$NEW" && PYTHONPATH=$NEW .venv/bin/python -m tests.bench.tracker \
  --json-out "$OUTD/tracker-new.json") > "$OUTD/tr-new.log" 2>&1
grep -hE "^  (met|MISSED)" "$OUTD/old.log" "$OUTD/new.log"
