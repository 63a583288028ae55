"""The latency an API key's quotas add to each of its requests: the quota gate's admission and its end (the
rpm/tpm check and count, taking and giving back a place at once, counting the tokens), for a key with all three
limits, against a key with none, alternating in one loop, counted in this process and in Redis.

Each round is one request of the key: admitted, holding its place, ending with 30 tokens. The limits are too high
to refuse anything, so every round pays the full check; the windows fill as the rounds go (a check under the
limits reads their counts and running total, not their entries), and the report names how many they held. Run
from the repository root:
`python bench/key_quotas.py [--rounds N]` (the Redis rows need the Redis server the tests use,
`LLAMASWAP_TEST_REDIS`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from bench.common import Stats, machine, stats  # noqa: E402
from proxy.serving.quota_counters import InProcessQuotaCounter, QuotaCounter, RedisQuotaCounter  # noqa: E402
from scheduling.keys.quota import QuotaLimits  # noqa: E402
from scheduling.keys.scope import KeyScope  # noqa: E402
from scheduling.tickets import Outcome, RequestState  # noqa: E402

REDIS_URL = os.environ.get("LLAMASWAP_TEST_REDIS", "redis://127.0.0.1:6379/0")
LIMITED = QuotaLimits(rpm=10**12, tpm=10**15, concurrency=10**6)
ANSWER = Outcome(state=RequestState.COMPLETED, usage={"input_tokens": 10, "output_tokens": 20})
ROUNDS = 2_000
QUICK_ROUNDS = 500
WARMUP = 50


@dataclass(frozen=True)
class Result:
    counter: str
    added_us: Stats  # the limited key's round minus the unlimited key's, paired
    unlimited_us: Stats
    window_entries: int


@functools.cache
def quota_gate():
    """`within_quota`, imported once Django is set up (the key checks beside it import the key table's model).
    No round reads a row: settings on a throwaway data dir do, and the suite's earlier parts ran without any."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llamaswap_site.settings")
    os.environ.setdefault("LLAMASWAP_DATA_DIR", tempfile.mkdtemp(prefix="llamaswap-bench-quotas-"))
    import django

    django.setup()
    from proxy.serving.quota_gate import within_quota

    return within_quota


async def one_request(scope: KeyScope, counter: QuotaCounter) -> float:
    within_quota = quota_gate()
    started = time.perf_counter()
    async with within_quota(scope, counter) as tally:
        tally.ended(ANSWER)
    return (time.perf_counter() - started) * 1e6


async def measure_counter(name: str, counter: QuotaCounter, rounds: int) -> Result:
    limited = KeyScope(name=f"bench-{uuid.uuid4().hex[:8]}", limits=LIMITED)
    unlimited = KeyScope(name="bench-unlimited")
    for _ in range(WARMUP):
        await one_request(limited, counter)
    added, bare = [], []
    for _ in range(rounds):
        without = await one_request(unlimited, counter)
        with_limits = await one_request(limited, counter)
        bare.append(without)
        added.append(with_limits - without)
    return Result(name, stats(added), stats(bare), rounds + WARMUP)


def redis_reachable() -> str | None:
    """None when the Redis server answers, else why not."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError as exc:
        return f"no Redis at {REDIS_URL}: {exc}"
    return None


async def measure_all(rounds: int) -> tuple[list[Result], str | None]:
    results = [await measure_counter("in this process", InProcessQuotaCounter(), rounds)]
    if (why := redis_reachable()) is not None:
        return results, why
    prefix = f"llamaswap-bench-quota-{uuid.uuid4().hex[:8]}"
    try:
        results.append(await measure_counter("Redis (local server)", RedisQuotaCounter(REDIS_URL, prefix=prefix),
                                             rounds))
    finally:
        with redis.Redis.from_url(REDIS_URL) as connection:
            for name in connection.scan_iter(f"{prefix}:*"):
                connection.delete(name)
    return results, None


def measure(rounds: int) -> tuple[list[Result], str | None]:
    """Every counter's result, and why Redis was not measured (None when it was)."""
    return asyncio.run(measure_all(rounds))


HEADER = ("| counter | rounds | added p50 | added p95 | added p99 | a request without limits, p50 | "
          "entries in the key's windows at the end |\n|---|---|---|---|---|---|---|")


def row(result: Result) -> str:
    added = result.added_us
    return (f"| {result.counter} | {added.n} | {added.p50:+.0f} µs | {added.p95:+.0f} µs | {added.p99:+.0f} µs | "
            f"{result.unlimited_us.p50:.0f} µs | {result.window_entries} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    results, why = measure(args.rounds)
    print(machine())
    print(HEADER)
    for result in results:
        print(row(result))
    if why:
        print(f"Redis not measured: {why}")


if __name__ == "__main__":
    main()
