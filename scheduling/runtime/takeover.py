"""The engine's side of a worker taking over from another: requests the previous one left queued are queued
again with their waits so far, a worker that stops hands its queue over unanswered, and a request a dead
worker had granted ends as its front end reports."""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import datetime, timezone
from typing import Any

from scheduling.rows.columns import outcome_columns
from scheduling.tickets import Carried, Interrupted, Lease, Outcome, Refused, RequestState

class HandedOver(Exception):
    """The request stays queued for the worker that takes over from this one: answer nothing."""


class Takeover:
    """Part of `SchedulerRuntime`."""

    def requeue(self, carried: list[Carried]) -> list[Coroutine[Any, Any, Lease]]:
        """Queue requests a previous worker had queued, all at once, and return what to await for
        each one's lease (as `submit`). Their waits so far count for aging."""
        if self._closing:
            raise Refused(503, "shutting_down", "llamaswap is shutting down; retry later", 1)
        now = self.now()
        wall = datetime.now(timezone.utc)
        waiters = [
            self._queue(c.request, now, now - max(0.0, (wall - c.arrived_at).total_seconds()), c.ticket_id)
            for c in carried
        ]
        self._run(lambda: self.scheduler.submit_all([w.ticket for w in waiters], now))
        return [self._wait(waiter) for waiter in waiters]

    def reopen(self, ticket_id: int, explanation: str) -> None:
        """A request whose row was ended `cancelled` is queued again under it (see `requeue`): the row
        says `queued` again, and why, until it ends as the request then does."""
        self.recorder.update(ticket_id, state=RequestState.QUEUED, status_code=None, error="", finished_at=None,
                             explanation=explanation)

    def drop_carried(self, ticket_id: int, reason: str) -> None:
        """A request a previous worker left queued is given up before it was queued again: its row ends."""
        self.recorder.update(ticket_id, state=RequestState.CANCELLED, error=reason, finished_at=self._wall(self.now()))

    def hand_over(self) -> int:
        """Stop serving the queue without answering it: the rows stay queued for the worker that takes
        over, which rebuilds the queue from them. Returns how many requests were handed over."""
        waiters = self.held.stop_all_waiting()
        now = self.now()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(HandedOver())
                waiter.future.exception()
            self._run(lambda ticket_id=waiter.ticket.id: self.scheduler.cancel(ticket_id, now))
        return len(waiters)

    def end_interrupted(self, interrupted: Interrupted, outcome: Outcome) -> None:
        """A request a dead worker had granted ended after all, its front end says how: its row says
        so instead of `interrupted`, with the times the front end stamped (see `stamped`)."""
        def wall(unix: float | None) -> datetime | None:
            return None if unix is None else datetime.fromtimestamp(unix, timezone.utc)

        finished_at = wall(outcome.ended_at) or self._wall(self.now())
        seconds = max(0.0, (finished_at - interrupted.dispatched_at).total_seconds())
        self.recorder.update(interrupted.ticket_id, **outcome_columns(
            outcome, finished_at, seconds, wall(outcome.first_byte_at)
        ))
