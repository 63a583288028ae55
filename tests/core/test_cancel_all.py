"""Requests that leave together (a front end that died) leave in one step: the scheduler gives out what
they held only once all of them are gone, so none of them is granted or has its model started."""

import pytest

from scheduling.core import FifoScheduler, SerialScheduler, SerialSettings

from .harness import Tickets, dequeued, grant_of, grants, one_at_a_time, specs, starts


def busy_x_with_y_next(cls):
    """x is up, running #1 (a front end's); #2 (the same front end's) wants y and goes next; in the
    serial scheduler #3 (another front end's) waits for x behind it."""
    scheduler = cls(specs("x", "y"), one_at_a_time("x", "y"), SerialSettings())
    ticket = Tickets()
    first = ticket("x")
    scheduler.submit(first, 0.0)
    scheduler.model_ready("x", 0.0)
    swap_next, behind = ticket("y", priority=100, arrival=1.0), ticket("x", arrival=2.0)
    assert not starts(scheduler.submit(swap_next, 1.0))
    if cls is SerialScheduler:
        assert not grants(scheduler.submit(behind, 2.0)), "x is busy"
    return scheduler, first, swap_next, behind


@pytest.mark.parametrize("cls", [SerialScheduler, FifoScheduler])
def test_one_by_one_the_running_ones_slot_goes_to_its_own_queued_request(cls):
    scheduler, first, swap_next, _ = busy_x_with_y_next(cls)
    assert [s.model for s in starts(scheduler.cancel(first.id, 3.0))] == ["y"], "why they must leave together"


@pytest.mark.parametrize("cls", [SerialScheduler, FifoScheduler])
def test_leaving_together_starts_no_model_and_grants_none_of_them(cls):
    scheduler, first, swap_next, behind = busy_x_with_y_next(cls)
    effects = scheduler.cancel_all([first.id, swap_next.id], 3.0)
    assert not starts(effects)
    assert dequeued(effects) == [swap_next.id]
    if cls is SerialScheduler:
        assert grants(effects) == [behind.id] and not grant_of(effects).decision.needs_swap
    assert scheduler.snapshot(3.0).waiting == 0


@pytest.mark.parametrize("cls", [SerialScheduler, FifoScheduler])
def test_ids_that_are_no_longer_there_are_ignored(cls):
    scheduler, first, swap_next, _ = busy_x_with_y_next(cls)
    scheduler.cancel_all([first.id, swap_next.id], 3.0)
    assert scheduler.cancel_all([99, first.id, swap_next.id], 4.0) == []
