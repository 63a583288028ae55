"""A client that leaves mid-stream hands the GPU on at once, every time.

Over a chain of streams, each queued behind the previous one, measures the gap between a client
closing its stream and the next queued request reaching the model (the fake model's event log
stamps each start), and bounds it: median under 100 ms, none over 1 s. Both clocks are this
machine's wall clock. The figures are printed too (run with `-s`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.e2e.conftest import db_rows
from tests.reliability.support import serial_config
from tests.served import Served, fake_cmd, read_events

pytestmark = pytest.mark.e2e

ROUNDS = 20
ENDLESS = {"tokens": 100_000, "tps": 20}  # a stream that outlives the test unless its client leaves
MEDIAN_GAP_MS = 100
MAX_GAP_MS = 1000


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


async def chain_of_abandoned_streams(served: Served) -> dict[str, float]:
    """Hold the model with stream 0; each round queues stream i, then abandons stream i-1.

    Returns when each stream's client closed it (wall clock, by stream id).
    """
    closed_at = {}
    async with httpx.AsyncClient(base_url=served.base, timeout=30) as client:
        holding = await open_stream(client, "s0")
        for i in range(1, ROUNDS + 1):
            following = asyncio.create_task(open_stream(client, f"s{i}"))
            await until_queued(served, 1)
            closed_at[f"s{i - 1}"] = time.time()
            await holding[0].aclose()  # mid-stream: the proxy must drop the upstream request and move on
            holding = await following
        await holding[0].aclose()
    return closed_at


def test_the_next_queued_request_starts_right_after_a_mid_stream_disconnect(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, serial_config({"m": {"cmd": fake_cmd("m", events)}})) as served:
        closed_at = asyncio.run(chain_of_abandoned_streams(served))
        rows = served.check_settled("m")
    assert [r["state"] for r in rows] == ["cancelled"] * (ROUNDS + 1) + ["completed"]
    assert all("mid-response" in r["error"] for r in rows[:-1])

    seen = {(e["event"], e["id"]): e["t"] for e in read_events(events)}
    for i in range(ROUNDS + 1):
        assert ("disconnect", f"s{i}") in seen and ("end", f"s{i}") not in seen, f"stream s{i} was not cut"
    gaps_ms = [(seen["start", f"s{i}"] - closed_at[f"s{i - 1}"]) * 1000 for i in range(1, ROUNDS + 1)]
    median = statistics.median(gaps_ms)
    print(f"\nclient closes a stream -> the next queued request reaches the model, {ROUNDS} rounds: "
          f"median {median:.1f} ms, max {max(gaps_ms):.1f} ms, min {min(gaps_ms):.1f} ms")
    assert median < MEDIAN_GAP_MS and max(gaps_ms) < MAX_GAP_MS, (
        f"the GPU did not pass on at once: median {median:.1f} ms (bound {MEDIAN_GAP_MS}), "
        f"max {max(gaps_ms):.1f} ms (bound {MAX_GAP_MS}); gaps {[round(g) for g in gaps_ms]}"
    )
