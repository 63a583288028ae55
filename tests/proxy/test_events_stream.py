"""The `/api/events` envelope, the queue's diff and the keep-alive, without a service."""

from __future__ import annotations

import json

from proxy.api import events_stream
from proxy.api.events_stream import _queue_changed, envelope
from scheduling.door.frontdoor import Unanswered


def test_envelope_is_llama_swaps_sse_message_with_json_text_inside():
    text = envelope("modelStatus", [{"id": "a", "state": "ready"}])
    assert text.startswith("event: message\ndata: ") and text.endswith("\n\n")
    message = json.loads(text.split("data: ", 1)[1])
    assert message["type"] == "modelStatus"
    assert json.loads(message["data"]) == [{"id": "a", "state": "ready"}]


def entry(ticket_id=1, position=1, eta_at=100.0, **changes):
    return {"id": ticket_id, "model": "m", "priority": 0, "state": "waiting", "position": position,
            "eta_at": eta_at, "waited_s": 3.0, **changes}


def test_the_queue_changes_with_its_requests_not_with_time_passing():
    sent = [entry(1), entry(2, position=2)]
    assert not _queue_changed(sent, [entry(1, waited_s=9.0), entry(2, position=2, eta_at=100.5)])
    assert _queue_changed(None, [])
    assert _queue_changed(sent, [entry(1)])
    assert _queue_changed(sent, [entry(2, position=1), entry(1, position=2)])
    assert _queue_changed(sent, [entry(1, state="starting", position=None), entry(2, position=2)])
    assert _queue_changed(sent, [entry(1, eta_at=103.0), entry(2, position=2)])
    assert _queue_changed(sent, [entry(1, eta_at=None), entry(2, position=2)])
    running = [entry(1, state="running", position=None, eta_at=100.0)]
    assert not _queue_changed(running, [entry(1, state="running", position=None, eta_at=160.0)])


class Quiet:
    """A connection whose service never changes after the first payload."""

    def __init__(self, service, **_):
        pass

    async def first(self):
        return "first"

    async def changes(self):
        return ""


async def test_a_quiet_stream_sends_only_keep_alive_comments():
    quiet = Quiet(None)
    stream = events_stream.events(quiet, await quiet.first(), tick_s=0, keepalive_s=0)
    assert await anext(stream) == "first"
    assert await anext(stream) == ": ping\n\n"
    await stream.aclose()


class Blinking(Quiet):
    """A connection whose scheduler does not answer its first look (Redis away), then tells a change."""

    looks = 0

    async def changes(self):
        self.looks += 1
        if self.looks == 1:
            raise Unanswered("cannot reach the scheduler workers over Redis (ConnectionError) to ask 'Queue'")
        return "changed"


async def test_a_look_the_scheduler_does_not_answer_ends_no_stream():
    blinking = Blinking(None)
    stream = events_stream.events(blinking, await blinking.first(), tick_s=0, keepalive_s=60)
    assert await anext(stream) == "first"
    assert await anext(stream) == "changed"
    assert blinking.looks == 2
    await stream.aclose()
