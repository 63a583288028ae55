"""A runtime over the real serial scheduler, with the fake fleet and recorder, per test.

Every request a test makes must have ended by the end of the test: the fixture then checks that
each row ended exactly once, before it stops whatever the test left running.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapGroup, SwapPolicy
from scheduling.runtime import SchedulerRuntime
from scheduling.tickets import Lease, Outcome, TicketRequest

from .fakes import DEADLINE, FakeFleet, FakeRecorder


@dataclass(eq=False)
class Client:
    """One caller of `submit()`, running as its own task like a front-end request."""

    ticket_id: int
    task: asyncio.Task

    async def lease(self) -> Lease:
        return await asyncio.wait_for(asyncio.shield(self.task), DEADLINE)


@dataclass(eq=False)
class Gpu:
    """A runtime, what it drives, and the requests a test made of it."""

    runtime: SchedulerRuntime
    fleet: FakeFleet
    recorder: FakeRecorder
    clients: list[Client] = field(default_factory=list)

    async def submit(self, model: str, priority: int = 0, max_wait_s: float | None = None) -> Client:
        """Start a request for `model`; returns once it has been queued (or answered)."""
        request = TicketRequest(model=model, path="/v1/chat/completions", priority=priority, max_wait_s=max_wait_s)
        task = asyncio.get_running_loop().create_task(self.runtime.submit(request))
        await asyncio.sleep(0)  # one step runs submit() up to its wait: it does not yield before
        ticket_id = max(self.recorder.rows)
        client = Client(ticket_id, task)
        self.clients.append(client)
        return client

    async def running(self, model: str) -> tuple[Client, Lease]:
        """A request for `model` holding its lease, `model` started for it."""
        client = await self.submit(model)
        await self.fleet.start(model)
        return client, await client.lease()

    def finish(self, lease: Lease) -> None:
        """The request ends well, released as a front end does."""
        self.runtime.release(lease.ticket_id, Outcome(state="completed", status_code=200))

    def row(self, client: Client) -> dict[str, Any]:
        return self.recorder.rows[client.ticket_id]

    def state(self, client: Client) -> str:
        return self.row(client)["state"]


@pytest.fixture
async def gpu_for():
    """`gpu_for(*models, groups=(), slots=None, recorder=None)`: a runtime serving `models`, which share
    one swap group unless `groups` (SwapGroups) say otherwise; a second runtime given the first's
    `recorder` shares its rows and numbers its requests after them, as a worker that takes over shares the
    database."""
    made: list[Gpu] = []

    def make(
        *models: str, groups: tuple[SwapGroup, ...] = (), slots: dict[str, int] | None = None,
        recorder: FakeRecorder | None = None,
    ) -> Gpu:
        scheduler = SerialScheduler(
            {model: ModelSpec(model) for model in models},
            SwapPolicy(groups, models),
            SerialSettings(slots=slots or {}),
        )
        fleet, recorder = FakeFleet(), recorder or FakeRecorder()
        first_ticket_id = max(recorder.rows, default=0) + 1
        gpu = Gpu(SchedulerRuntime(scheduler, fleet, recorder, first_ticket_id=first_ticket_id), fleet, recorder)
        made.append(gpu)
        return gpu

    yield make
    for gpu in made:
        assert not gpu.recorder.problems
        assert not gpu.recorder.unfinished(), "every request's row ends exactly once"
        for client in gpu.clients:
            client.task.cancel()
        await gpu.runtime.shutdown(0)
