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
