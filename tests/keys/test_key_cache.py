"""The key cache: read again once older than REFRESH_S, the last good rows kept through a failed read for
STALE_LIMIT_S and no longer, and the keys used written back with the next read."""

from __future__ import annotations

import asyncio
import threading

import pytest

from proxy.serving import key_cache
from proxy.serving.key_cache import READ_WAIT_S, REFRESH_S, STALE_LIMIT_S, KeyCache
from scheduling.keys.store import KeyRows


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Table:
    """A stand-in for the table: counts tries and reads, fails while `down` or while its connection is `broken`
    (until it is dropped), remembers the used names it was given."""

    def __init__(self) -> None:
        self.tries = self.reads = 0
        self.down = self.broken = self.connected = False
        self.used: list[set[str]] = []

    def read(self, used) -> KeyRows:
        self.tries += 1
        if self.down or self.broken:
            self.connected = self.connected and not self.down
            raise ConnectionError("the database is away")
        self.connected = True
        self.reads += 1
        self.used.append(set(used))
        return KeyRows({}, self.reads)


closed: list[bool] = []


@pytest.fixture
def parts(monkeypatch):
    closed.clear()
    clock, table = Clock(), Table()

    def drop_broken_connection() -> None:  # no database here: the table's connection stands in
        closed.append(table.broken)
        table.connected = table.connected and not table.broken
        table.broken = False

    monkeypatch.setattr(key_cache, "drop_broken_connection", drop_broken_connection)
    monkeypatch.setattr(key_cache, "connection_open", lambda: table.connected)
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
    assert closed == [False]  # the read that failed on an open connection was tried again once, on a new one
    table.down = False
    clock.now += REFRESH_S
    assert cache.current().count == 2
    assert "works again" in caplog.text


def test_a_read_on_a_connection_an_idle_outage_broke_is_tried_again_at_once_on_a_new_one(parts, caplog):
    clock, table, cache = parts
    cache.current()
    table.broken = True  # the database blinked while nobody read: the connection it broke is still open
    clock.now += 10 * REFRESH_S
    assert cache.current().count == 2  # the rows now, not the old ones kept through a failed read
    assert closed == [True] and table.tries == 3
    assert "failed" not in caplog.text


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
    assert table.tries == 3  # the first failed read, on the connection open before, is tried again at once
    clock.now += REFRESH_S
    cache.current()
    assert table.tries == 4


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


async def test_a_read_still_queued_when_the_wait_runs_out_runs_later_and_the_rows_are_fresh_again(parts, monkeypatch):
    """Django's one thread for synchronous calls may be busy (a large batch's rows): a key read queued behind that
    work outlasts the wait before it even starts. It must still run, or every later request is answered by rows
    that grow old — a new or revoked key never counts — and after STALE_LIMIT_S refused with 503."""
    clock, table, cache = parts
    cache.current()
    clock.now += REFRESH_S
    thread_free = asyncio.Event()

    def queued_behind_other_work(fn):
        async def run():
            await thread_free.wait()  # a cancelled wait here is a read that never runs
            return fn()

        return run

    monkeypatch.setattr(key_cache, "sync_to_async", queued_behind_other_work)
    monkeypatch.setattr(key_cache, "READ_WAIT_S", 0.05)
    assert (await cache.current_async()).count == 1  # the last good rows answer meanwhile
    thread_free.set()
    for _ in range(100):
        if table.reads == 2:
            break
        await asyncio.sleep(0.01)
    assert table.reads == 2  # the read ran once the thread was free
    clock.now += STALE_LIMIT_S + 1  # long after: requests read again and wait for it, nothing is refused
    rows = await cache.current_async()
    assert rows is not None and rows.count == 3
