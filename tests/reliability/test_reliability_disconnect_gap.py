"""A client that leaves mid-stream hands the GPU on at once, every time.

Measures the gap at the model between the departed stream's disconnect and the next request's
start, over a chain of streams each queued behind the previous one. The figure is printed (run
with `-s`), not asserted: timing depends on the machine.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.e2e.conftest import db_rows
from tests.reliability.support import all_rows_terminal, chat, serial_config
from tests.served import Served, fake_cmd, read_events

pytestmark = pytest.mark.e2e

ROUNDS = 20
ENDLESS = {"tokens": 100_000, "tps": 20}  # a stream that outlives the test unless its client leaves


async def open_stream(client: httpx.AsyncClient, request_id: str) -> tuple[httpx.Response, AsyncIterator[str]]:
    """Start a streaming chat and return once its first event has arrived (the GPU is then its own).

    The line iterator is returned too: dropping it would let its finaliser close the connection.
    """
    body = {"model": "m", "stream": True, "messages": [], "fake": {**ENDLESS, "id": request_id}}
    response = await client.send(client.build_request("POST", "/v1/chat/completions", json=body), stream=True)
    assert response.status_code == 200, await response.aread()
    lines = response.aiter_lines()
    await anext(lines)
    return response, lines


async def until_queued(served: Served, count: int) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while len(db_rows(served.data_dir, "state='queued'")) != count:
        assert asyncio.get_running_loop().time() < deadline, f"{count} request(s) never showed up as queued"
        await asyncio.sleep(0.01)


async def chain_of_abandoned_streams(served: Served) -> None:
    """Hold the model with stream 0; each round queues stream i, then abandons stream i-1."""
    async with httpx.AsyncClient(base_url=served.base, timeout=30) as client:
        holding = await open_stream(client, "s0")
        for i in range(1, ROUNDS + 1):
            following = asyncio.create_task(open_stream(client, f"s{i}"))
            await until_queued(served, 1)
            await holding[0].aclose()  # mid-stream: the proxy must drop the upstream request and move on
            holding = await following
        await holding[0].aclose()


def test_the_next_queued_request_starts_right_after_a_mid_stream_disconnect(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, serial_config({"m": {"cmd": fake_cmd("m", events)}})) as served:
        asyncio.run(chain_of_abandoned_streams(served))
        assert chat(served.base, "m").status_code == 200  # and the service still serves

        rows = all_rows_terminal(served.data_dir, ROUNDS + 2)
    assert [r["state"] for r in rows] == ["cancelled"] * (ROUNDS + 1) + ["completed"]
    assert all("mid-response" in r["error"] for r in rows[:-1])

    seen = {(e["event"], e["id"]): e["t"] for e in read_events(events)}
    for i in range(ROUNDS + 1):
        assert ("disconnect", f"s{i}") in seen and ("end", f"s{i}") not in seen, f"stream s{i} was not cut"
    gaps_ms = [(seen["start", f"s{i}"] - seen["disconnect", f"s{i - 1}"]) * 1000 for i in range(1, ROUNDS + 1)]
    print(f"\nmodel-side gap, disconnect of a stream -> start of the next queued one, {ROUNDS} rounds: "
          f"median {statistics.median(gaps_ms):.1f} ms, max {max(gaps_ms):.1f} ms, min {min(gaps_ms):.1f} ms "
          "(target < 100 ms)")
