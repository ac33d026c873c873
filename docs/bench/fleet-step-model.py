"""A step model of one simulated H200 at 100 tickers: what order and margins allow (a model).

Not the bench (tests/bench/fleet.py is): the fleet endpoint's step (20 ms + 0.2 ms a running
request), its 1,488,240 KV tokens and 256 sequences, and the synthetic ticker (4 analysts of
4,000 prompt tokens side by side, then 13 calls of 6,000 to 20,000, 300 tokens out each, all
exactly 300 steps long, so the chains move in lockstep). Calls wait in one queue and start
while ``reserved + prompt × margin + 300 ≤ fill × capacity`` (the token budget's fill and
prompt margin), nobody passing the first in line. ``order``: ``start`` (the ticker's start
order), ``fifo`` (ready first), ``chain`` (longest remaining chain first: every ticker
urgent). The tail rule itself is not modelled. ``python docs/bench/fleet-step-model.py``.
"""

A, B = 0.020, 0.0002
KV, MAX_SEQS, OUT = 1_488_240, 256, 300
STEP = (20_000 - 6_000) / 12
PROMPTS = [4_000] * 4 + [round(6_000 + i * STEP) for i in range(13)]


def night(tickers=100, fill=0.95, margin=1.05, order="start"):
    """Return (seconds, steps, mean running) of one night."""
    waiting, seq = [], 0
    left = {t: 17 for t in range(tickers)}
    analysts = {t: 4 for t in range(tickers)}
    for t in range(tickers):
        for i in range(4):
            waiting.append((t, i, seq))
            seq += 1
    running, reserved, seconds, steps, done, summed = [], 0.0, 0.0, 0, 0, 0

    def key(entry):
        t, _, s = entry
        return {"start": (t, 0), "fifo": (s, 0), "chain": (-min(left[t], 14), t)}[order]

    while done < tickers * 17:
        waiting.sort(key=key)
        while waiting and len(running) < MAX_SEQS:
            t, i, _ = waiting[0]
            tokens = PROMPTS[i] * margin + OUT
            if running and reserved + tokens > KV * fill:
                break
            waiting.pop(0)
            running.append([t, i, 0, tokens])
            reserved += tokens
        seconds += A + B * len(running)
        steps += 1
        summed += len(running)
        for call in running:
            call[2] += 1
        for call in [c for c in running if c[2] >= OUT]:
            running.remove(call)
            reserved -= call[3]
            done += 1
            t, i = call[0], call[1]
            left[t] -= 1
            if i < 4:
                analysts[t] -= 1
                if analysts[t] == 0:
                    waiting.append((t, 4, seq))
                    seq += 1
            elif i < 16:
                waiting.append((t, i + 1, seq))
                seq += 1
    return seconds, steps, summed / steps


if __name__ == "__main__":
    BOUND = 191.1  # the graph bound of this night (docs/bench/fleet-sim-100-tickers-*.json)
    for order in ("start", "fifo", "chain"):
        for fill, margin in ((0.95, 1.05), (0.95, 1.0), (1.0, 1.0)):
            s, n, r = night(fill=fill, margin=margin, order=order)
            print(f"order {order:5} fill {fill:.3f} margin {margin:.2f}: {s:6.1f} s, "
                  f"{n} steps, {r:5.1f} running, {BOUND / s:.3f} of the bound")
