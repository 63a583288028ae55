"""Upstream clients: a retired client is closed only once the last request using it has ended."""

from __future__ import annotations

import asyncio

from proxy.config.model import UpstreamTimeouts
from proxy.upstream.clients import UpstreamClients

TIMEOUTS = UpstreamTimeouts(connect=5.0, response_header=None)


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_retired_client_stays_open_until_its_last_request_ends_and_the_next_request_gets_a_new_one():
    async def scenario():
        clients = UpstreamClients()
        first, second = clients.use("m", TIMEOUTS), clients.use("m", TIMEOUTS)
        async with first as old:
            async with second as same:
                assert same is old
                clients.retire("m")
                async with clients.use("m", UpstreamTimeouts(connect=1.0, response_header=2.0)) as new:
                    assert new is not old and new.timeout.read == 2.0
                await settle()
                assert not old.is_closed
            await settle()
            assert not old.is_closed, "closed under a request still using it"
        await settle()
        assert old.is_closed and not new.is_closed
        await clients.aclose()
        assert new.is_closed

    asyncio.run(scenario())


def test_an_idle_client_closes_as_soon_as_it_is_retired():
    async def scenario():
        clients = UpstreamClients()
        async with clients.use("m", TIMEOUTS) as client:
            pass
        clients.retire("m")
        clients.retire("never-used")
        await settle()
        assert client.is_closed

    asyncio.run(scenario())
