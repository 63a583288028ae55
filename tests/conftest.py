"""Rules for the whole suite.

Under `CI=true` a skipped test fails. Locally a test may skip when the machine lacks something it
needs (Chromium, promtool, PostgreSQL, the llama-swap compat corpus, the real llama.cpp extra) and
says why; on CI such a skip would mean the setup is broken while the run stays green. One hook
covers every test, including skips declared by markers or raised at import time.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from llamaswap_site.environment import redis_host
from tests.served import share_of_range


def skips_fail() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def skip_reason(report) -> str:
    """The reason pytest recorded for a skip (its long representation is (path, line, reason))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def fail_the_skip(report) -> None:
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where every test must run: {skip_reason(report)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if skips_fail() and report.skipped and not hasattr(report, "wasxfail"):
        fail_the_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if skips_fail() and report.skipped:
        fail_the_skip(report)
    return report


POSTGRES_ADMIN_URL = os.environ.get("LLAMASWAP_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def postgres():
    """A fresh database on the local PostgreSQL server, dropped afterwards: (url, psycopg)."""
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {POSTGRES_ADMIN_URL}: {exc}")
    with admin, scratch_database(admin, POSTGRES_ADMIN_URL) as url:
        yield url, psycopg


@contextmanager
def scratch_database(admin, admin_url: str) -> Iterator[str]:
    """A fresh database on the server `admin` (an autocommit connection to `admin_url`) reaches, dropped
    afterwards: its URL. The tests' fixture and the distributed benchmark both make theirs here."""
    name = f"llamaswap_test_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


REDIS_URL = os.environ.get("LLAMASWAP_TEST_REDIS", "redis://127.0.0.1:6379/0")


def fresh_redis_db(redis_url: str) -> str:
    """`redis_url` with a database index of 1-15 that holds no keys, for one run's processes (flush it after).

    Whole processes share it, so it cannot be told apart by a key prefix; an index another run is using
    (it holds keys) is passed over. Raises redis's ConnectionError when no Redis answers."""
    import redis

    base = redis_url.rsplit("/", 1)[0]
    indexes = range(*share_of_range(1, 16))  # another pytest process could pick an index before it holds keys
    for index in random.sample(indexes, len(indexes)):
        with redis.Redis.from_url(f"{base}/{index}", socket_connect_timeout=5) as connection:
            if connection.dbsize() == 0:
                return f"{base}/{index}"
    raise RuntimeError(f"every Redis database index {indexes.start}-{indexes.stop - 1} at {base} holds keys: none is free")


@pytest.fixture(params=["lists", "pubsub"])
async def redis_layer_factory(request):
    """`make()`: a channel layer on the local Redis server, all of one test's layers sharing a key
    prefix of their own (so they reach each other and nothing else); flushed afterwards. Each test
    runs over both of LLAMASWAP_CHANNEL_LAYER's backends."""
    redis = pytest.importorskip("redis")
    pytest.importorskip("channels_redis.core")
    from django.utils.module_loading import import_string

    from llamaswap_site.environment import CHANNEL_LAYER_BACKENDS

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    backend = import_string(CHANNEL_LAYER_BACKENDS[request.param])
    prefix = f"llamaswap-test-{uuid.uuid4().hex[:12]}:"
    made = []

    def make():
        layer = backend(hosts=[redis_host(REDIS_URL)], prefix=prefix)
        made.append(layer)
        return layer

    yield make
    for layer in made:
        await layer.flush()
        if hasattr(layer, "close_pools"):
            await layer.close_pools()
