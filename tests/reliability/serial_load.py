"""Many concurrent clients against the serial scheduler, and the proof that nothing was lost.

One long stream holds the GPU while every client queues; releasing it lets the queue drain back
to back through fake models that answer at once (`--tps 0`). With agingDivisor 0 and
swapAffinityBonus 0 the score is the priority alone, so the model must see the requests in
priority-then-arrival order.

Clients arrive concurrently in waves: every request of a wave has a priority no other request of
that wave has, and a wave is sent only once the previous one is queued. Ties in priority are thus
always between waves, whose arrival order is known, and the whole expected order follows from the
plan. Every request carries `"fake": {"id": ...}`, so the model's event log names what it served.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.served import model_ports
from tests.served import Served, fake_cmd, read_events

MODELS = ("alpha", "beta", "gamma")
BLOCKER = "blocker"
# Distinct priorities for the requests of one wave, spread over the three bands.
WAVE_PRIORITIES = (*range(100, 117), *range(-8, 9), *range(-100, -84))
QUEUE_TIMEOUT_S = 60
# How long every queued request together may take once the GPU is free: minutes only on a badly loaded machine.
DRAIN_TIMEOUT_S = 300
POOL_SIZE = 50  # connections per client pool


@dataclass(frozen=True)
class PlannedRequest:
    id: str
    model: str
    priority: int
    wave: int


@dataclass(frozen=True)
class LoadRun:
    statuses: dict[str, int]  # request id → HTTP status the client got
    queueing_s: float  # from the first request sent to the last one queued
    draining_s: float  # from releasing the GPU to the last response


def plan_requests(clients: int, models: tuple[str, ...] = MODELS, seed: int = 1) -> list[PlannedRequest]:
    """`clients` requests in waves of distinct priorities, models mixed, sent in shuffled order."""
    rng = random.Random(seed)
    planned = []
    width = len(WAVE_PRIORITIES)
    for wave in range((clients + width - 1) // width):
        size = min(width, clients - wave * width)
        for priority in rng.sample(WAVE_PRIORITIES, size):
            index = len(planned)
            planned.append(PlannedRequest(f"r{index}", rng.choice(models), priority, wave))
    return planned


def expected_order(planned: list[PlannedRequest]) -> list[str]:
    """Higher priority first; equal priorities in arrival order, which is wave order."""
    return [p.id for p in sorted(planned, key=lambda p: (-p.priority, p.wave))]


def load_config(events: Path, models: tuple[str, ...] = MODELS) -> str:
    """Fake models answering at once, all loaded side by side (a non-swapping group), one serial GPU."""
    document = {
        "healthCheckTimeout": 20,
        "startPort": model_ports(len(models)),
        "models": {
            name: {"cmd": fake_cmd(name, events, "--tps", "0", "--tokens", "4"), "proxy": "http://127.0.0.1:${PORT}"}
            for name in models
        },
        "groups": {"one-at-a-time": {"swap": True, "members": list(models)}},
        "routing": {"scheduler": {"use": "serial", "settings": {
            "serial": {"agingDivisor": 0, "swapAffinityBonus": 0},
        }}},
    }
    return yaml.safe_dump(document, sort_keys=False)


def queued_count(data_dir: Path) -> int:
    con = sqlite3.connect(f"file:{data_dir / 'llamaswap.sqlite3'}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute("SELECT COUNT(*) FROM scheduling_queuedrequest WHERE state = 'queued'").fetchone()[0]
    finally:
        con.close()


async def _until_queued(data_dir: Path, count: int, deadline: float) -> None:
    while (queued := queued_count(data_dir)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {queued} of {count} requests were queued after {QUEUE_TIMEOUT_S}s")
        await asyncio.sleep(0.02)


def _body(model: str, request_id: str, **fake) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "fake": {"id": request_id, **fake}}


async def run_load(served: Served, planned: list[PlannedRequest]) -> LoadRun:
    """Hold the GPU, queue every planned request wave by wave, release, and collect the answers."""
    async with AsyncExitStack() as stack:
        # httpx's pool does work proportional to its size on every request, so hundreds of
        # connections are split over small pools; one pool would make the client the bottleneck.
        pools = [
            await stack.enter_async_context(httpx.AsyncClient(
                # No per-request limit: the last of 500 queued requests rightly waits for all the others,
                # which on a loaded machine takes minutes. The run as a whole has DRAIN_TIMEOUT_S.
                base_url=served.base, timeout=httpx.Timeout(None, connect=30),
                limits=httpx.Limits(max_connections=POOL_SIZE, max_keepalive_connections=POOL_SIZE),
            ))
            for _ in range(len(planned) // POOL_SIZE + 1)
        ]

        async def send(index: int, request: PlannedRequest) -> tuple[str, int]:
            response = await pools[index % len(pools)].post(
                "/v1/chat/completions", json=_body(request.model, request.id),
                headers={"X-LlamaSwap-Priority": str(request.priority)},
            )
            return request.id, response.status_code

        blocker = _body(planned[0].model, BLOCKER, tokens=1_000_000, tps=10) | {"stream": True}
        async with pools[-1].stream("POST", "/v1/chat/completions", json=blocker) as held:
            lines = held.aiter_lines()
            await anext(lines)  # the blocker now holds the GPU
            began = time.monotonic()
            deadline = began + QUEUE_TIMEOUT_S
            sent: list[asyncio.Task] = []
            for wave in range(planned[-1].wave + 1):
                sent += [asyncio.create_task(send(i, p)) for i, p in enumerate(planned) if p.wave == wave]
                await _until_queued(served.data_dir, len(sent), deadline)
            queued_at = time.monotonic()
        # Leaving the stream disconnects the blocker and hands the GPU to the queue.
        done, pending = await asyncio.wait(sent, timeout=DRAIN_TIMEOUT_S)
        if pending:
            raise AssertionError(f"{len(pending)} of {len(sent)} requests were not answered within {DRAIN_TIMEOUT_S}s "
                                 "of the GPU being freed")
        answers = [task.result() for task in sent]
        done_at = time.monotonic()
    return LoadRun(dict(answers), queueing_s=queued_at - began, draining_s=done_at - queued_at)


def nothing_lost(planned: list[PlannedRequest], run: LoadRun, events: Path, rows: list[dict],
                 service_log: str) -> list[str]:
    """Everything that went wrong, as sentences; empty when every request was served once, in order."""
    problems = []
    failed = Counter(status for status in run.statuses.values() if status != 200)
    if failed or len(run.statuses) != len(planned):
        problems.append(f"{len(run.statuses)} answers for {len(planned)} requests; non-200 answers: {dict(failed)}")

    served_ids = [e["id"] for e in read_events(events) if e["event"] == "start" and e["id"] != BLOCKER]
    ended = Counter(e["id"] for e in read_events(events) if e["event"] == "end")
    by_id = {p.id: p for p in planned}
    repeated = sorted(i for i, n in Counter(served_ids).items() if n > 1)
    missing = sorted(by_id.keys() - set(served_ids))
    unknown = sorted(set(served_ids) - by_id.keys())
    if repeated or missing or unknown:
        problems.append(f"the model saw {len(repeated)} requests more than once {repeated[:10]}, "
                        f"never saw {len(missing)} {missing[:10]} and saw {len(unknown)} unknown ones {unknown[:10]}")
    if any(ended[i] != 1 for i in served_ids):
        problems.append("some requests did not end exactly once at the model")
    expected = expected_order(planned)
    if served_ids != expected and not (repeated or missing or unknown):
        first = next(n for n, (got, want) in enumerate(zip(served_ids, expected)) if got != want)
        problems.append(f"dispatch order departs from priority-then-arrival at position {first}: "
                        f"got {by_id[served_ids[first]]}, expected {by_id[expected[first]]}")

    states = Counter(r["state"] for r in rows)
    if len(rows) != len(planned) + 1 or states != Counter({"completed": len(planned), "cancelled": 1}):
        problems.append(f"{len(rows)} request rows for {len(planned)} requests and the blocker, states {dict(states)}")
    if "database is locked" in service_log:
        problems.append("the service log reports 'database is locked'")
    return problems

