"""What an operator can do to waiting requests, and how a shutdown treats running and queued ones."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.core import SwapGroup
from scheduling.tickets import Refused, TicketRequest

from .fakes import DEADLINE


async def test_an_operator_cancels_a_queued_request_with_a_503_and_not_a_running_one(gpu_for):
    gpu = gpu_for("a")
    running, lease = await gpu.running("a")
    queued = await gpu.submit("a")

    assert gpu.runtime.operators.cancel(queued.ticket_id)

    with pytest.raises(Refused) as refused:
        await queued.lease()
    assert (refused.value.status, refused.value.code) == (503, "cancelled_by_operator")
    assert gpu.row(queued) | {"state": "cancelled", "status_code": 503} == gpu.row(queued)
    assert not gpu.runtime.operators.cancel(queued.ticket_id), "already gone"
    assert not gpu.runtime.operators.cancel(lease.ticket_id), "running requests are the unload's to cut"
    gpu.finish(lease)
    assert gpu.state(running) == "completed"


async def test_reprioritizing_a_queued_request_moves_it_ahead_and_updates_its_row(gpu_for):
    gpu = gpu_for("a")
    _, lease = await gpu.running("a")
    earlier, later = await gpu.submit("a"), await gpu.submit("a")

    assert gpu.runtime.operators.reprioritize(later.ticket_id, 100)
    assert not gpu.runtime.operators.reprioritize(lease.ticket_id, 100), "a running request has no rank to change"

    assert (gpu.row(later)["priority"], gpu.row(later)["band"]) == (100, "interactive")
    gpu.finish(lease)
    moved = await later.lease()
    assert moved.decision.priority == 100 and moved.decision.runner_up_id == earlier.ticket_id
    assert gpu.state(earlier) == "queued"
    gpu.finish(moved)
    gpu.finish(await earlier.lease())


async def test_shutdown_refuses_queued_requests_and_ends_as_soon_as_running_ones_do(gpu_for):
    gpu = gpu_for("a", "b")
    running, lease = await gpu.running("a")
    queued = [await gpu.submit("a"), await gpu.submit("b")]
    loop = asyncio.get_running_loop()
    began = loop.time()

    shutdown = loop.create_task(gpu.runtime.shutdown(drain_seconds=60))
    await asyncio.sleep(0)  # one step: shutdown refuses the queue before it first waits

    for client in queued:
        with pytest.raises(Refused) as refused:
            await client.lease()
        assert (refused.value.status, refused.value.code) == (503, "shutting_down")
        assert gpu.row(client) | {"state": "rejected", "status_code": 503} == gpu.row(client)
    with pytest.raises(Refused) as late:
        await gpu.runtime.submit(TicketRequest(model="a", path="/v1/chat/completions", priority=0))
    assert (late.value.status, late.value.code) == (503, "shutting_down")
    assert not shutdown.done(), "the running request may finish"

    gpu.finish(lease)
    await asyncio.wait_for(shutdown, DEADLINE)
    assert loop.time() - began < DEADLINE
    assert gpu.state(running) == "completed"
    assert gpu.fleet.stopped() == [], "models are stopped by the service after the drain, not cut by it"


async def test_shutdown_gives_up_after_its_budget_on_a_running_request_and_a_hanging_start(gpu_for):
    side_by_side = tuple(SwapGroup(model, (model,), exclusive=False) for model in ("a", "b"))
    gpu = gpu_for("a", "b", groups=side_by_side)
    _, lease = await gpu.running("a")
    starting = await gpu.submit("b")
    hanging = await gpu.fleet.next_call("swap_in", "b")
    loop = asyncio.get_running_loop()
    began = loop.time()

    await asyncio.wait_for(gpu.runtime.shutdown(drain_seconds=0.2), DEADLINE)

    assert 0.2 <= loop.time() - began < DEADLINE
    with pytest.raises(Refused) as refused:
        await starting.lease()
    assert (refused.value.status, refused.value.code, refused.value.ticket_id) == (503, "shutting_down", starting.ticket_id)
    await asyncio.wait_for(asyncio.wait([hanging.outcome]), DEADLINE)
    assert hanging.cancelled, "the start is abandoned once the budget is spent"
    assert (lease.cut.status, lease.cut.code) == (503, "shutting_down"), "the shutdown cut it, not its model stopping"
    assert gpu.runtime.granted_request(lease.ticket_id) is None
    assert gpu.row(lease) | {"state": "cancelled", "status_code": 503, "error": lease.cut.message} == gpu.row(lease)


def test_a_call_from_another_thread_after_the_runtime_loop_closed_raises_and_leaves_no_coroutine_behind():
    """A /metrics scrape during shutdown asks a runtime whose loop has closed: it gets a RuntimeError (which
    the collector turns into no figures), and no 'coroutine was never awaited' warning follows it."""
    import gc
    import warnings

    from types import SimpleNamespace

    from scheduling.runtime.operators import OperatorActions

    closed = asyncio.new_event_loop()
    closed.close()
    actions = OperatorActions(SimpleNamespace(_loop=closed))  # a runtime whose loop has closed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError):
            actions.from_thread(lambda: None)
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
