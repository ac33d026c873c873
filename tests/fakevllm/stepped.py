"""Stepped vLLM servers on 127.0.0.1: the fake server's load, decoding in steps like a GPU.

Each endpoint is a model of a vLLM server, served over HTTP by uvicorn: its queue, KV cache
and ``/metrics`` are the fake server's (tests/fakevllm/load.py: a request starts when its
whole answer fits the cache, so it never preempts), and it decodes in steps. A step gives
one token to every request admitted before it began and takes ``(a + b × running) ÷
speedup`` seconds; tokens
go out 16 to a chunk (vLLM's ``--stream-interval 16``, the GPU profiles'). The defaults are
the H200 of the 100-ticker MoE night (docs/performance.md): 1,488,240 KV tokens, 256
sequences, and a step of 20 ms + 0.2 ms per running request (2,222 tok/s at the 79.5
requests that night kept running; measured 2,264). Prompts may be sent shorter than they are
counted (``prompt_weight``): the cache and the step see production's prompts, the client
sends a fraction of their bytes.

Each endpoint keeps a prefix cache of the prompts it was sent (``PrefixCache``): blocks of
the prompt's text, chained like vLLM's block hashes and salted by ``cache_salt``, least
recently used out past ``kv_tokens``. It only counts (``vllm:prefix_cache_hits``, the
usage's ``cached_tokens``): a step costs the same whatever was cached, as the step model has
no prefill, so the hit rate says where a router placed a ticker's calls, not what it saved.

Each endpoint also says how far its own process kept to the model's clock
(``GET /fleet/stepper``, ``StepperRecord``): a host that runs it late delivers tokens late,
which a real GPU would not, and the fleet bench reports it beside the client's figures.

The fleet bench (tests/bench/fleet.py) serves them in a process of their own:
``python -m tests.fakevllm.stepped --ports 18100,18101 ...``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import math
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from app.bench.plan import H200_MOE
from app.traffic.budget import prompt_bytes
from tests.fakevllm.load import Sequence, ServerLoad
from tests.fakevllm.server import serving

MODEL = "fleet-model"
MAX_CATCH_UP = 64  # steps one late wake-up may run at once
MAX_MODEL_LEN = 65_536


@dataclass(frozen=True)
class GPUModel:
    """One endpoint's capacity and speed (the module's defaults: the H200 MoE night's)."""

    # ``nightdesk plan``'s h200-moe endpoint: the simulation and the plan model one server.
    kv_tokens: int = H200_MOE.kv_tokens
    max_num_seqs: int = H200_MOE.max_num_seqs
    step_a_s: float = H200_MOE.step_a_s
    step_b_s: float = H200_MOE.step_b_s
    speedup: float = 1.0  # time compression: every step this many times shorter
    stream_interval: int = 16
    prompt_weight: float = 1.0  # counted prompt tokens per token of text sent

    def step_s(self, running: int) -> float:
        return (self.step_a_s + self.step_b_s * running) / self.speedup


class PrefixCache:
    """Which prompt prefixes an endpoint holds: blocks of ``block_chars`` characters of the
    request's messages, each hash chained to the block before (vLLM's prefix-cache rule: a
    block is reused only after the same blocks), evicted least recently used past
    ``capacity_tokens`` counted tokens."""

    def __init__(self, capacity_tokens: int, tokens_per_block: float,
                 block_chars: int = 256) -> None:
        self.block_chars = block_chars
        self.tokens_per_block = tokens_per_block
        self.capacity = max(1, int(capacity_tokens / tokens_per_block))  # in blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def admit(self, body: dict[str, Any]) -> int:
        """Return the counted tokens of ``body``'s prompt already cached (its leading blocks
        found); cache all of its whole blocks."""
        text = json.dumps(body.get("messages"), ensure_ascii=False, sort_keys=True)
        chain, hits, missed = hash(body.get("cache_salt")), 0, False
        for start in range(0, len(text) - self.block_chars + 1, self.block_chars):
            chain = hash((chain, text[start:start + self.block_chars]))
            if not missed and chain in self.blocks:
                hits += 1
                self.blocks.move_to_end(chain)
                continue
            missed = True
            self.blocks[chain] = None
            if len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
        return int(hits * self.tokens_per_block)


@dataclass
class StepperRecord:
    """How one endpoint's stepper kept to the model's clock: the harness's share of a night.

    ``late_s``: at each wake-up, seconds past the due end of the step it woke for (the
    process's own lag); ``ends_late_s``: for each request, seconds from its last step's due
    end to its last chunk being queued (what the client waits beyond the model).
    """

    steps: int = 0
    modelled_s: float = 0.0  # Σ of the steps' modelled durations
    bunched: int = 0  # steps run at a wake-up past the first (the process was late)
    joined_late: int = 0  # steps a running request sat out: admitted after they began
    late_s: list[float] = field(default_factory=list)
    ends_late_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def spread(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            ordered = sorted(values)
            return {"mean": sum(ordered) / len(ordered),
                    "p50": ordered[len(ordered) // 2],
                    "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                    "max": ordered[-1], "sum": sum(ordered), "count": len(ordered)}
        return {"steps": self.steps, "modelled_s": self.modelled_s, "bunched": self.bunched,
                "joined_late": self.joined_late,
                "late_s": spread(self.late_s), "ends_late_s": spread(self.ends_late_s)}


@dataclass(eq=False)
class _Stream:
    seq: Sequence
    ready: asyncio.Queue[int] = field(default_factory=asyncio.Queue)  # tokens to send


class SteppedEndpoint:
    """A vLLM server modelled step by step (see the module); ``app`` is its ASGI app."""

    def __init__(self, gpu: GPUModel) -> None:
        self.gpu = gpu
        self.load = ServerLoad(capacity=gpu.max_num_seqs, kv_tokens=gpu.kv_tokens,
                               model=MODEL)
        self.streams: dict[int, _Stream] = {}
        self.busy = asyncio.Event()
        # A block of prompt text is block_chars ÷ 4 tokens sent, × prompt_weight counted.
        self.prefix = PrefixCache(gpu.kv_tokens, 256 / 4 * gpu.prompt_weight)
        self._ids = itertools.count(1)
        self.record = StepperRecord()
        self.app = Starlette(routes=[
            Route("/fleet/stepper", self.stepper),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models), Route("/tokenize", self.tokenize,
                                                    methods=["POST"]),
            Route("/health", self.health), Route("/metrics", self.metrics)])

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        return max(1, math.ceil(prompt_bytes(body) / 4 * self.gpu.prompt_weight))

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "max_model_len": MAX_MODEL_LEN}]})

    async def tokenize(self, request: Request) -> Response:
        count = self._prompt_tokens(await request.json())
        return JSONResponse({"count": count, "max_model_len": MAX_MODEL_LEN, "tokens": []})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.load.metrics_text())

    async def stepper(self, request: Request) -> Response:
        return JSONResponse(self.record.summary())

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        prompt = self._prompt_tokens(body)
        seq = Sequence(prompt, int(body.get("max_tokens") or 1),
                       min(prompt, self.prefix.admit(body)))
        stream = _Stream(seq)
        await self.load.enter(seq)
        key = id(seq)
        self.streams[key] = stream
        self.busy.set()
        rid = f"chatcmpl-fleet-{next(self._ids)}"
        return StreamingResponse(self._sse(key, stream, rid), media_type="text/event-stream")

    async def _sse(self, key: int, stream: _Stream, rid: str) -> AsyncIterator[bytes]:
        seq = stream.seq

        def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
            return (b"data: " + json.dumps({"id": rid, "object": "chat.completion.chunk",
                                            "created": 0, "model": MODEL, "choices": choices,
                                            "usage": usage}).encode() + b"\n\n")

        try:
            sent = 0
            while sent < seq.completion_tokens:
                tokens = await stream.ready.get()
                sent += tokens
                yield event([{"index": 0, "delta": {"content": " tok" * tokens},
                              "finish_reason": None}])
            yield event([{"index": 0, "delta": {}, "finish_reason": "length"}],
                        {"prompt_tokens": seq.prompt_tokens,
                         "prompt_tokens_details": {"cached_tokens": seq.cached_tokens},
                         "completion_tokens": seq.completion_tokens,
                         "total_tokens": seq.prompt_tokens + seq.completion_tokens})
            yield b"data: [DONE]\n\n"
        finally:
            self.streams.pop(key, None)
            self.load.leave(seq, "length" if seq.generated >= seq.completion_tokens else None)

    async def serve_steps(self) -> None:
        """Decode: one token per running request per step, sent every ``stream_interval``.

        Steps keep to the model's clock, not to wake-ups: a wake-up that comes late (a busy
        host) runs every step that fell due meanwhile, so the endpoint's speed is the
        model's whatever the host's timer latency. A step serves the requests admitted
        before it began, as a GPU's batch is set when its step starts: one admitted later,
        or during a late wake-up's missed steps, waits for the next.
        """
        loop = asyncio.get_running_loop()
        record = self.record
        due = loop.time()
        while True:
            if not self.streams:
                self.busy.clear()
                await self.busy.wait()
                due = loop.time()
            step = self.gpu.step_s(len(self.load.running))
            due += step
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            dues, record.modelled_s = [due], record.modelled_s + step
            while now >= due + step and len(dues) < MAX_CATCH_UP:
                due += step
                dues.append(due)
                record.modelled_s += step
            record.steps += len(dues)
            record.bunched += len(dues) - 1
            record.late_s.append(now - dues[0])
            self._step(len(dues), [d - step for d in dues], now - dues[-1])

    def _step(self, steps: int, starts: list[float] | None = None, late: float = 0.0) -> None:
        """Give every running request up to ``steps`` tokens; wake its stream per chunk.

        ``starts``: when each step began on the model's clock; a request admitted after a
        step began gets no token of it, and one that ends is recorded as late as its last
        step's end is behind the wake-up (``late``: the last step's own).
        """
        interval = self.gpu.stream_interval
        for stream in list(self.streams.values()):
            seq = stream.seq
            if seq.generated >= seq.completion_tokens:
                continue
            first = 0
            if starts is not None and seq.admitted_at is not None:
                first = bisect.bisect_left(starts, seq.admitted_at)
                self.record.joined_late += min(first, steps)
            before = seq.generated
            if steps > first:
                self.load.generate(seq, min(steps - first, seq.completion_tokens - before))
            after = seq.generated
            if starts is not None and after > before and after == seq.completion_tokens:
                # Its last token came at step first + (after - before) - 1 of the bunch.
                self.record.ends_late_s.append(
                    late + starts[-1] - starts[first + after - before - 1])
            # Chunks of ``interval`` tokens as the count crosses each multiple; the rest
            # goes with the last token.
            for _ in range((before // interval + 1) * interval, after + 1, interval):
                stream.ready.put_nowait(interval)
            if after == seq.completion_tokens and after % interval:
                stream.ready.put_nowait(after % interval)


async def serve_fleet(gpu: GPUModel, ports: list[int], ports_file: Path | None = None) -> None:
    """Serve one stepped endpoint per port on 127.0.0.1 until cancelled (port 0: a free one);
    write the ports bound, comma-joined, to ``ports_file`` once all serve."""
    endpoints = [SteppedEndpoint(gpu) for _ in ports]
    async with serving([e.app for e in endpoints], ports) as bound, asyncio.TaskGroup() as group:
        if ports_file is not None:  # renamed into place: a reader never sees half of it
            ports_file.with_suffix(".tmp").write_text(",".join(map(str, bound)))
            ports_file.with_suffix(".tmp").rename(ports_file)
        for endpoint in endpoints:
            group.create_task(endpoint.serve_steps())  # they step until cancelled




def main() -> None:
    """Serve the fleet (``python -m tests.fakevllm.stepped --ports 18100,18101 ...``)."""
    import argparse

    parser = argparse.ArgumentParser(description="Serve stepped vLLM endpoints on 127.0.0.1.")
    parser.add_argument("--ports", required=True, help="comma-joined; 0 for a free port")
    parser.add_argument("--ports-file", type=Path, help="where to write the ports bound")
    for name, default in asdict(GPUModel()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = vars(parser.parse_args())
    ports = [int(p) for p in args.pop("ports").split(",")]
    ports_file = args.pop("ports_file")
    gpu = GPUModel(**args)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_fleet(gpu, ports, ports_file))


if __name__ == "__main__":
    main()
