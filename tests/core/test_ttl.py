"""TTL unloads only idle models: a model that requests are queued for is not idle, and its TTL counts
from the moment it last became idle (its last request ended, or the last one waiting for it left)."""

import pytest

from scheduling.core import (
    FifoScheduler,
    SerialScheduler,
    SerialSettings,
    StartModel,
    StopModel,
    SwapGroup,
    SwapPolicy,
)

from .harness import Tickets, grants, specs, starts, stops

TTL = 5.0


@pytest.fixture
def ticket():
    return Tickets()


def side_by_side_serial():
    """a (ttl 5) and b share the GPU; c, in no group, evicts both. A request for c that waits for
    b's job reserves a for its swap, so a request for a waits with a loaded and idle."""
    policy = SwapPolicy([SwapGroup("ab", ("a", "b"), swap=False)], ("a", "b", "c"))
    return SerialScheduler(
        specs("a", "b", "c", a={"ttl": TTL}), policy, SerialSettings(aging_divisor=60, swap_affinity_bonus=0)
    )


def exclusive_beside_shared_fifo():
    """fifo: b's group is not exclusive, so b starts beside a; a's group is, so a request for a must
    evict b, and waits while b serves — with a loaded and idle."""
    policy = SwapPolicy([SwapGroup("a", ("a",)), SwapGroup("b", ("b",), exclusive=False)], ("a", "b"))
    return FifoScheduler(_specs(), policy, SerialSettings())


def _specs():
    return specs("a", "b", a={"ttl": TTL})


def run_to_ready(scheduler, ticket, model, now):
    """Serve one request for `model` from stopped, leaving it ready and idle at `now`."""
    t = ticket(model, arrival=now)
    assert starts(scheduler.submit(t, now))
    assert grants(scheduler.model_ready(model, now)) == [t.id]
    scheduler.finished(t.id, now)


def busy_with_b(scheduler, ticket, now):
    """Start b beside the idle a and grant it a request that keeps running."""
    b = ticket("b", arrival=now)
    assert starts(scheduler.submit(b, now)) == [StartModel("b", evict=())]
    assert grants(scheduler.model_ready("b", now)) == [b.id]
    return b


def hold_a_back(scheduler, ticket, now):
    """Serial: an urgent request for c, whose swap must wait for b's job, reserves a; returns it."""
    if not isinstance(scheduler, SerialScheduler):
        return None
    urgent = ticket("c", priority=100, arrival=now)
    assert scheduler.submit(urgent, now) == []
    return urgent


@pytest.mark.parametrize("build", [side_by_side_serial, exclusive_beside_shared_fifo], ids=["serial", "fifo"])
def test_a_model_with_queued_requests_is_not_unloaded_by_its_ttl(build, ticket):
    scheduler = build()
    run_to_ready(scheduler, ticket, "a", 0.0)
    assert scheduler.next_deadline() == TTL
    b = busy_with_b(scheduler, ticket, 1.0)
    swap = hold_a_back(scheduler, ticket, 1.5)
    waiting = ticket("a", arrival=2.0)
    assert grants(scheduler.submit(waiting, 2.0)) == []  # queued behind b's job

    assert scheduler.next_deadline() is None
    assert scheduler.tick(100.0) == []  # far past a's TTL: still loaded for the request waiting on it

    if swap is not None:  # serial: the swap that held a back is called off
        effects = scheduler.cancel(swap.id, 101.0)
    else:
        effects = scheduler.finished(b.id, 101.0)
    if stops(effects):  # fifo: a's group evicts b before a may run
        assert stops(effects) == [StopModel("b", "evict")]
        effects = scheduler.model_stopped("b", 101.5)
    assert grants(effects) == [waiting.id] and not starts(effects)  # served without reloading a
    assert scheduler.next_deadline() is None  # serving
    scheduler.finished(waiting.id, 110.0)
    assert scheduler.next_deadline() == 110.0 + TTL  # the clock restarts once a is idle again
    assert scheduler.tick(110.0 + TTL) == [StopModel("a", "ttl")]


@pytest.mark.parametrize("build", [side_by_side_serial, exclusive_beside_shared_fifo], ids=["serial", "fifo"])
def test_the_ttl_counts_from_when_the_last_waiting_request_left(build, ticket):
    scheduler = build()
    run_to_ready(scheduler, ticket, "a", 0.0)
    busy_with_b(scheduler, ticket, 1.0)
    hold_a_back(scheduler, ticket, 1.5)
    first, second = ticket("a", arrival=2.0), ticket("a", arrival=3.0)
    scheduler.submit(first, 2.0)
    scheduler.submit(second, 3.0)
    scheduler.cancel(first.id, 50.0)
    assert scheduler.next_deadline() is None  # one still waits
    scheduler.cancel(second.id, 60.0)
    assert scheduler.next_deadline() == 60.0 + TTL
    assert scheduler.tick(60.0 + TTL - 0.5) == []
    assert scheduler.tick(60.0 + TTL) == [StopModel("a", "ttl")]
