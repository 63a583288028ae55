"""What the runtime does when a model does not come up, exits on its own, or is unloaded."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.tickets import Outcome, Refused

from .fakes import DEADLINE


async def refusal(client) -> Refused:
    with pytest.raises(Refused) as refused:
        await client.lease()
    return refused.value


async def test_a_failed_start_rejects_its_request_and_every_request_queued_for_that_model_with_503(gpu_for):
    gpu = gpu_for("a", "b")
    first, second = await gpu.submit("a"), await gpu.submit("a")
    other = await gpu.submit("b")

    (await gpu.fleet.next_call("swap_in", "a")).fail("exited with code 1")

    for client in (first, second):
        refused = await refusal(client)
        assert (refused.status, refused.code) == (503, "model_start_failed")
        assert "exited with code 1" in refused.message
        assert gpu.row(client) | {"state": "rejected", "status_code": 503} == gpu.row(client)
    start = await gpu.fleet.next_call("swap_in", "b")
    assert start.evict == (), "the model that failed holds nothing to evict"
    start.succeed()
    gpu.finish(await other.lease())


async def test_a_crash_during_a_job_restarts_the_model_for_the_next_request_once_the_job_has_ended(gpu_for):
    gpu = gpu_for("a")
    running, lease = await gpu.running("a")
    queued = await gpu.submit("a")

    gpu.runtime.model_exited("a")

    assert lease.cut is None, "the crashed job fails by itself; it is not cut"
    assert gpu.state(queued) == "queued" and gpu.fleet.started() == [("a", ())]
    gpu.runtime.release(lease.ticket_id, Outcome(state="failed", status_code=502, error="upstream closed"))
    assert gpu.row(running) | {"state": "failed", "status_code": 502} == gpu.row(running)

    await gpu.fleet.start("a")
    restarted = await queued.lease()
    assert restarted.decision.needs_swap and gpu.fleet.started() == [("a", ()), ("a", ())]
    gpu.finish(restarted)


async def test_unloading_cuts_a_running_lease_cancels_its_holder_and_says_so_in_the_row(gpu_for):
    gpu = gpu_for("a")
    running, lease = await gpu.running("a")
    holder = asyncio.get_running_loop().create_future()  # stands for the task relaying the request
    lease.held_by(holder_task := asyncio.ensure_future(holder))
    queued = await gpu.submit("a")

    stops = gpu.runtime.unload(["a"])

    assert lease.cut is not None and (lease.cut.status, lease.cut.code) == (503, "model_unloaded")
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(holder_task, DEADLINE)
    row = gpu.row(running)
    assert (row["state"], row["status_code"]) == ("cancelled", 503)
    assert row["error"] == "model 'a' was unloaded by an operator while this request was running"
    gpu.finish(lease)  # the holder's own release afterwards changes nothing
    assert gpu.state(running) == "cancelled"

    assert gpu.state(queued) == "queued", "a waiting request stays queued through an unload"
    (await gpu.fleet.next_call("stop", "a")).succeed()
    await asyncio.wait_for(asyncio.gather(*stops), DEADLINE)
    await gpu.fleet.start("a")
    gpu.finish(await queued.lease())
    assert gpu.fleet.started() == [("a", ()), ("a", ())]


async def test_unloading_a_starting_model_refuses_its_request_and_a_later_request_starts_it_afresh(gpu_for):
    gpu = gpu_for("a")
    client = await gpu.submit("a")
    start = await gpu.fleet.next_call("swap_in", "a")

    stops = gpu.runtime.unload(["a"])
    refused = await refusal(client)
    assert (refused.status, refused.code) == (503, "model_unloaded")
    assert gpu.state(client) == "rejected"

    (await gpu.fleet.next_call("stop", "a")).succeed()
    start.fail("killed by the stop")  # what stopping a starting process does to its start
    await asyncio.wait_for(asyncio.gather(*stops), DEADLINE)
    later = await gpu.submit("a")
    await gpu.fleet.start("a")
    gpu.finish(await later.lease())
