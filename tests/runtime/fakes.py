"""Stand-ins for what the runtime drives: model processes the test starts and stops by hand, and
request rows kept in memory and checked for a single ending."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from scheduling.tickets import TERMINAL_STATES

DEADLINE = 2.0  # seconds any wait in this tier may take before the test fails


async def until(condition, what: str) -> None:
    """Poll `condition` until it holds, failing the test after DEADLINE."""
    async def poll():
        while not condition():
            await asyncio.sleep(0.001)

    try:
        await asyncio.wait_for(poll(), DEADLINE)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


@dataclass(eq=False)
class Call:
    """One `swap_in` or `stop` in progress: the test ends it with `succeed()` or `fail()`, or
    leaves it hanging. `cancelled` says whether the runtime gave up on it."""

    kind: str
    model: str
    evict: tuple[str, ...] = ()
    gpus: tuple[str, ...] | None = None
    outcome: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    cancelled: bool = False

    def succeed(self) -> None:
        self.outcome.set_result(None)

    def fail(self, message: str) -> None:
        self.outcome.set_exception(RuntimeError(message))


class FakeFleet:
    """The runtime's `Fleet`: every start and stop waits until the test answers it."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._taken: set[Call] = set()  # calls `next_call` already handed to the test
        self._arrived = asyncio.Event()

    async def swap_in(self, model: str, evict: tuple[str, ...], gpus: tuple[str, ...] | None = None) -> None:
        await self._carry_out(Call("swap_in", model, evict, gpus))

    async def stop(self, model: str) -> None:
        await self._carry_out(Call("stop", model))

    def upstream_url(self, model: str) -> str:
        return f"http://upstream.invalid/{model}"

    def check_exited(self, model: str) -> bool:
        return False  # a fake process never dies on its own; tests report crashes with model_exited

    async def _carry_out(self, call: Call) -> None:
        self.calls.append(call)
        self._arrived.set()
        try:
            await call.outcome
        except asyncio.CancelledError:
            call.cancelled = True
            raise

    def started(self) -> list[tuple[str, tuple[str, ...]]]:
        """Every `swap_in` so far, as (model, evicted models)."""
        return [(c.model, c.evict) for c in self.calls if c.kind == "swap_in"]

    def stopped(self) -> list[str]:
        return [c.model for c in self.calls if c.kind == "stop"]

    async def next_call(self, kind: str, model: str) -> Call:
        """The first `kind` call for `model` not yet handed to the test, once the runtime has made it."""
        async def arrival() -> Call:
            while True:
                for call in self.calls:
                    if call.kind == kind and call.model == model and call not in self._taken:
                        self._taken.add(call)
                        return call
                self._arrived.clear()
                await self._arrived.wait()

        return await asyncio.wait_for(arrival(), DEADLINE)

    async def start(self, model: str) -> Call:
        """Let the pending start of `model` succeed."""
        call = await self.next_call("swap_in", model)
        call.succeed()
        return call


class FakeRecorder:
    """The runtime's recorder, keeping rows in a dict: each row's states in order, and whatever
    was written to a row after it had ended (which the real one would store over the ending)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.states: dict[int, list[str]] = {}
        self.problems: list[str] = []
        self.backlog_full = False

    def backlogged(self) -> bool:
        return self.backlog_full

    def create(self, ticket_id: int, **fields: Any) -> None:
        if ticket_id in self.rows:
            self.problems.append(f"#{ticket_id} created twice")
        self.rows[ticket_id] = dict(fields)
        self.states[ticket_id] = [fields["state"]]

    def update(self, ticket_id: int, **fields: Any) -> None:
        row = self.rows.get(ticket_id)
        if row is None:
            self.problems.append(f"#{ticket_id} updated but never created: {fields}")
            return
        if row["state"] in TERMINAL_STATES:
            self.problems.append(f"#{ticket_id} updated after it ended {row['state']}: {fields}")
        row.update(fields)
        if "state" in fields:
            self.states[ticket_id].append(fields["state"])

    def unfinished(self) -> dict[int, list[str]]:
        """Rows that do not end in exactly one terminal state, with their states."""
        return {
            ticket_id: states
            for ticket_id, states in self.states.items()
            if states[-1] not in TERMINAL_STATES or sum(s in TERMINAL_STATES for s in states) != 1
        }


class InstantFleet(FakeFleet):
    """A fleet whose starts and stops succeed at once: for runs that only look at the scheduler's order."""

    async def _carry_out(self, call: Call) -> None:
        self.calls.append(call)


class OrderedRecorder(FakeRecorder):
    """A FakeRecorder that also keeps the order in which requests were dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.dispatched: list[int] = []

    def update(self, ticket_id: int, **fields: Any) -> None:
        super().update(ticket_id, **fields)
        if fields.get("state") == "dispatched":
            self.dispatched.append(ticket_id)
