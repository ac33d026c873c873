"""A step model of one simulated H200 with the fleet bench's own calls: where its cache binds.

Not the bench (tests/bench/fleet.py is): the stepped endpoint's step (20 ms + 0.2 ms a
running request), 1,488,240 KV tokens, 256 sequences, and the synthetic workload's calls
(app/bench/workloads.py at scale 0.2, outputs 300: 4 analysts of ~4,800 counted prompt
tokens, then 13 calls whose prompts grow to ~23,600). Every call is exactly 300 steps. A
call starts when its reservation fits the budget (``claims``: the token budget's own
``TokenBudget.claim`` at the server's ratio, under ``fill`` of the cache; else the server's
whole answer, prompt + 300, under the whole cache), nobody passing the first in line;
``order``: ``chain`` (longest remaining chain first, the tail rule with every ticker urgent)
or ``start``. ``starts``: when each ticker's analysts are sent; ``turn``: seconds between a
call's end and its ticker's next call. ``python docs/bench/fleet-tail-cache-model.py``
(from the checkout's root, with its .venv).
"""

import math

from app.bench.workloads import synthetic_workload
from app.config import load_settings
from app.promptsize import Counted
from app.traffic.budget import TokenBudget, prompt_bytes

A, B, KV, SEQS, OUT = 0.020, 0.0002, 1_488_240, 256, 300


def sizes(items):
    """Return each call's (budget claim, server's whole answer in blocks)."""
    budget = TokenBudget(capacity=KV)
    first = prompt_bytes(items[0].body)
    budget.counted = Counted(first, math.ceil(first / 4 * 5))  # the server's count: ×5 / 4
    return [(budget.claim(it.node, it.body).tokens,
             math.ceil((math.ceil(prompt_bytes(it.body) / 4 * 5) + OUT) / 16) * 16)
            for it in items]


def night(tickers, fill=0.95, claims=True, order="chain", starts=None, turn=0.0, trace=None):
    """Return (seconds, steps) of one endpoint's night; ``trace`` (a list) gets, every step,
    (seconds, running, ready but not admitted, reserved, KV held, running stages, ready stages)
    with a stage as the rows scripts count it (0: an analyst, 1..13 the chain's calls)."""
    workload = synthetic_workload(load_settings(llm_model="m"), tickers, 0.2, 0.2)
    calls = [sizes(workload[f"SYN{t:03d}"]) for t in range(tickers)]
    starts = starts or [0.0] * tickers
    queue = [(starts[t], t, i) for t in range(tickers) for i in range(4)]
    running, left, fan = [], [17] * tickers, [4] * tickers
    now, steps, reserved = 0.0, 0, 0
    while any(left):
        ready = sorted((q for q in queue if q[0] <= now),
                       key=lambda q: (q[1], q[2]) if order == "start" else (-left[q[1]], q[1]))
        for q in ready:
            cost = calls[q[1]][q[2]][0 if claims else 1]
            if running and (reserved + cost > fill * KV or len(running) >= SEQS):
                break
            queue.remove(q)
            running.append([q[1], q[2], 0, cost])
            reserved += cost
        if not running:
            now = min(q[0] for q in queue)
            continue
        if trace is not None:
            waiting = [q for q in queue if q[0] <= now]
            held = sum(calls[c[0]][c[1]][1] - OUT + c[2] for c in running)  # prompts + made
            trace.append((now, len(running), len(waiting), reserved, held,
                          [max(0, c[1] - 3) for c in running],
                          [max(0, q[2] - 3) for q in waiting]))
        now += A + B * len(running)
        steps += 1
        for call in running:
            call[2] += 1
        for call in [c for c in running if c[2] >= OUT]:
            running.remove(call)
            reserved -= call[3]
            t, i = call[0], call[1]
            left[t] -= 1
            if i < 4:
                fan[t] -= 1
                if fan[t] == 0:
                    queue.append((now + turn, t, 4))
            elif i < 16:
                queue.append((now + turn, t, i + 1))
    return now, steps


def doubling(tickers):
    """The request limit's start: 8 requests (2 tickers) at once, doubling each second."""
    return [0.0 if t < 2 else float(math.floor(math.log2((t + 1) / 2)) + 1)
            for t in range(tickers)]


if __name__ == "__main__":
    # 500 over 8: 62 or 63 tickers an endpoint, graph bound 147.75 s (the chain).
    # 500 over 5: 100 an endpoint, summed capacity 2,668.6 tok/s an endpoint.
    for tickers, share in ((62, lambda s: 147.75 / s), (63, lambda s: 147.75 / s),
                           (100, lambda s: 100 * 17 * OUT / s / 2668.6)):
        for label, kw in (("server's whole answers, whole cache", dict(fill=1.0, claims=False)),
                          ("budget (fill 0.95, prompts +5%)", {}),
                          ("budget, start order", dict(order="start")),
                          ("budget, turn 0.05 s", dict(turn=0.05)),
                          ("budget, turn 0.05 s, doubling start",
                           dict(turn=0.05, starts=doubling(tickers)))):
            seconds, steps = night(tickers, **kw)
            print(f"{tickers:3d} tickers  {label:40s} {seconds:7.2f} s  {steps} steps  "
                  f"{share(seconds):.3f}")
