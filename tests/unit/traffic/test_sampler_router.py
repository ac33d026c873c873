"""Behind a router, nightdesk reads each server's /metrics and sums the fleet's KV capacity;
when it cannot see the servers it says so and admits by request count."""

from __future__ import annotations

import httpx
import structlog

from app.traffic.sampler import MetricsSampler
from serving.metrics import MetricsSnapshot, combine
from tests.fakevllm import FakeServer
from tests.fakevllm.router import FakeRouter

KV = 60_000  # each server's KV cache, as in issue 44's fleet


def fleet(**router: object) -> FakeRouter:
    return FakeRouter({"http://gpu0.test:8000": FakeServer(kv_tokens=KV, capacity=16),
                       "http://gpu1.test:8000": FakeServer(kv_tokens=KV, capacity=16)},
                      **router)  # type: ignore[arg-type]


async def read_once(router: FakeRouter, **kwargs: object) -> MetricsSampler:
    async with router.client() as http:
        sampler = MetricsSampler(router.base_url, None, None, interval_s=None, client=http,
                                 endpoint=router.base_url, **kwargs)  # type: ignore[arg-type]
        assert await sampler.read() is not None
        await sampler.aclose()
    return sampler


def discovering(router: FakeRouter, http: httpx.AsyncClient) -> MetricsSampler:
    """A sampler that asks ``router`` for its servers, reading only when told to."""
    return MetricsSampler(router.base_url, None, None, interval_s=None, client=http,
                          discover=True)


async def test_the_fleet_behind_vllm_router_is_learned_and_its_capacity_summed() -> None:
    # The router's own page is one server's: read alone it says 60,000 tokens.
    alone = await read_once(fleet(), discover=False)
    assert alone.kv_capacity == KV and alone.fleet == []
    router = fleet()
    sampler = await read_once(router, discover=True)
    assert sampler.fleet == list(router.servers) and sampler.fleet_read == 2
    assert sampler.kv_capacity == 2 * KV
    # Each server was read itself.
    for fake in router.servers.values():
        assert [r.path for r in fake.requests].count("/metrics") == 1


async def test_servers_named_by_the_setting_are_read_without_asking_the_router() -> None:
    router = fleet(workers=False)
    sampler = await read_once(router, fleet=list(router.servers), discover=True)
    assert sampler.kv_capacity == 2 * KV and sampler.fleet_read == 2


async def test_a_plain_vllm_server_is_read_itself() -> None:
    server = FakeServer(kv_tokens=KV)
    async with server.client() as http:
        sampler = MetricsSampler("http://fake.test/v1", None, None, interval_s=None,
                                 client=http, discover=True)
        assert await sampler.read() is not None
    assert sampler.fleet == [] and sampler.kv_capacity == KV
    assert [r.path for r in server.requests] == ["/workers", "/metrics"]


async def test_a_fleet_it_cannot_read_is_said_once_and_admitted_by_request_count() -> None:
    # Servers the router reaches and this client does not (another network, a firewall).
    router = fleet()
    unreachable = ["http://10.9.9.1:8000", "http://10.9.9.2:8000"]
    with structlog.testing.capture_logs() as logs:
        async with router.client() as http:
            sampler = MetricsSampler(router.base_url, None, None, interval_s=None,
                                     client=http, fleet=unreachable, discover=True)
            # The router's own page keeps the reading (the router answers: it is up).
            first = await sampler.read()
            second = await sampler.read()
    assert first is not None and second is not None
    assert sampler.kv_capacity is None and sampler.fleet_read == 0
    said = [e["event"] for e in logs if "any server behind the router" in e["event"]]
    assert said == ["cannot read /metrics of any server behind the router: admission by "
                    "request count, the router's own /metrics for health"]


async def test_a_server_lost_behind_the_router_leaves_the_capacity_of_the_rest() -> None:
    router = fleet()
    async with router.client() as http:
        sampler = discovering(router, http)
        await sampler.read()
        assert sampler.kv_capacity == 2 * KV
        router.servers["http://gpu1.test:8000"].crash()
        await sampler.read()
        assert sampler.kv_capacity == KV and sampler.fleet_read == 1


async def test_servers_added_behind_the_router_are_read_at_its_next_list() -> None:
    router = fleet()
    async with router.client() as http:
        sampler = discovering(router, http)
        await sampler.read()
        assert sampler.kv_capacity == 2 * KV and sampler.fleet_read == 2
        router.servers["http://gpu2.test:8000"] = FakeServer(kv_tokens=KV, capacity=16)
        await sampler.read()  # within fleet_every_s: the list known is kept
        assert sampler.fleet_read == 2
        sampler.fleet_every_s = 0.0
        await sampler.read()
        assert sampler.fleet == list(router.servers)
        assert sampler.kv_capacity == 3 * KV and sampler.fleet_read == 3


async def test_a_router_not_ready_to_list_its_servers_is_asked_again() -> None:
    # A 503 at the first reading must not count the router as one server for the night.
    router = fleet(workers_status=503)
    async with router.client() as http:
        sampler = discovering(router, http)
        sampler.fleet_every_s = 0.0
        assert await sampler.read() is not None  # the router's own page: it is up
        # Not a server's own page: no capacity from it (one server's of several).
        assert sampler.fleet is None and sampler.kv_capacity is None
        router.workers_status = 200
        await sampler.read()
        assert sampler.kv_capacity == 2 * KV and sampler.fleet_read == 2


async def test_one_server_the_router_lists_under_several_names_is_counted_once() -> None:
    # vllm-router 0.1.17 given --worker-urls http://127.0.0.1:8000 http://localhost:8000
    # http://127.0.0.1:8000/ lists three workers: one server's cache, counted three times
    # (the token budget and the request ceiling three servers') before.
    one = FakeServer(kv_tokens=KV, capacity=16)
    router = FakeRouter({"http://127.0.0.1:8000": one, "http://localhost:8000": one,
                         "http://127.0.0.1:8000/": one, "http://gpu1.test:8000":
                         FakeServer(kv_tokens=KV, capacity=16)})
    sampler = await read_once(router, discover=True)
    assert sampler.fleet == ["http://127.0.0.1:8000", "http://gpu1.test:8000"]
    assert sampler.kv_capacity == 2 * KV and sampler.fleet_read == 2


async def test_a_router_gone_while_its_servers_answer_is_a_failed_reading() -> None:
    # A router restarting refuses connections; its servers, read directly, still answer:
    # the reading must fail, so the endpoint goes down and its calls wait for it.
    router = fleet()
    async with router.client() as http:
        sampler = discovering(router, http)
        assert await sampler.read() is not None and sampler.fleet_read == 2
        router.down = True
        assert await sampler.read() is None and sampler.failing
        router.down = False
        assert await sampler.read() is not None and not sampler.failing


def test_the_fleets_readings_add_up_as_one_servers_engines() -> None:
    one = MetricsSnapshot(running=3, waiting=1, kv_cache_usage=0.2, preemptions_total=1,
                          prompt_tokens_total=100, generation_tokens_total=40,
                          prefix_cache_hits_total=7, decode_time_s_total=None)
    two = MetricsSnapshot(running=5, waiting=0, kv_cache_usage=0.7, preemptions_total=0,
                          prompt_tokens_total=300, generation_tokens_total=60,
                          prefix_cache_hits_total=2, decode_time_s_total=4.0)
    both = combine([one, two])
    assert (both.running, both.waiting, both.preemptions_total) == (8, 1, 1)
    assert (both.prompt_tokens_total, both.generation_tokens_total) == (400, 100)
    assert both.kv_cache_usage == 0.7  # the fullest server is what blocks first
    assert both.prefix_cache_hits_total == 9
    assert both.decode_time_s_total is None  # one server does not say: unknown, not 4
