"""The key cache: read again once older than REFRESH_S, the last good rows kept through a failed read for
STALE_LIMIT_S and no longer, and the keys used written back with the next read."""

from __future__ import annotations

import asyncio
import threading

import pytest

from proxy.http import key_cache
from proxy.http.key_cache import READ_WAIT_S, REFRESH_S, STALE_LIMIT_S, KeyCache
from scheduling.keys.store import KeyRows


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Table:
    """A stand-in for the table: counts tries and reads, fails while `down`, remembers the used names it was given."""

    def __init__(self) -> None:
        self.tries = self.reads = 0
        self.down = False
        self.used: list[set[str]] = []

    def read(self, used) -> KeyRows:
        self.tries += 1
        if self.down:
            raise ConnectionError("the database is away")
        self.reads += 1
        self.used.append(set(used))
        return KeyRows({}, self.reads)


closed: list[bool] = []


@pytest.fixture
def parts(monkeypatch):
    closed.clear()
    monkeypatch.setattr(key_cache, "drop_broken_connection", lambda: closed.append(True))  # no database here
    clock, table = Clock(), Table()
    return clock, table, KeyCache(table.read, clock)


def test_rows_are_read_once_per_refresh_period(parts):
    clock, table, cache = parts
    assert cache.current().count == 1
    clock.now += REFRESH_S * 0.9
    assert cache.current().count == 1 and table.reads == 1
    clock.now += REFRESH_S * 0.2
    assert cache.current().count == 2
    assert REFRESH_S + READ_WAIT_S <= 2  # a new or revoked key counts within 2 s


def test_a_failed_read_keeps_the_last_good_rows_until_the_stale_limit(parts, caplog):
    clock, table, cache = parts
    good = cache.current()
    table.down = True
    clock.now += STALE_LIMIT_S
    assert cache.current() is good
    assert "reading the API key table" in caplog.text and "failed" in caplog.text
    clock.now += 1
    assert cache.current() is None  # too old to trust: row keys are refused, not guessed at
    assert closed == [True]  # a connection the outage broke is closed before the next try, once per try
    table.down = False
    clock.now += REFRESH_S
    assert cache.current().count == 2
    assert closed == [True, True]
    assert "works again" in caplog.text


def test_nothing_read_yet_and_no_database_means_no_rows(parts):
    _, table, cache = parts
    table.down = True
    assert cache.current() is None


def test_the_keys_used_are_handed_to_the_next_read_and_kept_through_a_failed_one(parts):
    clock, table, cache = parts
    cache.current()
    cache.used("alice")
    cache.used("")  # a config key or an open server: no row
    table.down = True
    clock.now += REFRESH_S
    cache.current()
    table.down = False
    cache.used("bob")
    clock.now += REFRESH_S
    cache.current()
    assert table.used == [set(), {"alice", "bob"}]


def test_during_an_outage_a_read_is_tried_once_per_refresh_period(parts):
    clock, table, cache = parts
    good = cache.current()
    table.down = True
    clock.now += REFRESH_S
    assert [cache.current() for _ in range(5)] == [good] * 5
    assert table.tries == 2
    clock.now += REFRESH_S
    cache.current()
    assert table.tries == 3


def test_concurrent_callers_share_one_read(parts):
    _, table, cache = parts
    threads = [threading.Thread(target=cache.current) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert table.reads == 1


async def test_a_read_slower_than_the_wait_is_answered_by_the_last_good_rows(parts, monkeypatch):
    clock, table, cache = parts
    good = cache.current()
    clock.now += REFRESH_S
    release = threading.Event()

    async def slow():
        await asyncio.to_thread(release.wait, 5)
        return KeyRows({}, 99)

    calls = []
    monkeypatch.setattr(key_cache, "sync_to_async", lambda fn: calls.append(fn) or slow)
    monkeypatch.setattr(key_cache, "READ_WAIT_S", 0.05)
    try:
        assert await cache.current_async() is good
        assert await cache.current_async() is good  # the hung read is not waited for again
        assert len(calls) == 1
    finally:
        release.set()
