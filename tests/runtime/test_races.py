"""Operator actions and stops that cross a client's departure or a start in flight."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.tickets import Outcome, Refused

from .fakes import DEADLINE

DONE = Outcome(state="completed", status_code=200)


async def test_an_operator_cancel_just_after_the_client_left_does_not_raise(gpu_for):
    """The client's task is cancelled (its waiter future with it) but has not run yet when the
    admin's cancel arrives: the cancel is taken, and the row ends once."""
    gpu = gpu_for("a")
    running = await gpu.submit("a")
    await gpu.fleet.start("a")
    lease = await running.lease()
    queued = await gpu.submit("a")

    queued.task.cancel()
    assert gpu.runtime.operators.cancel(queued.ticket_id)

    with pytest.raises((asyncio.CancelledError, Refused)):
        await asyncio.wait_for(queued.task, DEADLINE)
    gpu.runtime.release(lease.ticket_id, DONE)


async def test_reprioritize_says_no_for_a_request_already_dispatched_to_a_starting_model(gpu_for):
    """Dispatched to its model's start, the request has left the queue: a new priority would
    change nothing, so the runtime says so and leaves the row as it is."""
    gpu = gpu_for("a")
    client = await gpu.submit("a")
    start = await gpu.fleet.next_call("swap_in", "a")

    changed = gpu.runtime.operators.reprioritize(client.ticket_id, 100)
    row_priority = gpu.row(client)["priority"]

    start.succeed()
    lease = await client.lease()
    gpu.runtime.release(lease.ticket_id, DONE)
    assert (changed, row_priority) == (False, 0)


async def test_a_stop_that_fails_still_lets_the_start_it_cut_short_report_first(gpu_for):
    """Unloading a starting model whose stop raises: the aborted start still reports its failure
    before the stop is reported, so that failure is never taken for the next start's."""
    gpu = gpu_for("a")
    first = await gpu.submit("a")
    old_start = await gpu.fleet.next_call("swap_in", "a")
    gpu.runtime.unload(["a"])
    with pytest.raises(Refused):
        await first.lease()
    later = await gpu.submit("a")

    (await gpu.fleet.next_call("stop", "a")).fail("stop command failed")
    old_start.fail("killed by the stop")
    new_start = await gpu.fleet.next_call("swap_in", "a")
    new_start.succeed()
    lease = await later.lease()
    gpu.runtime.release(lease.ticket_id, DONE)
