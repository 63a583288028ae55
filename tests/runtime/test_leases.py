"""Requests get the GPU through leases: granted once their model is ready, one job per slot, handed
on when released, and never handed to a client that has left."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.tickets import Outcome

from .fakes import DEADLINE


async def test_a_request_gets_a_lease_once_its_model_is_ready(gpu_for):
    gpu = gpu_for("a")
    client = await gpu.submit("a")
    start = await gpu.fleet.next_call("swap_in", "a")
    assert start.evict == ()
    assert gpu.state(client) == "queued" and not client.task.done()

    start.succeed()
    lease = await client.lease()

    assert (lease.ticket_id, lease.model, lease.upstream) == (client.ticket_id, "a", "http://upstream.invalid/a")
    assert lease.cut is None and lease.decision.needs_swap
    assert gpu.row(client) | {"state": "dispatched", "needed_swap": True, "slot": 1} == gpu.row(client)

    gpu.finish(lease)
    assert gpu.state(client) == "completed" and gpu.row(client)["status_code"] == 200
    assert gpu.row(client)["duration_ms"] >= 0


@pytest.mark.parametrize("second_model", ["a", "b"], ids=["same model", "other model of the swap group"])
async def test_a_second_request_waits_behind_the_first_and_gets_its_lease_on_release(gpu_for, second_model):
    gpu = gpu_for("a", "b")
    first, first_lease = await gpu.running("a")

    second = await gpu.submit(second_model)
    assert gpu.state(second) == "queued"
    assert gpu.fleet.started() == [("a", ())], "nothing starts while the GPU is busy"

    gpu.finish(first_lease)
    if second_model == "b":
        start = await gpu.fleet.next_call("swap_in", "b")
        assert start.evict == ("a",)
        start.succeed()
    lease = await second.lease()

    assert lease.model == second_model and lease.decision.needs_swap == (second_model == "b")
    assert gpu.row(second)["waited_because"] == ""  # the GPU was all in use, not partly idle
    gpu.finish(lease)
    assert [gpu.state(first), gpu.state(second)] == ["completed", "completed"]


async def test_a_client_that_leaves_while_queued_is_cancelled_and_its_model_never_starts(gpu_for):
    gpu = gpu_for("a", "b")
    first, first_lease = await gpu.running("a")
    leaving = await gpu.submit("b")

    leaving.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(leaving.task, DEADLINE)

    assert gpu.state(leaving) == "cancelled"
    assert gpu.row(leaving)["error"] == "client disconnected while queued"
    after = await gpu.submit("a")
    gpu.finish(first_lease)
    lease = await after.lease()
    assert not lease.decision.needs_swap
    gpu.finish(lease)
    assert gpu.fleet.started() == [("a", ())]


async def test_a_client_that_leaves_while_its_model_starts_is_cancelled_and_the_start_still_finishes(gpu_for):
    gpu = gpu_for("a")
    leaving = await gpu.submit("a")
    start = await gpu.fleet.next_call("swap_in", "a")

    leaving.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(leaving.task, DEADLINE)
    assert gpu.state(leaving) == "cancelled"
    assert gpu.row(leaving)["error"] == "client disconnected while its model was starting for it"
    assert not start.cancelled

    start.succeed()
    after = await gpu.submit("a")
    lease = await after.lease()
    assert not lease.decision.needs_swap, "the model the departed client started serves the next one"
    gpu.finish(lease)
    assert gpu.fleet.started() == [("a", ())]


async def test_a_model_with_two_slots_serves_two_leases_at_once_and_never_a_third(gpu_for):
    gpu = gpu_for("a", slots={"a": 2})
    first, second, third = [await gpu.submit("a") for _ in range(3)]
    await gpu.fleet.start("a")

    leases = [await first.lease(), await second.lease()]
    assert sorted(lease.decision.slot for lease in leases) == [1, 2]
    assert gpu.state(third) == "queued"

    gpu.finish(leases[0])
    third_lease = await third.lease()
    assert third_lease.decision.slot == leases[0].decision.slot
    for lease in (leases[1], third_lease):
        gpu.finish(lease)
    assert gpu.fleet.started() == [("a", ())]


async def test_release_is_idempotent(gpu_for):
    gpu = gpu_for("a")
    clients = [await gpu.submit("a") for _ in range(3)]
    await gpu.fleet.start("a")
    lease = await clients[0].lease()

    gpu.runtime.release(lease.ticket_id, Outcome(state="completed", status_code=200))
    gpu.runtime.release(lease.ticket_id, Outcome(state="failed", status_code=502, error="late"))

    assert gpu.recorder.states[lease.ticket_id] == ["queued", "dispatched", "completed"]
    assert gpu.row(clients[0])["status_code"] == 200
    second = await clients[1].lease()
    assert gpu.state(clients[2]) == "queued", "a second release frees no second slot"
    gpu.finish(second)
    gpu.finish(await clients[2].lease())
