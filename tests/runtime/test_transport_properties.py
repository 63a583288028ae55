"""The scheduler decides the same over the channel layer as in one process: random programs of
requests from two front ends, finishes and clients leaving, run once through the in-process front
door and once through front ends and a worker over Redis (both channel-layer backends), dispatch
in the same order, and every request's row ends exactly once with no slot left held."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.utils.module_loading import import_string
from hypothesis import given, settings
from hypothesis import strategies as st

from llamaswap_site.environment import CHANNEL_LAYER_BACKENDS, redis_host

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapGroup, SwapPolicy
from scheduling.door.in_process import InProcessFrontDoor
from scheduling.door.remote import ChannelLayerFrontDoor
from scheduling.runtime import SchedulerRuntime
from scheduling.tickets import Outcome, Refused, TicketRequest
from scheduling.door.worker import SchedulerWorker

from tests.conftest import REDIS_URL

from .fakes import DEADLINE, InstantFleet, OrderedRecorder, until

MODELS = ("a", "b", "c")
DONE = Outcome(state="completed", status_code=200)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 1), st.sampled_from(MODELS), st.sampled_from((-10, 0, 10))),
        st.tuples(st.just("finish"), st.integers(0, 5)),
        st.tuples(st.just("leave"), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=14,
)


def runtime(recorder: OrderedRecorder) -> SchedulerRuntime:
    """a and b share a GPU and one slot each; c runs beside them with two slots."""
    scheduler = SerialScheduler(
        {model: ModelSpec(model) for model in MODELS},
        SwapPolicy((SwapGroup("gpu", ("a", "b")), SwapGroup("side", ("c",), exclusive=False)), MODELS),
        SerialSettings(slots={"c": 2}),
    )
    return SchedulerRuntime(scheduler, InstantFleet(), recorder)


async def play(program, doors, runtime: SchedulerRuntime, recorder: OrderedRecorder) -> list[int]:
    """Run `program` through `doors` (two front doors, or one door twice), letting everything settle
    after each step; the dispatch order, as the positions of the requests in the program."""
    clients: list[tuple[asyncio.Task, int]] = []  # (submit task, door index); request i has ticket id i + 1
    held: dict[int, object] = {}  # request -> its lease, in grant order
    finished: set[int] = set()
    left: set[int] = set()

    def settled(index: int, task: asyncio.Task) -> bool:
        row = recorder.rows.get(index + 1)
        if row is None:
            return False
        if index in left:
            return row["state"] == "cancelled"
        if row["state"] == "dispatched":  # and its release, if it was finished, has reached the worker
            return index not in finished and task.done() and not task.cancelled() and task.exception() is None
        if row["state"] == "completed":
            return index in finished
        if row["state"] == "rejected":
            return task.done() and isinstance(task.exception(), Refused)
        return row["state"] == "queued" and not task.done()

    async def step() -> None:
        await until(
            lambda: not runtime.snapshot[1].starting and all(settled(i, task) for i, (task, _) in enumerate(clients)),
            "the worker and the front ends",
        )
        for index, (task, _) in enumerate(clients):
            if index not in held and index not in finished and recorder.rows[index + 1]["state"] == "dispatched":
                held[index] = task.result()

    def finish(index: int) -> None:
        lease = held.pop(index)
        finished.add(index)
        doors[clients[index][1]].release(lease.ticket_id, DONE)

    for operation in program:
        if operation[0] == "submit":
            _, door, model, priority = operation
            request = TicketRequest(model=model, path="/v1/chat/completions", priority=priority)
            clients.append((asyncio.get_running_loop().create_task(doors[door].submit(request)), door))
        elif operation[0] == "finish" and held:
            finish(list(held)[operation[1] % len(held)])
        elif operation[0] == "leave":
            waiting = [i for i, (task, _) in enumerate(clients) if not task.done() and i not in left]
            if waiting:
                index = waiting[operation[1] % len(waiting)]
                left.add(index)
                clients[index][0].cancel()
        await step()
    while held:  # then everything ends, in grant order
        finish(next(iter(held)))
        await step()
    await until(lambda: not recorder.unfinished(), "every row ended")
    return [ticket_id - 1 for ticket_id in recorder.dispatched]


async def in_process(program) -> list[int]:
    recorder = OrderedRecorder()
    scheduler_runtime = runtime(recorder)
    door = InProcessFrontDoor(scheduler_runtime, None, None)
    order = await play(program, (door, door), scheduler_runtime, recorder)
    assert not recorder.problems
    return order


async def over_redis(program, backend) -> list[int]:
    recorder = OrderedRecorder()
    prefix = f"llamaswap-test-{uuid.uuid4().hex[:12]}:"
    layers = [backend(hosts=[HOST], prefix=prefix) for _ in range(3)]
    scheduler_runtime = runtime(recorder)
    worker = SchedulerWorker(InProcessFrontDoor(scheduler_runtime, None, None), layers[0], MODELS, gather_s=0)
    serving = asyncio.get_running_loop().create_task(worker.run())
    doors = [ChannelLayerFrontDoor(None, layer) for layer in layers[1:]]
    try:
        order = await play(program, doors, scheduler_runtime, recorder)
    finally:
        for door in doors:
            await door.close()
        await worker.stop()
        await asyncio.wait_for(serving, DEADLINE)
        for layer in layers:
            await layer.flush()
            if hasattr(layer, "close_pools"):
                await layer.close_pools()
    assert not recorder.problems
    return order


HOST = redis_host(REDIS_URL)


@pytest.mark.parametrize("backend_name", sorted(CHANNEL_LAYER_BACKENDS))
def test_the_channel_layer_dispatches_in_the_order_one_process_does(backend_name):
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    backend = import_string(CHANNEL_LAYER_BACKENDS[backend_name])

    @settings(max_examples=12, deadline=None)
    @given(operations)
    def same_order(program):
        expected = asyncio.run(in_process(program))
        assert asyncio.run(over_redis(program, backend)) == expected

    same_order()
