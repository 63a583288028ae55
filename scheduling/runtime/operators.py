"""The engine's operator side: cancelling, cutting and re-ranking requests, retuning and reconfiguring the
core, a shutdown's drain, and the reads the front doors' questions answer from (`scheduling.door.questions`)."""

from __future__ import annotations

import asyncio
import inspect
from datetime import datetime, timezone
from collections.abc import Collection, Mapping
from typing import Any, Callable

from scheduling.core import Band, Decision, ModelSpec, SerialSettings, StopModel, SwapPolicy, band_of
from scheduling.core.placement import Hardware
from scheduling.tickets import Outcome, Refused, RequestState, TicketRequest


# How long a shutdown waits, once it has cut what still runs, for those requests to end before models stop.
SHUTDOWN_CUT_GRACE_S = 2.0


class OperatorActions:
    """Part of `SchedulerRuntime`."""

    def operator_cut(self, ticket_id: int) -> bool:
        """Operator action: end a running request now, its client told why. Returns whether it ran."""
        if ticket_id not in self.held.granted:
            return False
        self._cut([ticket_id], Refused(503, "cancelled_by_operator", "cancelled by an operator while running"))
        return True

    def operator_cancel(self, ticket_id: int) -> bool:
        """Admin action: fail a queued request with a clear message. Returns whether it was waiting."""
        if ticket_id not in self.held.waiting:
            return False
        reason = Refused(503, "cancelled_by_operator", f"cancelled by an operator {self._where(ticket_id)}")
        self._refuse_waiting(ticket_id, reason, RequestState.CANCELLED)
        return True

    def refuse_key(self, key: str, reason: Refused) -> list[int]:
        """Refuse every waiting request of the API key `key` with `reason` (the key no longer counts); returns
        their ids. Its running requests go on."""
        refused = [ticket_id for ticket_id, waiter in self.held.waiting.items() if key and waiter.request.api_key == key]
        for ticket_id in refused:
            self._refuse_waiting(ticket_id, reason, RequestState.CANCELLED)
        return refused

    def reprioritize(self, ticket_id: int, priority: int) -> bool:
        """Admin action: re-rank a queued request. Returns whether it was still queued (one whose
        model is starting for it has left the queue)."""
        if ticket_id not in self.held.waiting or not self.scheduler.is_queued(ticket_id):
            return False
        now = self.now()
        self._run(lambda: self.scheduler.reprioritize(ticket_id, priority, now))
        self.recorder.update(ticket_id, priority=priority, band=band_of(priority).value)
        return True

    def retune(self, settings: SerialSettings) -> None:
        now = self.now()
        self._run(lambda: self.scheduler.retune(settings, now))

    def reconfigure(self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: list[str],
                    hardware: Hardware | None = None) -> None:
        """A reloaded config: new model table, swap groups and hardware; `restart` models get a fresh process."""
        now = self.now()
        self._run(lambda: self.scheduler.reconfigure(models, policy, restart, now, hardware))

    def apply_leases(self, leases: list[tuple[int, str, datetime]]) -> None:
        """The model leases in force, as rows say them (id, model, when it expires): each model is kept loaded
        until its latest one expires."""
        now, wall = self.now(), datetime.now(timezone.utc)
        kept: dict[str, tuple[str, float]] = {}
        for lease_id, model, expires_at in sorted(leases, key=lambda lease: lease[2]):
            kept[model] = (f"lease #{lease_id}", now + (expires_at - wall).total_seconds())
        self._run(lambda: self.scheduler.apply_leases(kept, now))

    def ranked(self) -> list:
        return self.scheduler.ranked(self.now())

    def from_thread(self, fn: Callable[..., Any], *args: Any, timeout: float = 5.0) -> Any:
        """Run `fn(*args)` on the runtime's event loop from another thread (sync admin views) and return its
        result, awaited there when it is awaitable."""

        async def call():
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        coroutine = call()
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the loop has closed (a process shutting down): the call is never run
            coroutine.close()
            raise
        return future.result(timeout)

    def waiting_request(self, ticket_id: int) -> TicketRequest | None:
        waiter = self.held.waiting.get(ticket_id)
        return waiter.request if waiter else None

    def arrival_of(self, ticket_id: int) -> float | None:
        """When a waiting request arrived (`now()` clock), counting a previous worker's wait for it."""
        waiter = self.held.waiting.get(ticket_id)
        return waiter.ticket.arrival if waiter else None

    def running_requests(self) -> list[tuple[int, tuple[TicketRequest, Decision, float]]]:
        return list(self.held.granted.items())

    def tickets_of(self, origins: Collection[str]) -> list[int]:
        """The requests, waiting or running, that front ends know by these keys (distributed mode)."""
        waiting = [tid for tid, waiter in self.held.waiting.items() if waiter.request.origin in origins]
        return waiting + [tid for tid, (request, _, _) in self.held.granted.items() if request.origin in origins]

    def ticket_of(self, origin: str) -> int | None:
        """The ticket of the waiting request a front end knows as `origin` (distributed mode)."""
        return next((tid for tid, waiter in self.held.waiting.items() if waiter.request.origin == origin), None)

    def granted_request(self, ticket_id: int) -> tuple[TicketRequest, Decision, float] | None:
        """A running request with its dispatch decision and when it was granted (`now()` clock), or None."""
        return self.held.granted.get(ticket_id)

    def oldest_wait_by_band(self) -> dict[Band, float]:
        """Oldest wait per band as of now, from the last published snapshot (thread-safe read)."""
        taken_at, snap = self.snapshot
        elapsed = self._loop.time() - taken_at
        return {
            band: (wait + elapsed if snap.depth_by_band[band] else 0.0)
            for band, wait in snap.oldest_wait_by_band.items()
        }

    def cancel_all(self, ticket_ids: list[int], reason: str) -> None:
        """Requests whose callers are gone together (their front end died), wherever each is: their
        rows end `cancelled` with `reason`, a running one's lease is revoked, and only then does the
        scheduler give out what they held, so none of them is granted or starts a model on its way out."""
        for ticket_id in ticket_ids:
            lease = self.held.lease(ticket_id)
            if not self._record_end(ticket_id, Outcome(state=RequestState.CANCELLED, error=reason)):
                self._end_waiting(ticket_id, reason)
            elif lease is not None:
                lease.revoke(Refused(499, "cancelled", reason))
        now = self.now()
        self._run(lambda: self.scheduler.cancel_all(ticket_ids, now))

    async def shutdown(self, drain_seconds: float) -> None:
        """Refuse new work, fail queued requests, give running ones `drain_seconds` to finish."""
        self._closing = True
        now = self.now()
        # The core asks to stop every model at once; that would cut the running request short, so the
        # stops wait until the drain is over (the service stops the whole fleet then).
        self._run(lambda: [e for e in self.scheduler.shutdown(now) if not isinstance(e, StopModel)])
        deadline = self.now() + drain_seconds
        while (self.held.granted or self.relayed.underway() or self._tasks) and self.now() < deadline:
            await asyncio.sleep(0.05)
        # What still runs is cut by the shutdown, not by its model stopping: each client is told so.
        cut = [lease for ticket_id in self.held.granted if (lease := self.held.lease(ticket_id)) is not None]
        self._cut(list(self.held.granted), Refused(503, "shutting_down", "llamaswap shut down before this request finished"))
        # A cut request closes its model server's connection as its holder ends: the models stop after
        # that, so a server is not killed in the middle of its side of the close.
        holders = [task for lease in cut if (task := lease.holder()) is not None]
        if holders:
            await asyncio.wait(holders, timeout=SHUTDOWN_CUT_GRACE_S)
        if self._timer:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
