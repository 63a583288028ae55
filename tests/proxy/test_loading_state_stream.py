"""The loading state's stream itself, against a front door whose wait the test controls: what is
sent while the line stays the same, and the ids the chunks carry."""

from __future__ import annotations

import asyncio
import json

import pytest

from proxy.http import loading_state
from scheduling.keys.scope import UNRESTRICTED
from scheduling.tickets import TicketRequest


class Consumer:
    """What the stream writes, as a consumer would send it."""

    def __init__(self) -> None:
        self.response_started = False
        self.sent: list[bytes] = []

    async def send_headers(self, *, status=200, headers=None) -> None:
        self.response_started = True

    async def send_body(self, body: bytes, *, more_body: bool = False) -> None:
        self.sent.append(body)


class Entry:
    ticket_id = 42
    outlook = "next in the queue; no prediction: no history yet"


class Door:
    def __init__(self) -> None:
        self.granted: asyncio.Future = asyncio.get_running_loop().create_future()

    async def submit(self, request, queued):
        queued(42)
        return await self.granted

    async def ask(self, question):  # only `Progress` is asked
        return Entry()


async def test_an_unchanging_wait_keeps_the_stream_alive_with_comments_and_names_its_request(monkeypatch):
    monkeypatch.setattr(loading_state, "GRACE_S", 0.0)
    monkeypatch.setattr(loading_state, "UPDATE_EVERY_S", 0.01)
    monkeypatch.setattr(loading_state, "KEEPALIVE_S", 0.05)
    consumer, door = Consumer(), Door()
    request = TicketRequest(model="chat", path="/v1/chat/completions", priority=0, requested_model="chat")
    waiting = asyncio.get_running_loop().create_task(
        loading_state.wait_showing_state(consumer, door, request, lambda ticket_id: [], UNRESTRICTED)
    )
    deadline = asyncio.get_running_loop().time() + 5
    while consumer.sent.count(b": still waiting\n\n") < 2:
        assert asyncio.get_running_loop().time() < deadline, consumer.sent
        await asyncio.sleep(0.01)
    door.granted.set_result("lease")
    assert await waiting == "lease"
    chunks = [json.loads(body[len(b"data: "):]) for body in consumer.sent if body.startswith(b"data: ")]
    lines = [c["choices"][0]["delta"]["reasoning_content"] for c in chunks]
    assert lines[:2] == ["Waiting for chat…\n", Entry.outlook + "\n"] and lines[-1].startswith("Done!")
    assert lines.count(Entry.outlook + "\n") == 1, "the same line is not repeated"
    assert {c["id"] for c in chunks} == {"llamaswap-loading-42"}
