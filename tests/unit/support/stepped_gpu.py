"""A GPU server modelled step by step, to compare admission policies in seconds, not days.

Not a benchmark (the H200 is, docs/performance.md): a model of what decides the H200's
numbers at the bench's shapes. Each step every running request decodes one token; at most
``max_seqs`` run; a waiting request starts when its prompt's blocks fit the KV cache; a
step whose cache overflows preempts the newest request, which waits to be prefilled again
(prompt and tokens so far). A step that runs ``r`` requests and prefills ``p`` tokens
takes ``1 + seq_cost * r + p / p_equiv`` units of time, so a bigger batch decodes each of
its requests slower and recomputed prefill is paid for. With ``prefix_cache`` a ticker's
downstream calls share its context (``SHARED`` tokens, as the bench's prompts do): when one
finishes, the context's blocks stay cached in the free part of the cache, least recently
used first out when a request needs the room, and a later call of the ticker that finds
them prefills only the rest; a call that runs beside another of its ticker's shares the
blocks. A reading is pushed every ``read_every`` steps, as the /metrics reader pushes one.
With its defaults it is the H200 run's server (49,152 KV tokens, 32 sequences), and at the
40-ticker shape it reproduced that run's ramp (tickers in flight 8/12/14/16 at 10/20/30/45 s against
8/12/14/16) and its ranking of adaptive and fixed-14. ``flood`` sends every call of every
ticker at once, as the bench's flood arm does.

    python -m tests.unit.support.stepped_gpu --tickers 40 --out 300 fixed-14 adaptive \
        adaptive:prefetch=off

(``adaptive`` prefetches by default; the model tables of
docs/lab/2026-12-01-prefetching-stepped-model.md were made before that, when ``adaptive``
was today's ``adaptive:prefetch=off``.)
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from agents.chat import CallTag
from app.traffic.client import TickerClient
from app.traffic.scheduler import Job
from app.traffic.strategy import Strategy
from tests.unit.support.budget_sim import G, KVGauges, body
from tests.unit.support.servers import over_one_server

ANALYST_PROMPT = 900  # tokens, the bench's shape at scale 0.2 (app/bench/workloads.py)
CHAIN_FIRST, CHAIN_LAST = 1_300, 4_400


@dataclass
class Request:
    prompt: int
    out: int
    done: asyncio.Future[None]
    seq: int
    generated: int = 0
    ticker: str = ""
    shared: int = 0  # leading tokens of the ticker's context (0: none)
    borrowed: int = 0  # of those, tokens another running call of the ticker holds


class SteppedGPU(KVGauges):
    """The server: ``attempt`` as TrackedLLM's, ``latest`` and ``push`` as the reader's."""

    def __init__(self, capacity: int = 49_152, max_seqs: int = 32, block: int = 16,
                 step_s: float = 0.001, read_every: int = 50, prefill_per_step: int = 8_192,
                 p_equiv: int = 1_000, prefix_cache: bool = False,
                 seq_cost: float = 0.0) -> None:
        self.capacity, self.max_seqs, self.block = capacity, max_seqs, block
        self.step_s, self.read_every = step_s, read_every
        self.prefill_per_step, self.p_equiv = prefill_per_step, p_equiv
        self.settings = SimpleNamespace(calls=SimpleNamespace(max_concurrency=256))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = self.generated = self.steps = self.prefilled = 0
        self.time = 0.0  # in steps, prefill paid for
        self.tokens_per_step: list[int] = []
        self._latest = G()
        self._seq = 0
        self.prefix_cache = prefix_cache
        self.seq_cost = seq_cost  # a step's time grows by this per running request
        self.cached: OrderedDict[str, int] = OrderedDict()  # ticker -> context tokens, LRU
        self.hits = self.sent = 0  # prompt tokens found cached, and sent
        # Where readings go: the server's, wired by the test (support/servers.one_server).
        self.push: Callable[[G], None] | None = None

    @property
    def latest(self) -> G:
        return self._latest

    def _blocks(self, request: Request) -> int:
        return math.ceil((request.prompt - request.borrowed + request.generated + 1)
                         / self.block)

    def used(self) -> int:
        return sum(self._blocks(r) for r in self.running) * self.block

    def _cached_tokens(self) -> int:
        return sum(math.ceil(t / self.block) * self.block for t in self.cached.values())

    def _make_room(self, needed: int) -> bool:
        """Evict cached contexts, oldest first, until ``needed`` more tokens fit."""
        while self.used() + self._cached_tokens() + needed > self.capacity and self.cached:
            self.cached.popitem(last=False)
        return self.used() + needed <= self.capacity

    def _admit(self, request: Request) -> int:
        """Start ``request``; return the tokens it prefills (its cached context spared)."""
        request.borrowed, hit = 0, 0
        if self.prefix_cache and request.shared:
            if any(r.ticker == request.ticker and r.shared for r in self.running):
                request.borrowed = hit = request.shared  # in use beside it: shared blocks
            elif self.cached.pop(request.ticker, None) is not None:
                hit = request.shared  # cached: its blocks are this request's again
        self.hits += hit
        self.running.append(request)
        return request.prompt - hit + request.generated

    def _finish(self, request: Request) -> None:
        self.running.remove(request)
        if self.prefix_cache and request.shared and not request.borrowed:
            self.cached[request.ticker] = request.shared
            self.cached.move_to_end(request.ticker)

    async def attempt(self, tag: CallTag, call: Any, body: dict[str, Any], *,
                      priority: int | None = None, ready_at: Any = None,
                      trimmed: Any = None) -> SimpleNamespace:
        # Called with the gate's place held, as TrackedLLM's attempt is.
        size = sum(len(m["content"].encode()) for m in body["messages"])
        self._seq += 1
        self.sent += size // 4
        ticker, shared = body.get("prefix", ("", 0))
        request = Request(size // 4, body["max_tokens"],
                          asyncio.get_running_loop().create_future(), self._seq,
                          ticker=ticker, shared=shared)
        self.waiting.append(request)
        await request.done
        return SimpleNamespace(prompt_tokens=size // 4, completion_tokens=body["max_tokens"])

    async def serve(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.step()
            await asyncio.sleep(self.step_s)

    def step(self) -> None:
        self.steps += 1
        prefill, room = 0, self.prefill_per_step
        while self.waiting and len(self.running) < self.max_seqs and room > 0:
            head = self.waiting[0]
            if not self._make_room(self._blocks(head) * self.block):
                break
            work = self._admit(self.waiting.popleft())
            room -= work
            prefill += work
        for request in self.running:
            request.generated += 1
        tokens = len(self.running)
        self._make_room(0)
        while self.used() > self.capacity and self.running:
            victim = max(self.running, key=lambda r: r.seq)  # the newest, as vLLM's FCFS
            self.running.remove(victim)
            victim.borrowed = 0
            self.waiting.appendleft(victim)
            self.preemptions += 1
        self.prefilled += prefill
        self.generated += tokens
        self.time += 1 + self.seq_cost * tokens + prefill / self.p_equiv
        self.tokens_per_step.append(tokens)
        for request in [r for r in self.running if r.generated >= r.out]:
            self._finish(request)
            request.done.set_result(None)
        if self.steps % self.read_every == 0:
            self._latest = G(kv_cache_usage=min(1.0, self.used() / self.capacity),
                             preemptions_total=self.preemptions,
                             generation_tokens_total=self.generated,
                             running=len(self.running), waiting=len(self.waiting),
                             taken_at=datetime.now(UTC))
            if self.push is not None:
                self.push(self._latest)


SHARED = 1_000  # a ticker's context at the head of each downstream prompt (the bench's)


def _body(tokens: int, out: int, prefix: tuple[str, int] | None = None) -> dict[str, Any]:
    sized = body(tokens * 4 + 2, out)  # the server counts a token per 4 bytes
    if prefix is not None:
        sized["prefix"] = prefix  # read by the model's server only
    return sized


def ticker(key: str, out: int, spans: dict[str, list[int]], gpu: SteppedGPU,
           flood: bool = False) -> Job:
    """A ticker of the bench's shape: four analysts side by side, then 13 growing calls."""
    def step(n: int) -> dict[str, Any]:
        return _body(round(CHAIN_FIRST + n * (CHAIN_LAST - CHAIN_FIRST) / 12), out,
                     (key, SHARED))

    async def run(gated: TickerClient) -> None:
        spans[key] = [gpu.steps, -1]
        analysts = [gated.send(CallTag(1, key, f"analyst{i}", 0), _body(ANALYST_PROMPT, out))
                    for i in range(4)]
        if flood:  # dependencies ignored
            await asyncio.gather(*analysts, *(gated.send(CallTag(1, key, f"step{n}", 0),
                                                         step(n)) for n in range(13)))
        else:
            await asyncio.gather(*analysts)
            for n in range(13):
                await gated.send(CallTag(1, key, f"step{n}", 0), step(n))
        spans[key][1] = gpu.steps
    return Job(key, run, requests=17, chain=14)


def run(strategy: str, tickers: int = 40, out: int = 300, **server: Any) -> dict[str, Any]:
    """Run one batch under ``strategy``; return its output per step of time and its ramp."""
    gpu = SteppedGPU(**server)
    flood = strategy == "flood"
    chosen = Strategy.parse("fixed-all" if flood else strategy)
    scheduler = over_one_server(gpu, chosen, gauges=gpu)
    spans: dict[str, list[int]] = {}

    async def batch() -> None:
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(gpu.serve(stop))
            try:
                # A ticker that fails raises here.
                await scheduler.run([ticker(f"T{i:03d}", out, spans, gpu, flood)
                                     for i in range(tickers)])
            finally:
                stop.set()

    asyncio.run(batch())
    second = gpu.read_every  # a reading a second, as the H200 bench's sampler

    def in_flight(at: int) -> int:
        return sum(1 for a, b in spans.values() if a <= at < (b if b >= 0 else 1 << 60))

    window = 30 * second
    return {"strategy": strategy, "output_per_step": round(gpu.generated / gpu.time, 2),
            "preemptions": gpu.preemptions, "prefix_hit": round(gpu.hits / max(1, gpu.sent), 3),
            "in_flight_10_20_30_45": [in_flight(s * second) for s in (10, 20, 30, 45)],
            "first_30_per_step": round(sum(gpu.tokens_per_step[:window]) / window, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategies", nargs="+")
    parser.add_argument("--tickers", type=int, default=40)
    parser.add_argument("--out", type=int, default=300, help="output tokens per call")
    parser.add_argument("--p-equiv", type=int, default=1_000,
                        help="prefill tokens that cost one decode step")
    parser.add_argument("--prefix-cache", action="store_true")
    parser.add_argument("--seq-cost", type=float, default=0.0,
                        help="a step's added time per running request")
    args = parser.parse_args()
    for strategy in args.strategies:
        print(run(strategy, args.tickers, args.out, p_equiv=args.p_equiv,
                  prefix_cache=args.prefix_cache, seq_cost=args.seq_cost), flush=True)


if __name__ == "__main__":
    main()
