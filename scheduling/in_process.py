"""The front door of a scheduler that runs in this process: direct calls on the runtime.

The request path calls the runtime as is (it runs on the event loop already). Operator calls
come from the admin's worker threads, so each one runs on the loop through `from_thread`,
between two scheduling steps, and waits for its answer.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from scheduling.core import SchedulerSnapshot, SerialSettings
from scheduling.frontdoor import BusyModel, RunningEntry, WaitingEntry
from scheduling.queue_view import QueueEntry, queue_entries
from scheduling.runtime import Lease, Outcome, SchedulerRuntime, TicketRequest


class InProcessFrontDoor:
    runs_scheduler = True

    def __init__(self, runtime: SchedulerRuntime, fleet, config) -> None:
        self.runtime = runtime
        self.fleet = fleet
        self.config = config

    # -- the request path ---------------------------------------------------------------------
    async def submit(self, request: TicketRequest, queued=None) -> Lease:
        return await self.runtime.submit(request, queued)

    async def progress(self, handle: int) -> QueueEntry | None:
        return self.read_queue_entry(handle)

    async def queue(self) -> list[QueueEntry]:
        return self.read_queue()

    async def queue_entry(self, ticket_id: int) -> QueueEntry | None:
        return self.read_queue_entry(ticket_id)

    async def cancel_request(self, ticket_id: int) -> bool:
        return self.end_request(ticket_id)

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        self.runtime.release(ticket_id, outcome)

    async def begin_relayed(self, request: TicketRequest, peer: str, explanation: str) -> int:
        return self.runtime.begin_relayed(request, peer, datetime.now(timezone.utc), explanation)

    def end_relayed(self, ticket_id: int | None, request: TicketRequest, outcome: Outcome, seconds: float,
                    first_byte_s: float | None) -> None:
        if ticket_id is not None:
            self.runtime.end_relayed(ticket_id, outcome, seconds, first_byte_s)

    async def unload(self, models: list[str] | None) -> None:
        stops = self.runtime.unload(models)
        if stops:
            await asyncio.wait(stops)

    # -- operators ----------------------------------------------------------------------------
    def snapshot(self) -> SchedulerSnapshot:
        return self.runtime.snapshot[1]

    def waiting(self) -> list[WaitingEntry]:
        return self.runtime.from_thread(self.read_waiting)

    def running(self) -> list[BusyModel]:
        return self.runtime.from_thread(self.read_running)

    # -- read on the event loop (also what a worker answers front ends with) -----------------------
    def read_waiting(self) -> list[WaitingEntry]:
        runtime = self.runtime
        now = runtime.now()
        entries = []
        for ticket, terms in runtime.ranked():
            request = runtime.waiting_request(ticket.id)
            if request is None:  # its caller already left; it is no longer waiting
                continue
            entries.append(
                WaitingEntry(
                    position=len(entries) + 1,
                    ticket_id=ticket.id,
                    model=ticket.model,
                    requested_model=request.requested_model,
                    path=request.path,
                    client=request.client,
                    priority=ticket.priority,
                    terms=terms,
                    waited_s=max(0.0, now - ticket.arrival),
                )
            )
        return entries

    def read_queue(self) -> list[QueueEntry]:
        return queue_entries(self.runtime)

    def read_queue_entry(self, ticket_id: int) -> QueueEntry | None:
        return next((entry for entry in self.read_queue() if entry.ticket_id == ticket_id), None)

    def end_request(self, ticket_id: int) -> bool:
        """Cancel a waiting request or cut a running one, as an operator; returns whether it was there."""
        return self.runtime.operator_cancel(ticket_id) or self.runtime.operator_cut(ticket_id)

    def read_running(self) -> list[BusyModel]:
        runtime = self.runtime
        now = runtime.now()

        def entry(ticket_id: int) -> RunningEntry | None:
            granted = runtime.granted_request(ticket_id)
            if granted is not None:
                _, decision, since = granted
                return RunningEntry(ticket_id, decision.priority, decision.slot, max(0.0, now - since))
            request = runtime.waiting_request(ticket_id)  # its model is starting for it
            return None if request is None else RunningEntry(ticket_id, request.priority, None, None)

        _, snapshot = runtime.snapshot
        busy = []
        for model, tickets in sorted(snapshot.running.items()):
            entries = [found for ticket_id in tickets if (found := entry(ticket_id)) is not None]
            entries.sort(key=lambda e: -1.0 if e.running_s is None else -e.running_s)
            if entries:
                busy.append(BusyModel(model, snapshot.slots.get(model), tuple(entries)))
        return busy

    def read_processes(self) -> dict[str, str]:
        fleet = self.fleet
        return {model: fleet.state(model) for model in dict.fromkeys([*self.config.models, *fleet.running()])}

    async def processes(self) -> dict[str, str]:
        return self.read_processes()

    async def logs(self) -> str:
        rings = self.fleet.logs.items()
        return "\n".join(f"=== {model_id} ===\n{ring.text()}" for model_id, ring in rings if ring.text())

    def model_states(self) -> dict[str, str]:
        return self.runtime.from_thread(self.read_processes)

    def cancel_waiting(self, ticket_ids: list[int]) -> list[int]:
        runtime = self.runtime
        return runtime.from_thread(lambda: [tid for tid in ticket_ids if runtime.operator_cancel(tid)])

    def reprioritize_waiting(self, ticket_ids: list[int], priority: int) -> list[int]:
        runtime = self.runtime
        return runtime.from_thread(lambda: [tid for tid in ticket_ids if runtime.reprioritize(tid, priority)])

    def unload_now(self, models: list[str]) -> None:
        self.runtime.from_thread(self.runtime.unload, models)

    def retune(self, settings: SerialSettings) -> None:
        self.runtime.from_thread(self.runtime.retune, settings)
