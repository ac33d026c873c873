"""Print the step model's share of the summed capacity against tickers an endpoint.

The model is docs/bench/fleet-tail-cache-model.py's ``night`` (one endpoint, the budget as
it is: fill 0.95, prompts +5%, 0.05 s between a chain's calls), run with the request limit's
doubling start and with every ticker started at once, so a fleet run at N tickers an
endpoint can be set beside it (docs/lab/2026-12-05-fleet-160-an-endpoint.md). The share is
the night's output (17 calls of 300 tokens a ticker) over its seconds and the 2,668.67 tok/s
an endpoint that the fleet JSONs give as ``summed_capacity_tok_s`` / endpoints. Also prints
the makespan 0.90 allows and the steps that leaves. ``PYTHONPATH=. python
docs/bench/fleet-model-by-tickers.py [N ...]`` (from the repository's root; default 100 130
160 200). About 10 s of CPU a night at 200: run it under the bench lock.
"""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "model", Path(__file__).with_name("fleet-tail-cache-model.py"))
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)

# Summed capacity, tok/s an endpoint: the fleet JSONs' summed_capacity_tok_s over endpoints.
PER_ENDPOINT = 13343.33 / 5
CALLS, TARGET = 17, 0.90

tickers_list = [int(a) for a in sys.argv[1:]] or [100, 130, 160, 200]
print("tickers  start      makespan  steps  share  | 0.90 makespan  steps it allows")
for tickers in tickers_list:
    tokens = tickers * CALLS * model.OUT
    allowed = tokens / PER_ENDPOINT / TARGET
    # The makespan less the steps' per-request cost (every running request's 0.2 ms a step,
    # i.e. B × all tokens), over the fixed 20 ms: the steps 0.90 leaves with nothing else.
    steps_allowed = (allowed - model.B * tokens) / model.A
    for label, starts in (("doubling", model.doubling(tickers)), ("at once", None)):
        seconds, steps = model.night(tickers, turn=0.05, starts=starts)
        share = tokens / seconds / PER_ENDPOINT
        print(f"{tickers:7d}  {label:9s} {seconds:8.2f} s {steps:6d}  {share:.3f}"
              f"  | {allowed:8.2f} s  {steps_allowed:8.0f}")
