"""Front ends reaching a scheduler worker over a real Redis channel layer: one queue for all of them,
leases given and taken back across the wire, and nothing leaked when a grant and a cancel cross."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from scheduling.core import Band
from scheduling.events import Finished, Unserved
from scheduling.door.frontdoor import Unanswered
from scheduling.door.in_process import InProcessFrontDoor
from scheduling.door.questions import BusyModels, Cancel, LogText, Reprioritize, Snapshot, Unload, Waiting
from scheduling.door.remote import ChannelLayerFrontDoor
from scheduling.tickets import Outcome, Refused, TicketRequest
from llamaswap_site.environment import redis_host
from scheduling.door.wire import FRONT_END_TIMEOUT_S, HEARTBEAT_S, Granted
from scheduling.door.worker import SchedulerWorker

from tests.conftest import REDIS_URL

from .fakes import DEADLINE, until

DONE = Outcome(state="completed", status_code=200)


@pytest.fixture
async def wired(gpu_for, redis_layer_factory):
    """`wired(*models)`: (gpu, worker, two front ends) on one channel layer, the worker serving."""
    workers, tasks, doors = [], [], []

    def make(
        *models: str, front_end_timeout_s: float = FRONT_END_TIMEOUT_S, heartbeat_s: float = HEARTBEAT_S,
        observers=(None, None),
    ):
        gpu = gpu_for(*models)
        door = InProcessFrontDoor(gpu.runtime, gpu.fleet, None)
        worker = SchedulerWorker(
            door, redis_layer_factory(), models, advertise="10.0.0.7", front_end_timeout_s=front_end_timeout_s,
            gather_s=0,
        )
        workers.append(worker)
        tasks.append(asyncio.get_running_loop().create_task(worker.run()))
        doors.extend(
            ChannelLayerFrontDoor(None, redis_layer_factory(), heartbeat_s=heartbeat_s, observer=observer)
            for observer in observers
        )
        return gpu, worker, doors[-2], doors[-1]

    yield make
    for door in doors:
        await door.close()
    for worker in workers:
        await worker.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE)


def submit(door: ChannelLayerFrontDoor, model: str, priority: int = 0) -> asyncio.Task:
    request = TicketRequest(model=model, path="/v1/chat/completions", priority=priority)
    return asyncio.get_running_loop().create_task(door.submit(request))


async def test_requests_through_two_front_ends_share_one_priority_order(wired):
    gpu, _, first, second = wired("a")
    holding = submit(first, "a")
    await gpu.fleet.start("a")
    lease = await asyncio.wait_for(holding, DEADLINE)
    assert lease.upstream.startswith("http://10.0.0.7"), "front ends reach the model at the worker's address"

    waiting = {
        submit(second, "a", -100): second, submit(first, "a", 0): first,
        submit(second, "a", 100): second, submit(first, "a", 0): first,
    }
    await until(lambda: len(gpu.recorder.rows) == 5, "every request queued at the worker")
    owner, order = first, []
    while len(order) < len(waiting):
        owner.release(lease.ticket_id, DONE)
        pending = [task for task in waiting if not task.done()]
        done, _ = await asyncio.wait(pending, timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "the released slot went to exactly one request"
        (task,) = done
        lease, owner = task.result(), waiting[task]
        order.append(lease.decision.priority)
    owner.release(lease.ticket_id, DONE)
    await until(lambda: not gpu.recorder.unfinished(), "every row ended")
    assert order == [100, 0, 0, -100]


async def test_a_client_that_leaves_while_queued_is_cancelled_at_the_worker(wired):
    gpu, _, first, second = wired("a", "b")
    holding = submit(first, "a")
    await gpu.fleet.start("a")
    lease = await asyncio.wait_for(holding, DEADLINE)
    leaving = submit(second, "b")
    await until(lambda: len(gpu.recorder.rows) == 2, "the second request queued")

    leaving.cancel()
    await until(lambda: gpu.recorder.rows[2]["state"] == "cancelled", "the worker cancelled the request")
    first.release(lease.ticket_id, DONE)
    await until(lambda: gpu.recorder.rows[1]["state"] == "completed", "the first request completed")
    assert gpu.fleet.started() == [("a", ())], "the leaving client's model is never started"


async def test_a_grant_that_crosses_a_cancel_is_given_back_and_the_slot_is_free(wired):
    gpu, _, first, second = wired("a")
    leaving = submit(first, "a")
    start = await gpu.fleet.next_call("swap_in", "a")
    start.succeed()  # the worker grants now, while the client leaves
    leaving.cancel()
    await until(lambda: gpu.recorder.rows[1]["state"] == "cancelled", "the crossed request ended cancelled")

    lease = await asyncio.wait_for(submit(second, "a"), DEADLINE)
    assert lease.ticket_id == 2, "the slot was free for the next request"
    second.release(lease.ticket_id, DONE)
    await until(lambda: gpu.recorder.rows[2]["state"] == "completed", "the next request completed")


async def test_a_failed_start_is_refused_through_the_front_end(wired):
    gpu, _, first, _ = wired("a")
    refused = submit(first, "a")
    (await gpu.fleet.next_call("swap_in", "a")).fail("exited with status 1")
    with pytest.raises(Refused) as raised:
        await asyncio.wait_for(refused, DEADLINE)
    assert (raised.value.status, raised.value.code) == (503, "model_start_failed")
    assert "exited with status 1" in raised.value.message


async def test_an_unload_cuts_the_lease_at_the_front_end(wired):
    gpu, _, first, _ = wired("a")
    lease = await asyncio.wait_for(asyncio.gather(submit(first, "a"), gpu.fleet.start("a")), DEADLINE)
    lease = lease[0]
    holder = asyncio.get_running_loop().create_task(asyncio.sleep(DEADLINE * 10))
    lease.held_by(holder)

    unloading = asyncio.get_running_loop().create_task(first.ask(Unload(("a",))))  # an operator, on a front end
    (await gpu.fleet.next_call("stop", "a")).succeed()
    await asyncio.wait_for(unloading, DEADLINE)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(holder, DEADLINE)
    assert (lease.cut.status, lease.cut.code) == (503, "model_unloaded")
    first.release(lease.ticket_id, Outcome(state="cancelled", status_code=503, error=lease.cut.message))
    assert gpu.recorder.rows[1]["state"] == "cancelled"


async def test_the_front_ends_outcome_ends_the_row(wired):
    gpu, _, first, _ = wired("a")
    lease = (await asyncio.wait_for(asyncio.gather(submit(first, "a"), gpu.fleet.start("a")), DEADLINE))[0]
    first.release(lease.ticket_id, Outcome(state="failed", status_code=502, error="model stopped answering"))
    await until(lambda: gpu.recorder.rows[1]["state"] == "failed", "the row took the front end's outcome")
    assert gpu.recorder.rows[1]["status_code"] == 502


async def test_operators_on_a_front_end_see_and_change_the_workers_queue(wired):
    gpu, _, first, second = wired("a")
    holding = submit(first, "a")
    await gpu.fleet.start("a")
    lease = await asyncio.wait_for(holding, DEADLINE)
    queued = []
    for priority in (0, -100):
        queued.append(submit(second, "a", priority))
        await until(lambda: len(gpu.recorder.rows) == len(queued) + 1, "the request queued at the worker")

    def operate():
        """What the admin does, from a worker thread of the front end."""
        before = [(entry.ticket_id, entry.priority) for entry in first.ask_now(Waiting())]
        assert [busy.model for busy in first.ask_now(BusyModels())] == ["a"]
        moved = first.ask_now(Reprioritize((3,), 100))
        cancelled = first.ask_now(Cancel((2, 99)))
        return before, moved, cancelled, first.ask_now(Snapshot())

    before, moved, cancelled, snapshot = await asyncio.to_thread(operate)
    assert before == [(2, 0), (3, -100)]
    assert (moved, cancelled) == ([3], [2])
    assert snapshot.running == {"a": (1,)} and snapshot.waiting == 1
    with pytest.raises(Refused) as refused:
        await asyncio.wait_for(queued[0], DEADLINE)
    assert refused.value.code == "cancelled_by_operator"
    first.release(lease.ticket_id, DONE)
    lease = await asyncio.wait_for(queued[1], DEADLINE)
    assert lease.decision.priority == 100
    second.release(lease.ticket_id, DONE)
    await until(lambda: not gpu.recorder.unfinished(), "every row ended")


async def test_a_question_the_worker_does_not_know_is_answered_with_an_error(wired):
    _, worker, first, _ = wired("a")
    with pytest.raises(Unanswered, match="could not answer 'LogText'.*nothing answers 'LogText'"):
        await first._ask_worker(worker.channel, LogText("a", "", ""))


async def test_a_question_the_workers_database_cannot_answer_is_refused_as_the_database_away(wired, monkeypatch):
    """The worker's database away under an unload (it revokes the models' leases first): the front end is told the
    database is unreachable, 503 `database_unreachable` as in one process, and not the database's words, which name
    its address; those stay in the worker's log."""
    from django.db import OperationalError

    from proxy.api.unavailable import DATABASE_RETRY_AFTER_S, as_unavailable

    gpu, worker, first, _ = wired("a")

    async def away(models):
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')

    monkeypatch.setattr(gpu.runtime.model_leases, "revoke_for", away)
    with pytest.raises(Unanswered) as unanswered:
        await first._ask_worker(worker.channel, Unload(("a",)))
    refusal = as_unavailable(unanswered.value)
    assert (refusal.status, refusal.code) == (503, "database_unreachable"), refusal.message
    assert refusal.headers == {"Retry-After": str(DATABASE_RETRY_AFTER_S)}
    assert refusal.message.startswith("the database is unreachable") and "127.0.0.1" not in refusal.message


async def test_the_leases_of_a_front_end_that_went_silent_are_given_back(wired):
    gpu, _, first, second = wired("a", front_end_timeout_s=0.4, heartbeat_s=0.05)
    holding = submit(first, "a")
    await gpu.fleet.start("a")
    await asyncio.wait_for(holding, DEADLINE)
    waiting = submit(second, "a")
    await until(lambda: len(gpu.recorder.rows) == 2, "the second front end's request queued")

    first._heartbeat.cancel()  # the first front end dies holding its lease: no release will come
    lease = await asyncio.wait_for(waiting, DEADLINE)
    assert gpu.recorder.rows[1]["state"] == "cancelled"
    await asyncio.sleep(3 * 0.4)  # three silence timeouts: a front end that keeps beating keeps its lease
    assert gpu.recorder.rows[2]["state"] == "dispatched"
    second.release(lease.ticket_id, DONE)
    await until(lambda: gpu.recorder.rows[2]["state"] == "completed", "the next request completed")



async def test_each_front_end_counts_the_requests_it_served_as_they_ended(wired):
    served = {"first": [], "second": []}
    gpu, _, first, second = wired("a", observers=(served["first"].append, served["second"].append))
    holding = submit(first, "a")
    await gpu.fleet.start("a")
    lease = await asyncio.wait_for(holding, DEADLINE)
    leaving = submit(second, "a")
    await until(lambda: len(gpu.recorder.rows) == 2, "the second request queued")
    leaving.cancel()
    await asyncio.wait([leaving])
    first.release(lease.ticket_id, Outcome(
        state="completed", status_code=200, usage={"output_tokens": 5},
        first_byte_monotonic=asyncio.get_running_loop().time(),
    ))

    cut = await asyncio.wait_for(submit(second, "a"), DEADLINE)
    gpu.runtime.unload(["a"])
    (await gpu.fleet.next_call("stop", "a")).succeed()
    await until(lambda: len(served["second"]) == 2, "the cut request counted")
    second.release(cut.ticket_id, Outcome(state="cancelled", error="client disconnected mid-response"))

    (finished,) = served["first"]
    assert isinstance(finished, Finished)
    assert (finished.model, finished.route, finished.band, finished.status) == ("a", "other", Band.NORMAL, 200)
    assert finished.usage == {"output_tokens": 5} and 0 <= finished.ttfb_s <= finished.seconds
    refused, cut_short = served["second"]
    assert refused == Unserved("a", "other", 499, cancelled=True)
    assert (cut_short.state, cut_short.status) == ("cancelled", 503), "counted as the worker ended it"


async def test_a_front_end_counts_a_refusal_with_the_workers_status(wired):
    seen = []
    gpu, _, first, _ = wired("a", observers=(seen.append, None))
    refused = submit(first, "a")
    (await gpu.fleet.next_call("swap_in", "a")).fail("exited with status 1")
    with pytest.raises(Refused):
        await asyncio.wait_for(refused, DEADLINE)
    assert seen == [Unserved("a", "other", 503)]


async def test_a_client_that_leaves_in_the_instant_its_grant_lands_gives_the_slot_back(wired):
    gpu, _, first, second = wired("a")
    leaving = submit(first, "a")
    start = await gpu.fleet.next_call("swap_in", "a")
    answer = first._answer

    def answer_then_leave(message):  # the grant is handed over, and the client is gone before it resumes
        answer(message)
        if isinstance(message, Granted):
            leaving.cancel()

    first._answer = answer_then_leave
    start.succeed()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(leaving, DEADLINE)
    lease = await asyncio.wait_for(submit(second, "a"), DEADLINE)
    second.release(lease.ticket_id, DONE)
    await until(lambda: not gpu.recorder.unfinished(), "every row ended")


async def test_a_front_end_that_cannot_reach_redis_answers_503_and_tries_again_next_time(redis_layer_factory):
    """A front end holds a new request while Redis is away, up to its wait, then refuses it."""
    backend = type(redis_layer_factory())
    door = ChannelLayerFrontDoor(None, backend(hosts=[redis_host("redis://127.0.0.1:1/0")]), redis_wait_s=0.5)
    for _ in range(2):
        began = asyncio.get_running_loop().time()
        with pytest.raises(Refused) as raised:
            await asyncio.wait_for(submit(door, "a"), DEADLINE)
        assert (raised.value.status, raised.value.code, raised.value.retry_after) == (503, "scheduler_unreachable", 1)
        assert asyncio.get_running_loop().time() - began >= 0.5, "refused only once its wait for Redis was over"


def redis_relay(name: str):
    """A relay between one process's layer and the test's Redis server, for the test to cut."""
    from tests.faults.relay import Relay

    target = urlsplit(REDIS_URL)
    return Relay(target.hostname, target.port or 6379, name=name).start()


def through(relay, redis_layer_factory):
    """A layer among the test's (same key prefix) that reaches Redis through `relay`."""
    probe = redis_layer_factory()
    return type(probe)(hosts=[redis_host(f"redis://{relay.url_host}")], prefix=probe.prefix)


def serve(gpu, layer) -> tuple[SchedulerWorker, asyncio.Task]:
    """A worker for model "a" of `gpu` on `layer`, running."""
    worker = SchedulerWorker(InProcessFrontDoor(gpu.runtime, gpu.fleet, None), layer, ("a",), gather_s=0)
    return worker, asyncio.get_running_loop().create_task(worker.run())


async def tear_down(doors, worker: SchedulerWorker, serving: asyncio.Task, relay) -> None:
    """The front ends closed, then the worker (its relay restored, so it reads its stop), then the relay."""
    for door in doors:
        await door.close()
    relay.restore()
    await worker.stop()
    await asyncio.wait_for(serving, DEADLINE)
    relay.close()


async def test_a_worker_cut_from_redis_longer_than_the_silence_limit_keeps_every_front_ends_requests(
    gpu_for, redis_layer_factory
):
    """The worker's own outage (here 7 s, over the 5 s default silence limit) is no front end's death:
    the running lease and the queued request both stay theirs once Redis is back."""
    relay = redis_relay("worker-redis")
    gpu = gpu_for("a")
    worker, serving = serve(gpu, through(relay, redis_layer_factory))
    first, second = ChannelLayerFrontDoor(None, redis_layer_factory()), ChannelLayerFrontDoor(None, redis_layer_factory())
    try:
        holding = submit(first, "a")
        await gpu.fleet.start("a")
        lease = await asyncio.wait_for(holding, DEADLINE)
        waiting = submit(second, "a")
        await until(lambda: len(gpu.recorder.rows) == 2, "the second front end's request queued")

        relay.cut()
        await asyncio.sleep(FRONT_END_TIMEOUT_S + 2)  # the fault itself: longer than the silence limit
        relay.restore()
        await asyncio.sleep(FRONT_END_TIMEOUT_S / 2)  # Redis back: heartbeats flow again
        assert [row["state"] for row in gpu.recorder.rows.values()] == ["dispatched", "queued"]
        first.release(lease.ticket_id, DONE)
        second_lease = await asyncio.wait_for(waiting, 5 * DEADLINE)  # the layers reconnect first
        second.release(second_lease.ticket_id, DONE)
        await until(lambda: [row["state"] for row in gpu.recorder.rows.values()] == ["completed", "completed"],
                    "both requests completed, one row each")
    finally:
        await tear_down([first, second], worker, serving, relay)


async def test_a_grant_made_while_the_worker_cannot_reach_redis_reaches_its_front_end_once_it_can(
    gpu_for, redis_layer_factory
):
    """The model becomes ready while the worker is cut from Redis: the grant is sent once Redis is back
    (lost, the request's row said cancelled while its client waited for ever)."""
    relay = redis_relay("worker-redis")
    gpu = gpu_for("a")
    worker, serving = serve(gpu, through(relay, redis_layer_factory))
    door = ChannelLayerFrontDoor(None, redis_layer_factory())
    try:
        waiting = submit(door, "a")
        await until(lambda: len(gpu.recorder.rows) == 1, "the request queued, its model starting")
        relay.cut()
        await gpu.fleet.start("a")  # the model is ready: the worker grants while it cannot reach Redis
        await asyncio.sleep(1.0)  # the fault itself
        relay.restore()
        lease = await asyncio.wait_for(waiting, 5 * DEADLINE)
        assert [row["state"] for row in gpu.recorder.rows.values()] == ["dispatched"]
        door.release(lease.ticket_id, DONE)
        await until(lambda: [row["state"] for row in gpu.recorder.rows.values()] == ["completed"], "one row, completed")
    finally:
        await tear_down([door], worker, serving, relay)


async def test_a_request_after_redis_silently_lost_the_pooled_connections_reaches_the_worker(
    gpu_for, redis_layer_factory
):
    """Redis forgot the front end's connections without a word (its machine rebooted, say): the next
    send fails on its pooled connection, which is dropped, and the submit is tried again at once on a
    fresh one instead of being refused with 503."""
    relay = redis_relay("front-end-redis")
    gpu = gpu_for("a")
    worker, serving = serve(gpu, redis_layer_factory())
    door = ChannelLayerFrontDoor(None, through(relay, redis_layer_factory), redis_wait_s=0)
    try:
        first = submit(door, "a")
        await gpu.fleet.start("a")
        door.release((await asyncio.wait_for(first, DEADLINE)).ticket_id, DONE)
        await until(lambda: [row["state"] for row in gpu.recorder.rows.values()] == ["completed"], "the first served")
        relay.forget()
        second = submit(door, "a")  # no wait for Redis: only the retry at once can save it
        await until(lambda: len(gpu.recorder.rows) == 2 or second.done(), "the second request reached the worker")
        assert not second.done(), second.exception()
        second.cancel()
        await until(lambda: list(gpu.recorder.rows.values())[1]["state"] == "cancelled", "its client left")
    finally:
        await tear_down([door], worker, serving, relay)


async def test_pubsub_deployments_on_one_redis_told_apart_by_database_index_never_hear_each_other(gpu_for):
    """Redis's pub/sub ignores the database index: two deployments of the same models on redis://…/1 and
    redis://…/2 each keep their own requests (the layer's prefix, taken from the index, tells them apart)."""
    from django.utils.module_loading import import_string

    from llamaswap_site.environment import channel_layers_from_url

    base = REDIS_URL.rsplit("/", 1)[0]

    def layer(index: int):
        settings = channel_layers_from_url(f"{base}/{index}", {"ENGINE": "django.db.backends.postgresql"}, "pubsub")
        return import_string(settings["default"]["BACKEND"])(**settings["default"]["CONFIG"])

    gpus = [gpu_for("a"), gpu_for("a")]
    workers = [SchedulerWorker(InProcessFrontDoor(gpu.runtime, gpu.fleet, None), layer(index), ("a",), gather_s=0)
               for gpu, index in zip(gpus, (1, 2))]
    serving = [asyncio.get_running_loop().create_task(worker.run()) for worker in workers]
    doors = [ChannelLayerFrontDoor(None, layer(index)) for index in (1, 2)]
    try:
        for gpu, door in zip(gpus, doors):
            for turn in range(3):
                waiting = submit(door, "a")
                if turn == 0:
                    await gpu.fleet.start("a")
                door.release((await asyncio.wait_for(waiting, DEADLINE)).ticket_id, DONE)
        await until(lambda: all(len(gpu.recorder.rows) == 3 and not gpu.recorder.unfinished() for gpu in gpus),
                    "each deployment's three requests served by its own worker")
    finally:
        for door in doors:
            await door.close()
        for worker in workers:
            await worker.stop()
        await asyncio.wait_for(asyncio.gather(*serving), DEADLINE)
