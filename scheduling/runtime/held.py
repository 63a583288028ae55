"""The requests the engine holds for their callers: each waits (its caller awaits its future) until the core
grants it a slot, then runs under its lease until it ends; or it is refused or cancelled while it waits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import MappingProxyType

from scheduling.core import Decision, Ticket
from scheduling.tickets import Lease, TicketRequest


@dataclass
class Waiter:
    future: asyncio.Future
    ticket: Ticket
    request: TicketRequest


class HeldRequests:
    """Owned here: the requests waiting and those granted, a request never both, each granted one with its lease.
    Only these methods change them; `waiting` and `granted` are read-only views (granted: request, its
    dispatch decision, when it was granted on the `now()` clock). `SchedulerRuntime` makes one (`runtime.held`)."""

    def __init__(self) -> None:
        self._waiting: dict[int, Waiter] = {}
        self._granted: dict[int, tuple[TicketRequest, Decision, float]] = {}
        self._leases: dict[int, Lease] = {}
        self.waiting = MappingProxyType(self._waiting)
        self.granted = MappingProxyType(self._granted)

    def wait(self, waiter: Waiter) -> None:
        self._waiting[waiter.ticket.id] = waiter

    def stop_waiting(self, ticket_id: int) -> Waiter | None:
        """A request leaves the waiting (granted, refused or cancelled): its waiter, None if it did not wait."""
        return self._waiting.pop(ticket_id, None)

    def take_waiter(self, ticket_id: int) -> Waiter:
        """As `stop_waiting`, for a request that waits."""
        return self._waiting.pop(ticket_id)

    def stop_all_waiting(self) -> list[Waiter]:
        waiters = list(self._waiting.values())
        self._waiting.clear()
        return waiters

    def grant(self, ticket_id: int, request: TicketRequest, decision: Decision, now: float, lease: Lease) -> None:
        self._granted[ticket_id] = (request, decision, now)
        self._leases[ticket_id] = lease

    def end(self, ticket_id: int) -> tuple[TicketRequest, Decision, float] | None:
        """A granted request ended: what it was granted with, None if it was not running. Its lease is let go."""
        granted = self._granted.pop(ticket_id, None)
        if granted is not None:
            self._leases.pop(ticket_id, None)
        return granted

    def lease(self, ticket_id: int) -> Lease | None:
        return self._leases.get(ticket_id)
