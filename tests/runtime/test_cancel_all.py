"""Requests whose callers are gone together (a dead front end's) end in one step: their rows say so, a
running one's lease is cut, and only then does the scheduler pick, so none of them starts a model."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.tickets import Refused

from .fakes import DEADLINE


async def test_a_running_and_a_queued_request_leave_together_and_start_no_model(gpu_for):
    gpu = gpu_for("x", "y")
    running, lease = await gpu.running("x")
    lease.held_by(holder := asyncio.get_running_loop().create_task(asyncio.sleep(DEADLINE)))
    swap_next = await gpu.submit("y", priority=100)  # next once x is free: it would swap x out
    live = await gpu.submit("x")

    gpu.runtime.cancel_all([running.ticket_id, swap_next.ticket_id], "its front end was not heard from for 5 s")

    live_lease = await live.lease()
    assert not live_lease.decision.needs_swap and gpu.fleet.started() == [("x", ())], "y was never started"
    assert gpu.state(running) == gpu.state(swap_next) == "cancelled"
    assert gpu.row(running)["error"] == gpu.row(swap_next)["error"] == "its front end was not heard from for 5 s"
    assert lease.cut is not None and lease.cut.status == 499
    await asyncio.wait([holder], timeout=DEADLINE)
    assert holder.cancelled(), "the lease's holder is stopped"
    with pytest.raises(Refused):
        await swap_next.task
    gpu.finish(live_lease)
