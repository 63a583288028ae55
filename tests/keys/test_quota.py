"""A key's quotas: the sliding-window arithmetic (Retry-After exact), a property that no 60 s window ever
admits more than rpm, and the two counters — in this process and in Redis — answering the same."""

from __future__ import annotations

import asyncio
import logging
import uuid
from urllib.parse import urlsplit

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.serving.quota_counters import InProcessQuotaCounter, RedisQuotaCounter
from proxy.serving.quota_gate import within_quota
from proxy.serving.errors import ProxyError
from scheduling.keys.quota import WINDOW_S, OverQuota, QuotaLimits, RateWindows, rpm_freed_at, tpm_freed_at
from scheduling.keys.scope import KeyScope
from tests.conftest import REDIS_URL
from tests.faults.relay import Relay
from tests.served import free_port

T0 = 1_800_000_000.0


# -- the arithmetic ------------------------------------------------------------------------------------

def test_rpm_admits_while_fewer_than_rpm_are_in_the_window():
    assert rpm_freed_at([], 1, T0) is None
    assert rpm_freed_at([T0 - 10, T0 - 5], 3, T0) is None
    assert rpm_freed_at([T0 - 10, T0 - 5, T0 - 1], 3, T0) == T0 - 10 + WINDOW_S


def test_rpm_frees_when_the_admission_that_must_leave_does():
    times = [T0 - 50, T0 - 40, T0 - 30, T0 - 20]  # four in the window, rpm 2: the third-newest must leave
    assert rpm_freed_at(times, 2, T0) == T0 - 30 + WINDOW_S


def test_an_admission_exactly_60_s_old_has_left_the_window():
    assert rpm_freed_at([T0 - WINDOW_S], 1, T0) is None
    assert rpm_freed_at([T0 - WINDOW_S + 0.001], 1, T0) == pytest.approx(T0 + 0.001)


def test_tpm_admits_while_the_windows_tokens_are_under_the_limit():
    assert tpm_freed_at([(T0 - 30, 999)], 1000, T0) is None
    assert tpm_freed_at([(T0 - 30, 1000)], 1000, T0) == T0 + 30
    # 700 + 500 + 300 = 1500; the 700 leaving leaves 800, under 1000
    assert tpm_freed_at([(T0 - 45, 700), (T0 - 20, 500), (T0 - 5, 300)], 1000, T0) == T0 + 15
    # the 200 leaving leaves 1300, not under 1000; the 700 too leaves 600
    assert tpm_freed_at([(T0 - 59, 200), (T0 - 45, 700), (T0 - 20, 600)], 1000, T0) == T0 + 15
    assert tpm_freed_at([(T0 - 61, 5000)], 1000, T0) is None  # out of the window


def test_retry_after_is_the_exact_wait_and_the_header_rounds_it_up():
    windows = RateWindows()
    limits = QuotaLimits(rpm=2)
    assert windows.admit("k", limits, T0) is None
    assert windows.admit("k", limits, T0 + 10.25) is None
    over = windows.admit("k", limits, T0 + 20)
    assert over == OverQuota("k", "rpm", 2, 40.0)
    assert over.retry_after_header() == "40"
    assert windows.admit("k", limits, T0 + 59.999) is not None
    assert windows.admit("k", limits, T0 + 60) is None  # exactly when Retry-After said
    over = windows.admit("k", limits, T0 + 60.5)
    assert over.retry_after_s == pytest.approx(9.75)
    assert over.retry_after_header() == "10"
    assert "'k' is over its limit of 2 requests per minute (rpm)" in over.message()


def test_a_refused_request_is_not_counted():
    windows = RateWindows()
    limits = QuotaLimits(rpm=1)
    assert windows.admit("k", limits, T0) is None
    for second in range(1, 60):
        assert windows.admit("k", limits, T0 + second) is not None
    assert windows.admit("k", limits, T0 + 60) is None


def test_tokens_refuse_until_the_window_drops_under_tpm():
    windows = RateWindows()
    limits = QuotaLimits(tpm=100)
    assert windows.admit("k", limits, T0) is None
    windows.spend("k", 60, T0 + 1)
    assert windows.admit("k", limits, T0 + 2) is None  # 60 < 100: admitted, though it may take the total over
    windows.spend("k", 60, T0 + 3)
    over = windows.admit("k", limits, T0 + 4)
    assert (over.limit, over.value, over.retry_after_s) == ("tpm", 100, 57.0)  # at T0+61 the first 60 leaves
    assert "100 tokens per minute (tpm)" in over.message()
    assert windows.admit("k", limits, T0 + 61) is None


def test_keys_are_counted_apart_and_places_at_once_are_given_back():
    windows = RateWindows()
    assert windows.admit("a", QuotaLimits(rpm=1), T0) is None
    assert windows.admit("b", QuotaLimits(rpm=1), T0) is None
    assert windows.take("a", 1) and not windows.take("a", 1) and windows.take("b", 1)
    windows.give_back("a")
    assert windows.take("a", 1)


@settings(max_examples=300, deadline=None)
@given(rpm=st.integers(1, 8), gaps=st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=80))
def test_no_60_s_window_ever_admits_more_than_rpm(rpm, gaps):
    windows, now, admitted = RateWindows(), T0, []
    for gap in gaps:
        now += gap
        over = windows.admit("k", QuotaLimits(rpm=rpm), now)
        if over is None:
            admitted.append(now)
        else:  # Retry-After is exact: not a moment sooner would do, and then one more fits
            assert over.retry_after_s > 0
            assert rpm_freed_at(admitted, rpm, now + over.retry_after_s) is None
    for start in admitted:
        assert sum(start <= t < start + WINDOW_S for t in admitted) <= rpm


# -- the counters --------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def redis_reachable() -> None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")


@pytest.fixture(params=["in-process", "redis"])
def make_counter(request):
    """`make(clock)`: counters of one kind; the Redis ones of a test share a prefix of their own (so they
    count together, as front ends do), removed afterwards."""
    if request.param == "in-process":
        shared = {}
        yield lambda clock: shared.setdefault("counter", InProcessQuotaCounter(clock))
        return
    redis_reachable()
    prefix = f"llamaswap-test-quota-{uuid.uuid4().hex[:12]}"
    yield lambda clock: RedisQuotaCounter(REDIS_URL, prefix=prefix, clock=clock)
    with redis.Redis.from_url(REDIS_URL) as connection:
        for name in connection.scan_iter(f"{prefix}:*"):
            connection.delete(name)


async def admitted(counter, key: str, limits: QuotaLimits) -> OverQuota | None:
    return (await counter.admit(key, limits, take_place=False)).over


async def test_both_counters_answer_rpm_with_the_exact_retry_after(make_counter):
    clock = Clock()
    one, two = make_counter(clock), make_counter(clock)  # two front ends
    limits = QuotaLimits(rpm=3)
    assert await admitted(one, "k", limits) is None
    clock.now += 10.5
    assert await admitted(two, "k", limits) is None
    assert await admitted(one, "k", limits) is None
    clock.now += 1
    assert await admitted(two, "k", limits) == OverQuota("k", "rpm", 3, 48.5)
    assert await admitted(one, "other", limits) is None
    clock.now += 48.5
    assert await admitted(one, "k", limits) is None


async def test_both_counters_answer_tpm_from_spent_tokens(make_counter):
    clock = Clock()
    one, two = make_counter(clock), make_counter(clock)
    limits = QuotaLimits(tpm=1000)
    assert await admitted(one, "k", limits) is None
    await one.end("k", None, 700)
    clock.now += 25
    await two.end("k", None, 500)
    clock.now += 5
    assert await admitted(two, "k", limits) == OverQuota("k", "tpm", 1000, 30.0)
    clock.now += 30  # the 700 leaves: 500 left, under the limit
    assert await admitted(one, "k", limits) is None
    await one.end("k", None, 600)
    clock.now += 25  # the 500 leaves too: 600 left
    assert await admitted(two, "k", limits) is None
    await two.end("k", None, 400)
    assert await admitted(one, "k", limits) == OverQuota("k", "tpm", 1000, 35.0)


async def test_both_counters_hold_places_at_once_across_front_ends(make_counter):
    clock = Clock()
    one, two = make_counter(clock), make_counter(clock)
    limits = QuotaLimits(rpm=100, concurrency=2)
    first = await one.admit("k", limits, take_place=True)
    second = await two.admit("k", limits, take_place=True)
    assert first.over is None and first.place is not None and second.place is not None
    third = await one.admit("k", limits, take_place=True)
    assert third.over is None and third.place is None  # admitted, with no place yet
    assert await two.take("k", 2) is None
    assert await one.take("other", 2) is not None
    await two.end("k", second.place, 0)
    assert await one.take("k", 2) is not None


async def test_giving_back_one_of_two_places_frees_that_one_only(make_counter):
    clock = Clock()
    one, two = make_counter(clock), make_counter(clock)
    first, second = await one.take("k", 2), await two.take("k", 2)
    assert first is not None and second is not None
    await one.end("k", first, 0)
    assert await two.take("k", 2) is not None  # the one given back
    assert await one.take("k", 2) is None  # the other is still held
    await two.end("k", second, 0)


async def test_a_request_that_held_no_place_frees_none_when_it_ends(make_counter):
    """A request admitted without a place at once (its key had no concurrency then) ends: the place another
    request holds stays held."""
    clock = Clock()
    counter = make_counter(clock)
    held = await counter.take("k", 1)
    assert held is not None
    await counter.end("k", None, 10)
    assert await counter.take("k", 1) is None
    await counter.end("k", held, 0)
    assert await counter.take("k", 1) is not None


async def test_a_place_held_past_its_lease_and_past_redis_expiry_is_renewed_and_stays_held(monkeypatch):
    """A request running longer than the lease keeps its place: its front end pushes the lapse on while it holds it,
    and keeps Redis from expiring the places' record under it. The lease is shortened here (renewed every 0.1 s;
    the record set to expire 2 s after a take), and the lapse runs on the test's clock."""
    redis_reachable()
    monkeypatch.setattr("proxy.serving.quota_counters.LEASE_S", 0.3)
    clock = Clock()
    prefix = f"llamaswap-test-quota-{uuid.uuid4().hex[:12]}"
    holding, other = (RedisQuotaCounter(REDIS_URL, prefix=prefix, clock=clock) for _ in range(2))
    loop = asyncio.get_running_loop()
    try:
        place = await holding.take("k", 1)
        assert place is not None
        clock.now += 0.2  # within its first lease, which ends at T0 + 0.3
        with redis.Redis.from_url(REDIS_URL) as connection:
            deadline = loop.time() + 5.0
            while (connection.zscore(f"{prefix}:k:held", place) or 0) < T0 + 0.45:
                assert loop.time() < deadline, "the held place was never renewed"
                await asyncio.sleep(0.02)
        clock.now += 0.2  # past its first lease, within the renewed ones
        past_expiry = loop.time() + 3.0  # what a take set the record to expire in (2 s) has passed
        while loop.time() < past_expiry:
            assert await other.take("k", 1) is None, "a place still held lapsed"
            await asyncio.sleep(0.1)
        await holding.end("k", place, 0)
        assert await other.take("k", 1) is not None
    finally:
        with redis.Redis.from_url(REDIS_URL) as connection:
            for name in connection.scan_iter(f"{prefix}:*"):
                connection.delete(name)


steps = st.lists(st.tuples(st.floats(0, 40, allow_nan=False), st.integers(0, 400)), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None)
@given(rpm=st.one_of(st.none(), st.integers(1, 5)), tpm=st.one_of(st.none(), st.integers(1, 1000)), program=steps)
def test_redis_answers_exactly_as_the_windows_in_this_process(rpm, tpm, program):
    """Random programs of requests (each after a pause, ending with some tokens): the same refusals, to the
    same Retry-After, from Redis as from this process."""
    redis_reachable()
    limits = QuotaLimits(rpm=rpm, tpm=tpm)
    prefix = f"llamaswap-test-quota-{uuid.uuid4().hex[:12]}"

    async def run() -> list:
        clock = Clock()
        here, shared = InProcessQuotaCounter(clock), RedisQuotaCounter(REDIS_URL, prefix=prefix, clock=clock)
        answers = []
        for pause, tokens in program:
            clock.now += pause
            for counter in (here, shared):
                admission = await counter.admit("k", limits, take_place=False)
                answers.append((counter is here, admission.over))
                if admission.over is None:
                    await counter.end("k", None, tokens)
        return answers

    try:
        answers = asyncio.run(run())
    finally:
        with redis.Redis.from_url(REDIS_URL) as connection:
            for name in connection.scan_iter(f"{prefix}:*"):
                connection.delete(name)
    assert [over for is_here, over in answers if is_here] == [over for is_here, over in answers if not is_here]


async def test_a_place_held_by_a_front_end_that_died_lapses():
    redis_reachable()
    clock = Clock()
    prefix = f"llamaswap-test-quota-{uuid.uuid4().hex[:12]}"
    dead, alive = (RedisQuotaCounter(REDIS_URL, prefix=prefix, clock=clock) for _ in range(2))
    assert await dead.take("k", 1) is not None  # never given back, never renewed
    assert await alive.take("k", 1) is None
    clock.now += 30.001
    assert await alive.take("k", 1) is not None
    with redis.Redis.from_url(REDIS_URL) as connection:
        connection.delete(f"{prefix}:k:held")


async def test_with_redis_away_requests_are_admitted_uncounted_and_the_log_says_so_once(caplog):
    away = RedisQuotaCounter(f"redis://127.0.0.1:{free_port()}/0", prefix="llamaswap-test-quota-away")
    limits = QuotaLimits(rpm=1, tpm=1, concurrency=1)
    with caplog.at_level(logging.WARNING, logger="llamaswap.quota"):
        for _ in range(3):
            admission = await away.admit("k", limits, take_place=True)
            assert admission.over is None and admission.place is not None
            assert await away.take("k", 1) is not None
            await away.end("k", admission.place, 50)
    warnings = [r.getMessage() for r in caplog.records if r.name == "llamaswap.quota"]
    assert len(warnings) == 1 and "admitted uncounted" in warnings[0], warnings


async def test_a_place_redis_missed_giving_back_is_given_back_as_soon_as_it_answers(caplog):
    """Redis away when a request ends: its place is not left held for the rest of its lease (the key's next
    request waited that long), and the log says once that the give-back waits for Redis."""
    redis_reachable()
    target = urlsplit(REDIS_URL)
    prefix = f"llamaswap-test-quota-{uuid.uuid4().hex[:12]}"
    try:
        with Relay(target.hostname, target.port or 6379, name="redis") as relay:
            ending = RedisQuotaCounter(f"redis://{relay.url_host}{target.path}", prefix=prefix)
            other = RedisQuotaCounter(REDIS_URL, prefix=prefix)  # another front end, its Redis never away
            place = await ending.take("k", 1)
            assert place is not None
            relay.cut()
            with caplog.at_level(logging.WARNING, logger="llamaswap.quota"):
                await ending.end("k", place, 0)
                await asyncio.sleep(0.5)  # some give-backs tried and failed meanwhile
            assert await other.take("k", 1) is None
            relay.restore()
            deadline = asyncio.get_running_loop().time() + 2.0
            while await other.take("k", 1) is None:
                assert asyncio.get_running_loop().time() < deadline, "the place was not given back once Redis was back"
                await asyncio.sleep(0.05)
    finally:
        with redis.Redis.from_url(REDIS_URL) as connection:
            for name in connection.scan_iter(f"{prefix}:*"):
                connection.delete(name)
    given_back = [r.getMessage() for r in caplog.records if "could not give back" in r.getMessage()]
    assert len(given_back) == 1 and "'k'" in given_back[0], given_back


# -- the gate ------------------------------------------------------------------------------------------

async def test_the_gate_refuses_over_rpm_with_429_and_retry_after():
    clock = Clock()
    counter = InProcessQuotaCounter(clock)
    scope = KeyScope(name="k", limits=QuotaLimits(rpm=1))
    async with within_quota(scope, counter):
        pass
    clock.now += 0.4
    with pytest.raises(ProxyError) as refused:
        async with within_quota(scope, counter):
            pass
    assert (refused.value.status, refused.value.code) == (429, "rate_limit_exceeded")
    assert refused.value.headers == {"Retry-After": "60"}  # 59.6 s, rounded up


async def test_over_concurrency_a_request_waits_for_the_keys_own_and_others_go_on():
    counter = InProcessQuotaCounter()
    limited = KeyScope(name="k", limits=QuotaLimits(concurrency=1))
    order: list[str] = []
    first_in, first_may_end = asyncio.Event(), asyncio.Event()

    async def first():
        async with within_quota(limited, counter):
            order.append("first")
            first_in.set()
            await first_may_end.wait()

    async def second():
        async with within_quota(limited, counter):
            order.append("second")

    async def other_key():
        async with within_quota(KeyScope(name="other", limits=QuotaLimits(concurrency=1)), counter):
            order.append("other")

    one = asyncio.create_task(first())
    await first_in.wait()
    two = asyncio.create_task(second())
    await asyncio.wait_for(other_key(), 5)  # not held up behind k's waiter
    assert order == ["first", "other"] and not two.done()
    first_may_end.set()
    await asyncio.wait_for(asyncio.gather(one, two), 5)
    assert order == ["first", "other", "second"]


async def test_a_waiter_that_leaves_takes_no_place():
    counter = InProcessQuotaCounter()
    limited = KeyScope(name="k", limits=QuotaLimits(concurrency=1))
    held, release = asyncio.Event(), asyncio.Event()

    async def holder():
        async with within_quota(limited, counter):
            held.set()
            await release.wait()

    task = asyncio.create_task(holder())
    await held.wait()
    waiter = asyncio.create_task(within_quota(limited, counter).__aenter__())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await task
    async with within_quota(limited, counter):  # the place is free: nobody kept it
        pass


class Watched(InProcessQuotaCounter):
    """The in-process counter, telling when a request waiting for a place at once asks it for one and gets none
    (the request then waits to be woken), as opposed to one refused a place at its admission."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()
        self._admitting = False

    async def admit(self, key, limits, *, take_place):
        self._admitting = True
        try:
            return await super().admit(key, limits, take_place=take_place)
        finally:
            self._admitting = False

    async def take(self, key, concurrency):
        place = await super().take(key, concurrency)
        if place is None and not self._admitting:
            self.waiting.set()
        return place


async def held(scope, counter, name: str, order: list[str], may_end: asyncio.Event | None = None) -> None:
    """One request of `scope`'s key: `name` in `order` once it has its place, which it holds until `may_end`."""
    async with within_quota(scope, counter):
        order.append(name)
        if may_end is not None:
            await may_end.wait()


async def first_holding_second_waiting(counter: Watched):
    """Two requests of a key of concurrency 1: "first" holds its place until `release` is set, "second" has asked for
    one and waits. Returns (the key's scope, the order they got places in, release, their tasks)."""
    limited = KeyScope(name="k", limits=QuotaLimits(concurrency=1))
    order: list[str] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(held(limited, counter, "first", order, release)),
             asyncio.create_task(held(limited, counter, "second", order))]
    await asyncio.wait_for(counter.waiting.wait(), 5)
    return limited, order, release, tasks


async def test_a_place_freed_goes_to_the_keys_waiter_before_a_request_arriving_then():
    """Arrival order: a request that comes just as a place frees queues behind the key's request already waiting."""
    limited, order, release, tasks = await first_holding_second_waiting(counter := Watched())
    release.set()
    tasks.append(asyncio.create_task(held(limited, counter, "third", order)))  # comes right after first gives back
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["first", "second", "third"]


async def test_a_waiter_goes_on_when_a_place_frees_without_asking_again_on_a_timer(monkeypatch):
    """A place freed on this front end wakes the key's waiter at once; the timer that asks the counter again (for
    places freed on other front ends) is set to an hour here, so a waiter that only polled would not go on."""
    monkeypatch.setattr("proxy.serving.quota_gate.RETRY_S", 3600.0)
    _, order, release, tasks = await first_holding_second_waiting(Watched())
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["first", "second"]
