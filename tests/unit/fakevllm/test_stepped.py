"""The simulated fleet's endpoint: a vLLM server decoding in steps, at the model's speed."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from serving.metrics import parse_cache_config, parse_metrics
from tests.fakevllm.stepped import MODEL, GPUModel, SteppedEndpoint


async def _chat(client: httpx.AsyncClient, tokens: int, words: int = 40) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": tokens, "stream": True,
            "messages": [{"role": "user", "content": "word " * words}]}
    chunks, usage, started = [], None, time.monotonic()
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                usage = event["usage"] or usage
                chunks += [c["delta"].get("content", "") for c in event["choices"]]
    return {"seconds": time.monotonic() - started, "text": "".join(chunks), "usage": usage,
            "chunks": len([c for c in chunks if c])}


async def test_an_endpoint_decodes_at_its_steps_speed_and_batches_requests() -> None:
    # 10 ms a step, one token per running request per step: 64 tokens take 0.64 s alone,
    # and two requests side by side take no longer (one step serves both), sent 16 a chunk.
    gpu = GPUModel(kv_tokens=100_000, max_num_seqs=8, step_a_s=0.01, step_b_s=0.0,
                   prompt_weight=5.0)
    endpoint = SteppedEndpoint(gpu)
    transport = httpx.ASGITransport(app=endpoint.app)
    async with asyncio.TaskGroup() as group:
        stepper = group.create_task(endpoint.serve_steps())
        async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as client:
            one = await _chat(client, 64)
            pair = await asyncio.gather(_chat(client, 64), _chat(client, 64))
            page = (await client.get("/metrics")).text
            count = (await client.post("/tokenize", json={
                "messages": [{"role": "user", "content": "word " * 40}]})).json()["count"]
        stepper.cancel()
    assert one["text"] == " tok" * 64 and one["chunks"] == 4
    assert one["usage"]["completion_tokens"] == 64
    # Counted at five times the text sent (200 bytes: 50 tokens, x5).
    assert one["usage"]["prompt_tokens"] == count == 250
    assert 0.6 <= one["seconds"] < 2.0  # never faster than the model; late wake-ups catch up
    assert all(p["text"] == " tok" * 64 for p in pair)
    assert max(p["seconds"] for p in pair) < 1.6 * max(one["seconds"], 0.64)
    snap = parse_metrics(page)
    assert snap.generation_tokens_total == 3 * 64 and snap.running == 0
    config = parse_cache_config(page)
    assert config is not None and config.tokens() == 100_000


@pytest.mark.parametrize("steps", [1, 3, 16, 40])
def test_a_late_wake_up_sends_every_chunk_that_fell_due(steps: int) -> None:
    gpu = GPUModel(kv_tokens=100_000, max_num_seqs=8, stream_interval=16)
    endpoint = SteppedEndpoint(gpu)
    from tests.fakevllm.load import Sequence
    from tests.fakevllm.stepped import _Stream

    seq = Sequence(10, 40)
    stream = _Stream(seq)
    endpoint.streams[1] = stream
    endpoint.load.running.append(seq)
    sent = 0
    while seq.generated < 40:
        endpoint._step(steps)
    while not stream.ready.empty():
        sent += stream.ready.get_nowait()
    # 40 tokens: two chunks of 16 and the last 8, however the steps were bunched.
    assert sent == 40 and seq.generated == 40


def test_a_step_serves_only_the_requests_admitted_before_it_began() -> None:
    # A late wake-up runs the four steps that began at 0, 1, 2 and 3 s at once: a request
    # admitted at 1.5 s was in only the last two (a GPU's batch is set when a step starts),
    # and the one that ends is recorded as late as the wake-up is past its last step.
    from tests.fakevllm.load import Sequence
    from tests.fakevllm.stepped import _Stream

    endpoint = SteppedEndpoint(GPUModel(kv_tokens=100_000, max_num_seqs=8))
    early, joined = Sequence(10, 40, admitted_at=-0.5), Sequence(10, 2, admitted_at=1.5)
    for key, seq in enumerate((early, joined)):
        endpoint.streams[key] = _Stream(seq)
        endpoint.load.running.append(seq)
    endpoint._step(4, [0.0, 1.0, 2.0, 3.0], late=0.25)
    assert (early.generated, joined.generated) == (4, 2)
    assert endpoint.record.joined_late == 2
    assert endpoint.record.ends_late_s == [0.25]  # its last token: the last step's
    endpoint._step(4, [4.0, 5.0, 6.0, 7.0], late=0.0)
    assert early.generated == 8 and joined.generated == 2


def test_the_prefix_cache_finds_a_prompts_leading_blocks_per_salt_and_forgets_the_oldest(
) -> None:
    from tests.fakevllm.stepped import PrefixCache

    def body(text: str, salt: str = "a") -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}], "cache_salt": salt}

    cache = PrefixCache(capacity_tokens=10 * 4, tokens_per_block=4, block_chars=8)
    shared = "x" * 40
    assert cache.admit(body(shared + "first")) == 0  # nothing cached yet
    # The same context with another ending: its leading whole blocks were cached.
    again = cache.admit(body(shared + "second"))
    assert 4 * 4 <= again <= 6 * 4
    assert cache.admit(body(shared + "second", salt="b")) == 0  # another salt shares nothing
    # Past 10 blocks the least recently used go: a long new prompt pushes the first out.
    cache.admit(body("y" * 200))
    assert cache.admit(body(shared + "first")) == 0


async def test_an_endpoint_counts_the_prefix_it_found_in_usage_and_metrics() -> None:
    endpoint = SteppedEndpoint(GPUModel(kv_tokens=100_000, max_num_seqs=8, step_a_s=0.001,
                                        step_b_s=0.0))
    transport = httpx.ASGITransport(app=endpoint.app)
    async with asyncio.TaskGroup() as group:
        stepper = group.create_task(endpoint.serve_steps())
        async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as client:
            first = await _chat(client, 4, words=400)
            second = await _chat(client, 4, words=400)
            page = (await client.get("/metrics")).text
        stepper.cancel()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # All but its last partial block (256 characters of 2,000).
    assert 0.8 * second["usage"]["prompt_tokens"] <= cached <= second["usage"]["prompt_tokens"]
    snap = parse_metrics(page)
    assert snap.prefix_cache_hits_total == cached
    assert snap.prefix_cache_queries_total == 2 * first["usage"]["prompt_tokens"]
