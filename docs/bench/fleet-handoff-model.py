"""The step model of one simulated H200 at 100 tickers, with the client between budget and GPU.

docs/bench/fleet-tail-cache-model.py's endpoint and calls (20 ms + 0.2 ms a running request
a step, 1,488,240 KV tokens, 256 sequences, the synthetic workload at scale 0.2, outputs
300), with what that model leaves out (docs/lab/2026-12-06-fleet-100-an-endpoint.md):

- ``order``: ``tail`` (our gate: start order, the tail rule's urgent tickers first, longest
  remaining chain first; ``rounds`` from the chains the budget fits) or ``fifo`` (the
  server's own queue, ``fixed-all``: first ready, first in);
- ``claims``: reservations are the token budget's own ``claim`` under ``fill`` (× the
  factor) of the cache; without, the server's whole answers under ``fill`` of it;
- ``handoff``: seconds a reservation is held while the server does not run the call, on
  the way in (sent to admitted) and on the way out (last step to released at our gate);
- ``jitter``: a call runs 300 to 300 + ``jitter`` steps (steps sat out, joined mid-step),
  and a chain's next call is ready ``turn`` + up to ``turn_jitter`` s after the last ends:
  without them every call starts on a 300-step round and the model counts whole rounds.

``python docs/bench/fleet-handoff-model.py`` (from the checkout's root, with its .venv)
prints each case's makespan, steps and share of the summed capacity, over three seeds.
"""

import importlib.util
import random
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "model", Path(__file__).with_name("fleet-tail-cache-model.py"))
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)

A, B, KV, SEQS, OUT = model.A, model.B, model.KV, model.SEQS, model.OUT
CHAIN = 14  # the analysts' stage and 13 chained calls


def night(tickers=100, fill=0.95, claims=True, order="tail", turn=0.05, turn_jitter=0.0,
          handoff=0.0, jitter=0, seed=1):
    """Return (seconds, steps) of one endpoint's night, every ticker ready at 0."""
    rnd = random.Random(seed)
    from app.bench.workloads import synthetic_workload
    from app.config import load_settings
    workload = synthetic_workload(load_settings(llm_model="m"), tickers, 0.2, 0.2)
    calls = [model.sizes(workload[f"SYN{t:03d}"]) for t in range(tickers)]
    queue = [(0.0, t, i) for t in range(tickers) for i in range(4)]
    left, fan = [17] * tickers, [4] * tickers
    going_in, running, going_out = [], [], []
    now, steps, reserved, limit = 0.0, 0, 0, fill * KV
    while True:
        for call in [c for c in going_out if c[2] <= now]:
            going_out.remove(call)
            reserved -= call[3]
            t, i = call[0], call[1]
            left[t] -= 1
            ready = now + turn + rnd.uniform(0, turn_jitter)
            if i < 4:
                fan[t] -= 1
                if fan[t] == 0:
                    queue.append((ready, t, 4))
            elif i < 16:
                queue.append((ready, t, i + 1))
        if not any(left):
            return now, steps
        for call in [c for c in going_in if c[2] <= now]:
            going_in.remove(call)
            running.append([call[0], call[1], 0, call[3], OUT + rnd.randint(0, jitter)])
        if order == "tail":
            per = sum(c[3] for c in running) / len(running) if running else calls[0][0][0]
            rounds = sum(left) / max(1, int(limit / per)) - 1

            def key(q, rounds=rounds):
                chain = min(left[q[1]], CHAIN)
                return -(1 + chain) * 10**6 + q[1] if chain >= rounds else q[1]
        else:
            def key(q):
                return q
        for q in sorted((q for q in queue if q[0] <= now), key=key):
            cost = calls[q[1]][q[2]][0 if claims else 1]
            held = running or going_in or going_out
            if held and (reserved + cost > limit or len(running) + len(going_in) >= SEQS):
                break  # nobody passes the first in line
            queue.remove(q)
            reserved += cost
            going_in.append([q[1], q[2], now + handoff, cost])
        if not running:
            # Idle: on to the next handoff or ready call (one ready now waits for room).
            now = min([c[2] for c in going_in + going_out] + [q[0] for q in queue if q[0] > now])
            continue
        now += A + B * len(running)
        steps += 1
        for call in running:
            call[2] += 1
        for call in [c for c in running if c[2] >= c[4]]:
            running.remove(call)
            going_out.append([call[0], call[1], now + handoff, call[3]])


def share(seconds, tickers=100):
    """Return the night's share of the summed capacity (2,668.6 tok/s an endpoint)."""
    return tickers * 17 * OUT / seconds / 2668.6


if __name__ == "__main__":
    noisy = dict(jitter=3, turn_jitter=0.1)
    cases = (
        ("whole rounds: the budget, our gate", {}),
        ("whole rounds: the server's queue, whole cache", dict(order="fifo", fill=1.0,
                                                               claims=False)),
        ("the server's queue, whole answers, whole cache (fixed-all)",
         dict(order="fifo", fill=1.0, claims=False, **noisy)),
        ("the budget (fill 0.95, prompts +5%), our gate (adaptive)", noisy),
        ("the budget at fill 0.98 x factor 1.05", dict(fill=0.98 * 1.05, **noisy)),
        ("the budget, handoffs 0.05 s each way", dict(handoff=0.05, **noisy)),
        ("the budget, handoffs 0.10 s each way", dict(handoff=0.10, **noisy)),
        ("the budget, handoffs 0.20 s each way", dict(handoff=0.20, **noisy)),
        ("fill 0.98 x 1.05, handoffs 0.20 s each way", dict(fill=0.98 * 1.05, handoff=0.20,
                                                             **noisy)),
    )
    for label, kw in cases:
        runs = [night(seed=seed, **kw) for seed in (1, 2, 3)]
        print(f"{label:62s} " + "  ".join(f"{s:6.1f} s {n:5d} steps {share(s):.3f}"
                                           for s, n in runs))
