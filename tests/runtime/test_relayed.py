"""Requests served without the scheduler (relayed to a peer): a row and metrics, no place in the queue."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapPolicy
from scheduling.events import Finished
from scheduling.runtime import SchedulerRuntime
from scheduling.tickets import Outcome, TicketRequest

from .fakes import FakeFleet, FakeRecorder

BEGAN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def runtime_with(events: list) -> SchedulerRuntime:
    scheduler = SerialScheduler({"local": ModelSpec("local")}, SwapPolicy((), ("local",)), SerialSettings())
    return SchedulerRuntime(scheduler, FakeFleet(), FakeRecorder(), observer=events.append)


def peer_request() -> TicketRequest:
    return TicketRequest(model="box/m1", path="/v1/chat/completions", priority=-100, requested_model="m1",
                         stream=True, route="chat", selector="fast")


async def test_a_relayed_request_has_a_row_from_start_to_end_and_is_counted():
    events: list = []
    runtime = runtime_with(events)
    ticket_id = runtime.begin_relayed(peer_request(), "box", BEGAN, "relayed to peer 'box'")
    row = runtime.recorder.rows[ticket_id]
    assert row | {"model": "box/m1", "peer": "box", "selector": "fast", "state": "dispatched", "band": "batch",
                  "arrived_at": BEGAN, "dispatched_at": BEGAN} == row

    usage = {"input_tokens": 5, "output_tokens": 7}
    runtime.end_relayed(ticket_id, Outcome(state="completed", status_code=200, usage=usage, response_bytes=99), 2.5, 0.5)
    runtime.end_relayed(ticket_id, Outcome(state="cancelled"), 3.0, None)  # a second end changes nothing
    assert runtime.recorder.states[ticket_id] == ["dispatched", "completed"]
    assert row | {"finished_at": BEGAN + timedelta(seconds=2.5), "first_byte_at": BEGAN + timedelta(seconds=0.5),
                  "duration_ms": 2500, "status_code": 200, "response_bytes": 99, **usage} == row
    (finished,) = [event for event in events if isinstance(event, Finished)]
    assert (finished.model, finished.route, finished.status, finished.seconds, finished.ttfb_s) == (
        "box/m1", "chat", 200, 2.5, 0.5)
    assert finished.usage == usage
    await runtime.shutdown(0)


async def test_a_relayed_request_takes_no_place_from_local_requests():
    runtime = runtime_with([])
    relayed = runtime.begin_relayed(peer_request(), "box", BEGAN, "")
    local = asyncio.create_task(runtime.submit(TicketRequest(model="local", path="/v1/chat/completions", priority=0)))
    start = await runtime.fleet.next_call("swap_in", "local")
    start.succeed()
    lease = await asyncio.wait_for(local, 5)
    assert lease.ticket_id != relayed
    assert runtime.snapshot[1].waiting == 0
    runtime.release(lease.ticket_id, Outcome(state="completed", status_code=200))
    runtime.end_relayed(relayed, Outcome(state="completed", status_code=200), 1.0, None)
    await runtime.shutdown(0)


async def test_shutdown_gives_a_relayed_request_its_drain_time():
    runtime = runtime_with([])
    ticket_id = runtime.begin_relayed(peer_request(), "box", BEGAN, "")
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, runtime.end_relayed, ticket_id, Outcome(state="completed", status_code=200), 0.2, None)
    began = loop.time()
    await runtime.shutdown(5)
    assert 0.15 < loop.time() - began < 4
    assert runtime.recorder.rows[ticket_id]["state"] == "completed"
