"""Check the one fake server: its /metrics reads back through our parser, load and faults."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from openai import APIConnectionError, APIStatusError, AsyncOpenAI

from serving.metrics import parse_cache_config, parse_metrics
from tests.fakevllm import BASE_URL, FakeServer, Reply
from tests.fakevllm.load import Sequence, ServerLoad


async def ask(client: AsyncOpenAI, text: str) -> list[str]:
    """Stream one chat completion to its end; return the content pieces."""
    stream = await client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": text}], max_tokens=16,
        stream=True, stream_options={"include_usage": True})
    return [c.choices[0].delta.content or "" async for c in stream if c.choices]


def openai_client(http: httpx.AsyncClient) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=BASE_URL, api_key="EMPTY", max_retries=0, http_client=http)


async def until(condition: object, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


async def test_metrics_parse_back_to_the_load_the_fake_carries() -> None:
    # Two places, a cache of 100 blocks of 16 tokens; three requests of 100 prompt tokens
    # held before decoding: two run, one waits, and each running one holds ceil(100/16) blocks.
    hold = asyncio.Event()
    server = FakeServer(lambda chat: Reply("four five six seven", prompt_tokens=100,
                                           completion_tokens=12, cached_tokens=40, hold=hold),
                        capacity=2, kv_tokens=1600, block_size=16)
    async with server.client() as http:
        client = openai_client(http)
        asks = [asyncio.create_task(ask(client, f"q{i}")) for i in range(3)]
        await until(lambda: len(server.chats) == 3)
        server.preempt(3)
        snap = parse_metrics((await http.get("http://fake.test/metrics")).text)
        assert (snap.running, snap.waiting, snap.preemptions_total) == (2, 1, 3)
        assert snap.kv_cache_usage == pytest.approx(2 * math.ceil(100 / 16) / 100)
        assert (snap.prompt_tokens_total, snap.generation_tokens_total) == (200, 0)
        assert (snap.prefix_cache_queries_total, snap.prefix_cache_hits_total) == (200, 80)
        config = parse_cache_config((await http.get("http://fake.test/metrics")).text)
        assert config is not None
        assert config.blocks() == 100 and config.labels["block_size"] == "16"
        hold.set()
        answers = await asyncio.gather(*asks)
        assert all("".join(a) == "four five six seven" for a in answers)
        done = parse_metrics((await http.get("http://fake.test/metrics")).text)
    assert (done.running, done.waiting, done.kv_cache_usage) == (0, 0, 0.0)
    assert (done.prompt_tokens_total, done.generation_tokens_total) == (300, 36)
    # All three finished: request times are recorded, as vLLM's histograms record them.
    assert done.prefill_time_s_total is not None and done.prefill_time_s_total > 0
    assert server.load.max_in_flight == 3 and server.load.max_waiting == 1
    assert [(s.running, s.waiting) for s in server.load.scrapes] == [(2, 1), (2, 1), (0, 0)]


def test_kv_grows_while_decoding_and_admission_waits_for_room() -> None:
    async def scenario() -> None:
        load = ServerLoad(capacity=10, kv_tokens=320, block_size=16)  # 20 blocks
        # Each answer is 100 prompt + 60 output tokens: 10 blocks once done, so two fit.
        seqs = [Sequence(100, 60) for _ in range(3)]
        entering = [asyncio.create_task(load.enter(s)) for s in seqs]
        await asyncio.sleep(0)
        assert (len(load.running), len(load.waiting)) == (2, 1)
        assert load.kv_usage() == pytest.approx(2 * 7 / 20)  # prompts only, so far
        load.generate(seqs[0], 60)
        assert load.kv_usage() == pytest.approx((10 + 7) / 20)
        load.leave(seqs[0], "stop")
        await asyncio.sleep(0)
        assert (len(load.running), len(load.waiting)) == (2, 0)
        await asyncio.gather(*entering)
        load.restart()
        assert (load.prompt_tokens, load.generation_tokens, load.preemptions) == (0, 0, 0)

    asyncio.run(scenario())


def test_capacity_caps_running_whatever_the_cache() -> None:
    async def scenario() -> None:
        load = ServerLoad(capacity=3, kv_tokens=10**9)
        entering = [asyncio.create_task(load.enter(Sequence(10, 10))) for _ in range(5)]
        await asyncio.sleep(0)
        assert (len(load.running), len(load.waiting)) == (3, 2)
        # A waiter that gives up leaves the queue; nobody is admitted in its place.
        entering[-1].cancel()
        await asyncio.sleep(0)
        assert (len(load.running), len(load.waiting)) == (3, 1)
        for task in entering[:3]:
            await task

    asyncio.run(scenario())


async def test_http_status_on_cue_then_the_script_again() -> None:
    server = FakeServer(lambda chat: "fine")
    server.cue(Reply(status=503, error="overloaded"), times=2)
    async with server.client() as http:
        client = openai_client(http)
        for _ in range(2):
            with pytest.raises(APIStatusError) as info:
                await ask(client, "q")
            assert info.value.status_code == 503 and "overloaded" in str(info.value)
        assert "".join(await ask(client, "q")) == "fine"
    assert [c.attempt for c in server.chats] == [1, 2, 3]
    assert [c.completed for c in server.chats] == [False, False, True]


async def test_a_burst_answers_k_requests_in_a_row_from_the_one_it_starts_at() -> None:
    server = FakeServer(lambda chat: "fine")
    server.burst(429, 2, at=1, retry_after="3")
    statuses: list[tuple[int, str | None]] = []
    async with server.client() as http:
        client = openai_client(http)
        for _ in range(4):
            try:
                await ask(client, "q")
                statuses.append((200, None))
            except APIStatusError as error:
                statuses.append((error.status_code, error.response.headers.get("retry-after")))
    assert statuses == [(200, None), (429, "3"), (429, "3"), (200, None)]
    assert server.burst_answers == 2


async def test_a_burst_can_start_at_a_nodes_first_request() -> None:
    # Nodes are told from the seed; none of these requests carries one of the node's.
    server = FakeServer(lambda chat: "fine")
    server.burst(503, 5, node="portfolio_manager")
    async with server.client() as http:
        for _ in range(3):
            assert "".join(await ask(openai_client(http), "q")) == "fine"
    assert server.burst_answers == 0


async def test_dropped_connection_and_cut_stream_leave_no_work_behind() -> None:
    server = FakeServer(lambda chat: Reply("a b c d e f", chunks=3), capacity=1)
    server.cue(Reply(drop=True))
    server.cue(Reply("a b c d e f", chunks=3, cut_after=1))
    async with server.client() as http:
        client = openai_client(http)
        with pytest.raises(APIConnectionError) as dropped:
            await ask(client, "q")
        assert isinstance(dropped.value.__cause__, httpx.RemoteProtocolError)
        pieces: list[str] = []
        with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
            stream = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "q"}],
                max_tokens=16, stream=True)
            async for chunk in stream:
                pieces += [c.delta.content or "" for c in chunk.choices]
        assert "".join(pieces) == "a b "  # the first of three pieces got out
        assert "".join(await ask(client, "q")) == "a b c d e f"
        snap = parse_metrics((await http.get("http://fake.test/metrics")).text)
    assert (snap.running, snap.waiting) == (0, 0)
    assert [c.completed for c in server.chats] == [False, False, True]
    assert server.load.finished == {"abort": 1, "stop": 1}


async def test_slow_answers_and_a_failing_metrics_page_on_cue() -> None:
    server = FakeServer(lambda chat: Reply("x y", delay_s=0.05, token_delay_s=0.01,
                                           completion_tokens=5))
    server.cue(Reply(status=500), path="/metrics")
    async with server.client() as http:
        assert (await http.get("http://fake.test/metrics")).status_code == 500
        assert (await http.get("http://fake.test/metrics")).status_code == 200
        loop = asyncio.get_running_loop()
        started = loop.time()
        await ask(openai_client(http), "q")
        assert loop.time() - started >= 0.05 + 5 * 0.01 - 0.005


async def test_over_asgi_the_fake_streams_the_same_answer() -> None:
    # What serving() puts on a socket: the same chunks, usage and records as through
    # MockTransport (ASGITransport here, so no port is needed).
    server = FakeServer(lambda chat: Reply("one two three four", chunks=2))
    transport = httpx.ASGITransport(app=server.asgi())
    async with httpx.AsyncClient(transport=transport) as http:
        pieces = await ask(openai_client(http), "hello")
        page = (await http.get("http://fake.test/metrics")).text
    assert "".join(pieces) == "one two three four" and len([p for p in pieces if p]) == 2
    assert len(server.served()) == 1
    assert server.usage_totals()["completion_tokens"] == 4  # 18 bytes, a token per 4
    assert parse_metrics(page).generation_tokens_total == 4


def test_a_key_guards_the_openai_routes_only_and_the_blocking_client_answers() -> None:
    server = FakeServer(api_key="right")
    with server.sync_client() as http:
        assert http.get("http://fake.test/v1/models").status_code == 401
        assert http.get("http://fake.test/v1/models",
                        headers={"Authorization": "Bearer right"}).status_code == 200
        assert http.get("http://fake.test/health").status_code == 200
        assert http.get("http://fake.test/metrics").status_code == 200
