"""The fault tier's settings: a short seeded run in `make test`; `make chaos SECONDS=N SEED=S` sets
LLAMASWAP_CHAOS_SECONDS and LLAMASWAP_CHAOS_SEED for a long one (a seed of 0 draws one, printed)."""

from __future__ import annotations

import os
import random

import pytest

from tests.conftest import REDIS_URL, fresh_redis_db

SHORT_RUN_S = 25.0
SHORT_RUN_SEED = 19


@pytest.fixture
def chaos():
    """(seconds, seed, requests) of this run."""
    seconds = float(os.environ.get("LLAMASWAP_CHAOS_SECONDS") or SHORT_RUN_S)
    seed = int(os.environ.get("LLAMASWAP_CHAOS_SEED") or SHORT_RUN_SEED) or random.randrange(1, 1 << 31)
    return seconds, seed, max(20, int(seconds * 2.5))


@pytest.fixture
def redis_url():
    """A Redis database of this test's own, emptied after it."""
    redis = pytest.importorskip("redis")
    try:
        url = fresh_redis_db(REDIS_URL)
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    yield url
    redis.Redis.from_url(url).flushdb()
