"""A scheduler worker taking over from one that stopped or died, over a real Redis channel layer: the
queue rebuilt from the rows and from the front ends' second submits, every request served exactly
once (the shared recorder checks each row ends once), in priority order."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from scheduling.door.in_process import InProcessFrontDoor
from scheduling.door.remote import ChannelLayerFrontDoor
from scheduling.tickets import Carried, Interrupted, Outcome, TicketRequest, stamped
from scheduling.door.worker import SchedulerWorker

from .fakes import DEADLINE, FakeRecorder, until

DONE = Outcome(state="completed", status_code=200)


class Deaf(SchedulerWorker):
    """A worker that dies with the submits it read before recording them."""

    def handle(self, message) -> None:
        if type(message).__name__ != "Submit":
            super().handle(message)


@pytest.fixture
async def workers(redis_layer_factory):
    """`start(gpu, cls=SchedulerWorker, carried=())`: a worker serving `gpu` on the test's channel layer;
    `stop(worker)`: end it. Everything still running is stopped after the test."""
    running: dict[SchedulerWorker, asyncio.Task] = {}

    def start(gpu, cls=SchedulerWorker, carried=()):
        worker = cls(InProcessFrontDoor(gpu.runtime, gpu.fleet, None), redis_layer_factory(), ["a"])
        worker.rebuild(list(carried))
        running[worker] = asyncio.get_running_loop().create_task(worker.run())
        return worker

    async def stop(worker):
        await worker.stop()
        await asyncio.wait_for(running.pop(worker), DEADLINE)

    yield start, stop
    for worker in list(running):
        await stop(worker)


@pytest.fixture
async def front_ends(redis_layer_factory):
    made = [ChannelLayerFrontDoor(None, redis_layer_factory(), heartbeat_s=0.05) for _ in range(2)]
    yield made
    for door in made:
        await door.close()


def submit(door: ChannelLayerFrontDoor, model: str, priority: int = 0) -> asyncio.Task:
    request = TicketRequest(model=model, path="/v1/chat/completions", priority=priority, route="/v1/chat/completions")
    return asyncio.get_running_loop().create_task(door.submit(request))


def carried_from(recorder) -> list[Carried]:
    """What `scheduling.rows.recovery.carried_requests` reads from the database, read from the fake rows."""
    queued = sorted((row["arrived_at"], ticket_id) for ticket_id, row in recorder.rows.items() if row["state"] == "queued")
    carried = []
    for arrived_at, ticket_id in queued:
        row = recorder.rows[ticket_id]
        request = TicketRequest(model=row["model"], path=row["path"], priority=row["priority"], route=row["route"],
                                origin=row["origin"])
        carried.append(Carried(request, arrived_at, ticket_id))
    return carried


async def serve_in_order(gpu, waiting: dict[asyncio.Task, ChannelLayerFrontDoor]) -> list[int]:
    """Start the model, then finish each granted request in turn; the priorities in grant order."""
    await gpu.fleet.start("a")
    order = []
    while len(order) < len(waiting):
        pending = [task for task in waiting if not task.done()]
        done, _ = await asyncio.wait(pending, timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "one slot, one grant at a time"
        (task,) = done
        lease = task.result()
        order.append(lease.decision.priority)
        waiting[task].release(lease.ticket_id, DONE)
    return order


async def granted_by_a_worker(gpu_for, start, door: ChannelLayerFrontDoor):
    """A worker serving "a", the model up, and the lease it granted `door`'s first request: (gpu, worker, lease)."""
    gpu = gpu_for("a")
    worker = start(gpu)
    holding = submit(door, "a")
    await gpu.fleet.start("a")
    return gpu, worker, await asyncio.wait_for(holding, DEADLINE)


async def check_settled(gpu, door: ChannelLayerFrontDoor) -> None:
    """The end of every takeover test, as `tests.served.Served.check_settled` ends the end-to-end ones:
    every row has ended exactly once, and the next request is granted and its row ends too."""
    await until(lambda: not gpu.recorder.unfinished() and not gpu.recorder.problems, "every row to end once")
    loaded = "a" in gpu.runtime.snapshot[1].loaded
    holding = submit(door, "a")
    if not loaded:
        await gpu.fleet.start("a")
    lease = await asyncio.wait_for(holding, DEADLINE)
    door.release(lease.ticket_id, DONE)
    await until(lambda: gpu.recorder.rows[lease.ticket_id]["state"] == "completed", "the next request to end")
    assert not gpu.recorder.unfinished() and not gpu.recorder.problems


async def test_a_worker_that_takes_over_serves_the_queue_from_the_rows_once_in_priority_order(
    gpu_for, workers, front_ends
):
    start, stop = workers
    first, second = front_ends
    gpu, old, held = await granted_by_a_worker(gpu_for, start, first)
    waiting = {submit(second, "a", -100): second, submit(first, "a", 0): first,
               submit(second, "a", 100): second, submit(first, "a", 0): first}
    await until(lambda: len(gpu.recorder.rows) == 5, "every request queued at the first worker")

    assert old.hand_over() == 4
    first.release(held.ticket_id, DONE)
    await until(lambda: gpu.recorder.rows[held.ticket_id]["state"] == "completed", "the running request to end")
    await stop(old)
    assert not any(task.done() for task in waiting), "handed over, not answered"

    successor = gpu_for("a", recorder=gpu.recorder)
    start(successor, carried=carried_from(gpu.recorder))
    assert await serve_in_order(successor, waiting) == [100, 0, 0, -100]
    assert len(gpu.recorder.rows) == 5, "the front ends' second submits were recognised, not queued again"
    await check_settled(successor, first)


async def test_requests_a_dead_worker_never_recorded_are_submitted_again_with_their_arrival(
    gpu_for, workers, front_ends
):
    start, stop = workers
    first, second = front_ends
    dead = start(gpu_for("a"), cls=Deaf)
    waiting = {submit(first, "a", 0): first, submit(second, "a", 100): second, submit(first, "a", -100): first}
    await until(lambda: len(dead._heard) == 2, "the first worker to read from both front ends")
    await stop(dead)
    took_over_at = datetime.now(timezone.utc)

    gpu = gpu_for("a")
    start(gpu)
    await until(lambda: len(gpu.recorder.rows) == 3, "the front ends to submit their requests again")
    assert all(row["arrived_at"] < took_over_at for row in gpu.recorder.rows.values()), "arrival kept for aging"
    assert await serve_in_order(gpu, waiting) == [100, 0, -100]
    await check_settled(gpu, second)


async def test_a_request_whose_client_left_while_no_worker_served_it_ends_its_row(gpu_for, workers, front_ends):
    start, stop = workers
    first, _ = front_ends
    gpu, old, held = await granted_by_a_worker(gpu_for, start, first)
    leaving = submit(first, "a")
    await until(lambda: len(gpu.recorder.rows) == 2, "the second request queued")
    assert old.hand_over() == 1
    first.release(held.ticket_id, DONE)
    await until(lambda: gpu.recorder.rows[held.ticket_id]["state"] == "completed", "the running request to end")
    await stop(old)

    successor = gpu_for("a", recorder=gpu.recorder)
    new = start(successor, carried=carried_from(gpu.recorder))  # it gathers for half a second
    await until(lambda: new._greeted, "the new worker to hear from the front end")  # a pub/sub layer listens now
    leaving.cancel()
    await until(lambda: gpu.recorder.rows[2]["state"] == "cancelled", "the left request's row to end")
    assert successor.fleet.calls == [], "no model is started for a client that is gone"
    await check_settled(successor, first)


async def test_a_stop_its_predecessor_left_on_the_channel_does_not_stop_the_next_worker(
    gpu_for, workers, front_ends, redis_layer_factory
):
    """A worker that exits as it reads its own stop leaves channels_redis's in-flight copy, which the
    next worker for the same models reads first from their shared channel."""
    start, _ = workers
    first, _ = front_ends
    gone = SchedulerWorker(InProcessFrontDoor(gpu_for("a").runtime, None, None), redis_layer_factory(), ["a"])
    await gone.stop()  # never read: as the copy put back on the channel
    gpu = gpu_for("a")
    start(gpu)
    holding = submit(first, "a")
    await gpu.fleet.start("a")
    lease = await asyncio.wait_for(holding, DEADLINE)
    first.release(lease.ticket_id, DONE)
    await check_settled(gpu, first)


async def test_a_request_granted_by_a_worker_that_died_ends_as_its_front_end_reports(gpu_for, workers, front_ends):
    """The stream runs from the model to the front end: its end, reported to the worker that took over,
    replaces the `interrupted` the rows say after the takeover, with the times the front end saw."""
    start, stop = workers
    first, _ = front_ends
    gpu, old, lease = await granted_by_a_worker(gpu_for, start, first)
    await stop(old)  # gone without a word, as under kill -9: the row stays dispatched
    row = dict(gpu.recorder.rows[lease.ticket_id])
    interrupted = Interrupted(lease.ticket_id, row["origin"], row["dispatched_at"])

    database = FakeRecorder()  # as the takeover found it
    database.rows[lease.ticket_id], database.states[lease.ticket_id] = row, [row["state"]]
    successor = gpu_for("a", recorder=database)
    gpu.recorder.update(lease.ticket_id, state="interrupted")  # what the dead worker's runtime knew ends there
    new = start(successor)
    new.expect_ends([interrupted])
    await until(lambda: new._greeted, "the new worker to hear from the front end")  # a pub/sub layer listens now
    now = asyncio.get_running_loop().time()
    ended = stamped(Outcome(state="completed", status_code=200, usage={"output_tokens": 7},
                            first_byte_monotonic=now - 1.0), now)
    first.release(lease.ticket_id, ended)
    await until(lambda: successor.recorder.rows[lease.ticket_id]["state"] == "completed", "the row to say how it ended")
    row = successor.recorder.rows[lease.ticket_id]
    assert row["output_tokens"] == 7 and row["status_code"] == 200 and row["error"] == ""
    assert row["finished_at"].timestamp() == pytest.approx(ended.ended_at)
    assert row["first_byte_at"].timestamp() == pytest.approx(ended.ended_at - 1.0)
    assert row["duration_ms"] == pytest.approx((row["finished_at"] - row["dispatched_at"]).total_seconds() * 1000, abs=1)
    await check_settled(successor, first)
