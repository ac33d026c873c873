"""Behind a router the one gate admits for every server the reader sees: the adaptive
request limit's start and ceiling are one server's (``max_concurrency``) per server read,
summed, and follow the servers read; a fleet it cannot see is admitted as one server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog

from app.config import load_settings
from app.llm import TrackedLLM
from app.recorder import figures
from app.traffic.sampler import MetricsSampler
from app.traffic.server import Server
from app.traffic.strategy import Strategy
from tests.fakevllm import FakeServer
from tests.fakevllm.router import FakeRouter

CEILING = 8  # NIGHTDESK_MAX_CONCURRENCY: one server's
START = Strategy.parse("adaptive").admission_policy(CEILING).initial


def fleet(servers: int) -> FakeRouter:
    return FakeRouter({f"http://gpu{i}.test:8000": FakeServer(kv_tokens=60_000, capacity=16)
                       for i in range(servers)})


@asynccontextmanager
async def behind(router: FakeRouter, **sampler: object) -> AsyncIterator[Server]:
    """Yield the product's Server for ``router``, its reader reading only when a test asks."""
    settings = load_settings(llm_base_url=router.base_url, max_concurrency=CEILING)
    async with router.client() as http:
        gauges = MetricsSampler(router.base_url, None, None, interval_s=1.0, client=http,
                                endpoint=router.base_url, discover=True,
                                **sampler)  # type: ignore[arg-type]
        llm = TrackedLLM(settings, None, http_client=http)  # type: ignore[arg-type]
        yield Server(0, router.base_url, llm, Strategy.parse("adaptive"), gauges=gauges)


async def test_two_servers_behind_the_router_get_twice_one_servers_start_and_ceiling() -> None:
    async with behind(fleet(2)) as server:
        assert server.gate.limit == START  # before any reading: one server's
        assert await server.sample_once() is not None
        assert server.limits.policy.maximum == 2 * CEILING
        assert server.gate.limit == 2 * START


async def test_a_server_lost_behind_the_router_takes_its_share_of_the_room() -> None:
    router = fleet(4)
    lost = router.servers["http://gpu3.test:8000"]
    lost.preempt(5)  # counters that leave the fleet's sum with it
    async with behind(router) as server:
        await server.sample_once()
        assert (server.gate.limit, server.limits.policy.maximum) == (4 * START, 4 * CEILING)
        server.limits.policy.limit = 4 * 5.0  # grown to 5 a server
        lost.crash()
        with structlog.testing.capture_logs() as logs:
            await server.sample_once()
        assert server.limits.policy.maximum == 3 * CEILING
        assert server.gate.limit == 3 * 5
        # The sum fell with the server gone: no server restarted, no limit started over.
        assert not [e for e in logs if "restarted" in e["event"]]


async def test_a_fleet_it_cannot_see_is_admitted_as_one_server() -> None:
    # Servers the router reaches and this client does not: no reading of any of them.
    unreachable = ["http://10.9.9.1:8000", "http://10.9.9.2:8000"]
    async with behind(fleet(2), fleet=unreachable) as server:
        assert await server.sample_once() is not None
        assert server.limits.policy.maximum == CEILING
        assert server.gate.limit == START


async def test_a_plain_vllm_server_keeps_one_servers_ceiling() -> None:
    router = fleet(2)
    router.workers = False  # a front without /workers reads as one server
    async with behind(router) as server:
        assert await server.sample_once() is not None
        assert server.limits.policy.maximum == CEILING


async def test_the_admission_record_names_the_servers_behind_the_router() -> None:
    # The recorder reads them off the endpoint's reader (app/recorder/figures.py, ``fleet``).
    async with behind(fleet(2)) as server:
        assert figures.fleet(server) is None  # not read yet: nothing known behind it
        await server.sample_once()
        behind_it = figures.fleet(server)
        assert behind_it is not None and (behind_it.servers, behind_it.read) == (2, 2)
        assert behind_it.kv_tokens == 2 * 60_000
    plain = fleet(2)
    plain.workers = False  # a front without /workers: a server, no fleet to record
    async with behind(plain) as server:
        await server.sample_once()
        assert figures.fleet(server) is None
